import { afterAll, describe, expect, test } from "bun:test";
import { chmodSync, existsSync, mkdirSync, readFileSync, readlinkSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { isSameProcess, readProcessStat } from "../../../src/engine/supervisor";
import { ShimLauncher } from "../../../src/engine/supervisor/launcher";
import { createLogger } from "../../../src/lib/logger";
import { eventually, tempDir, testShim } from "../../helpers";

const dir = tempDir("engine-launcher-");
const log = createLogger({ level: "silent", stdout: false }).log;
const started: number[] = [];
/** ignore takes the exit notices of tests that read exit.json instead. */
const ignore = () => undefined;
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
function shimArgv(shim: string, name: string, argv: string[], notify = "-"): { runDir: string; argv: string[] } {
  const runDir = join(dir, name);
  mkdirSync(runDir, { recursive: true });
  return { runDir, argv: [shim, runDir, join(runDir, "out.log"), notify, "1048576", "2", "-", "-", "--", ...argv] };
}

describe("ShimLauncher", () => {
  test("holds runs in one launcher with the env and cwd asked for, and reports while the workload still runs", async () => {
    const launcher = new ShimLauncher(testShim(), log, ignore);
    try {
      const first = shimArgv(testShim(), "env", [
        "/bin/sh",
        "-c",
        'echo "$GREETING from $(pwd)"; ls -l /proc/$$/fd/0; ulimit -n; exec sleep 30',
      ]);
      const report = await launcher.launch(first.argv, { GREETING: "hello", PATH: "/usr/bin:/bin" }, dir);
      const match = /^ok (\d+) (\d+) \d+$/.exec(report ?? "");
      expect(match).not.toBeNull();
      const [shimPid, pid] = [Number(match?.[1]), Number(match?.[2])];
      started.push(pid);
      // The run is held by the launcher itself (no shim process of its own), which leads a
      // session and process group of its own: no terminal, no signal to the daemon's group.
      // The workload is its child and leads a group of its own.
      expect(shimPid).toBe(launcher.pid ?? -1);
      expect(sessionOf(shimPid)).toBe(shimPid);
      expect(readProcessStat(shimPid)?.pgid).toBe(shimPid);
      expect(readProcessStat(pid)?.ppid).toBe(shimPid);
      expect(readProcessStat(pid)?.pgid).toBe(pid);
      await eventually(
        () => existsSync(join(first.runDir, "out.log")) && readFileSync(join(first.runDir, "out.log"), "utf8").split("\n").length > 3,
      );
      const output = readFileSync(join(first.runDir, "out.log"), "utf8");
      expect(output).toContain(`stdout F hello from ${dir}`);
      // Its stdin is /dev/null, not the launcher's request pipe; its limit of open files is the
      // one a plain spawn gives (the launcher raises its own for its runs' descriptors).
      expect(output).toContain("-> /dev/null");
      const spawned = Bun.spawnSync(["/bin/sh", "-c", "ulimit -n"]).stdout.toString().trim();
      expect(output).toMatch(new RegExp(`stdout F ${spawned}\n`));
      const second = shimArgv(testShim(), "second", ["true"]);
      const secondReport = await launcher.launch(second.argv, { PATH: "/usr/bin:/bin" }, dir);
      expect(secondReport).toMatch(new RegExp(`^ok ${shimPid} \\d+ \\d+$`));
      await eventually(() => existsSync(join(second.runDir, "exit.json")));
      expect(JSON.parse(readFileSync(join(second.runDir, "exit.json"), "utf8"))).toMatchObject({ exit_code: 0 });
      // A workload that ended is reaped by the launcher: no zombie stays.
      const secondPid = Number(secondReport?.split(" ")[2]);
      await eventually(() => readProcessStat(secondPid) === null);
    } finally {
      launcher.stop();
    }
  });

  test("an exec failure and a working directory that is not there come back as the shim's reports", async () => {
    const launcher = new ShimLauncher(testShim(), log, ignore);
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
    const launcher = new ShimLauncher(testShim(), log, ignore);
    try {
      const service = join(dir, "services", "svc_1");
      const runDir = join(service, "runs", "run_1");
      const argv = [testShim(), runDir, join(service, "logs", "output.log"), "-", "1048576", "2", "-", "-", "--", "true"];
      expect(await launcher.launch(argv, { PATH: "/usr/bin:/bin" }, dir)).toMatch(/^ok \d+ \d+ \d+$/);
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

  test("many launches at once each get their own report, all held by the one launcher", async () => {
    const launcher = new ShimLauncher(testShim(), log, ignore);
    try {
      const runs = Array.from({ length: 40 }, (_, i) =>
        shimArgv(testShim(), `many-${i}`, ["/bin/sh", "-c", `echo run ${i}; exit ${i % 7}`]),
      );
      const reports = await Promise.all(runs.map((run) => launcher.launch(run.argv, { PATH: "/usr/bin:/bin" }, dir)));
      const pids = reports.map((report) => Number(/^ok \d+ (\d+) \d+$/.exec(report ?? "")?.[1]));
      expect(pids.every((pid) => pid > 0)).toBe(true);
      expect(new Set(pids).size).toBe(runs.length);
      expect(new Set(reports.map((report) => report?.split(" ")[1])).size).toBe(1);
      for (const [i, run] of runs.entries()) {
        await eventually(() => existsSync(join(run.runDir, "exit.json")));
        const exit = JSON.parse(readFileSync(join(run.runDir, "exit.json"), "utf8"));
        expect(exit).toMatchObject({ exit_code: i % 7, pid: pids[i] });
        // Each run's output went to its own log, and nowhere else.
        expect(readFileSync(join(run.runDir, "out.log"), "utf8")).toMatch(new RegExp(`^\\S+ stdout F run ${i}\n$`));
      }
    } finally {
      launcher.stop();
    }
  });

  test("a run's end is told on the launcher's stdout while the daemon reads it, and on the notify socket once it stopped", async () => {
    const socketPath = join(dir, "notify.sock");
    const bySocket: string[] = [];
    const listener = Bun.listen<{ buffer: string }>({
      unix: socketPath,
      socket: {
        open: (socket) => {
          socket.data = { buffer: "" };
        },
        data: (socket, chunk) => {
          socket.data.buffer += chunk.toString();
          for (let newline = socket.data.buffer.indexOf("\n"); newline >= 0; newline = socket.data.buffer.indexOf("\n")) {
            bySocket.push(socket.data.buffer.slice(0, newline));
            socket.data.buffer = socket.data.buffer.slice(newline + 1);
          }
        },
      },
    });
    const byPipe: string[] = [];
    const launcher = new ShimLauncher(testShim(), log, (runDir) => byPipe.push(runDir));
    try {
      const runs = Array.from({ length: 10 }, (_, i) => shimArgv(testShim(), `told-${i}`, ["/bin/sh", "-c", `exit ${i}`], socketPath));
      const reports = await Promise.all(runs.map((run) => launcher.launch(run.argv, { PATH: "/usr/bin:/bin" }, dir)));
      expect(reports.every((report) => /^ok \d+ \d+ \d+$/.test(report ?? ""))).toBe(true);
      await eventually(() => byPipe.length === runs.length);
      expect(byPipe.toSorted()).toEqual(runs.map((run) => run.runDir).toSorted());
      expect(bySocket).toEqual([]);
      // Each was told after its exit record was written: the daemon reads it at once.
      for (const run of runs) expect(existsSync(join(run.runDir, "exit.json"))).toBe(true);
      const held = shimArgv(testShim(), "told-after-stop", ["sleep", "30"], socketPath);
      const heldPid = Number((await launcher.launch(held.argv, { PATH: "/usr/bin:/bin" }, dir))?.split(" ")[2]);
      started.push(heldPid);
      const holder = launcher.pid as number;
      launcher.stop();
      // Stopped, the launcher's stdout is closed (it points at /dev/null once the launcher has
      // read the end of its stdin): the run it still holds is told on the socket. Held on, it
      // lives until its run ends.
      await eventually(() => readlinkSync(`/proc/${holder}/fd/1`) === "/dev/null");
      expect(isSameProcess(holder, readProcessStat(holder)?.startTime ?? -1)).toBe(true);
      process.kill(-heldPid, "SIGTERM");
      await eventually(() => bySocket.length === 1);
      expect(bySocket).toEqual([`exit ${held.runDir}`]);
      expect(byPipe).toHaveLength(runs.length);
    } finally {
      launcher.stop();
      listener.stop(true);
    }
  });

  test("a launcher that was killed is started again; one that was stopped holds its runs to their end, then exits", async () => {
    const launcher = new ShimLauncher(testShim(), log, ignore);
    const first = shimArgv(testShim(), "again-1", ["sleep", "30"]);
    const report = await launcher.launch(first.argv, { PATH: "/usr/bin:/bin" }, dir);
    const workload = Number(/^ok \d+ (\d+) \d+$/.exec(report ?? "")?.[1]);
    started.push(workload);
    const before = launcher.pid as number;
    // The serving launcher's start time is read once for all its runs; no other pid has one here.
    expect(launcher.startTimeOf(before)).toBe(readProcessStat(before)?.startTime as number);
    expect(launcher.startTimeOf(workload)).toBeUndefined();
    process.kill(before, "SIGKILL");
    await eventually(() => launcher.pid === null);
    expect(launcher.startTimeOf(before)).toBeUndefined();
    expect(readProcessStat(workload)).not.toBeNull(); // the killed launcher's workload runs on
    const second = shimArgv(testShim(), "again-2", ["/bin/sh", "-c", 'read line; echo "got $line"; exit 3']);
    const secondReport = await launcher.launch(second.argv, { PATH: "/usr/bin:/bin" }, dir);
    expect(secondReport).toMatch(/^ok \d+ \d+ \d+$/);
    const secondPid = Number(secondReport?.split(" ")[2]);
    started.push(secondPid);
    const after = launcher.pid as number;
    expect(after).not.toBe(before);
    // The new launcher's own, not the killed one's.
    expect(launcher.startTimeOf(after)).toBe(readProcessStat(after)?.startTime as number);
    const third = shimArgv(testShim(), "again-3", ["sleep", "30"]);
    const thirdPid = Number((await launcher.launch(third.argv, { PATH: "/usr/bin:/bin" }, dir))?.split(" ")[2]);
    started.push(thirdPid);
    launcher.stop();
    // Stopped, it takes no more requests but holds its runs: one that ends is still recorded.
    await eventually(() => existsSync(join(second.runDir, "exit.json"))); // `read` met /dev/null's EOF at once
    expect(isSameProcess(after, readProcessStat(after)?.startTime ?? -1)).toBe(true);
    expect(JSON.parse(readFileSync(join(second.runDir, "exit.json"), "utf8"))).toMatchObject({ exit_code: 3 });
    process.kill(-thirdPid, "SIGTERM");
    await eventually(() => existsSync(join(third.runDir, "exit.json")));
    expect(JSON.parse(readFileSync(join(third.runDir, "exit.json"), "utf8"))).toMatchObject({ signal: "SIGTERM" });
    // Its last run ended: it exits.
    await eventually(() => !isSameProcess(after, readProcessStat(after)?.startTime ?? -1));
    expect(readProcessStat(workload)).not.toBeNull(); // the first run's workload outlived both launchers
  });

  /**
   * rawLauncher starts `engine-shim --launcher` without ShimLauncher, so that a test can write a
   * flood of requests in one write (one read on the launcher's side) and read every line it says.
   */
  async function rawLauncher(prefix: string[] = []) {
    const proc = Bun.spawn([...prefix, testShim(), "--launcher"], { stdin: "pipe", stdout: "pipe", stderr: "ignore", cwd: "/" });
    const lines: string[] = [];
    void (async () => {
      let buffer = "";
      const reader = proc.stdout.getReader();
      for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) {
        buffer += new TextDecoder().decode(chunk.value);
        for (let newline = buffer.indexOf("\n"); newline >= 0; newline = buffer.indexOf("\n")) {
          lines.push(buffer.slice(0, newline));
          buffer = buffer.slice(newline + 1);
        }
      }
    })();
    await eventually(() => lines[0] === "ready");
    /** request frames one launch as the daemon does: `LEN\n`, then NUL-terminated fields. */
    const request = (id: number, argv: string[]) => {
      const fields = [String(id), dir, String(argv.length), ...argv, "1", "PATH=/usr/bin:/bin"];
      const payload = Buffer.from(`${fields.join("\0")}\0`);
      return Buffer.concat([Buffer.from(`${payload.length}\n`), payload]);
    };
    return { proc, lines, request };
  }

  test("a flood of requests read at once does not hold back the exits of the runs it started first", async () => {
    const { proc, lines, request } = await rawLauncher();
    try {
      // Told on the launcher's stdout (the socket is never needed while that pipe has room).
      const notify = join(dir, "flood.sock");
      const runs = Array.from({ length: 120 }, (_, i) => shimArgv(testShim(), `flood-${i}`, ["true"], notify));
      // One write, well under the pipe's 64 KiB: the launcher reads the whole flood at once.
      const flood = Buffer.concat(runs.map((run, i) => request(i + 1, run.argv)));
      expect(flood.length).toBeLessThan(60_000);
      proc.stdin.write(flood);
      proc.stdin.flush();
      await eventually(() => lines.filter((line) => line.startsWith("exit ")).length === runs.length, { timeoutMs: 30_000 });
      const reports = lines.filter((line) => /^\d+ /.test(line));
      expect(reports).toHaveLength(runs.length);
      expect(reports.every((line) => /^\d+ ok \d+ \d+ \d+$/.test(line))).toBe(true);
      // The first run's `true` ended while the launcher was still starting the rest of the
      // flood: its end is told before the last report, not after all of them.
      const firstExit = lines.indexOf(`exit ${runs[0]?.runDir}`);
      const lastReport = lines.indexOf(reports.at(-1) ?? "");
      expect(firstExit).toBeGreaterThan(0);
      expect(firstExit).toBeLessThan(lastReport);
      for (const run of runs) expect(JSON.parse(readFileSync(join(run.runDir, "exit.json"), "utf8"))).toMatchObject({ exit_code: 0 });
      // A run's files are made once the flood's reports are out, or at its end if it ended
      // before that: each run has its log, however early it ended.
      for (const run of runs) expect(existsSync(join(run.runDir, "out.log"))).toBe(true);
    } finally {
      proc.kill("SIGKILL");
      await proc.exited;
    }
  });

  test("the requests the daemon sent whole before it went are all started, however many came at once", async () => {
    const { proc, request } = await rawLauncher();
    const runs = Array.from({ length: 40 }, (_, i) => shimArgv(testShim(), `last-words-${i}`, ["true"]));
    proc.stdin.write(Buffer.concat(runs.map((run, i) => request(i + 1, run.argv))));
    proc.stdin.end();
    // Its stdin ended: it starts what it had read, holds the runs to their end, and exits.
    expect(await proc.exited).toBe(0);
    for (const run of runs) expect(JSON.parse(readFileSync(join(run.runDir, "exit.json"), "utf8"))).toMatchObject({ exit_code: 0 });
  });

  // strace counts the launcher's syncs; .ci/run installs it.
  test.skipIf(!Bun.which("strace"))(
    "an exit told on stdout leaves its record to the daemon's store; one told on the socket, once stdin closed, is synced",
    async () => {
      const trace = join(dir, "launcher.strace");
      const { proc, lines, request } = await rawLauncher(["strace", "-f", "-qq", "-y", "-e", "trace=fsync,fdatasync", "-o", trace]);
      const notify = join(dir, "synced.sock");
      const told = shimArgv(testShim(), "synced-told", ["true"], notify);
      const held = shimArgv(testShim(), "synced-held", ["sleep", "30"], notify);
      proc.stdin.write(request(1, told.argv));
      proc.stdin.flush();
      await eventually(() => lines.includes(`exit ${told.runDir}`));
      proc.stdin.write(request(2, held.argv));
      proc.stdin.flush();
      const report = await eventually(() => lines.find((line) => line.startsWith("2 ok ")));
      const [launcherPid, heldPid] = [Number(report.split(" ")[2]), Number(report.split(" ")[3])];
      started.push(heldPid);
      proc.stdin.end();
      // Stopped (its stdout is /dev/null by now), it tells of the held run's end on the socket,
      // where no daemon listens: that record is the one a daemon that comes back will read.
      await eventually(() => readlinkSync(`/proc/${launcherPid}/fd/1`) === "/dev/null");
      process.kill(-heldPid, "SIGKILL");
      expect(await proc.exited).toBe(0); // strace, once the launcher held no more runs and exited
      const synced = readFileSync(trace, "utf8")
        .split("\n")
        .map((line) => /\bf(?:data)?sync\(\d+<([^>]*)>\)\s+= 0$/.exec(line)?.[1])
        .filter((path) => path !== undefined);
      expect(synced).toEqual([join(held.runDir, "exit.json")]);
      expect(JSON.parse(readFileSync(join(held.runDir, "exit.json"), "utf8"))).toMatchObject({ signal: "SIGKILL" });
      expect(JSON.parse(readFileSync(join(told.runDir, "exit.json"), "utf8"))).toMatchObject({ exit_code: 0 });
    },
  );

  test("a shim with no launcher mode makes launch answer undefined: the caller spawns it itself", async () => {
    const old = join(dir, "old-shim");
    writeFileSync(old, "#!/bin/sh\necho 'usage: engine-shim RUN_DIR ...' >&2\nexit 2\n");
    chmodSync(old, 0o755);
    const launcher = new ShimLauncher(old, log, ignore);
    const run = shimArgv(old, "old", ["true"]);
    expect(await launcher.launch(run.argv, {}, dir)).toBeUndefined();
    expect(await launcher.launch(run.argv, {}, dir)).toBeUndefined();
    expect(launcher.pid).toBeNull();
  });
});
