import { afterEach, describe, expect, test } from "bun:test";
import { chmodSync, existsSync, mkdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { eventually, runCli, type SpawnedEngine, spawnEngine, tempDir } from "../../helpers";

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()?.();
});

function scratch(): string {
  const dir = tempDir();
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

async function started(dataDir: string, options?: Parameters<typeof spawnEngine>[1]): Promise<SpawnedEngine> {
  const engine = await spawnEngine(dataDir, options);
  cleanups.push(() => engine.stop());
  return engine;
}

describe("daemon process", () => {
  test("first start writes admin.token (0600), a 0600 socket, and logs where the token is but not the token", async () => {
    const dir = scratch();
    const engine = await started(dir);
    const tokenFile = join(dir, "admin.token");
    expect(statSync(tokenFile).mode & 0o777).toBe(0o600);
    expect(statSync(join(dir, "engine.sock")).mode & 0o777).toBe(0o600);
    // As root, database servers run as their own users and must traverse it (docs/decisions.md 128).
    expect(statSync(dir).mode & 0o777).toBe(process.getuid?.() === 0 ? 0o711 : 0o700);
    expect(statSync(join(dir, "engine.db")).mode & 0o777).toBe(0o600);
    const token = (await Bun.file(tokenFile).text()).trim();
    expect(engine.output()).toContain(tokenFile);
    expect(engine.output()).not.toContain(token);
    const response = await fetch(`${engine.url}/api/tokens`, { headers: { authorization: `Bearer ${token}` } });
    expect(response.status).toBe(200);
  });

  test("SIGTERM stops it cleanly and removes the socket; a restart keeps the tokens", async () => {
    const dir = scratch();
    const first = await spawnEngine(dir);
    const token = (await Bun.file(join(dir, "admin.token")).text()).trim();
    expect(await first.stop()).toBe(0);
    expect(existsSync(join(dir, "engine.sock"))).toBe(false);
    const second = await started(dir);
    expect((await Bun.file(join(dir, "admin.token")).text()).trim()).toBe(token);
    expect((await fetch(`${second.url}/api/tokens`, { headers: { authorization: `Bearer ${token}` } })).status).toBe(200);
  });

  test("ENGINE_ADMIN_TOKEN sets the admin token instead of admin.token", async () => {
    const dir = scratch();
    const secret = "my-own-admin-token-0123456789";
    const engine = await started(dir, { env: { ENGINE_ADMIN_TOKEN: secret } });
    expect(existsSync(join(dir, "admin.token"))).toBe(false);
    expect((await fetch(`${engine.url}/api/tokens`, { headers: { authorization: `Bearer ${secret}` } })).status).toBe(200);
    expect(engine.output()).not.toContain(secret);
  });

  test("POST /api/daemon/restart answers 202, drains and re-executes in place: same pid, new process image", async () => {
    const dir = scratch();
    const engine = await started(dir, { args: [] });
    const token = (await Bun.file(join(dir, "admin.token")).text()).trim();
    const auth = { authorization: `Bearer ${token}`, "content-type": "application/json" };
    const before = (await (await fetch(`${engine.url}/api/health`)).json()) as { pid: number; uptime_s: number };
    // --port 0 picks a new port after the re-exec, so find it from the new "listening" line.
    const linesBefore = engine.output().split('"msg":"listening"').length;
    const response = await fetch(`${engine.url}/api/daemon/restart`, {
      method: "POST",
      headers: auth,
      body: JSON.stringify({ drain_timeout_s: 2 }),
    });
    expect(response.status).toBe(202);
    expect(await response.json()).toEqual({});
    await eventually(() => engine.output().split('"msg":"listening"').length > linesBefore, { timeoutMs: 15000 });
    const port = Number(/"port":(\d+)/.exec(engine.output().slice(engine.output().lastIndexOf('"port":')))?.[1]);
    const after = (await (await fetch(`http://127.0.0.1:${port}/api/health`)).json()) as { pid: number; uptime_s: number };
    expect(after.pid).toBe(before.pid);
    expect(engine.proc.exitCode).toBeNull();
    expect((await fetch(`http://127.0.0.1:${port}/api/tokens`, { headers: auth })).status).toBe(200);
  });

  test("a port in use is one clear error and exit 1", async () => {
    const dir = scratch();
    const blocker = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response("busy") });
    cleanups.push(() => blocker.stop(true));
    const result = await runCli(["serve", "--data-dir", dir, "--port", String(blocker.port)]);
    expect(result.code).toBe(1);
    expect(result.stderr.trim().split("\n").at(-1)).toMatch(/^engine: port \d+ on 127\.0\.0\.1 is already in use.*\[port_in_use\]$/);
    expect(result.stderr).not.toContain("    at ");
  });

  test("a second engine on the same data dir is refused", async () => {
    const dir = scratch();
    await started(dir);
    const result = await runCli(["serve", "--data-dir", dir, "--port", "0"]);
    expect(result.code).toBe(1);
    expect(result.stderr).toContain("another engine is already running on this data dir");
  });

  test("an unusable data dir is one clear error", async () => {
    const dir = scratch();
    writeFileSync(join(dir, "file"), "x");
    const result = await runCli(["serve", "--data-dir", join(dir, "file", "data"), "--port", "0"]);
    expect(result.code).toBe(1);
    expect(result.stderr).toMatch(/^engine: the data dir .* is not usable \(ENOTDIR\).*\[data_dir_unwritable\]\n$/);
  });

  test.each([
    [["--port", "http"], {}, "config: port: must be an integer from 0 to 65535"],
    [["--port", "70000"], {}, "config: port: must be an integer from 0 to 65535"],
    [["--log-level", "loud"], {}, "config: log_level: must be one of"],
    [[], { ENGINE_ADMIN_TOKEN: "short" }, "config: admin_token: ENGINE_ADMIN_TOKEN must be 16 to 512 printable characters"],
  ] as const)("bad configuration %p %p is one clear error", async (args, env, message) => {
    const dir = scratch();
    const result = await runCli(["serve", "--data-dir", dir, "--port", "0", ...args], env as Record<string, string>);
    expect(result.code).toBe(1);
    expect(result.stderr).toContain(message);
    expect(result.stderr).not.toContain('short"');
    expect(result.stderr.trim().split("\n").length).toBe(1);
  });

  test("a corrupt template in the data dir is reported and skipped, not fatal", async () => {
    const dir = scratch();
    mkdirSync(join(dir, "templates"));
    writeFileSync(join(dir, "templates", "broken.json"), "{ not json");
    writeFileSync(join(dir, "templates", "custom.json"), JSON.stringify({ id: "custom" }));
    const engine = await started(dir);
    expect(engine.output()).toContain("skipped a broken app template");
    expect(engine.output()).toContain("broken.json");
    expect(engine.output()).toContain("custom.json");
    const token = (await Bun.file(join(dir, "admin.token")).text()).trim();
    const list = (await (await fetch(`${engine.url}/api/app-templates`, { headers: { authorization: `Bearer ${token}` } })).json()) as {
      id: string;
    }[];
    expect(list.map((t) => t.id)).not.toContain("custom");
  });
});

