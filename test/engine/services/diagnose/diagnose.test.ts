import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { connect } from "node:net";
import { join } from "node:path";
import { eventually, freePort, runCli, startTestEngine, type TestEngine, workloadPath } from "../../../helpers";
import { ServiceClient } from "../harness";

/**
 * Diagnosis names the line that matters: real workloads fail (a port another service holds, a
 * file that is not there, a module that is not installed) and the diagnosis carries the class,
 * the key line of their output and a remediation that says what to do.
 */

// A root engine runs each workload as its own user: the system's Python, never one under /root.
const PYTHON = ["/usr/bin/python3", "/usr/local/bin/python3"].find((path) => existsSync(path));

let engine: TestEngine;
let api: ServiceClient;
const outside: Bun.Subprocess[] = [];
beforeAll(async () => {
  engine = await startTestEngine();
  api = new ServiceClient(engine);
});
afterAll(async () => {
  for (const proc of outside) proc.kill("SIGKILL");
  await engine.close();
});

/** listening says whether something accepts TCP connections on 127.0.0.1:port. */
function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host: "127.0.0.1", port }, () => {
      socket.destroy();
      resolve(true);
    });
    socket.on("error", () => resolve(false));
  });
}

const ONE_RESTART = { policy: "always", max_restarts: 1, window_seconds: 120, backoff_s: 0 };

describe.skipIf(!PYTHON)("diagnosis of real workloads", () => {
  const python = PYTHON as string;

  test("a port another engine service holds without declaring it: port_in_use naming that service", async () => {
    const port = await freePort();
    await api.deployed({ name: "web1", command: [python, "-m", "http.server", "--bind", "127.0.0.1", String(port)] });
    await api.waitFor("web1", "running");
    await eventually(() => listening(port), { timeoutMs: 10_000 });

    await api.deployed({ name: "web2", command: [python, "-m", "http.server", "--bind", "127.0.0.1", String(port)], restart: ONE_RESTART });
    await api.waitFor("web2", "failed", () => true, 20_000);
    const diagnosis = await api.diagnose("web2");
    expect(diagnosis.error?.class).toBe("port_in_use");
    expect(diagnosis.error?.key_line).toBe("OSError: [Errno 98] Address already in use");
    expect(diagnosis.error?.message).toStartWith(`port ${port} is already in use: the engine service web1 holds it (pid `);
    // It crash-looped, but the cause keeps its class; the give-up is in the message.
    expect(diagnosis.error?.message).toContain("gave up after 1 restarts in 120 s");
    expect(diagnosis.remediation?.code).toBe("free_port");
    expect(diagnosis.remediation?.detail).toContain(`Port ${port} is held by the engine service web1`);
    expect(diagnosis.remediation?.detail).toContain("`engine services stop web1`");
    expect(diagnosis.remediation?.detail).toContain("`engine services start web2`");

    // The CLI leads with the cause, the key line and the fix.
    const report = await runCli(["--data-dir", engine.dataDir, "diagnose", "web2"]);
    expect(report.code).toBe(0);
    const [cause, keyLine, fix] = report.stdout.split("\n");
    expect(cause).toStartWith(`web2: failed — port_in_use: port ${port} is already in use: the engine service web1 holds it`);
    expect(keyLine).toBe("key line: OSError: [Errno 98] Address already in use");
    expect(fix).toStartWith(`fix (free_port): Port ${port} is held by the engine service web1`);
    await api.control("web1", "stop");
  }, 60_000);

  test("a script binding a port from its settings: the port is found in its env, the holder named", async () => {
    const port = await freePort();
    const script = workloadPath(join(import.meta.dir, "fixtures", "bind.py"));
    await api.deployed({ name: "holder", command: [python, script], env: { APP_PORT: String(port) } });
    await eventually(() => listening(port), { timeoutMs: 10_000 });
    await api.deployed({ name: "clash", command: [python, script], env: { APP_PORT: String(port) }, restart: { policy: "never" } });
    await api.waitFor("clash", "failed", () => true, 20_000);
    const diagnosis = await api.diagnose("clash");
    expect(diagnosis.error).toMatchObject({ class: "port_in_use", key_line: "OSError: [Errno 98] Address already in use" });
    expect(diagnosis.error?.message).toContain(`port ${port} is already in use: the engine service holder holds it`);
    expect(diagnosis.remediation?.detail).toContain("`engine services stop holder`");
    await api.control("holder", "stop");
  }, 60_000);

  test("a port a process outside the engine holds: its pid and command are named", async () => {
    const port = await freePort();
    const proc = Bun.spawn([python, "-m", "http.server", "--bind", "127.0.0.1", String(port)], { stdout: "ignore", stderr: "ignore" });
    outside.push(proc);
    await eventually(() => listening(port), { timeoutMs: 10_000 });
    await api.deployed({
      name: "web3",
      command: [python, "-m", "http.server", "--bind", "127.0.0.1", String(port)],
      restart: { policy: "never" },
    });
    await api.waitFor("web3", "failed", () => true, 20_000);
    const diagnosis = await api.diagnose("web3");
    expect(diagnosis.error?.class).toBe("port_in_use");
    expect(diagnosis.remediation?.detail).toContain(`Port ${port} is held by pid ${proc.pid} (${python} -m http.server`);
    expect(diagnosis.remediation?.detail).toContain("a process outside the engine");
    expect(diagnosis.remediation?.detail).toContain(`\`kill ${proc.pid}\``);
    proc.kill("SIGKILL");
  }, 60_000);

  test("a script that fails to open a file: file_not_found with the path and the cwd it is relative to", async () => {
    await api.deployed({
      name: "loader",
      kind: "batch",
      command: [python, "-c", "print('loading weights'); open('weights/model.bin', 'rb')"],
      restart: { policy: "never" },
    });
    await api.waitFor("loader", "failed", () => true, 20_000);
    const diagnosis = await api.diagnose("loader");
    expect(diagnosis.error).toEqual({
      class: "file_not_found",
      message: "it could not open a file: weights/model.bin; exited with code 1",
      key_line: "FileNotFoundError: [Errno 2] No such file or directory: 'weights/model.bin'",
    });
    expect(diagnosis.remediation?.code).toBe("provide_file");
    expect(diagnosis.remediation?.detail).toContain(
      `weights/model.bin is relative to the service's cwd, ${join(engine.dataDir, "data", "loader")}`,
    );
  }, 60_000);

  test("a crash loop whose output says `cannot open` stays file_not_found, not a generic crash_loop", async () => {
    await api.deployed({ name: "crasher", command: "echo 'boom: cannot open model file' >&2; exit 1", restart: ONE_RESTART });
    await api.waitFor("crasher", "failed", () => true, 20_000);
    const diagnosis = await api.diagnose("crasher");
    expect(diagnosis.error).toEqual({
      class: "file_not_found",
      message: "it could not open a file; exited with code 1; gave up after 1 restarts in 120 s",
      key_line: "boom: cannot open model file",
    });
    expect(diagnosis.remediation?.code).toBe("provide_file");
  }, 60_000);

  test("python3 -c 'import nonexistent_mod': module_not_found, and the fix installs it", async () => {
    await api.deployed({
      name: "importer",
      kind: "batch",
      command: [python, "-c", "import nonexistent_mod"],
      restart: { policy: "never" },
    });
    await api.waitFor("importer", "failed", () => true, 20_000);
    const diagnosis = await api.diagnose("importer");
    expect(diagnosis.error).toEqual({
      class: "module_not_found",
      message: "a module it imports is not installed: nonexistent_mod; exited with code 1",
      key_line: "ModuleNotFoundError: No module named 'nonexistent_mod'",
    });
    expect(diagnosis.remediation?.code).toBe("install_module");
    expect(diagnosis.remediation?.detail).toContain("`python3 -m pip install nonexistent_mod`");
  }, 60_000);
});

