import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, readFileSync, readlinkSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { eventually, REPO_ROOT, reapWorkloads, runCli, type SpawnedEngine, spawnEngine, tempDir } from "../helpers";
import { installEngine } from "./binaries";

/** SPEC_ROUTES is the endpoint table of ../shared/spec/local-engine-api.md. */
const SPEC_ROUTES = [
  "GET /api/tokens",
  "POST /api/databases/{name}/restore",
  "POST /api/daemon/restart",
  "GET /api/app-templates/{template_id}",
  "GET /api/app-templates",
  "GET /api/proxy/status",
  "DELETE /api/services/{name}/domains/{domain}",
  "PUT /api/link/vcs-token",
  "GET /api/services/{ident}/diagnose",
  "GET /api/openapi.json",
];

/** specFile finds the contract beside the repository (CI puts shared/ there), if present. */
function specFile(): string | undefined {
  return [join(REPO_ROOT, "..", "shared", "spec", "local-engine-api.md"), join(REPO_ROOT, "shared", "spec", "local-engine-api.md")].find(
    (c) => existsSync(c),
  );
}

let workDir: string;
let binary: string;
let engine: SpawnedEngine;

beforeAll(async () => {
  workDir = tempDir("engine-e2e-");
  // Run it from a directory with nothing beside it: no node_modules, no sources, no templates.
  binary = await installEngine(workDir);
  // ENGINE_SHIM empty: the binary must use the shim it carries, not the tests' compiled one.
  // The proxy runs too, on free ports: its processes are the binary itself, running the proxy bundle it carries.
  engine = await spawnEngine(join(workDir, "data"), {
    command: [binary],
    env: {
      ENGINE_SHIM: "",
      ENGINE_PROXY: "on",
      ENGINE_HTTPS_PORT: "0",
      ENGINE_HTTP_PORT: "0",
      ENGINE_MDNS: "off",
      ENGINE_PROXY_PROCESSES: "2",
    },
  });
}, 180_000);

afterAll(async () => {
  await engine?.stop();
  reapWorkloads(join(workDir, "data"));
  rmSync(workDir, { recursive: true, force: true });
});

