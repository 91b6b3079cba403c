import { afterEach, describe, expect, test } from "bun:test";
import { chmodSync, chownSync, existsSync, mkdirSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { resolveConfig } from "../../../src/engine/config";
import { startDaemon } from "../../../src/engine/daemon";
import { WARM_RESTART_BODY } from "../../../src/engine/daemon/listeners";
import { buildBinaries } from "../../e2e/binaries";
import { eventually, reapWorkloads, runCli, type SpawnedEngine, spawnEngine, tempDir, testShim, workloadPath } from "../../helpers";

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

/** snapshot lists a directory tree with each entry's mode, to show that a failed start changed nothing. */
function snapshot(dir: string): string[] {
  return readdirSync(dir, { recursive: true })
    .map(String)
    .sort()
    .map((entry) => `${entry} ${(statSync(join(dir, entry)).mode & 0o7777).toString(8)}`)
    .concat(`. ${(statSync(dir).mode & 0o7777).toString(8)}`);
}

/** jsonLines parses the JSON log lines of an engine's output (its human lines on stderr aside). */
function jsonLines(output: string): Record<string, unknown>[] {
  return output
    .split("\n")
    .filter((line) => line.startsWith("{"))
    .map((line) => JSON.parse(line) as Record<string, unknown>);
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
    await eventually(() => engine.stderr().includes("the admin token is the one set in ENGINE_ADMIN_TOKEN"));
    expect((await fetch(`${engine.url}/api/tokens`, { headers: { authorization: `Bearer ${secret}` } })).status).toBe(200);
    expect(engine.output()).not.toContain(secret);
  });

  test("the restart request a successor warms its handlers with is refused by the route's schema over the socket, and restarts nothing", async () => {
    const dir = scratch();
    const engine = await started(dir, { args: [] });
    // The unix socket counts as admin: only the body's schema stands between this request and a restart.
    const response = await fetch("http://localhost/api/daemon/restart", {
      unix: join(dir, "engine.sock"),
      method: "POST",
      headers: { "content-type": "application/json" },
      body: WARM_RESTART_BODY,
    });
    expect(response.status).toBe(422);
    const payload = (await response.json()) as { detail: { loc: unknown[] }[] };
    expect(payload.detail).toContainEqual(expect.objectContaining({ loc: ["body", "drain_timeout_s"] }));
    // A restart would have logged its request at once, before any drain.
    const health = await fetch(`${engine.url}/api/health`);
    expect(health.status).toBe(200);
    expect(engine.output()).not.toContain("restart requested");
  });

  test("POST /api/daemon/restart answers 202, hands over to a stand-in and re-executes in place: same pid and port, new process image", async () => {
    const dir = scratch();
    const engine = await started(dir, { args: [] });
    const token = (await Bun.file(join(dir, "admin.token")).text()).trim();
    const auth = { authorization: `Bearer ${token}`, "content-type": "application/json" };
    const before = (await (await fetch(`${engine.url}/api/health`)).json()) as { pid: number; uptime_s: number };
    const linesBefore = engine.output().split('"msg":"listening"').length;
    const response = await fetch(`${engine.url}/api/daemon/restart`, {
      method: "POST",
      headers: auth,
      body: JSON.stringify({ drain_timeout_s: 2 }),
    });
    expect(response.status).toBe(202);
    expect(await response.json()).toEqual({});
    // Two starts: the stand-in's, then this pid's own after its execve; both keep the port
    // (--port 0 picked it), and the stand-in is gone once the pid took the work back.
    await eventually(() => engine.output().split('"msg":"listening"').length >= linesBefore + 2, { timeoutMs: 30000 });
    const listening = jsonLines(engine.output()).filter((line) => line.msg === "listening");
    const standIn = listening.at(-2)?.pid as number;
    expect(standIn).not.toBe(before.pid);
    expect(listening.at(-1)?.pid).toBe(before.pid);
    expect(listening.slice(-2).map((line) => line.port)).toEqual([engine.port, engine.port]);
    const after = (await (await fetch(`${engine.url}/api/health`)).json()) as { pid: number; uptime_s: number };
    expect(after.pid).toBe(before.pid);
    expect(engine.proc.exitCode).toBeNull();
    expect((await fetch(`${engine.url}/api/tokens`, { headers: auth })).status).toBe(200);
    await eventually(() => !existsSync(`/proc/${standIn}`), { timeoutMs: 10000 });
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

  test("a first start whose API port another program holds exits 1 with one line and leaves no data dir", async () => {
    const dir = scratch();
    const blocker = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response("busy") });
    cleanups.push(() => blocker.stop(true));
    const dataDir = join(dir, "parent", "state");
    const result = await runCli(["serve", "--data-dir", dataDir, "--port", String(blocker.port)]);
    expect(result.code).toBe(1);
    expect(result.stderr).toBe(
      `engine: port ${blocker.port} on 127.0.0.1 is already in use (another engine?): choose another with --port or ENGINE_PORT [port_in_use]\n`,
    );
    // Neither the data dir nor the parent the start would have made.
    expect(existsSync(join(dir, "parent"))).toBe(false);
  });

  test("an existing data dir is left exactly as it was when the port is taken", async () => {
    const dir = scratch();
    chmodSync(dir, 0o755);
    writeFileSync(join(dir, "notes.txt"), "mine");
    const before = snapshot(dir);
    const blocker = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response("busy") });
    cleanups.push(() => blocker.stop(true));
    const result = await runCli(["serve", "--data-dir", dir, "--port", String(blocker.port)]);
    expect(result.code).toBe(1);
    expect(result.stderr).toContain("[port_in_use]");
    expect(snapshot(dir)).toEqual(before);
  });

  test("a first start whose chosen proxy port another program holds exits 1 with one line and leaves no data dir", async () => {
    const dir = scratch();
    const blocker = Bun.listen({ hostname: "0.0.0.0", port: 0, socket: { data() {} } });
    cleanups.push(() => blocker.stop(true));
    const dataDir = join(dir, "state");
    // The proxy is on (runCli does not turn it off), with its HTTPS port chosen.
    const result = await runCli(["serve", "--data-dir", dataDir, "--port", "0", "--https-port", String(blocker.port), "--http-port", "0"]);
    expect(result.code).toBe(1);
    expect(result.stderr).toMatch(
      new RegExp(`^engine: the proxy's HTTPS port ${blocker.port} on 0\\.0\\.0\\.0 is already in use: .*\\[port_in_use\\]\n$`),
    );
    expect(existsSync(dataDir)).toBe(false);
  });

  test("a first start that fails after it wrote (here a module that throws) removes the data dir it made", async () => {
    const dir = scratch();
    const dataDir = join(dir, "made", "state");
    const config = resolveConfig({ dataDir, port: 0, logToStdout: false, shimPath: testShim(), proxy: false }, {});
    const start = startDaemon(config, {
      decorateServices: () => {
        throw new Error("injected failure after the database and admin token were written");
      },
    });
    await expect(start).rejects.toThrow("injected failure");
    expect(existsSync(join(dir, "made"))).toBe(false);
  });

  test("start-up says on stderr where the API and web UI are, how to sign in and where the admin token is", async () => {
    const dir = scratch();
    const engine = await started(dir);
    const token = (await Bun.file(join(dir, "admin.token")).text()).trim();
    const human = await eventually(() => (engine.stderr().includes(" ui` ") ? engine.stderr() : null));
    expect(human).toBe(
      `engine: API and web UI at http://127.0.0.1:${engine.port}; the local CLI uses ${join(dir, "engine.sock")}\n` +
        `engine: sign in to the web UI with \`engine --data-dir ${dir} ui\` (a one-time link); the admin token is in ${join(dir, "admin.token")}\n`,
    );
    expect(human).not.toContain(token);
    // The JSON log is on stdout, untouched: every line of it parses.
    expect(
      engine
        .output()
        .split("\n")
        .filter((line) => line.startsWith("engine: ")),
    ).toHaveLength(2);
    expect(jsonLines(engine.output()).some((line) => line.msg === "listening")).toBe(true);
  });

  test("SIGTERM says which services keep running and how to stop them all; `engine services stop --all` does", async () => {
    const dir = scratch();
    cleanups.push(() => reapWorkloads(dir));
    const first = await spawnEngine(dir);
    const token = (await Bun.file(join(dir, "admin.token")).text()).trim();
    const auth = { authorization: `Bearer ${token}`, "content-type": "application/json" };
    const deploy = await fetch(`${first.url}/api/services`, {
      method: "POST",
      headers: auth,
      body: JSON.stringify({ name: "nap", command: ["sleep", "300"] }),
    });
    expect(deploy.status).toBe(201);
    let pid = 0;
    await eventually(async () => {
      const record = (await (await fetch(`${first.url}/api/services/nap`, { headers: auth })).json()) as { status: string; pid: number };
      pid = record.pid;
      return record.status === "running";
    });
    expect(await first.stop()).toBe(0);
    expect(first.stderr()).toEndWith(
      "engine: stopped. 1 service keeps running (nap); the next `engine serve` adopts them\n" +
        "engine: to stop them all, run `engine services stop --all` while the engine runs\n",
    );
    const said = jsonLines(first.output()).find((line) => String(line.msg).includes("services stop --all"));
    expect(said).toMatchObject({ level: 30, services: ["nap"] });

    const second = await started(dir);
    await eventually(() => second.output().includes("adopted a running service"));
    // One line for the adoption's pass, naming what it adopted as the stop's line named it (decision 535).
    const adopted = jsonLines(second.output()).filter((line) => String(line.msg).startsWith("adopted "));
    expect(adopted).toHaveLength(1);
    expect(adopted[0]).toMatchObject({ level: 30, msg: "adopted a running service", services: ["nap"], workload_pids: [pid] });
    const stopped = await runCli(["--data-dir", dir, "services", "stop", "--all"]);
    expect(stopped).toMatchObject({ code: 0, stdout: "stopped nap (was running, now stopped)\n", stderr: "" });
    expect(await runCli(["--data-dir", dir, "services", "stop", "--all"])).toMatchObject({
      code: 0,
      stdout: "nothing to stop: no service is running\n",
    });
    expect(await second.stop()).toBe(0);
    expect(second.stderr()).toEndWith("engine: stopped; no service was running\n");
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
    expect(readdirSync(dir)).toEqual(["file"]);
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
    // The first start tightened what was open, and said so as a warning naming each path.
    const first = jsonLines(engine.output()).find((line) => line.level === 40 && Array.isArray(line.tightened));
    expect(first?.tightened).toEqual(expect.arrayContaining([`${dir} 0755 -> 0711`, `${join(dir, "bin")} 0755 -> 0700`]));
    expect(String(first?.msg)).toContain(`${dir} 0755 -> 0711`);
    const again = await started(dir, { env: { ENGINE_SHIM: "" } });
    const warning = jsonLines(again.output()).find((line) => line.level === 40 && Array.isArray(line.tightened));
    expect(warning?.tightened).toEqual([`${join(dir, "engine.db")} 0644 -> 0600`]);
    expect(String(warning?.msg)).toStartWith("the data dir had modes looser than the engine keeps; tightened ");
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

// An unprivileged engine: the compiled binary as `nobody`, where setpriv can make one.
(process.getuid?.() === 0 && Bun.which("setpriv") ? describe : describe.skip)("the data dir as an unprivileged user", () => {
  const asNobody = async () => [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
    "--",
    workloadPath((await buildBinaries()).engine),
  ];

  test("loose modes become 0700 and 0600, with a warning naming each path; a data dir it may not create is one error, nothing made", async () => {
    const base = scratch();
    chmodSync(base, 0o755);
    const owned = join(base, "owned");
    mkdirSync(owned);
    chownSync(owned, 65534, 65534);
    const dataDir = join(owned, "state");
    const command = await asNobody();
    const first = await spawnEngine(dataDir, { command });
    expect(await first.stop()).toBe(0);
    chmodSync(dataDir, 0o755);
    chmodSync(join(dataDir, "engine.db"), 0o644);
    const again = await started(dataDir, { command });
    const warning = jsonLines(again.output()).find((line) => line.level === 40 && Array.isArray(line.tightened));
    expect(warning?.tightened).toEqual(expect.arrayContaining([`${dataDir} 0755 -> 0700`, `${join(dataDir, "engine.db")} 0644 -> 0600`]));
    expect(statSync(dataDir).mode & 0o777).toBe(0o700);
    expect(statSync(join(dataDir, "engine.db")).mode & 0o777).toBe(0o600);

    // base is root's and 0755: nobody may not create a data dir in it.
    const result = await runCli(["serve", "--data-dir", join(base, "theirs", "state"), "--port", "0"], { ENGINE_PROXY: "off" }, command);
    expect(result.code).toBe(1);
    expect(result.stderr).toBe(
      `engine: the data dir ${join(base, "theirs", "state")} is not usable (EACCES): it cannot be created in ${base}; choose another with --data-dir or ENGINE_DATA_DIR [data_dir_unwritable]\n`,
    );
    expect(readdirSync(base)).toEqual(["owned"]);
  }, 180_000);
});
