import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { eventually, REPO_ROOT, reapWorkloads, runCli, type SpawnedEngine, spawnEngine, tempDir } from "../helpers";
import { buildBinaries } from "./binaries";
import { Terminal } from "./terminal";

/**
 * `engine top` in a real terminal (tmux), as its user runs it: the compiled engine serving with
 * the fake nvidia-smi's two busy H100s, two services, then the view read off the screen while
 * a service changes, the terminal resized, and `q` and Ctrl-C leaving the shell as it was.
 */

const FAKE_NVIDIA_SMI = join(REPO_ROOT, "test", "fixtures", "gpu", "nvidia-smi");

let dataDir: string;
let workDir: string;
let engine: SpawnedEngine | undefined;
let engineBinary: string;
let term: Terminal;
let shell: string;

const cli = (...args: string[]) => runCli(args, { ENGINE_DATA_DIR: dataDir }, [engineBinary]);

/** frame polls the window until what it shows now (the alternate screen, while top runs) matches. */
const frame = (pattern: RegExp, timeoutMs = 20_000) =>
  eventually(() => (pattern.test(term.visible(shell)) ? term.visible(shell) : ""), { timeoutMs, intervalMs: 100 }).catch((error: Error) => {
    throw new Error(`${error.message} (${pattern}); the terminal shows:\n${term.visible(shell)}`);
  });

beforeAll(async () => {
  const binaries = await buildBinaries();
  engineBinary = binaries.engine;
  dataDir = tempDir("engine-top-");
  workDir = tempDir("engine-top-cwd-");
  engine = await spawnEngine(dataDir, {
    command: [engineBinary],
    env: { ENGINE_NVIDIA_SMI: FAKE_NVIDIA_SMI, FAKE_NVIDIA_SMI_SCENARIO: "busy-h100" },
  });
  for (const args of [
    ["services", "deploy", "trainer", "--gpus", "1", "--command", "sleep 600"],
    ["services", "deploy", "web", "--command", "sleep 600"],
  ]) {
    const deployed = await cli(...args);
    if (deployed.code !== 0) throw new Error(`${args.join(" ")}: ${deployed.stderr}`);
  }
  term = new Terminal("top", {
    PATH: `${binaries.dir}:${process.env.PATH ?? "/usr/bin:/bin"}`,
    HOME: process.env.HOME ?? "/tmp",
    TERM: "xterm-256color",
    ENGINE_DATA_DIR: dataDir,
  });
  shell = term.open(workDir);
}, 240_000);

afterAll(async () => {
  term?.close();
  await engine?.stop();
  if (dataDir) {
    reapWorkloads(dataDir);
    rmSync(dataDir, { recursive: true, force: true });
  }
  if (workDir) rmSync(workDir, { recursive: true, force: true });
});

