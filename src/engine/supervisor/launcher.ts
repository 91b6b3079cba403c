import type { Subprocess } from "bun";
import type { Logger } from "../../lib/logger";
import { readProcessStat } from "./procfs";

/**
 * ShimLauncher starts runs through one long-lived `engine-shim --launcher` process (shim.c),
 * which holds them: it starts each workload itself and watches all of them in one event loop,
 * so the daemon never forks (a spawn from the daemon's large, many-threaded process blocked its
 * event loop ~1 ms per launch: decision 457) and a run costs the machine one process, its
 * workload, not a shim's besides (decision 508). The daemon writes a request on the launcher's
 * stdin (framing: `LEN\n`, then NUL-terminated fields: id, cwd, argc, argv, envc, env) and reads
 * `ID REPORT` lines on its stdout, REPORT being the run's (`ok LAUNCHER PID`, `err ERRNO STAGE`),
 * and `exit RUN_DIR` lines, a run's end told on the pipe it already reads (`told`) instead of a
 * connection to the notify socket per run: one event of a pipe read, not an accept, a read and
 * a close (the socket stays for a launcher whose daemon is gone, and for a shim of one run).
 * The launcher is started on the first launch, not before (a successor prepares at a lower
 * priority, which its workloads would keep), and again after it ended. Once its stdin closes
 * (this daemon stopped, or is gone) it takes no more requests and holds its runs until the last
 * has ended; the next daemon starts one of its own. Where it cannot run (a shim from before it,
 * given as ENGINE_SHIM), launch answers `undefined` and the caller spawns the shim itself.
 */
export class ShimLauncher {
  /** current is the launcher that serves and the requests it has not answered yet. */
  private current: Launcher | null = null;
  private starting: Promise<boolean> | null = null;
  private unsupported = false;
  private nextId = 0;

  constructor(
    private readonly shimPath: string,
    private readonly log: Logger,
    private readonly told: (runDir: string) => void,
  ) {}

  /** pid is the launcher's while it runs (a restart in place reaps it: it is a child Bun knows of only until the execve). */
  get pid(): number | null {
    return this.current?.proc.pid ?? null;
  }

  /**
   * startTimeOf is the start time (/proc/PID/stat field 22) of the launcher that serves, when
   * `pid` is its pid: read once per launcher, not once per run it holds. Undefined for any
   * other pid, or where it cannot be read (the caller reads /proc itself).
   */
  startTimeOf(pid: number): number | undefined {
    const launcher = this.current;
    if (!launcher || launcher.proc.pid !== pid) return undefined;
    launcher.startTime ??= readProcessStat(pid)?.startTime;
    return launcher.startTime;
  }

  /**
   * launch starts `argv` (a shim's command line) in `cwd` with `env`, and answers the shim's
   * report; null when the launcher ended before it answered (the caller reads the run's
   * directory, as for a shim that said nothing); undefined when no launcher can run here.
   */
  async launch(argv: string[], env: Record<string, string>, cwd: string): Promise<string | null | undefined> {
    const entries = Object.entries(env).map(([key, value]) => `${key}=${value}`);
    // A NUL cannot travel in the framing (nor in an argv or environment): the caller's spawn refuses it.
    if ([cwd, ...argv, ...entries].some((field) => field.includes("\0"))) return undefined;
    if (!(await this.ensure())) return undefined;
    const launcher = this.current;
    if (!launcher) return null;
    const id = String(++this.nextId);
    const fields = [id, cwd, String(argv.length), ...argv, String(entries.length), ...entries];
    const payload = Buffer.from(`${fields.join("\0")}\0`, "utf8");
    const report = new Promise<string | null>((resolve) => launcher.pending.set(id, resolve));
    try {
      launcher.proc.stdin.write(`${payload.length}\n`);
      launcher.proc.stdin.write(payload);
      launcher.proc.stdin.flush();
    } catch {
      launcher.pending.delete(id);
      return null;
    }
    return report;
  }

  /**
   * stop closes the launcher's stdin: it takes no more requests and holds its runs until the
   * last has ended. It no longer keeps this process alive (a daemon that stops leaves its
   * workloads running, held).
   */
  stop(): void {
    const proc = this.current?.proc;
    this.current = null;
    this.starting = null;
    try {
      proc?.stdin.end();
    } catch {
      // it is gone already
    }
    proc?.unref();
  }

  private ensure(): Promise<boolean> {
    if (this.unsupported) return Promise.resolve(false);
    this.starting ??= this.start();
    return this.starting;
  }

  private start(): Promise<boolean> {
    let proc: Subprocess<"pipe", "pipe", "ignore">;
    try {
      proc = Bun.spawn([this.shimPath, "--launcher"], { stdin: "pipe", stdout: "pipe", stderr: "ignore", cwd: "/" });
    } catch (error) {
      this.log.warn({ err: (error as Error).message }, "the shim launcher did not start: the daemon spawns each shim itself");
      this.unsupported = true;
      return Promise.resolve(false);
    }
    const launcher: Launcher = { proc, pending: new Map() };
    this.current = launcher;
    return new Promise<boolean>((resolveReady) => {
      void this.read(launcher, resolveReady).then((ready) => {
        // The launcher answers no more: it ended, or it closed its stdout once its stdin had
        // closed (it then holds its runs on, and is left alone).
        for (const resolve of launcher.pending.values()) resolve(null);
        launcher.pending.clear();
        if (this.current === launcher) {
          this.current = null;
          this.starting = null;
        }
        // One that never said it was ready holds nothing.
        if (!ready) proc.kill("SIGKILL");
      });
    });
  }

  /** read takes the launcher's lines until its stdout ends: `ready` first, then the reports; it answers whether `ready` came. */
  private async read(launcher: Launcher, resolveReady: (ready: boolean) => void): Promise<boolean> {
    const decoder = new TextDecoder();
    let buffer = "";
    let ready = false;
    try {
      const reader = launcher.proc.stdout.getReader();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        for (let newline = buffer.indexOf("\n"); newline >= 0; newline = buffer.indexOf("\n")) {
          const line = buffer.slice(0, newline);
          buffer = buffer.slice(newline + 1);
          if (!ready) {
            ready = line === "ready";
            if (!ready) break;
            resolveReady(true);
            continue;
          }
          if (line.startsWith("exit ")) {
            this.told(line.slice(5));
            continue;
          }
          const space = line.indexOf(" ");
          const id = line.slice(0, space);
          launcher.pending.get(id)?.(line.slice(space + 1));
          launcher.pending.delete(id);
        }
        if (!ready) break;
      }
    } catch {
      // the pipe broke: handled as its end
    }
    if (!ready) {
      // A shim that does not know --launcher printed its usage and exited.
      this.unsupported = true;
      this.log.warn("the shim has no launcher mode: the daemon spawns each shim itself");
      resolveReady(false);
    }
    return ready;
  }
}

interface Launcher {
  proc: Subprocess<"pipe", "pipe", "ignore">;
  pending: Map<string, (report: string | null) => void>;
  /** startTime is the launcher's start time, once read (startTimeOf). */
  startTime?: number;
}
