import { afterAll, describe, expect, test } from "bun:test";
import { chmodSync, existsSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { readProcessStat } from "../../../src/engine/supervisor";
import { ShimLauncher } from "../../../src/engine/supervisor/launcher";
import { createLogger } from "../../../src/lib/logger";
import { eventually, tempDir, testShim } from "../../helpers";

const dir = tempDir("engine-launcher-");
const log = createLogger({ level: "silent", stdout: false }).log;
const started: number[] = [];
afterAll(() => {
  for (const pid of started) {
    try {
      process.kill(-pid, "SIGKILL");
    } catch {
      // gone
    }
  }
  rmSync(dir, { recursive: true, force: true });
});

/** sessionOf reads a process's session id (the sixth field of /proc/<pid>/stat). */
function sessionOf(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[3]);
}

/** shimArgv is a shim's command line for a run in `dir/<name>`, as the supervisor builds it. */
function shimArgv(shim: string, name: string, argv: string[]): { runDir: string; argv: string[] } {
  const runDir = join(dir, name);
  mkdirSync(runDir, { recursive: true });
  return { runDir, argv: [shim, runDir, join(runDir, "out.log"), "-", "1048576", "2", "-", "-", "--", ...argv] };
}

describe("ShimLauncher", () => {
  test("starts shims from one launcher with the env and cwd asked for, and reports while the workload still runs", async () => {
    const launcher = new ShimLauncher(testShim(), log);
    try {
      const first = shimArgv(testShim(), "env", ["/bin/sh", "-c", 'echo "$GREETING from $(pwd)"; exec sleep 30']);
      const report = await launcher.launch(first.argv, { GREETING: "hello", PATH: "/usr/bin:/bin" }, dir);
      const match = /^ok (\d+) (\d+)$/.exec(report ?? "");
      expect(match).not.toBeNull();
      const [shimPid, pid] = [Number(match?.[1]), Number(match?.[2])];
      started.push(pid);
      // The shim is the launcher's own child (no worker or double fork between them), and leads
      // a session and process group of its own: no terminal, no signal to the launcher's group.
      expect(readProcessStat(shimPid)?.ppid).toBe(launcher.pid ?? -1);
      expect(sessionOf(shimPid)).toBe(shimPid);
      expect(readProcessStat(shimPid)?.pgid).toBe(shimPid);
      await eventually(
        () => existsSync(join(first.runDir, "out.log")) && readFileSync(join(first.runDir, "out.log"), "utf8").includes("\n"),
      );
      expect(readFileSync(join(first.runDir, "out.log"), "utf8")).toContain(`stdout F hello from ${dir}`);
      const launcherPid = launcher.pid;
      expect(launcherPid).not.toBeNull();
      const second = shimArgv(testShim(), "second", ["true"]);
      expect(await launcher.launch(second.argv, { PATH: "/usr/bin:/bin" }, dir)).toMatch(/^ok \d+ \d+$/);
      expect(launcher.pid).toBe(launcherPid);
      await eventually(() => existsSync(join(second.runDir, "exit.json")));
      expect(JSON.parse(readFileSync(join(second.runDir, "exit.json"), "utf8"))).toMatchObject({ exit_code: 0 });
      // A shim that ended is reaped by the kernel (the launcher ignores SIGCHLD): no zombie stays.
      const secondShim = Number(readFileSync(join(second.runDir, "pids"), "utf8").split(" ")[0]);
      await eventually(() => readProcessStat(secondShim) === null);
    } finally {
      launcher.stop();
    }
  });

  test("an exec failure and a working directory that is not there come back as the shim's reports", async () => {
    const launcher = new ShimLauncher(testShim(), log);
    try {
      const missing = shimArgv(testShim(), "enoent", ["/no/such/program"]);
      expect(await launcher.launch(missing.argv, {}, dir)).toBe("err 2 exec");
      const nowhere = shimArgv(testShim(), "nowhere", ["true"]);
      expect(await launcher.launch(nowhere.argv, {}, join(dir, "not-there"))).toBe("err 2 chdir");
    } finally {
      launcher.stop();
    }
  });

  test("the shim makes its run's directory and the log's, with their parents; one it cannot make is reported as such", async () => {
    const launcher = new ShimLauncher(testShim(), log);
    try {
      const service = join(dir, "services", "svc_1");
      const runDir = join(service, "runs", "run_1");
      const argv = [testShim(), runDir, join(service, "logs", "output.log"), "-", "1048576", "2", "-", "-", "--", "true"];
      expect(await launcher.launch(argv, { PATH: "/usr/bin:/bin" }, dir)).toMatch(/^ok \d+ \d+$/);
      const mode = (path: string) => statSync(path).mode & 0o777;
      expect(mode(runDir)).toBe(0o750 & ~process.umask());
      for (const made of [service, join(service, "runs"), join(service, "logs")]) expect(mode(made)).toBe(0o700 & ~process.umask());
      await eventually(() => existsSync(join(runDir, "exit.json")));
      writeFileSync(join(dir, "a-file"), "");
      const blocked = [testShim(), join(dir, "a-file", "run"), join(dir, "out.log"), "-", "1048576", "2", "-", "-", "--", "true"];
      expect(await launcher.launch(blocked, {}, dir)).toBe("err 20 rundir"); // ENOTDIR
    } finally {
      launcher.stop();
    }
  });

  test("many launches at once each get their own report", async () => {
    const launcher = new ShimLauncher(testShim(), log);
    try {
      const runs = Array.from({ length: 40 }, (_, i) => shimArgv(testShim(), `many-${i}`, ["/bin/sh", "-c", `exit ${i % 7}`]));
      const reports = await Promise.all(runs.map((run) => launcher.launch(run.argv, { PATH: "/usr/bin:/bin" }, dir)));
      const pids = reports.map((report) => Number(/^ok \d+ (\d+)$/.exec(report ?? "")?.[1]));
      expect(pids.every((pid) => pid > 0)).toBe(true);
      expect(new Set(pids).size).toBe(runs.length);
      for (const [i, run] of runs.entries()) {
        await eventually(() => existsSync(join(run.runDir, "exit.json")));
        const exit = JSON.parse(readFileSync(join(run.runDir, "exit.json"), "utf8"));
        expect(exit).toMatchObject({ exit_code: i % 7, pid: pids[i] });
      }
    } finally {
      launcher.stop();
    }
  });

  test("a launcher that was killed is started again; stop ends it and the shims run on", async () => {
    const launcher = new ShimLauncher(testShim(), log);
    const first = shimArgv(testShim(), "again-1", ["sleep", "30"]);
    const report = await launcher.launch(first.argv, { PATH: "/usr/bin:/bin" }, dir);
    const workload = Number(/^ok \d+ (\d+)$/.exec(report ?? "")?.[1]);
    started.push(workload);
    const before = launcher.pid as number;
    process.kill(before, "SIGKILL");
    await eventually(() => launcher.pid === null);
    const second = shimArgv(testShim(), "again-2", ["true"]);
    expect(await launcher.launch(second.argv, { PATH: "/usr/bin:/bin" }, dir)).toMatch(/^ok \d+ \d+$/);
    const after = launcher.pid as number;
    expect(after).not.toBe(before);
    launcher.stop();
    await eventually(() => readProcessStat(after) === null || readProcessStat(after)?.state === "Z");
    expect(readProcessStat(workload)).not.toBeNull(); // the first run's workload outlived both launchers
  });

  test("a shim with no launcher mode makes launch answer undefined: the caller spawns it itself", async () => {
    const old = join(dir, "old-shim");
    writeFileSync(old, "#!/bin/sh\necho 'usage: engine-shim RUN_DIR ...' >&2\nexit 2\n");
    chmodSync(old, 0o755);
    const launcher = new ShimLauncher(old, log);
    const run = shimArgv(old, "old", ["true"]);
    expect(await launcher.launch(run.argv, {}, dir)).toBeUndefined();
    expect(await launcher.launch(run.argv, {}, dir)).toBeUndefined();
    expect(launcher.pid).toBeNull();
  });
});
