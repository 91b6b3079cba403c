import { chmodSync, existsSync, mkdirSync, readFileSync, rmdirSync } from "node:fs";
import { constants as osConstants } from "node:os";
import { dirname, join } from "node:path";
import type { Logger } from "../../lib/logger";
import { bindUnixAt, ownsPath, removeIfOwned, type UnixSocketName } from "../../lib/sockets";
import { credentialsArg, type WorkloadUser } from "../users";
import { type CgroupDriver, detectCgroupDriver } from "./cgroup";
import { ShimLauncher } from "./launcher";
import { isSameProcess, type ProcessStat, readProcessStat } from "./procfs";
import { ensureShim } from "./shim";

export { type CgroupDriver, detectCgroupDriver } from "./cgroup";
export { isSameProcess, type ProcessStat, processTreeUsage, readProcessStat, residentKb, type TreeUsage } from "./procfs";
export { compileShim, ensureShim, installByHash, shimSource } from "./shim";

/** LaunchSpec is one run of one service, as the supervisor starts it. */
export interface LaunchSpec {
  runId: string;
  runDir: string;
  logFile: string;
  argv: string[];
  env: Record<string, string>;
  cwd: string;
  memoryMb: number | null;
  /** user is who the workload runs as (the shim drops to it just before exec); null: the engine's own user. */
  user: WorkloadUser | null;
  /**
   * spare asks the shim to make the service's next run directory once the workload runs, for a
   * service likely to start again soon (a restart then makes no new inode before its workload
   * runs). Left out: none is made, and a run takes one that is there all the same.
   */
  spare?: boolean;
}

/** RunHandle names a live run: the shim and the workload, each by pid and start time. */
export interface RunHandle {
  runId: string;
  runDir: string;
  shimPid: number;
  shimStart: number;
  pid: number;
  pidStart: number;
  cgroupDir: string | null;
}

/** ExitRecord is how a run ended, from the shim's exit.json and the run's cgroup. */
export interface ExitRecord {
  exitCode: number | null;
  signal: string | null;
  endedAt: string;
  /** execError is set when the command never started: ENOENT, EACCES, ... */
  execError: string | null;
  execStage: string | null;
  execMessage: string | null;
  /** oomKilled is true when the kernel's OOM killer acted in the run's cgroup. */
  oomKilled: boolean;
  /** lost is true when the shim vanished without recording an exit (it was killed itself). */
  lost: boolean;
}

export type LaunchResult = { ok: true; handle: RunHandle } | { ok: false; exit: ExitRecord };

export interface SupervisorOptions {
  dataDir: string;
  log: Logger;
  shimPath?: string;
  logMaxBytes: number;
  logMaxFiles: number;
  /** livenessIntervalMs is how often shims are checked for having died without notice. */
  livenessIntervalMs?: number;
  cgroups?: boolean;
}

interface Watched {
  handle: RunHandle;
  reported: boolean;
}

/**
 * Supervisor starts runs under the shim, learns when they end (the shim's notification on
 * the daemon's socket, or the liveness sweep for a shim killed outright), re-adopts runs
 * after a daemon restart, and signals workloads by process group. It keeps no state of its
 * own beyond the runs it watches: the store is the record, the run directory the evidence.
 */
export class Supervisor {
  readonly notifySocket: string;
  readonly cgroup: CgroupDriver | null;
  readonly cgroupReason: string | null;
  private readonly shimPath: string;
  private readonly launcher: ShimLauncher;
  private readonly watched = new Map<string, Watched>();
  private readonly byRunDir = new Map<string, string>();
  private readonly earlyExits = new Set<string>();
  private listener: ReturnType<typeof Bun.listen> | null = null;
  private notifyName: UnixSocketName | null = null;
  /** early holds the exit notices that arrived before start(): a successor binds the socket first. */
  private early: string[] | null = [];
  private stopped = false;
  private timer: ReturnType<typeof setInterval> | null = null;
  private exitHandler: (handle: RunHandle, exit: ExitRecord) => void = () => undefined;

  constructor(private readonly options: SupervisorOptions) {
    this.notifySocket = join(options.dataDir, "shim.sock");
    this.shimPath = ensureShim(join(options.dataDir, "bin"), options.shimPath);
    this.launcher = new ShimLauncher(this.shimPath, options.log, (runDir) => this.told(runDir));
    if (options.cgroups === false) {
      this.cgroup = null;
      this.cgroupReason = "cgroups are turned off by configuration";
    } else {
      const detected = detectCgroupDriver();
      this.cgroup = detected.driver;
      this.cgroupReason = detected.driver ? null : detected.reason;
    }
  }

  /** onExit sets the one handler told of every run that ends, exactly once per run. */
  onExit(handler: (handle: RunHandle, exit: ExitRecord) => void): void {
    this.exitHandler = handler;
  }