(process.getuid?.() === 0 ? describe : describe.skip)("the data dir's layout as root (docs/decisions.md 128)", () => {
  test("an existing data dir becomes 0711 with data/ 0711, and what an older engine left open is closed", async () => {
    const dir = scratch();
    chmodSync(dir, 0o755);
    // An older engine's state: its database and bin/ made with the umask's modes.
    mkdirSync(join(dir, "bin"), { mode: 0o755 });
    chmodSync(join(dir, "bin"), 0o755);
    const engine = await started(dir, { env: { ENGINE_SHIM: "" } });
    await engine.stop();
    chmodSync(join(dir, "engine.db"), 0o644);
    const again = await started(dir, { env: { ENGINE_SHIM: "" } });
    expect(statSync(dir).mode & 0o777).toBe(0o711);
    expect(statSync(join(dir, "data")).mode & 0o777).toBe(0o711);
    expect(statSync(join(dir, "engine.db")).mode & 0o777).toBe(0o600);
    expect(statSync(join(dir, "bin")).mode & 0o777).toBe(0o700);
    expect(statSync(join(dir, "shim.sock")).mode & 0o777).toBe(0o600);
    expect(again.output()).toContain('"msg":"listening"');
  });

  test("a data dir others may write to (a shared one) is never changed", async () => {
    const dir = scratch();
    chmodSync(dir, 0o1777);
    await started(dir);
    expect(statSync(dir).mode & 0o7777).toBe(0o1777);
  });
});
