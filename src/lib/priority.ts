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
 * root may raise a priority again, so only root lowers one.
 */
export function lowerWhileStarting(pid: number): number | null {
  if (process.getuid?.() !== 0) return null;
  try {
    const own = getPriority(0);
    setPriority(pid, Math.min(19, own + STARTING_NICE));
    return own;
  } catch {
    return null;
  }
}

/** restorePriority gives `pid` (0: this process) its priority back; a process already gone is no matter. */
export function restorePriority(pid: number, priority: number): void {
  try {
    setPriority(pid, priority);
  } catch {
    // gone, or not permitted: it runs on at the lower priority
  }
}
