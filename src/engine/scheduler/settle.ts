import { isDiskFull } from "../../lib/errors";
import type { Logger } from "../../lib/logger";
import type { RunRow, ServiceStore } from "../services/store";
import type { ExitRecord, RunHandle } from "../supervisor";
import { RETRY_SOON_MS } from "./runner";

/** SettleContext is what the settler asks of the engine: the store, and the runner that settles a service's exit. */
export interface SettleContext {
  store: ServiceStore;
  log: Logger;
  /**
   * recordExit settles one run's exit of a service in the store (ServiceRunner.recordExit), in a
   * savepoint of its own inside the settle's transaction, and answers what follows the commit.
   */
  recordExit(serviceId: string, run: RunRow, exit: ExitRecord, processes: RunHandle | null): () => void;
  /** handedOver says whether the daemon has handed its workloads over to the next one: no retry is armed then. */
  handedOver(): boolean;
}

/**
 * ExitSettler holds the exits the supervisor reported (and those found at start) until the
 * store has taken them, and records them: the exits told together (the launcher reports what
 * ended while the daemon was busy, dozens at a time under a flood of jobs) in one transaction,
 * once this turn's notices are read. What each exit means for its service (the restart
 * policy, the retry, forensics) is the runner's and exit.ts's.
 */
export class ExitSettler {
  /** unsettled holds exits reported by the supervisor that the store has not taken yet. */
  private readonly unsettled = new Map<string, ExitRecord>();
  /**
   * processes are the processes of reported exits, for the settle to record where its run has
   * none on record yet: a job that ends at once is settled before its launch records them,
   * which then took a commit of its own.
   */
  private readonly processes = new Map<string, RunHandle>();
  /** due is true while a settle of the exits reported in this turn is queued. */
  private due = false;
  private timer: ReturnType<typeof setTimeout> | null = null;
  private failing = false;

  constructor(private readonly ctx: SettleContext) {}

  /** told takes an exit the supervisor reported, settled with the others told in this turn. */
  told(handle: RunHandle, exit: ExitRecord): void {
    this.unsettled.set(handle.runId, exit);
    this.processes.set(handle.runId, handle);
    if (this.due) return;
    this.due = true;
    queueMicrotask(() => {
      this.due = false;
      this.settle();
    });
  }

  /** queue takes an exit nobody will report (a run that ended while no daemon watched, a launch that failed), settled at the next settle(). */
  queue(runId: string, exit: ExitRecord): void {
    this.unsettled.set(runId, exit);
  }

  /** pending is a run's exit the store has not taken yet (a full disk): the run has ended all the same. */
  pending(runId: string): ExitRecord | undefined {
    return this.unsettled.get(runId);
  }

  /** stop drops the retry timer: a daemon handing over leaves what is unsettled to the next one, which reads the shims' records. */
  stop(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  /**
   * settle records every exit the store has not taken yet, in one transaction, each exit in a
   * savepoint of its own (recordExit's): one the store refuses ends the batch, those before it are
   * committed, and it is tried again last. What follows an exit (its runner's state, the
   * waiters, the retry) follows only once the transaction committed. One exit of a service goes
   * in at a time: a second one (a stray older run) waits for the first's consequences. It never
   * throws: it runs from the supervisor's exit handler, where an uncaught SQLITE_FULL used to
   * end the daemon (issue 13). A settle refused for lack of space stays pending, the service is
   * known to have exited meanwhile (pending), and it is tried again every second until the disk
   * has room; the shim's exit.json keeps the truth for a daemon that restarts first.
   */
  settle(): void {
    const { store, log } = this.ctx;
    const recorded: { runId: string; follow: () => void }[] = [];
    const services = new Set<string>();
    let failed: { error: unknown; runId: string | null } | null = null;
    try {
      store.transaction(() => {
        for (const [runId, exit] of this.unsettled) {
          try {
            const run = store.getRun(runId);
            if (run && run.ended_at === null) {
              if (services.has(run.service_id)) continue;
              services.add(run.service_id);
              const processes = this.processes.get(runId) ?? null;
              recorded.push({ runId, follow: this.ctx.recordExit(run.service_id, run, exit, processes) });
            } else recorded.push({ runId, follow: () => undefined });
          } catch (error) {
            // Its savepoint is rolled back; the store may have rolled the whole transaction
            // back too (SQLITE_FULL can), so nothing more is written in it. It goes last, so
            // that a retry tries the others first.
            failed = { error, runId };
            this.deferService(runId);
            break;
          }
        }
      });
    } catch (error) {
      // The commit itself was refused: none of them is on record.
      failed ??= { error, runId: null };
      recorded.length = 0;
    }
    for (const { runId } of recorded) {
      this.unsettled.delete(runId);
      this.processes.delete(runId);
    }
    // The exits are on disk a moment later, off the event loop: the launcher left their
    // records unsynced, since it told this daemon of them (decision 524).
    if (recorded.length > 0) void store.syncSoon();
    // What follows each exit is its runner's (waiters, the retry): one that throws is logged,
    // and neither skips the others' nor escapes the settle.
    for (const { runId, follow } of recorded) {
      try {
        follow();
      } catch (error) {
        log.error({ err: error, run: runId }, "what follows a service's exit failed");
      }
    }
    if (failed && !this.failing) {
      this.failing = true;
      const { error, runId } = failed;
      log.error({ err: error, run: runId, disk_full: isDiskFull(error) }, "cannot record a service's exit yet: retrying");
    }
    if (this.unsettled.size === 0) {
      if (this.failing) log.info("recorded the exits that were waiting for the disk");
      this.failing = false;
      return;
    }
    // A second exit of a service waited for the first's: its turn is now.
    if (!failed && recorded.length > 0) {
      this.settle();
      return;
    }
    if (this.timer || this.ctx.handedOver()) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      this.settle();
    }, RETRY_SOON_MS);
    this.timer.unref?.();
  }

  /**
   * deferService moves a refused exit to the end of the queue, and the later exits of its own
   * service with it, in their order: the other services' exits are tried first on the retry,
   * while one service's exits are still recorded in the order they were told.
   */
  private deferService(runId: string): void {
    const serviceOf = (id: string) => this.ctx.store.getRun(id)?.service_id;
    const service = serviceOf(runId);
    const moved: [string, ExitRecord][] = [];
    let reached = false;
    for (const entry of this.unsettled) {
      reached ||= entry[0] === runId;
      if (reached && (entry[0] === runId || (service !== undefined && serviceOf(entry[0]) === service))) moved.push(entry);
    }
    for (const [id, exit] of moved) {
      this.unsettled.delete(id);
      this.unsettled.set(id, exit);
    }
  }
}