  /**
   * bindNotify binds the notify socket (shim.sock) at a private name and renames it over the
   * path, so the path names a listening socket at every moment, also while a restart hands it
   * from one daemon to the next (docs/decisions.md 360). Notices that arrive before start()
   * wait for replayEarlyNotices().
   */
  bindNotify(): void {
    if (this.listener) return;
    // Only the shims (the engine's user) may report exits: a line from anyone else would end a
    // run that is still alive. A umask of 077 makes the socket private from the moment it exists.
    const umask = process.umask(0o077);
    try {
      const bound = bindUnixAt(this.notifySocket, (privatePath) => {
        const listener = this.listen(privatePath);
        chmodSync(privatePath, 0o600);
        return listener;
      });
      this.listener = bound.server;
      this.notifyName = bound.name;
    } finally {
      process.umask(umask);
    }
  }

  /** reclaimNotify binds the notify socket again when a successor that took it over went away. */
  reclaimNotify(): void {
    if (!this.notifyName || ownsPath(this.notifyName)) return;
    this.listener?.stop(true);
    this.listener = null;
    this.bindNotify();
  }

  start(): void {
    this.bindNotify();
    this.timer = setInterval(() => this.sweep(), this.options.livenessIntervalMs ?? 1000);
  }

  /** replayEarlyNotices handles the notices that came before start(), once the runs are adopted. */
  replayEarlyNotices(): void {
    const early = this.early ?? [];
    this.early = null;
    for (const runDir of early) this.noticeExit(runDir);
  }

  private listen(path: string): ReturnType<typeof Bun.listen> {
    return Bun.listen<{ buffer: string }>({
      unix: path,
      socket: {
        open: (socket) => {
          socket.data = { buffer: "" };
        },
        data: (socket, chunk) => {
          socket.data.buffer += chunk.toString();
          let newline = socket.data.buffer.indexOf("\n");
          while (newline >= 0) {
            const line = socket.data.buffer.slice(0, newline);
            socket.data.buffer = socket.data.buffer.slice(newline + 1);
            if (line.startsWith("exit ")) this.told(line.slice(5));
            newline = socket.data.buffer.indexOf("\n");
          }
        },
      },
    });
  }

  /**
   * told takes a notice that the run in `runDir` ended, from the notify socket or the launcher's
   * stdout. A stopped supervisor takes none: its launcher may still write a line or two before it
   * reads the end of its stdin, and the store they would be settled in is this process's no
   * more (the next daemon reads the run's exit record when it adopts it, or its sweep finds it).
   */
  private told(runDir: string): void {
    if (this.stopped) return;
    if (this.early) this.early.push(runDir);
    else this.noticeExit(runDir);
  }

  /** launcherPid is the shim launcher's pid while it runs: a restart in place must reap it. */
  get launcherPid(): number | null {
    return this.launcher.pid;
  }

  stop(): void {
    this.stopped = true;
    this.launcher.stop();
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    this.listener?.stop(true);
    this.listener = null;
    // After a hand-over the path names the successor's socket: it is left alone.
    if (this.notifyName) removeIfOwned(this.notifyName);
    try {
      // Succeeds only when no run's cgroup is left under it, i.e. nothing is running.
      if (this.cgroup) rmdirSync(this.cgroup.parent);
    } catch {
      // runs are still going: their cgroups stay for the next daemon
    }
  }

