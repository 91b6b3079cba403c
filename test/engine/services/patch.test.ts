import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { Diagnosis, ServiceRecord } from "../../../src/contract/engine";
import { detectCgroupDriver } from "../../../src/engine/supervisor";
import { createToken, startTestEngine, type TestEngine } from "../../helpers";
import { processExists, ServiceClient } from "./harness";

let engine: TestEngine;
let api: ServiceClient;
beforeAll(async () => {
  engine = await startTestEngine();
  api = new ServiceClient(engine);
});
afterAll(() => engine.close());

type Answer = ServiceRecord & {
  error?: { code: string; message: string };
  detail?: { loc: (string | number)[]; type: string; msg: string }[];
};

const patch = (name: string, body: unknown, token?: string) => engine.json<Answer>("PATCH", `/api/services/${name}`, { body, token });

const cgroups = detectCgroupDriver();

/** memoryLimitMb reads the memory limit of a run's cgroup (v1 or v2); null where the engine has no cgroups here. */
function memoryLimitMb(runId: string): number | null {
  if (!cgroups.driver) return null;
  const dir = join(cgroups.driver.parent, runId);
  const file = cgroups.driver.version === 1 ? "memory.limit_in_bytes" : "memory.max";
  return Number(readFileSync(join(dir, file), "utf8").trim()) / (1024 * 1024);
}

async function lastRun(name: string): Promise<{ id: string; version: number; pid: number | null }> {
  const diagnosis: Diagnosis = await api.diagnose(name);
  return diagnosis.last_run as { id: string; version: number; pid: number | null };
}

