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
 * lowerWhileStarting lowers the priority of `pid` (0: this process) by STARTING_NICE and
 * answers the priority to give back, this process's own; null when nothing was changed. Only
 * root may raise a priority again, so only root lowers one. On Linux a priority is each
 * thread's: every thread the process has is lowered, and the threads it starts later inherit it.
 */
export function lowerWhileStarting(pid: number): number | null {
  if (process.getuid?.() !== 0) return null;
  try {
    const own = getPriority(0);
    setThreadsPriority(pid, Math.min(19, own + STARTING_NICE));
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
