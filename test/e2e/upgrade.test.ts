/**
 * `engine upgrade` end to end with two compiled builds that say different versions
 * (docs/decisions.md 364-365): under a loop of API calls and a loop of requests through the
 * proxy, the running binary is replaced and the daemon restarts into it with no failed
 * request, keeping its pid and the upstream service's; a broken new binary is rolled back
 * with the old one serving all along; a binary that does not know the data dir's store schema
 * and binaries that cannot be one are refused before anything is replaced.
 */
import { Database } from "bun:sqlite";
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, copyFileSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { VERSION } from "../../src/lib/version";
import {
  eventually,
  freePort,
  REPO_ROOT,
  reapWorkloads,
  runCli,
  type SpawnedEngine,
  spawnEngine,
  tempDir,
  waitProxied,
  workloadBun,
  workloadPath,
} from "../helpers";
import { buildBinaries, buildEngineVersion } from "./binaries";

const UPSTREAM = join(REPO_ROOT, "test", "fixtures", "proxy", "upstream.ts");
const NEXT = `${VERSION}-next`;

let workDir: string;
/** installed is where the engine runs from: the path an upgrade replaces. */
let installed: string;
let nextBinary: string;
let dataDir: string;
let engine: SpawnedEngine;
let headers: Record<string, string>;
let httpPort = 0;

const sha256 = (file: string) => new Bun.CryptoHasher("sha256").update(readFileSync(file)).digest("hex");

/** install copies a build where a package manager would put it: a root-owned 0755 file. */
function install(from: string, to: string): string {
  mkdirSync(join(to, ".."), { recursive: true, mode: 0o755 });
  copyFileSync(from, to);
  chmodSync(to, 0o755);
  return to;
}

beforeAll(async () => {
  workDir = tempDir("engine-e2e-upgrade-");
  chmodSync(workDir, 0o755);
  const [current, next] = await Promise.all([buildBinaries(), buildEngineVersion(NEXT)]);
  installed = install(current.engine, join(workDir, "bin", "engine"));
  nextBinary = install(next, join(workDir, "new", "engine"));
  dataDir = join(workDir, "data");
  // A fixed port (not 0): an upgrade that fails after the hand-over starts the engine again in
  // place, which would pick another free port.
  engine = await spawnEngine(dataDir, {
    command: [installed],
    args: ["--port", String(await freePort())],
    env: {
      ENGINE_SHIM: "",
      ENGINE_PROXY: "on",
      ENGINE_HTTPS_PORT: "0",
      ENGINE_HTTP_PORT: "0",
      ENGINE_MDNS: "off",
      ENGINE_PROXY_PROCESSES: "2",
    },
  });
  headers = { authorization: `Bearer ${readFileSync(join(dataDir, "admin.token"), "utf8").trim()}`, "content-type": "application/json" };
  const port = await freePort();
  const deployed = await fetch(`${engine.url}/api/services`, {
    method: "POST",
    headers,
    body: JSON.stringify({ name: "web", port, command: [workloadBun(), workloadPath(UPSTREAM)], env: { SERVICE_NAME: "web" } }),
  });
  expect(deployed.status).toBe(201);
  httpPort = await eventually(
    async () => {
      const status = (await (await fetch(`${engine.url}/api/proxy/status`, { headers })).json()) as {
        tls: { http_port: number };
        routes: { items: { host: string; state: string }[] };
      };
      return status.routes.items.some((route) => route.host === "web.localhost" && route.state === "up") ? status.tls.http_port : 0;
    },
    { timeoutMs: 30_000 },
  );
  // The load below counts every failure: it starts once the upstream answers, not only once its route is up.
  await waitProxied(httpPort, "web.localhost", "web");
}, 240_000);

afterAll(async () => {
  await engine?.stop();
  reapWorkloads(dataDir);
  rmSync(workDir, { recursive: true, force: true });
});

interface Load {
  api: number;
  proxied: number;
  failures: string[];
  stop(): Promise<void>;
}

/** underLoad keeps API calls (TCP and unix socket) and proxied requests going until stopped. */
function underLoad(): Load {
  let go = true;
  const load: Load = {
    api: 0,
    proxied: 0,
    failures: [],
    async stop() {
      go = false;
      await Promise.all(loops);
    },
  };
  const loop = (kind: "api" | "proxied", call: () => Promise<Response>, check: (body: string) => boolean) =>
    (async () => {
      while (go) {
        try {
          const response = await call();
          const body = await response.text();
          if (response.status === 200 && check(body)) load[kind] += 1;
          else load.failures.push(`${kind}: ${response.status} ${body.slice(0, 160)}`);
        } catch (error) {
          load.failures.push(`${kind}: ${(error as Error).message}`);
        }
        await Bun.sleep(2);
      }
    })();
  const socket = join(dataDir, "engine.sock");
  const loops = [
    loop(
      "api",
      () => fetch(`${engine.url}/api/health`),
      (body) => body.includes('"status":"ok"'),
    ),
    loop(
      "api",
      () => fetch(`${engine.url}/api/services`, { headers }),
      (body) => body.includes('"web"'),
    ),
    loop(
      "api",
      () => fetch("http://engine/api/services/web", { unix: socket }),
      (body) => body.includes('"web"'),
    ),
    loop(
      "proxied",
      () => fetch(`http://127.0.0.1:${httpPort}/`, { headers: { host: "web.localhost" } }),
      (body) => body.includes('"web"'),
    ),
    loop(
      "proxied",
      () => fetch(`http://127.0.0.1:${httpPort}/`, { headers: { host: "web.localhost" }, keepalive: false }),
      (body) => body.includes('"web"'),
    ),
  ];
  return load;
}