describe("PATCH /api/services/{ident}", () => {
  test("a new memory limit makes a new version and restarts the running process under it; the rest is kept", async () => {
    await api.deployed({
      name: "hog",
      command: "exec sleep 300",
      memory_mb: 64,
      env: { KEEP: "me", DROP: "me" },
      secrets: { TOKEN: "s3cr3t-patch-value" },
      restart: { policy: "always", max_restarts: 7 },
    });
    const before = await api.waitFor("hog", "running", (r) => r.pid !== null);
    const firstRun = await lastRun("hog");
    if (cgroups.driver) expect(memoryLimitMb(firstRun.id)).toBe(64);

    const answer = await patch("hog", { memory_mb: 400, env: { DROP: null, ADDED: "yes" }, restart: { backoff_s: 2 } });
    expect(answer.status).toBe(200);
    expect(answer.body).toMatchObject({
      name: "hog",
      version: 2,
      memory_mb: 400,
      env: { KEEP: "me", ADDED: "yes" },
      secret_keys: ["TOKEN"],
      command: ["/bin/sh", "-c", "exec sleep 300"],
      restart: { policy: "always", max_restarts: 7, backoff_s: 2 },
    });
    expect(JSON.stringify(answer.body)).not.toContain("s3cr3t-patch-value");
    const after = await api.waitFor("hog", "running", (r) => r.pid !== null && r.pid !== before.pid);
    expect(processExists(before.pid as number)).toBe(false);
    const secondRun = await lastRun("hog");
    expect(secondRun.version).toBe(2);
    expect(secondRun.id).not.toBe(firstRun.id);
    if (cgroups.driver) expect(memoryLimitMb(secondRun.id)).toBe(400);
    // A roll is not a crash: no restart is counted.
    expect(after.restarts).toBe(0);
    // null resets: no memory limit at all.
    const cleared = await patch("hog", { memory_mb: null });
    expect(cleared.body).toMatchObject({ version: 3, memory_mb: null });
    await api.waitFor("hog", "running", (r) => r.pid !== null && r.pid !== after.pid);
    // The secret went along to every version: the workload still has it.
    const diagnosis = await api.diagnose("hog");
    expect(diagnosis.injected_env_keys).toEqual(expect.arrayContaining(["TOKEN", "KEEP", "ADDED"]));
  }, 30_000);

  test("a patch that changes nothing makes no version and leaves the process alone", async () => {
    const before = await api.waitFor("hog", "running", (r) => r.pid !== null);
    const same = await patch("hog", { env: { KEEP: "me" } });
    expect(same.status).toBe(200);
    expect(same.body.version).toBe(before.version);
    expect((await api.get("hog")).pid).toBe(before.pid);
  });

  test.each([
    ["a value under the minimum", { memory_mb: 1 }, ["body", "memory_mb"], "greater_than_equal"],
    ["a field a patch does not take (name is the path's)", { name: "other" }, ["body", "name"], "extra_forbidden"],
    ["what the service is (its kind)", { kind: "batch" }, ["body", "kind"], "extra_forbidden"],
    ["an unknown field", { memroy_mb: 400 }, ["body", "memroy_mb"], "extra_forbidden"],
    ["a port out of range", { port: 70000 }, ["body", "port"], "less_than_equal"],
    ["a program that does not exist", { command: ["/no/such/program"] }, ["body", "command"], "command_not_found"],
    ["whole GPUs and a share of one at once", { gpus: 1, gpu_memory_mb: 100 }, ["body", "gpu_memory_mb"], "value_error"],
    ["a probe without a port", { health: { type: "tcp" } }, ["body", "health", "port"], "missing"],
    ["a binding to itself", { bindings: ["hog"] }, ["body", "bindings"], "value_error"],
  ])("422 for %s, and nothing changes", async (_label, body, loc, type) => {
    const before = await api.waitFor("hog", "running", (r) => r.pid !== null);
    const answer = await patch("hog", body);
    expect(answer.status).toBe(422);
    expect(answer.body.detail?.[0]).toMatchObject({ loc, type });
    const after = await api.get("hog");
    expect({ version: after.version, pid: after.pid, memory_mb: after.memory_mb }).toEqual({
      version: before.version,
      pid: before.pid,
      memory_mb: before.memory_mb,
    });
  });

  test("roles and scope: readonly 403, a submitter outside its scope 403 out_of_scope, inside it allowed; user is an admin's", async () => {
    const readonly = await createToken(engine, { name: "patch-ro", role: "readonly" });
    const outside = await createToken(engine, { name: "patch-out", role: "submitter", scope_services: ["elsewhere"] });
    const inside = await createToken(engine, { name: "patch-in", role: "submitter", scope_services: ["hog"] });
    const before = await api.get("hog");
    const refusedRole = await patch("hog", { memory_mb: 128 }, readonly.secret);
    expect(refusedRole.status).toBe(403);
    expect(refusedRole.body.error?.code).toBe("forbidden");
    const refusedScope = await patch("hog", { memory_mb: 128 }, outside.secret);
    expect(refusedScope.status).toBe(403);
    expect(refusedScope.body.error?.code).toBe("out_of_scope");
    const refusedBinding = await patch("hog", { bindings: ["elsewhere"] }, inside.secret);
    expect(refusedBinding.status).toBe(403);
    expect(refusedBinding.body.error?.code).toBe("out_of_scope");
    const refusedUser = await patch("hog", { user: "root" }, inside.secret);
    expect(refusedUser.status).toBe(403);
    expect(refusedUser.body.error?.code).toBe("forbidden");
    expect((await api.get("hog")).version).toBe(before.version);
    const allowed = await patch("hog", { memory_mb: 128 }, inside.secret);
    expect(allowed.status).toBe(200);
    expect(allowed.body).toMatchObject({ version: before.version + 1, memory_mb: 128 });
  });

  test("a token's GPU cap holds for a patch as for a deploy", async () => {
    const capped = await createToken(engine, { name: "patch-capped", role: "submitter", max_gpus: 0 });
    const answer = await patch("hog", { gpus: 1 }, capped.secret);
    expect(answer.status).toBe(403);
    expect(answer.body.error?.code).toBe("cap_exceeded");
  });

  test("404 for a service that does not exist", async () => {
    const answer = await patch("no-such-service", { memory_mb: 128 });
    expect(answer.status).toBe(404);
    expect(answer.body.error?.code).toBe("service_not_found");
  });

  test("a service stopped by request stays stopped, and starts on the new version", async () => {
    // The patch before this one rolled hog: let that launch finish before stopping it.
    await api.waitFor("hog", "running", (r) => r.pid !== null);
    const stop = await api.control("hog", "stop");
    expect(stop.status).toBe(200);
    const stopped = await api.waitFor("hog", "stopped");
    const answer = await patch("hog", { memory_mb: 96 });
    expect(answer.status).toBe(200);
    expect(answer.body).toMatchObject({ status: "stopped", version: stopped.version + 1, memory_mb: 96, pid: null });
    expect((await api.control("hog", "start")).status).toBe(200);
    await api.waitFor("hog", "running", (r) => r.pid !== null);
    const run = await lastRun("hog");
    expect(run.version).toBe(stopped.version + 1);
    if (cgroups.driver) expect(memoryLimitMb(run.id)).toBe(96);
    await api.control("hog", "stop");
  });
});
