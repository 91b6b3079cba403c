import { readdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { Subprocess } from "bun";
import { cpuOfSlot } from "../../lib/affinity";
import { keepFreedPages } from "../../lib/allocator";
import { reapNoHang } from "../../lib/libc";
import type { Logger } from "../../lib/logger";
import { lowerWhileStarting, restorePriority } from "../../lib/priority";
import { installByHash, isSameProcess } from "../supervisor";
import { ProxyTotals, type RouteCounts } from "./meter";
import type { FromProxy, ListenerConfig, ProxyPidRecord, ProxySnapshot, ToProxy } from "./snapshot";

// build.ts defines these in the compiled binary: that it is one, and the proxy's own bundle.
declare const __ENGINE_COMPILED__: boolean | undefined;
declare const __ENGINE_EMBEDDED_PROXY__: string | undefined;

/**
 * ProxyCommand is how a proxy process starts: its command line, what its environment adds, and
 * where (the daemon's working directory when not said).
 */
export interface ProxyCommand {
  argv: string[];
  env: Record<string, string>;
  cwd?: string;
}

/**
 * proxyCommand is how to start a proxy process. From source, Bun runs the proxy's entry. The
 * compiled binary carries the proxy as a bundle of its own (build.ts), written once into
 * `binDir` by its hash, as the shim is, and runs it with its own runtime (`BUN_BE_BUN=1` makes
 * the binary Bun). A process started as `engine __proxy` would hold the functions of every
 * module in the binary, which an ESM bundle creates at start, imported or not: a heap two
 * and a half times the size, and longer pauses of the collections that set the proxy's p99
 * (docs/decisions.md 487). `engine __proxy` stays the way when the bundle cannot be written.
 */
export function proxyCommand(binDir: string): ProxyCommand {
  if (typeof __ENGINE_COMPILED__ === "undefined" || !__ENGINE_COMPILED__) {
    return { argv: [process.execPath, join(import.meta.dir, "main.ts")], env: {} };
  }
  if (typeof __ENGINE_EMBEDDED_PROXY__ === "string") {
    try {
      // As Bun, the binary would read bunfig.toml and .env files where it starts: it starts in
      // bin/, the engine's own, and reads no .env (decision 488).
      return {
        argv: [process.execPath, "--no-env-file", installByHash(binDir, "engine-proxy", __ENGINE_EMBEDDED_PROXY__, 0o600, ".js")],
        env: { BUN_BE_BUN: "1" },
        cwd: binDir,
      };
    } catch {
      // No room for the file: the binary's own entry serves too, with the larger heap.
    }
  }
  return { argv: [process.execPath, "__proxy"], env: {} };
}

/** ProcessesStatus is the `respawn` object of the proxy's status. */
export interface ProcessesStatus {
  processes: number;
  pids: number[];
  count: number;
  last_at: string | null;
  last_reason: string | null;
  retired_on_start: number;
  /** cpus is, beside each of `pids`, the CPU its event loop is pinned to, or null where it is not pinned. */
  cpus: (number | null)[];
}

interface Member {
  proc: Subprocess;
  ready: boolean;
  stopping: boolean;
  /** applied is the newest snapshot generation the process serves. */
  applied: number;
  /** slot numbers the processes of one generation (0, 1, ...); a respawned process takes the slot of the one it replaces. */
  slot: number;
  /** cpu is the CPU the process pinned its event loop to, once it says so (null: not pinned). */
  cpu: number | null;
}

/**
 * ProxyProcesses keeps N proxy processes that share the ports with SO_REUSEPORT. The first
 * binds (resolving port 0), the others join it; each gets every snapshot; one that dies is
 * respawned with backoff and counted. Processes left by the previous daemon (a restart in
 * place) are retired only after the new ones have bound, so the ports never go unserved.
 */
export class ProxyProcesses {
  private readonly members: Member[] = [];
  private snapshot: ProxySnapshot | null = null;
  private stopped = false;
  private respawns = 0;
  private lastRespawnAt: string | null = null;
  private lastReason: string | null = null;
  private retired = 0;
  private readonly respawnTimers = new Set<ReturnType<typeof setTimeout>>();
  httpsPort = 0;
  httpPort = 0;
  private appliedWaiters: { generation: number; resolve: () => void }[] = [];
  private readonly counts = new ProxyTotals();

  /**
   * `cpus` are the CPUs the processes' event loops are pinned to, slot by slot in turn (null:
   * none pinned; docs/decisions.md 521).
   */
  constructor(
    private readonly options: {
      config: ListenerConfig;
      count: number;
      log: Logger;
      binDir: string;
      command?: string[];
      cpus?: readonly number[] | null;
    },
  ) {}

  /** previous lists the proxy processes a previous daemon left serving, from their pid files. */
  previous(): ProxyPidRecord[] {
    const dir = this.options.config.stateDir;
    let files: string[];
    try {
      files = readdirSync(dir).filter((file) => file.endsWith(".pid"));
    } catch {
      return [];
    }
    const alive: ProxyPidRecord[] = [];
    for (const file of files) {
      try {
        const record = JSON.parse(readFileSync(join(dir, file), "utf8")) as ProxyPidRecord;
        if (isSameProcess(record.pid, record.start_time)) alive.push(record);
        else rmSync(join(dir, file), { force: true });
      } catch {
        rmSync(join(dir, file), { force: true });
      }
    }
    return alive;
  }

  /**
   * start spawns the processes and resolves with the bound ports once all are ready, then
   * retires `retire` (the previous daemon's processes). A bind failure rejects with the
   * process's error code (EADDRINUSE, EACCES) and leaves nothing running.
   */
  async start(snapshot: ProxySnapshot, retire: ProxyPidRecord[]): Promise<{ httpsPort: number; httpPort: number }> {
    this.snapshot = snapshot;
    // The first process takes every new connection while the processes it replaces retire (decision 443).
    const first = await this.spawn({ ...this.options.config, steer: retire.length > 0 });
    this.httpsPort = first.httpsPort;
    this.httpPort = first.httpPort;
    const rest = await Promise.allSettled(Array.from({ length: this.options.count - 1 }, () => this.spawn(this.boundConfig())));
    const failure = rest.find((result) => result.status === "rejected");
    if (failure) {
      await this.stop();
      throw (failure as PromiseRejectedResult).reason;
    }
    for (const record of retire) {
      try {
        process.kill(record.pid, "SIGTERM");
        this.retired += 1;
      } catch {
        // already gone
      }
    }
    if (retire.length > 0) {
      this.options.log.info(
        { retiring: retire.length, processes: this.options.count, steered_by: first.steered },
        "new proxy processes serve; the previous ones retire",
      );
      void Promise.all(retire.map((record) => this.reapWhenGone(record.pid))).then(() => {
        for (const member of this.members) if (member.ready && !member.stopping) this.send(member, { type: "unsteer" });
      });
    }
    return { httpsPort: this.httpsPort, httpPort: this.httpPort };
  }

  private async reapWhenGone(pid: number): Promise<void> {
    for (let i = 0; i < 600; i++) {
      reapNoHang(pid); // a process from before this pid re-executed itself: no zombie stays
      try {
        process.kill(pid, 0);
      } catch {
        return;
      }
      await Bun.sleep(100);
    }
  }

  private boundConfig(): ListenerConfig {
    return { ...this.options.config, httpsPort: this.httpsPort, httpPort: this.httpPort };
  }

  private spawn(config: ListenerConfig): Promise<{ httpsPort: number; httpPort: number; steered: "socket" | "index" | null }> {
    return new Promise((resolve, reject) => {
      let settled = false;
      const slot = this.freeSlot();
      const cpu = this.options.cpus ? cpuOfSlot(this.options.cpus, slot) : null;
      const member: Member = { proc: undefined as unknown as Subprocess, ready: false, stopping: false, applied: -1, slot, cpu: null };
      let restoreTo: number | null = null;
      // Asked at each start: a bundle file removed meanwhile is written again.
      const command = this.options.command ? { argv: this.options.command, env: {} } : proxyCommand(this.options.binDir);
      member.proc = Bun.spawn(command.argv, {
        ...(command.cwd ? { cwd: command.cwd } : {}),
        stdin: "ignore",
        stdout: "inherit",
        stderr: "inherit",
        // Its allocator keeps the pages it frees: with purging on, a process under load made one
        // madvise call every 11–20 requests and faulted the pages in again at once (decision 431).
        env: { ...keepFreedPages(process.env), ...command.env },
        serialization: "json",
        ipc: (raw) => {
          const message = raw as FromProxy;
          if (message.type === "ready") {
            if (restoreTo !== null) restorePriority(member.proc.pid, restoreTo);
            member.ready = true;
            member.applied = message.generation;
            member.cpu = message.cpu ?? null;
            this.notifyApplied();
            if (!settled) {
              settled = true;
              resolve({ httpsPort: message.httpsPort, httpPort: message.httpPort, steered: message.steered ?? null });
            }
            // A snapshot may have changed while this process was starting.
            if (this.snapshot && this.snapshot.generation > message.generation)
              this.send(member, { type: "snapshot", snapshot: this.snapshot });
          } else if (message.type === "applied") {
            member.applied = message.generation;
            this.notifyApplied();
          } else if (message.type === "counts") {
            this.counts.update(member.proc.pid, message.counts);
          } else if (message.type === "error") {
            this.options.log.error({ code: message.code, proxy_pid: member.proc.pid }, `proxy process: ${message.message}`);
            if (!settled) {
              settled = true;
              reject(Object.assign(new Error(message.message), { code: message.code }));
            }
          }
        },
        onExit: (_proc, exitCode, signalCode) => {
          this.counts.retire(member.proc.pid);
          const index = this.members.indexOf(member);
          if (index >= 0) this.members.splice(index, 1);
          const reason = signalCode ? `killed by ${signalCode}` : `exited with ${exitCode}`;
          if (!settled) {
            settled = true;
            reject(Object.assign(new Error(`the proxy process ${reason} before it was ready`), { code: "proxy_failed" }));
            return;
          }
          if (this.stopped || member.stopping) return;
          this.respawnLater(reason);
        },
      });
      // It starts beside an engine that serves: at a lower priority until it is ready (decision 368).
      restoreTo = lowerWhileStarting(member.proc.pid);
      this.members.push(member);
      this.send(member, { type: "start", config, snapshot: this.snapshot as ProxySnapshot, cpu });
    });
  }

  /** freeSlot is the lowest slot no live process of this generation holds. */
  private freeSlot(): number {
    const taken = new Set(this.members.filter((member) => !member.stopping).map((member) => member.slot));
    let slot = 0;
    while (taken.has(slot)) slot++;
    return slot;
  }

  private respawnLater(reason: string): void {
    this.respawns += 1;
    this.lastRespawnAt = new Date().toISOString();
    this.lastReason = reason;
    const delay = Math.min(30_000, 100 * 2 ** Math.min(8, this.respawns - 1));
    this.options.log.warn({ reason, respawns: this.respawns, delay_ms: delay }, "proxy process ended: respawning");
    const timer = setTimeout(() => {
      this.respawnTimers.delete(timer);
      if (this.stopped) return;
      this.spawn(this.boundConfig()).catch((error) => {
        this.options.log.error({ err: error }, "proxy process respawn failed");
        if (!this.stopped) this.respawnLater((error as Error).message);
      });
    }, delay);
    this.respawnTimers.add(timer);
  }

  private send(member: Member, message: ToProxy): void {
    try {
      member.proc.send(message);
    } catch (error) {
      this.options.log.warn({ err: error, proxy_pid: member.proc.pid }, "proxy process did not take a message");
    }
  }

  /** setPorts chooses the ports the first process binds (0: any free port). */
  setPorts(httpsPort: number, httpPort: number): void {
    this.options.config.httpsPort = httpsPort;
    this.options.config.httpPort = httpPort;
  }

  private notifyApplied(): void {
    const ready = this.members.filter((member) => member.ready);
    const lowest = ready.length === 0 ? Number.POSITIVE_INFINITY : Math.min(...ready.map((member) => member.applied));
    const due = this.appliedWaiters.filter((waiter) => waiter.generation <= lowest);
    this.appliedWaiters = this.appliedWaiters.filter((waiter) => waiter.generation > lowest);
    for (const waiter of due) waiter.resolve();
  }

  /** whenApplied resolves once every ready process serves `generation` or a newer snapshot, or after `timeoutMs`. */
  whenApplied(generation: number, timeoutMs: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, timeoutMs);
      this.appliedWaiters.push({
        generation,
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
      });
      this.notifyApplied();
    });
  }

  /** broadcast sends a snapshot to every process; those still starting get it when ready. */
  broadcast(snapshot: ProxySnapshot): void {
    this.snapshot = snapshot;
    for (const member of this.members) if (member.ready) this.send(member, { type: "snapshot", snapshot });
  }

  /** stop ends every process gracefully, killing those that take longer than `graceMs`. */
  async stop(graceMs = 5000): Promise<void> {
    this.stopped = true;
    for (const timer of this.respawnTimers) clearTimeout(timer);
    this.respawnTimers.clear();
    const members = [...this.members];
    for (const member of members) {
      member.stopping = true;
      this.send(member, { type: "stop" });
    }
    await Promise.all(
      members.map(async (member) => {
        const exited = await Promise.race([member.proc.exited, Bun.sleep(graceMs).then(() => null)]);
        if (exited === null) member.proc.kill("SIGKILL");
      }),
    );
  }

  /**
   * handOver leaves the processes serving for the next daemon (a restart in place): they see
   * the IPC channel close, keep the last snapshot, and wait to be retired.
   */
  handOver(): void {
    this.stopped = true;
    for (const timer of this.respawnTimers) clearTimeout(timer);
    for (const member of this.members) member.stopping = true;
  }

  /** requestCounts are the proxy's request counts since this daemon started its processes (docs/decisions.md 335). */
  requestCounts(): RouteCounts[] {
    return this.counts.totals();
  }

  status(): ProcessesStatus {
    return {
      processes: this.members.filter((member) => member.ready).length,
      pids: this.members.map((member) => member.proc.pid),
      count: this.respawns,
      last_at: this.lastRespawnAt,
      last_reason: this.lastReason,
      retired_on_start: this.retired,
      cpus: this.members.map((member) => member.cpu),
    };
  }
}
