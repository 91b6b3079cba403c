import { readFileSync } from "node:fs";

/** ProcessStat is what /proc/<pid>/stat tells the supervisor about one process. */
export interface ProcessStat {
  state: string;
  ppid: number;
  pgid: number;
  /** startTime is field 22, in clock ticks since boot: with the pid it names one process forever. */
  startTime: number;
}

/**
 * readProcessStat parses /proc/<pid>/stat, or returns null when the process does not exist.
 * The command name (field 2) may hold spaces and parentheses, so fields are counted from
 * the last ')'.
 */
export function readProcessStat(pid: number): ProcessStat | null {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return null;
  }
  const close = text.lastIndexOf(")");
  if (close < 0) return null;
  const fields = text.slice(close + 2).split(" ");
  // fields[0] is field 3 (state); field N is fields[N - 3].
  return { state: fields[0] ?? "?", ppid: Number(fields[1]), pgid: Number(fields[2]), startTime: Number(fields[19]) };
}

/**
 * isSameProcess says whether `pid` is still the process that started at `startTime` and has
 * not exited: a pid reused by another process, or a zombie, is not.
 */
export function isSameProcess(pid: number, startTime: number): boolean {
  const stat = readProcessStat(pid);
  return stat !== null && stat.startTime === startTime && stat.state !== "Z" && stat.state !== "X";
}

/** residentKb returns VmRSS of a process in KiB, or null when it is gone. */
export function residentKb(pid: number): number | null {
  try {
    const match = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
    return match ? Number(match[1]) : 0;
  } catch {
    return null;
  }
}