describe("compiled dist/engine", () => {
  test("supervises a service with the shim it carries", async () => {
    const token = readFileSync(join(workDir, "data", "admin.token"), "utf8").trim();
    const headers = { authorization: `Bearer ${token}`, "content-type": "application/json" };
    const deployed = await fetch(`${engine.url}/api/services`, {
      method: "POST",
      headers,
      body: JSON.stringify({ name: "e2e", command: "echo from-binary; exec sleep 300" }),
    });
    expect(deployed.status).toBe(201);
    const running = await eventually(async () => {
      const record = (await (await fetch(`${engine.url}/api/services/e2e`, { headers })).json()) as { status: string; pid: number | null };
      return record.status === "running" ? record : null;
    });
    expect(running.pid).toBeGreaterThan(0);
    const shims = [...new Bun.Glob("engine-shim-*").scanSync({ cwd: join(workDir, "data", "bin") })];
    expect(shims.length).toBe(1);
    await eventually(async () => {
      const lines = (await (await fetch(`${engine.url}/api/services/e2e/logs`, { headers })).json()) as { line: string }[];
      return lines.some((line) => line.line === "from-binary");
    });
    expect((await fetch(`${engine.url}/api/services/e2e/stop`, { method: "POST", headers })).status).toBe(200);
  });

  test("its proxy processes are the binary itself, and they answer for the engine's own name", async () => {
    const token = readFileSync(join(workDir, "data", "admin.token"), "utf8").trim();
    const status = (await (await fetch(`${engine.url}/api/proxy/status`, { headers: { authorization: `Bearer ${token}` } })).json()) as {
      state: string;
      tls: { http_port: number };
      respawn: { processes: number; pids: number[] };
    };
    expect(status.state).toBe("running");
    expect(status.respawn.processes).toBe(2);
    // Each runs the proxy's own bundle, written into bin/ by its hash, with the binary's runtime
    // (decision 487), not the whole binary's modules.
    // It starts in bin/ and reads no .env: as Bun, the binary would read both where it starts (decision 488).
    for (const pid of status.respawn.pids) {
      const [exe, flag, script] = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
      expect(exe).toBe(binary);
      expect(flag).toBe("--no-env-file");
      expect(script).toMatch(new RegExp(`^${join(workDir, "data", "bin")}/engine-proxy-[0-9a-f]{12}\\.js$`));
      expect(readlinkSync(`/proc/${pid}/cwd`)).toBe(join(workDir, "data", "bin"));
    }
    const health = await fetch(`http://127.0.0.1:${status.tls.http_port}/api/health`, { headers: { host: "localhost" } });
    expect(health.status).toBe(200);
    expect(((await health.json()) as { status: string }).status).toBe("ok");
  });

  test("reads no bunfig.toml and no .env from the directory it is started in", async () => {
    // A standalone Bun executable runs a bunfig.toml's preload scripts, and loads .env files,
    // from its working directory unless built not to: whoever could write the directory an
    // admin starts `engine` in (as root, often) would run code in it (decision 488).
    const dir = join(workDir, "hostile-cwd");
    const marker = join(dir, "preloaded");
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "preload.js"), `require("node:fs").writeFileSync(${JSON.stringify(marker)}, "ran");\n`);
    writeFileSync(join(dir, "bunfig.toml"), 'preload = ["./preload.js"]\n');
    writeFileSync(join(dir, ".env"), `ENGINE_URL=${engine.url}\n`);
    const version = (env: Record<string, string>) => {
      const run = Bun.spawnSync([binary, "--json", "version"], {
        cwd: dir,
        env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: dir, ...env },
      });
      expect(run.exitCode).toBe(0);
      return JSON.parse(run.stdout.toString()) as { cli: string; daemon: string | null };
    };
    // The .env would point the CLI at the running engine; unread, the CLI looks at its default socket, where none is.
    expect(version({}).daemon).toBeNull();
    expect(version({ ENGINE_URL: engine.url }).daemon).toBeString();
    expect(existsSync(marker)).toBe(false);
  });

  test("runs with no node_modules and answers /api/openapi.json listing every path of the spec", async () => {
    const response = await fetch(`${engine.url}/api/openapi.json`);
    expect(response.status).toBe(200);
    const doc = (await response.json()) as { openapi: string; paths: Record<string, Record<string, unknown>> };
    expect(doc.openapi).toStartWith("3.1");
    const served = Object.entries(doc.paths).flatMap(([path, ops]) => Object.keys(ops).map((m) => `${m.toUpperCase()} ${path}`));
    for (const route of SPEC_ROUTES) expect({ route, served: served.includes(route) }).toEqual({ route, served: true });
  });

  test("SPEC_ROUTES is the spec's endpoint table (checked where shared/ is beside the repository)", () => {
    const file = specFile();
    if (!file) return console.warn("shared/spec not found beside the repository: checked the built-in list only");
    const rows = readFileSync(file, "utf8").matchAll(/^\| (GET|POST|PUT|DELETE|PATCH) \| (\/api\/[^ |]*) \|/gm);
    expect([...rows].map((row) => `${row[1]} ${row[2]}`).sort()).toEqual([...SPEC_ROUTES].sort());
  });

  test("serves the offline docs page without any CDN", async () => {
    const response = await fetch(`${engine.url}/api/docs`);
    expect(response.status).toBe(200);
    const html = await response.text();
    expect(html).toContain("/api/openapi.json");
    expect(html).not.toMatch(/https?:\/\/(cdn|unpkg|fonts)\./);
  });

  test("carries the templates inside and its CLI talks to its daemon", async () => {
    const result = await runCli(["--data-dir", join(workDir, "data"), "--json", "templates", "list"], {}, [binary]);
    expect(result.code).toBe(0);
    expect((JSON.parse(result.stdout) as unknown[]).length).toBeGreaterThanOrEqual(12);
  });
});