describe("the key line", () => {
  test("an unknown failure still shows its last error line; a crash loop of it stays crash_loop", async () => {
    await api.deployed({
      name: "keyed",
      command: "echo starting; echo 'Traceback (most recent call last):' >&2; echo \"KeyError: 'model'\" >&2; exit 1",
      restart: ONE_RESTART,
    });
    await api.waitFor("keyed", "failed", () => true, 20_000);
    const diagnosis = await api.diagnose("keyed");
    expect(diagnosis.error?.class).toBe("crash_loop");
    expect(diagnosis.error?.key_line).toBe("KeyError: 'model'");
    expect(diagnosis.remediation?.code).toBe("crash_loop");
    expect(diagnosis.remediation?.detail).toContain("`engine services start keyed`");
  }, 60_000);

  test("a secret the service prints is redacted from the key line", async () => {
    await api.deployed({
      name: "leaky",
      kind: "batch",
      command: 'echo "Error: the server refused token $API_TOKEN" >&2; exit 1',
      secrets: { API_TOKEN: "tok-4f9a1c-very-secret" },
      restart: { policy: "never" },
    });
    await api.waitFor("leaky", "failed", () => true, 20_000);
    const diagnosis = await api.diagnose("leaky");
    expect(diagnosis.error?.key_line).toBe("Error: the server refused token ***");
    expect(JSON.stringify(diagnosis.error)).not.toContain("tok-4f9a1c");
  }, 60_000);

  test("an OOM kill stays oom_killed, and its fix prints the update command with a memory value", async () => {
    await api.deployed({
      name: "hog",
      command: "echo 'Error: allocating the cache' >&2; head -c 400M /dev/zero | tail",
      memory_mb: 32,
      restart: { policy: "never" },
    });
    await api.waitFor("hog", "failed", () => true, 20_000);
    const diagnosis = await api.diagnose("hog");
    expect(diagnosis.forensics.oom_killed).toBe(true);
    expect(diagnosis.error?.class).toBe("oom_killed");
    expect(diagnosis.error?.key_line).toBe("Error: allocating the cache");
    expect(diagnosis.remediation?.code).toBe("raise_memory_limit");
    expect(diagnosis.remediation?.detail).toContain("`engine services update hog --memory-mb 64`");
  }, 60_000);
});