  /**
   * launch starts one run and resolves once the workload's exec succeeded or failed. A run
   * that fails to exec resolves with its exit record and is never watched.
   */
  async launch(spec: LaunchSpec): Promise<LaunchResult> {
    let cgroupDir: string | null = null;
    let procs = "-";
    // Joining a cgroup costs ~10 ms per launch on cgroup v1 (the kernel's migration lock), a
    // real share of a crash-to-restart: only runs with a memory limit pay it.
    if (this.cgroup && spec.memoryMb !== null) {
      const group = this.cgroup.create(spec.runId, spec.memoryMb);
      cgroupDir = group.dir;
      procs = group.procsPath;
    }
    this.byRunDir.set(spec.runDir, spec.runId);
    const args = [
      spec.runDir,
      spec.logFile,
      this.notifySocket,
      String(this.options.logMaxBytes),
      String(this.options.logMaxFiles),
      procs,
      credentialsArg(spec.user),
      "--",
      ...spec.argv,
    ];
    let report: string;
    try {
      report = await this.startShim(args, spec);
      // What a spawn would have thrown: a working directory it cannot enter, a run directory
      // it cannot make (a full disk is the disk's fault, not the service's: the caller knows it by its code).
      const setup = /^err (\d+) (chdir|rundir)$/.exec(report);
      if (setup)
        throw setupError(
          Number(setup[1]),
          setup[2] === "chdir" ? `cannot enter the working directory ${spec.cwd}` : `cannot make the run's directory ${spec.runDir}`,
        );
    } catch (error) {
      this.byRunDir.delete(spec.runDir);
      if (cgroupDir) this.cgroup?.remove(cgroupDir);
      throw error;
    }
    const ok = /^ok (\d+) (\d+)(?: (\d+))?$/.exec(report);
    if (!ok) {
      this.byRunDir.delete(spec.runDir);
      this.earlyExits.delete(spec.runId);
      const exit = this.readExit(spec.runDir, cgroupDir) ?? {
        ...lostExit(),
        execError: "ESHIM",
        execStage: "setup",
        execMessage: `the shim failed: ${report}`,
        lost: false,
      };
      if (cgroupDir) this.cgroup?.remove(cgroupDir);
      return { ok: false, exit };
    }
    const shimPid = Number(ok[1]);
    const pid = Number(ok[2]);
    const handle: RunHandle = {
      runId: spec.runId,
      runDir: spec.runDir,
      shimPid,
      shimStart: this.launcher.startTimeOf(shimPid) ?? readProcessStat(shimPid)?.startTime ?? -1,
      pid,
      // The shim read the start time beside the fork; a report without it (a shim from before
      // that, a run recovered from its pids file) leaves it to be read here.
      pidStart: ok[3] !== undefined ? Number(ok[3]) : (readProcessStat(pid)?.startTime ?? -1),
      cgroupDir,
    };
    this.watched.set(spec.runId, { handle, reported: false });
    // The workload may have ended, and the shim told us, before we knew its handle.
    if (this.earlyExits.delete(spec.runId) || (handle.shimStart === -1 && existsSync(join(spec.runDir, "exit.json")))) {
      queueMicrotask(() => this.finish(spec.runId));
    }
    return { ok: true, handle };
  }

  /**
   * startShim starts the shim with `args` through the launcher (no fork in this process), or
   * spawns it where no launcher runs, and answers its one-line report (its stdout, else its
   * stderr). A report lost with its launcher is read back from the run's `pids` file, which the
   * shim writes before it reports: without it, the shim never got going.
   */
  private async startShim(args: string[], spec: LaunchSpec): Promise<string> {
    const launched = await this.launcher.launch([this.shimPath, ...(spec.spare ? ["--spare"] : []), ...args], spec.env, spec.cwd);
    if (launched === undefined) {
      // A shim from before the launcher does not make its directories: made here, as the shim
      // makes them (the service's logs/ and runs/ 0700, the run's 0750).
      mkdirSync(dirname(spec.logFile), { recursive: true, mode: 0o700 });
      mkdirSync(dirname(spec.runDir), { recursive: true, mode: 0o700 });
      mkdirSync(spec.runDir, { mode: 0o750 });
      // Nor does it know --spare.
      const proc = Bun.spawn([this.shimPath, ...args], { cwd: spec.cwd, env: spec.env, stdin: "ignore", stdout: "pipe", stderr: "pipe" });
      const [stdout, stderr] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
      return stdout.trim() || stderr.trim();
    }
    if (launched === null) {
      const recovered = this.recover(spec.runId, spec.runDir);
      return recovered.shimPid > 0 ? `ok ${recovered.shimPid} ${recovered.pid}` : "err 0 setup (the shim launcher ended)";
    }
    return launched;
  }

  /**
   * adopt takes over a run started by an earlier daemon. It reports "running" when the
   * shim is the same process that was recorded (pid and start time: a reused pid is never
   * adopted), else the exit the shim recorded, else a lost run. `seen` is what this adoption
   * pass read of each shim's process, shared by the runs one launcher holds.
   */
  adopt(handle: RunHandle, seen?: Map<number, ProcessStat | null>): { state: "running" } | { state: "exited"; exit: ExitRecord } {
    this.byRunDir.set(handle.runDir, handle.runId);
    // A launcher holds other runs after one has ended: a run whose holder lives may have ended
    // (and told a daemon that was not there), so its record is read first.
    const recorded = this.readExit(handle.runDir, handle.cgroupDir);
    if (!recorded && isSameProcess(handle.shimPid, handle.shimStart, seen)) {
      this.watched.set(handle.runId, { handle, reported: false });
      // It may end between the check and the watch; the sweep catches that.
      return { state: "running" };
    }
    this.byRunDir.delete(handle.runDir);
    const exit = recorded ?? lostExit();
    if (handle.cgroupDir) this.cgroup?.remove(handle.cgroupDir);
    return { state: "exited", exit };
  }

