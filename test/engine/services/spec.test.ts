import { describe, expect, test } from "bun:test";
import { chmodSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { assertNoBindingCycle, type BoundService, bindingVariables } from "../../../src/engine/services/env";
import { applyPatch, assertCommandExists, deployOf, normalizeDeploy } from "../../../src/engine/services/spec";
import { bundledTemplateSources, TemplateCatalog } from "../../../src/engine/templates";
import { InputError } from "../../../src/lib/validation";
import { tempDir } from "../../helpers";

const silent = { warn: () => undefined, info: () => undefined, error: () => undefined } as never;
const templates = new TemplateCatalog(bundledTemplateSources(), silent);

describe("normalizeDeploy from a template", () => {
  test("the template gives the command, port, GPUs, kind and probe; its secret variables become secrets", () => {
    const { spec, secrets } = normalizeDeploy({ name: "llm", template_id: "vllm", env: { MODEL: "m", HF_TOKEN: "hf_x" } }, templates);
    expect(spec).toMatchObject({ kind: "model", port: 8000, gpus: 1, template_id: "vllm", env: { MODEL: "m" }, secret_keys: ["HF_TOKEN"] });
    expect(spec.command.slice(0, 2)).toEqual(["/bin/sh", "-c"]);
    expect(spec.health).toEqual({
      type: "http",
      path: "/health",
      interval_s: 10,
      timeout_s: 5,
      failure_threshold: 3,
      start_period_s: 1800,
    });
    expect(spec.restart.policy).toBe("always");
    expect(secrets).toEqual({ HF_TOKEN: "hf_x" });
  });

  test("explicit fields override the template; gpu_memory_mb replaces the template's whole GPUs", () => {
    const { spec } = normalizeDeploy(
      { name: "llm", template_id: "vllm", env: { MODEL: "m" }, gpu_memory_mb: 20000, port: 9000, health: null },
      templates,
    );
    expect(spec).toMatchObject({ gpus: 0, gpu_memory_mb: 20000, port: 9000, health: null });
  });

  test("every problem is reported at once", () => {
    try {
      normalizeDeploy({ name: "ui", template_id: "open-webui", health: { type: "exec" }, gpus: 1, gpu_memory_mb: 5 }, templates);
      throw new Error("expected an InputError");
    } catch (error) {
      expect(error).toBeInstanceOf(InputError);
      expect((error as InputError).detail.map((d) => d.loc.join("."))).toEqual(
        expect.arrayContaining(["body.env.WEBUI_SECRET_KEY", "body.gpu_memory_mb", "body.health.command"]),
      );
    }
  });
});

describe("a patch over the deploy that makes a spec again (decision 180)", () => {
  const vllm = normalizeDeploy(
    { name: "llm", template_id: "vllm", env: { MODEL: "m", OTHER: "o", HF_TOKEN: "hf_x" }, memory_mb: 2048, restart: { max_restarts: 9 } },
    templates,
  );

  test("deployOf makes the same spec again, template defaults included and not applied twice", () => {
    const again = normalizeDeploy(deployOf(vllm.spec, vllm.secrets), templates);
    expect(again.spec).toEqual(vllm.spec);
    expect(again.secrets).toEqual(vllm.secrets);
  });

  test("a service deployed without a probe does not get its template's probe back", () => {
    const bare = normalizeDeploy({ name: "llm", template_id: "vllm", env: { MODEL: "m" }, health: null }, templates);
    expect(normalizeDeploy(applyPatch(deployOf(bare.spec, {}), { memory_mb: 512 }), templates).spec.health).toBeNull();
  });

  test.each([
    ["a field left out keeps its value", { port: 9000 }, { port: 9000, memory_mb: 2048, gpus: 1 }],
    ["null resets a field to the deploy's default", { memory_mb: null, port: null }, { memory_mb: null, port: 8000 }],
    ["env merges key by key; null removes a key", { env: { OTHER: null, EXTRA: "1" } }, { env: { MODEL: "m", EXTRA: "1" } }],
    ["restart merges field by field", { restart: { policy: "never" } }, { restart: { policy: "never", max_restarts: 9 } }],
    ["health is replaced whole; null removes the probe", { health: null }, { health: null }],
    [
      "a probe without its type changes the current probe",
      { health: { start_period_s: 60 } },
      { health: { type: "http", path: "/health", start_period_s: 60 } },
    ],
    ["a share of one GPU drops the whole GPUs", { gpu_memory_mb: 8000 }, { gpus: 0, gpu_memory_mb: 8000 }],
  ] as const)("%s", (_label, patch, expected) => {
    const { spec } = normalizeDeploy(applyPatch(deployOf(vllm.spec, vllm.secrets), patch as never), templates);
    expect(spec).toMatchObject(expected as never);
  });

  test("a patch is checked as a deploy: removing a variable the template requires is refused", () => {
    expect(() => normalizeDeploy(applyPatch(deployOf(vllm.spec, vllm.secrets), { env: null }), templates)).toThrow(
      "template vllm requires MODEL",
    );
  });

  test("secrets merge like env; a key set to null is removed", () => {
    const merged = applyPatch(deployOf(vllm.spec, vllm.secrets), { secrets: { HF_TOKEN: null, API_KEY: "k" } });
    expect(merged.secrets).toEqual({ API_KEY: "k" });
  });

  test("a managed database's deploy leaves its command and user to the adapter", () => {
    const db = normalizeDeploy({ name: "pg", engine: "postgres" }, templates);
    const body = deployOf(db.spec, { POSTGRES_PASSWORD: "x" });
    expect(body).toMatchObject({ kind: "database", engine: "postgres" });
    expect(body.command).toBeUndefined();
    expect(body.user).toBeUndefined();
  });
});

describe("normalizeDeploy: the probe's start period", () => {
  const http = { type: "http" as const, path: "/health" };
  const startPeriod = (body: Parameters<typeof normalizeDeploy>[0]) => normalizeDeploy(body, templates).spec.health?.start_period_s;

  test.each<[string, Parameters<typeof normalizeDeploy>[0], number]>([
    ["a service's probe gets 10 s", { name: "web", command: ["true"], port: 8080, health: http }, 10],
    ["a model's probe gets 600 s", { name: "llm", kind: "model", command: ["true"], port: 8080, health: http }, 600],
    ["an exec probe gets 10 s too", { name: "job", command: ["true"], health: { type: "exec", command: "true" } }, 10],
    ["0 turns it off", { name: "web", command: ["true"], port: 8080, health: { ...http, start_period_s: 0 } }, 0],
    ["a given value is kept", { name: "web", command: ["true"], port: 8080, health: { ...http, start_period_s: 45 } }, 45],
    ["a template gives its own", { name: "llm", template_id: "vllm", env: { MODEL: "m" } }, 1800],
    ["a template's applies to a probe given in full", { name: "llm", template_id: "vllm", env: { MODEL: "m" }, health: http }, 1800],
    [
      "a given value beats the template's",
      { name: "llm", template_id: "vllm", env: { MODEL: "m" }, health: { start_period_s: 7200 } },
      7200,
    ],
  ])("%s", (_name, body, expected) => {
    expect(startPeriod(body)).toBe(expected);
  });

  test("a probe without a type changes the template's probe and keeps the rest of it", () => {
    const { spec } = normalizeDeploy(
      { name: "lcpp", template_id: "llama-cpp", env: { MODEL_PATH: "/m.gguf" }, health: { start_period_s: 60, interval_s: 2 } },
      templates,
    );
    expect(spec.health).toEqual({ type: "http", path: "/health", interval_s: 2, timeout_s: 5, failure_threshold: 3, start_period_s: 60 });
  });

  test.each<[string, Parameters<typeof normalizeDeploy>[0], string]>([
    ["without a template", { name: "web", command: ["true"], port: 8080, health: { start_period_s: 5 } }, "no template gives one"],
    [
      "with a template that has no probe",
      { name: "db", template_id: "postgres", health: { start_period_s: 5 } },
      "template postgres has no probe to change",
    ],
  ])("a probe without a type %s is refused", (_name, body, why) => {
    try {
      normalizeDeploy(body, templates);
      throw new Error("expected an InputError");
    } catch (error) {
      expect(error).toBeInstanceOf(InputError);
      expect((error as InputError).detail).toContainEqual(
        expect.objectContaining({ loc: ["body", "health", "type"], type: "missing", msg: expect.stringContaining(why) }),
      );
    }
  });
});

describe("bindings", () => {
  const bound = (over: Partial<BoundService>): BoundService => ({
    name: "db",
    kind: "database",
    template_id: null,
    port: 5432,
    env: {},
    secrets: {},
    ...over,
  });

  test("a postgres binding provides DATABASE_URL and libpq's variables", () => {
    const vars = bindingVariables(
      bound({ template_id: "postgres", env: { POSTGRES_USER: "app" }, secrets: { POSTGRES_PASSWORD: "p@ss word" } }),
    );
    expect(vars).toMatchObject({
      DATABASE_URL: "postgresql://app:p%40ss%20word@127.0.0.1:5432/app",
      PGHOST: "127.0.0.1",
      PGPORT: "5432",
      PGUSER: "app",
      PGPASSWORD: "p@ss word",
      DB_HOST: "127.0.0.1",
      DB_PORT: "5432",
    });
  });

  test("redis and http services", () => {
    expect(bindingVariables(bound({ name: "cache", template_id: "redis", port: 6380 })).REDIS_URL).toBe("redis://127.0.0.1:6380/0");
    expect(bindingVariables(bound({ name: "my-api", kind: "service", port: 8080 })).MY_API_URL).toBe("http://127.0.0.1:8080");
  });

  test.each([
    [
      ["b"],
      new Map([
        ["b", ["c"]],
        ["c", ["a"]],
      ]),
      true,
    ],
    [
      ["b"],
      new Map([
        ["b", ["c"]],
        ["c", []],
      ]),
      false,
    ],
    [
      ["b", "c"],
      new Map([
        ["b", ["c"]],
        ["c", []],
      ]),
      false,
    ],
  ])("a binds %j over %j: cycle %s", (bindings, graph, cycle) => {
    const check = () => assertNoBindingCycle("a", bindings as string[], graph as Map<string, string[]>);
    if (cycle) expect(check).toThrow(/a → b → c → a/);
    else expect(check).not.toThrow();
  });
});

describe("assertCommandExists on a PATH", () => {
  test("a program is found where it is now: moved along the PATH, removed, or no longer executable", () => {
    const first = tempDir("engine-test-path-a-");
    const second = tempDir("engine-test-path-b-");
    const path = `${first}:${second}`;
    const code = () => {
      try {
        assertCommandExists(["tool-x", "--flag"], null, path);
        return "found";
      } catch (error) {
        return (error as InputError).detail[0]?.type;
      }
    };
    try {
      expect(code()).toBe("command_not_found");
      writeFileSync(join(second, "tool-x"), "#!/bin/sh\n", { mode: 0o755 });
      expect(code()).toBe("found");
      expect(code()).toBe("found");
      renameSync(join(second, "tool-x"), join(first, "tool-x"));
      expect(code()).toBe("found");
      chmodSync(join(first, "tool-x"), 0o644);
      expect(code()).toBe("command_not_found"); // root too: no execute bit at all
      chmodSync(join(first, "tool-x"), 0o755);
      expect(code()).toBe("found");
      rmSync(join(first, "tool-x"));
      expect(code()).toBe("command_not_found");
    } finally {
      rmSync(first, { recursive: true, force: true });
      rmSync(second, { recursive: true, force: true });
    }
  });
});