const health = async () => (await (await fetch(`${engine.url}/api/health`)).json()) as { version: string; pid: number; uptime_s: number };
const upstreamPid = async () => ((await (await fetch(`${engine.url}/api/services/web`, { headers })).json()) as { pid: number }).pid;
const binDir = () => readdirSync(join(workDir, "bin")).sort();

/** versionOf asks a binary what `engine upgrade` asks it. */
async function versionOf(binary: string): Promise<{ cli: string; store_schema: string }> {
  const result = await runCli(["version", "--no-daemon", "--json"], {}, [binary]);
  expect(result.code).toBe(0);
  return JSON.parse(result.stdout) as { cli: string; store_schema: string };
}

describe("engine upgrade (compiled binaries)", () => {
  test("replaces the binary and restarts into it under load: no failed request, same pids, the previous binary kept", async () => {
    const before = await health();
    expect(before.version).toBe(VERSION);
    const webPid = await upstreamPid();
    const previousHash = sha256(installed);
    const load = underLoad();
    let result: Awaited<ReturnType<typeof runCli>>;
    try {
      await eventually(() => load.api > 20 && load.proxied > 20);
      // The old binary's own CLI asks its daemon, over the unix socket, and waits for the new version.
      result = await runCli(["--data-dir", dataDir, "upgrade", nextBinary, "--drain-timeout", "10", "--wait"], {}, [installed]);
      const counts = { api: load.api, proxied: load.proxied };
      await eventually(() => load.api > counts.api + 20 && load.proxied > counts.proxied + 20);
    } finally {
      await load.stop();
    }
    expect(result.stderr).toBe("");
    expect(result.code).toBe(0);
    expect(result.stdout).toContain(`upgrading ${VERSION} -> ${NEXT}: the new binary is in place at ${installed}`);
    expect(result.stdout).toContain(`the daemon runs ${NEXT} (pid ${before.pid})`);
    expect(load.failures).toEqual([]);
    console.log(`upgrade under load: ${load.api} API calls and ${load.proxied} proxied requests answered, none failed`);
    expect(await health()).toMatchObject({ version: NEXT, pid: before.pid });
    expect(await upstreamPid()).toBe(webPid);
    expect(sha256(installed)).toBe(sha256(nextBinary));
    expect(sha256(`${installed}.previous`)).toBe(previousHash);
    expect((await versionOf(`${installed}.previous`)).cli).toBe(VERSION);
    expect(binDir()).toEqual(["engine", "engine.previous"]);
  }, 180_000);

  test("a new binary that exits at once is rolled back; the old one serves all along", async () => {
    const before = await health();
    const runningHash = sha256(installed);
    const facts = await versionOf(nextBinary);
    // It answers what an upgrade asks before the swap, and fails as a daemon.
    const broken = join(workDir, "broken", "engine");
    mkdirSync(join(workDir, "broken"), { mode: 0o755 });
    writeFileSync(
      broken,
      `#!/bin/sh\nif [ "$1" = version ]; then echo '${JSON.stringify({ ...facts, cli: `${VERSION}-broken` })}'; exit 0; fi\necho "broken on purpose" >&2\nexit 1\n`,
      { mode: 0o755 },
    );
    const load = underLoad();
    try {
      await eventually(() => load.api > 20 && load.proxied > 20);
      const response = await fetch(`${engine.url}/api/daemon/upgrade`, {
        method: "POST",
        headers,
        body: JSON.stringify({ binary: broken, drain_timeout_s: 5, health_timeout_s: 10 }),
      });
      expect(response.status).toBe(202);
      expect(await response.json()).toEqual({
        from_version: NEXT,
        to_version: `${VERSION}-broken`,
        binary: installed,
        previous: `${installed}.previous`,
        store_schema: facts.store_schema,
      });
      await eventually(() => engine.output().includes(`the upgrade to ${VERSION}-broken failed: the new process did not take over`), {
        timeoutMs: 60_000,
      });
      const counts = { api: load.api, proxied: load.proxied };
      await eventually(() => load.api > counts.api + 20 && load.proxied > counts.proxied + 20);
    } finally {
      await load.stop();
    }
    expect(load.failures).toEqual([]);
    expect(await health()).toMatchObject({ version: NEXT, pid: before.pid });
    expect(sha256(installed)).toBe(runningHash);
    expect(binDir()).toEqual(["engine", "engine.previous"]);
    // A restart is possible again: the failed upgrade left nothing under way.
    const again = await fetch(`${engine.url}/api/daemon/upgrade`, {
      method: "POST",
      headers,
      body: JSON.stringify({ binary: "relative/engine" }),
    });
    expect(again.status).toBe(422);
  }, 180_000);

  test("a new binary that serves but does not answer /api/health as itself in time is killed, and the previous one starts again in place", async () => {
    const before = await health();
    const runningHash = sha256(installed);
    const facts = await versionOf(nextBinary);
    // It says one version when asked, and runs the next build, which answers with another.
    const liar = join(workDir, "liar", "engine");
    mkdirSync(join(workDir, "liar"), { mode: 0o755 });
    writeFileSync(
      liar,
      `#!/bin/sh\nif [ "$1" = version ]; then echo '${JSON.stringify({ ...facts, cli: `${VERSION}-liar` })}'; exit 0; fi\nexec ${nextBinary} "$@"\n`,
      { mode: 0o755 },
    );
    const response = await fetch(`${engine.url}/api/daemon/upgrade`, {
      method: "POST",
      headers,
      body: JSON.stringify({ binary: liar, drain_timeout_s: 5, health_timeout_s: 3 }),
    });
    expect(response.status).toBe(202);
    await eventually(() => engine.output().includes(`the upgrade to ${VERSION}-liar failed after this engine had handed over`), {
      timeoutMs: 60_000,
    });
    // The engine's own pid starts again from the previous binary, on the same port.
    const after = await eventually(
      async () => {
        const answer = await health();
        return answer.pid === before.pid && answer.version === before.version ? answer : null;
      },
      { timeoutMs: 60_000 },
    );
    expect(after).toMatchObject({ version: before.version, pid: before.pid });
    expect(sha256(installed)).toBe(runningHash);
    expect(binDir()).toEqual(["engine", "engine.previous"]);
    expect(readdirSync(dataDir).filter((entry) => /^\.[a-z]\d+$/.test(entry))).toEqual([]);
  }, 180_000);

  test("a binary that does not know the data dir's store schema is refused (409 schema_downgrade), nothing replaced", async () => {
    const runningHash = sha256(installed);
    const db = new Database(join(dataDir, "engine.db"));
    db.exec("PRAGMA busy_timeout = 5000");
    db.query("INSERT INTO schema_migrations (id, applied_at) VALUES (?, ?)").run("2099-01-01-01-from-the-future", new Date().toISOString());
    try {
      const response = await fetch(`${engine.url}/api/daemon/upgrade`, {
        method: "POST",
        headers,
        body: JSON.stringify({ binary: nextBinary }),
      });
      expect(response.status).toBe(409);
      const body = (await response.json()) as { error: { code: string; message: string } };
      expect(body.error.code).toBe("schema_downgrade");
      expect(body.error.message).toContain("2099-01-01-01-from-the-future");
      expect(body.error.message).toContain("a downgrade of the store is refused");
    } finally {
      db.query("DELETE FROM schema_migrations WHERE id = ?").run("2099-01-01-01-from-the-future");
      db.close();
    }
    expect(sha256(installed)).toBe(runningHash);
    expect(binDir()).toEqual(["engine", "engine.previous"]);
  });

  test.each([
    ["a relative path", () => "new/engine", "the path must be absolute"],
    ["a missing file", () => join(workDir, "nowhere", "engine"), "it cannot be opened (ENOENT)"],
    ["a directory", () => join(workDir, "new"), "it is not a regular file"],
    ["a file others may write", () => writable(0o757), "others may write to it (mode 0757)"],
    ["a file that is not executable", () => writable(0o644), "it is not executable (mode 0644)"],
    ["a program that is not an engine", () => "/bin/true", "did not print JSON (is it an engine binary?)"],
    ["a program that fails", () => "/bin/false", "`version --no-daemon --json` exited with 1"],
  ])("%s is refused with 422 (binary_invalid), nothing replaced", async (_name, path, reason) => {
    const runningHash = sha256(installed);
    const response = await fetch(`${engine.url}/api/daemon/upgrade`, { method: "POST", headers, body: JSON.stringify({ binary: path() }) });
    expect(response.status).toBe(422);
    // A 422 keeps the contract's `detail` shape; the code is in ctx.
    const body = (await response.json()) as { detail: { loc: string[]; msg: string; ctx: { code: string } }[] };
    expect(body.detail).toHaveLength(1);
    expect(body.detail[0]?.loc).toEqual(["body", "binary"]);
    expect(body.detail[0]?.ctx.code).toBe("binary_invalid");
    expect(body.detail[0]?.msg).toContain(reason);
    expect(sha256(installed)).toBe(runningHash);
    expect(binDir()).toEqual(["engine", "engine.previous"]);
  });
});

/** writable makes a copy of the new binary with `mode`, for the refusals. */
function writable(mode: number): string {
  const dir = join(workDir, `mode-${mode.toString(8)}`);
  mkdirSync(dir, { recursive: true, mode: 0o755 });
  const file = join(dir, "engine");
  copyFileSync(nextBinary, file);
  chmodSync(file, mode);
  return file;
}