  /**
   * recover rebuilds the handle of a run whose shim was started but whose pids were never
   * recorded (the daemon died in between), from the `pids` file the shim writes before it
   * reports. Without that file the shim never got going, and the handle names no process.
   */
  recover(runId: string, runDir: string): RunHandle {
    let shimPid = -1;
    let pid = -1;
    try {
      [shimPid, pid] = readFileSync(join(runDir, "pids"), "utf8").trim().split(" ").map(Number) as [number, number];
    } catch {
      // no pids file: nothing was started
    }
    return {
      runId,
      runDir,
      shimPid,
      shimStart: shimPid > 0 ? (readProcessStat(shimPid)?.startTime ?? -1) : -1,
      pid,
      pidStart: pid > 0 ? (readProcessStat(pid)?.startTime ?? -1) : -1,
      cgroupDir: this.cgroup ? join(this.cgroup.parent, runId) : null,
    };
  }

  /** signal sends a signal to the workload's process group, if the workload is still the recorded process. */
  signal(handle: RunHandle, signal: NodeJS.Signals): boolean {
    if (!isSameProcess(handle.pid, handle.pidStart)) return false;
    try {
      process.kill(-handle.pid, signal);
      return true;
    } catch {
      return false;
    }
  }

  /** isWatching says whether a run is live as far as the supervisor knows. */
  isWatching(runId: string): boolean {
    const watched = this.watched.get(runId);
    return watched !== undefined && !watched.reported;
  }

  private noticeExit(runDir: string): void {
    const runId = this.byRunDir.get(runDir);
    if (!runId) return;
    if (!this.watched.has(runId)) {
      this.earlyExits.add(runId);
      return;
    }
    this.finish(runId);
  }

  /**
   * sweep settles the runs whose end no notice told: a shim that is gone (killed outright), or
   * a workload that is gone while its launcher, which holds other runs, lives on (a notice that
   * did not get through); finish then reads its record, or waits for it while the launcher
   * still drains the run's output. Each launcher is looked at once, however many runs it holds.
   */
  private sweep(): void {
    const seen = new Map<number, ProcessStat | null>();
    for (const [runId, watched] of this.watched) {
      if (watched.reported) continue;
      const { shimPid, shimStart, pid, pidStart } = watched.handle;
      if (!isSameProcess(shimPid, shimStart, seen) || !isSameProcess(pid, pidStart)) this.finish(runId);
    }
  }

  private finish(runId: string): void {
    const watched = this.watched.get(runId);
    if (!watched || watched.reported) return;
    const exit = this.readExit(watched.handle.runDir, watched.handle.cgroupDir);
    // Not ended yet, unless its directory is gone: a launcher, which outlives its runs, reports
    // the end of a run it had nowhere to record.
    if (!exit && isSameProcess(watched.handle.shimPid, watched.handle.shimStart) && existsSync(watched.handle.runDir)) return;
    watched.reported = true;
    this.watched.delete(runId);
    this.byRunDir.delete(watched.handle.runDir);
    if (watched.handle.cgroupDir) this.cgroup?.remove(watched.handle.cgroupDir);
    this.exitHandler(watched.handle, exit ?? lostExit());
  }

  /** readExit reads a run's exit.json and its cgroup's OOM counter; null while it has not ended. */
  readExit(runDir: string, cgroupDir: string | null): ExitRecord | null {
    const path = join(runDir, "exit.json");
    // A run still going has none: asked first, as a failed read costs an exception each time
    // (an adoption asks of every run).
    if (!existsSync(path)) return null;
    let raw: Record<string, unknown>;
    try {
      raw = JSON.parse(readFileSync(path, "utf8"));
    } catch {
      return null;
    }
    const oomKills = cgroupDir && this.cgroup ? (this.cgroup.oomKills(cgroupDir) ?? 0) : 0;
    return {
      exitCode: typeof raw.exit_code === "number" ? raw.exit_code : null,
      signal: typeof raw.signal === "string" ? raw.signal : null,
      endedAt: typeof raw.ended_at === "string" ? new Date(raw.ended_at).toISOString() : new Date().toISOString(),
      execError: typeof raw.exec_error === "string" ? raw.exec_error : null,
      execStage: typeof raw.stage === "string" ? raw.stage : null,
      execMessage: typeof raw.message === "string" ? raw.message : null,
      oomKilled: oomKills > 0,
      lost: false,
    };
  }
}

function lostExit(): ExitRecord {
  return {
    exitCode: null,
    signal: null,
    endedAt: new Date().toISOString(),
    execError: null,
    execStage: null,
    execMessage: null,
    oomKilled: false,
    lost: true,
  };
}

/** setupError is the error a failed chdir or mkdir would have thrown here, its code (ENOSPC, ENOENT, ...) from the errno the shim reported. */
function setupError(errno: number, what: string): NodeJS.ErrnoException {
  const code = Object.entries(osConstants.errno).find(([, value]) => value === errno)?.[0] ?? `errno ${errno}`;
  const error = new Error(`${code}: ${what}`) as NodeJS.ErrnoException;
  error.code = code;
  error.errno = -errno;
  return error;
}