describe("engine top in a terminal (compiled engine, tmux)", () => {
  test("shows the GPUs and the services on the alternate screen, cursor hidden, and follows a status change", async () => {
    const before = await term.run(shell, "echo ready-for-top");
    expect(before.code).toBe(0);
    term.type(shell, "engine top --interval 0.5");
    const first = await frame(/^trainer +running/m);
    // The GPUs as nvidia-smi reports them, bars and figures, and the service that holds GPU 0.
    expect(first).toMatch(/^GPU +NAME +UTIL +MEMORY +HELD BY$/m);
    expect(first).toMatch(/^0 +NVIDIA H100 80GB HBM3 +\[\|+ +\] 87% +\[\|+ +\] +60G\/80G +trainer$/m);
    expect(first).toMatch(/^1 +NVIDIA H100 80GB HBM3 +\[\|* +\] 12% +\[\|* +\] +8\.0G\/80G +-$/m);
    expect(first).toMatch(/^NAME +STATUS +CPU +MEM +GPU MEM +RESTARTS +PID +KIND +UPTIME +MESSAGE$/m);
    expect(first).toMatch(/^web +running/m);
    expect(first).toMatch(/^engine top {2}\d\d:\d\d:\d\d {2}2\/2 running {2}every 0\.5s, q quits/m);
    expect(term.state(shell)).toMatchObject({ alternateScreen: true, cursorVisible: false });
    // From the second sample on, the CPU and memory of each live workload, and trainer's GPU.
    await frame(/^trainer +running +\d+\.\d% +[\d.]+[KMG] +(?:[\d.]+[KMG]?\/)?80G gpu0 +0 +\d+ +service/m);

    expect((await cli("services", "stop", "web")).code).toBe(0);
    const changed = await frame(/^web +stopped +- +- +- +0 +-/m);
    expect(changed).toMatch(/1\/2 running/);
  }, 60_000);

  test("a narrower terminal redraws at once, dropping columns in the stated order", async () => {
    term.resize(shell, 60, 20);
    const narrow = await frame(/^NAME +STATUS +CPU +MEM +GPU MEM +RESTARTS +PID$/m);
    for (const line of narrow.split("\n")) expect(line.length).toBeLessThanOrEqual(60);
    expect(narrow).toMatch(/^0 +NVIDIA H100 80GB HBM3 +\[\|+ *\] 87% +60G\/80G +trainer$/m);
    term.resize(shell, 200, 50);
    await frame(/^NAME +STATUS +CPU +MEM +GPU MEM +RESTARTS +PID +KIND +UPTIME +MESSAGE$/m);
  }, 30_000);

  test("q quits and gives the terminal back: the normal screen, its text, the cursor, a prompt", async () => {
    term.key(shell, "q");
    await eventually(() => !term.state(shell).alternateScreen, { timeoutMs: 10_000 });
    expect(term.state(shell).cursorVisible).toBe(true);
    const screen = await term.waitFor(shell, /engine top --interval 0\.5\n\$\s*$/);
    // What was on the screen before top is still there, and nothing of top's frames is.
    expect(screen).toContain("ready-for-top");
    expect(screen).not.toContain("HELD BY");
    expect(await term.run(shell, "true")).toEqual({ code: 0, out: "" });
  }, 30_000);

  test("Ctrl-C quits as q does, with status 0 and the terminal restored", async () => {
    term.type(shell, "engine top");
    await frame(/^trainer +running/m);
    term.key(shell, "C-c");
    await eventually(() => !term.state(shell).alternateScreen, { timeoutMs: 10_000 });
    expect(term.state(shell).cursorVisible).toBe(true);
    expect(await term.run(shell, "echo status=$?")).toMatchObject({ code: 0, out: "status=0" });
    // The keyboard is out of raw mode: a typed line still needs Enter and echoes as typed.
    expect(await term.run(shell, "echo typed")).toEqual({ code: 0, out: "typed" });
  }, 30_000);

  test("through a pipe it prints one frame without escape codes and exits; --json prints the data", async () => {
    const piped = await cli("top");
    expect(piped.code).toBe(0);
    expect(piped.stdout).not.toContain("\x1b");
    expect(piped.stdout).toMatch(/^trainer +running +\d+\.\d% /m);
    expect(piped.stdout).toMatch(/^web +stopped/m);
    expect(piped.stdout).toMatch(/^0 +NVIDIA H100 80GB HBM3 .* 87% .*trainer$/m);
    const json = await cli("--json", "top");
    expect(json.code).toBe(0);
    const data = JSON.parse(json.stdout) as {
      services: { name: string }[];
      gpus: { devices: unknown[] };
      cpu_percent: Record<string, number>;
    };
    expect(data.services.map((s) => s.name).sort()).toEqual(["trainer", "web"]);
    expect(data.gpus.devices).toHaveLength(2);
    expect(Object.keys(data.cpu_percent)).toEqual(["trainer"]);
  }, 30_000);

  test("an engine that is not running is one line on the normal screen, status 1", async () => {
    const missing = await runCli(["top"], { ENGINE_DATA_DIR: join(workDir, "nothing-here"), ENGINE_PORT: "1" }, [engineBinary]);
    expect(missing.code).toBe(1);
    expect(missing.stdout).toBe("");
    expect(missing.stderr).toMatch(
      /^engine: cannot reach the engine at http:\/\/127\.0\.0\.1:1: is `engine serve` running\?.*\[daemon_not_running\]\n$/,
    );
  }, 30_000);
});
