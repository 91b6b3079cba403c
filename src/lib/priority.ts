import { readdirSync } from "node:fs";
import { getPriority, setPriority } from "node:os";

/**
 * STARTING_NICE is how much lower the CPU priority of a process is while it starts beside an
 * engine that serves (a restart's new process, a proxy process): on a machine of two cores a
 * start-up (a runtime of 100 MB, compiled validators) takes CPU from the requests being
 * answered. It is given back once the process serves (docs/decisions.md 368).
 */
export const STARTING_NICE = 10;

/**
 * HANDOVER_BOOST is how much higher the CPU priority of each side of a hand-over is while new
 * requests wait on it: the successor from the switch until it has answered what waited, the
 * predecessor from the switch until it has released its work (docs/decisions.md 527). Beside
 * busy workloads and proxy processes on two cores, a daemon at the same priority as they got a
 * third of a core for the steps that end the wait.
 */
export const HANDOVER_BOOST = 5;

/**
 * lowerWhileStarting lowers the priority of `pid` (0: this process) by STARTING_NICE and
 * answers the priority to give back, this process's own; null when nothing was changed. Only
 * root may raise a priority again, so only root lowers one. On Linux a priority is each
 * thread's: every thread the process has is lowered, and the threads it starts later inherit it.
 */
export function lowerWhileStarting(pid: number): number | null {
  return shiftPriority(pid, 0, lowered);
}

/** lowered is the priority a process starts at beside an engine that serves: STARTING_NICE below `own`. */
function lowered(own: number): number {
  return Math.min(19, own + STARTING_NICE);
}

/** raised is the priority a side of a hand-over runs at while requests wait on it: HANDOVER_BOOST above `own`. */
export function raised(own: number): number {
  return Math.max(-20, own - HANDOVER_BOOST);
}

/**
 * raiseWhileHandingOver raises the priority of `pid` (0: this process), every thread of it,
 * by HANDOVER_BOOST and answers the priority to give back, its own; null when nothing was
 * changed (only root may raise a priority).
 */
export function raiseWhileHandingOver(pid: number): number | null {
  return shiftPriority(pid, pid, raised);
}

/**
 * shiftPriority sets every thread of `pid` to `to(own)`, `own` being the priority of `ownPid`
 * (0: this process), and answers `own`; null when not root or not permitted.
 */
function shiftPriority(pid: number, ownPid: number, to: (own: number) => number): number | null {
  if (process.getuid?.() !== 0) return null;
  try {
    const own = getPriority(ownPid);
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
  let threads: string[];
  try {
    threads = readdirSync(`/proc/${pid === 0 ? "self" : pid}/task`);
  } catch {
    return; // no /proc: the process's first thread is all that could be set
  }
  for (const thread of threads) {
    try {
      setPriority(Number(thread), priority);
    } catch {
      // the thread ended meanwhile
    }
  }
}
