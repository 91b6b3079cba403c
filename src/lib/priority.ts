import { FFIType, ptr } from "bun:ffi";
import { readdirSync } from "node:fs";
import { getPriority, setPriority } from "node:os";
import { openLibc } from "./libc";

/**
 * STARTING_NICE is how much lower the CPU priority of a process is while it starts beside an
 * engine that serves (a restart's new process, a proxy process): on a machine of two cores a
 * start-up (a runtime of 100 MB, compiled validators) takes CPU from the requests being
 * answered. It is given back once the process serves (docs/decisions.md 368).
 */
export const STARTING_NICE = 10;

/**
 * HANDOVER_BOOST is how much higher the CPU priority of each side of a hand-over is while new
 * requests wait on it: the successor from its bind until it has answered what waited, the
 * predecessor from the switch until it has released its work (docs/decisions.md 527). Beside
 * busy workloads and proxy processes on two cores, a daemon at their priority got a third of a
 * core for the steps that end the wait.
 */
export const HANDOVER_BOOST = 5;

/**
 * lowerWhileStarting lowers the priority of `pid` (0: this process) by STARTING_NICE and
 * answers the priority to give back, this process's own; null when nothing was changed. Only
 * root may raise a priority again, so only root lowers one. On Linux a priority is each
 * thread's: every thread the process has is lowered, and the threads it starts later inherit it.
 */
export function lowerWhileStarting(pid: number): number | null {
  return shiftPriority(pid, lowered);
}

/** lowered is the priority a process starts at beside an engine that serves: STARTING_NICE below `own`. */
function lowered(own: number): number {
  return Math.min(19, own + STARTING_NICE);
}

/**
 * lowerFor runs `work` with every thread of this process at STARTING_NICE below its priority,
 * and gives the priority back after: as root only, since only root may raise it again (a
 * user's process runs `work` as it is). The threads `work` wakes (a collector's markers) run
 * lowered too, so the engine that serves meanwhile keeps its CPU.
 */
export function lowerFor<T>(work: () => T): T {
  const own = lowerWhileStarting(0);
  try {
    return work();
  } finally {
    if (own !== null) restorePriority(0, own);
  }
}

/**
 * raiseWhileHandingOver raises this process, every thread of it, from 0 to -HANDOVER_BOOST
 * while new requests wait on it, and says whether it did. Only a daemon at the default priority
 * is raised (one an operator set otherwise keeps it), only by root, and only where each thread
 * can be marked SCHED_RESET_ON_FORK: a process it starts meanwhile (a shim launcher, a probe,
 * a build) then starts at 0, not raised.
 */
export function raiseWhileHandingOver(): boolean {
  if (process.getuid?.() !== 0 || getPriority(0) !== 0 || !setResetOnFork(true)) return false;
  try {
    setThreadsPriority(0, -HANDOVER_BOOST);
    return true;
  } catch {
    setResetOnFork(false);
    return false;
  }
}

/** givePriorityBack ends a raise of raiseWhileHandingOver: every thread back at 0, the reset-on-fork mark taken off. */
export function givePriorityBack(): void {
  restorePriority(0, 0);
  setResetOnFork(false);
}

const SCHED_OTHER = 0;
const SCHED_RESET_ON_FORK = 0x40000000;
let setScheduler: ((tid: number, policy: number, param: unknown) => number) | null | undefined;

/**
 * setResetOnFork marks every thread of this process SCHED_RESET_ON_FORK, or takes the mark
 * off, keeping the normal policy (sched_setscheduler(2), which keeps the nice value): a marked
 * thread at a negative nice value starts its children, and its new threads, at 0. False where
 * the C library or the kernel refuses for the calling thread.
 */
function setResetOnFork(on: boolean): boolean {
  if (setScheduler === undefined) {
    const symbols = openLibc({ sched_setscheduler: { args: [FFIType.i32, FFIType.i32, FFIType.ptr], returns: FFIType.i32 } });
    setScheduler = symbols ? (symbols.sched_setscheduler as unknown as typeof setScheduler) : null;
  }
  if (!setScheduler) return false;
  const param = new Int32Array(1); // struct sched_param { int sched_priority; }: 0 for SCHED_OTHER
  const policy = SCHED_OTHER | (on ? SCHED_RESET_ON_FORK : 0);
  if (setScheduler(0, policy, ptr(param)) !== 0) return false;
  for (const thread of threadsOf(0)) setScheduler(thread, policy, ptr(param)); // a thread that ended meanwhile is no matter
  return true;
}

/** shiftPriority sets every thread of `pid` to `to(own)`, `own` being this process's priority, and answers `own`; null when not root or not permitted. */
function shiftPriority(pid: number, to: (own: number) => number): number | null {
  if (process.getuid?.() !== 0) return null;
  try {
    const own = getPriority(0);
    setThreadsPriority(pid, to(own));
    return own;
  } catch {
    return null;
  }
}

/**
 * restorePriority gives `pid` (0: this process) its priority back, on every one of its threads:
 * given back to the first thread alone, a runtime's garbage collector helpers, JIT compilers and
 * I/O pool, started while it was lowered, kept the lower priority for the process's life, and a
 * collection waited for helpers the machine's other work starved (decision 471). A process
 * already gone is no matter.
 */
export function restorePriority(pid: number, priority: number): void {
  try {
    setThreadsPriority(pid, priority);
  } catch {
    // gone, or not permitted: it runs on at the lower priority
  }
}

/** setThreadsPriority sets the priority of each thread of `pid` (0: this process); throws where the process itself cannot be set. */
function setThreadsPriority(pid: number, priority: number): void {
  setPriority(pid, priority);
  for (const thread of threadsOf(pid)) {
    try {
      setPriority(thread, priority);
    } catch {
      // the thread ended meanwhile
    }
  }
}

/** threadsOf lists the threads of `pid` (0: this process); none where /proc cannot say (the first thread is then all that is set). */
function threadsOf(pid: number): number[] {
  try {
    return readdirSync(`/proc/${pid === 0 ? "self" : pid}/task`).map(Number);
  } catch {
    return [];
  }
}
