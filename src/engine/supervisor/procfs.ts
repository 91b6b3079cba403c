import { readdirSync, readFileSync } from "node:fs";

/** ProcessStat is what /proc/<pid>/stat tells the engine about one process. */
export interface ProcessStat {
  state: string;
  ppid: number;
  pgid: number;
  /** cpuTicks is utime + stime + cutime + cstime (USER_HZ): its own CPU time and that of the children it reaped. */
  cpuTicks: number;
  /** rssPages is field 24, its resident pages. */
  rssPages: number;
  /** startTime is field 22, in clock ticks since boot: with the pid it names one process forever. */
  startTime: number;
}

/**
 * parseStat reads a /proc/<pid>/stat line; null when it is not one. The command name (field 2)
 * may hold spaces and parentheses, so fields are counted from the last ')'. A field the line
 * lacks reads NaN: each caller says what it does with one.
 */
export function parseStat(text: string): ProcessStat | null {
  const close = text.lastIndexOf(")");
  if (close < 0) return null;
  const fields = text.slice(close + 2).split(" ");
  // fields[0] is field 3 (state); field N is fields[N - 3].
  return {
    state: fields[0] ?? "?",
    ppid: Number(fields[1]),
    pgid: Number(fields[2]),
    cpuTicks: Number(fields[11]) + Number(fields[12]) + Number(fields[13]) + Number(fields[14]),
    rssPages: Number(fields[21]),
    startTime: Number(fields[19]),
  };
}

/** readProcessStat parses /proc/<pid>/stat, or returns null when the process does not exist. */
export function readProcessStat(pid: number): ProcessStat | null {
  try {
    return parseStat(readFileSync(`/proc/${pid}/stat`, "latin1"));
  } catch {
    return null;
  }
}

/**
 * readProcessTable reads /proc/<pid>/stat of every process once: the one pass both the API's
 * usage (processTreeUsage) and the metrics' scan make. A process that ends while it is read is
 * left out; an unreadable `procDir` gives an empty table.
 */
export function readProcessTable(procDir = "/proc"): Map<number, ProcessStat> {
  const table = new Map<number, ProcessStat>();
  let names: string[];
  try {
    names = readdirSync(procDir);
  } catch {
    return table;
  }
  for (const name of names) {
    if (!/^\d+$/.test(name)) continue;
    let text: string;
    try {
      text = readFileSync(`${procDir}/${name}/stat`, "latin1");
    } catch {
      continue; // it ended while we looked
    }
    const stat = parseStat(text);
    if (stat) table.set(Number(name), stat);
  }
  return table;
}

/**
 * isSameProcess says whether `pid` is still the process that started at `startTime` and has
 * not exited: a pid reused by another process, or a zombie, is not. `seen` keeps what one pass
 * read of each pid (a shim launcher holds many runs: it is read once, not once per run).
 */
export function isSameProcess(pid: number, startTime: number, seen?: Map<number, ProcessStat | null>): boolean {
  let stat = seen?.get(pid);
  if (stat === undefined) {
    stat = readProcessStat(pid);
    seen?.set(pid, stat);
  }
  return stat !== null && stat.startTime === startTime && stat.state !== "Z" && stat.state !== "X";
}

/** residentKb returns VmRSS of a process in KiB, or null when it is gone. */
export function residentKb(pid: number, procDir = "/proc"): number | null {
  try {
    const match = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`${procDir}/${pid}/status`, "utf8"));
    return match ? Number(match[1]) : 0;
  } catch {
    return null;
  }
}

/**
 * USER_HZ is the unit of the CPU times in /proc/<pid>/stat. The kernel reports them in USER_HZ
 * whatever its own tick rate, and USER_HZ is 100 on every architecture Linux runs Bun on
 * (sysconf(_SC_CLK_TCK) answers the same constant).
 */
const USER_HZ = 100;

/** TreeUsage is what the processes of one workload use together. */
export interface TreeUsage {
  /** processes counts the workload and the processes counted with it. */
  processes: number;
  /** cpuSeconds is user + system time, the time of children they waited for included: it only grows while the tree lives. */
  cpuSeconds: number;
  /** rssBytes is the sum of the processes' resident memory (shared pages are counted in each). */
  rssBytes: number;
}

/**
 * workloadOwner answers, for a process of `processes` (pid to parent and process group), the
 * workload of `workloads` it belongs to: itself, its group's leader, or its nearest ancestor
 * that is one; null for none. Memoised, so asking for every process stays linear.
 */
export function workloadOwner(
  processes: ReadonlyMap<number, { ppid: number; pgid: number }>,
  workloads: ReadonlySet<number>,
): (pid: number) => number | null {
  const owners = new Map<number, number | null>();
  const owner = (pid: number, depth = 0): number | null => {
    const known = owners.get(pid);
    if (known !== undefined) return known;
    const entry = processes.get(pid);
    let found: number | null = null;
    if (workloads.has(pid)) found = pid;
    else if (entry && workloads.has(entry.pgid)) found = entry.pgid;
    else if (entry && entry.ppid > 1 && depth < 256) found = owner(entry.ppid, depth + 1);
    owners.set(pid, found);
    return found;
  };
  return (pid) => owner(pid);
}

/**
 * processTreeUsage measures each workload named by its pid: the processes of its process
 * group (the supervisor signals workloads by group) and every descendant of it, a child that
 * made a session of its own included. One pass over /proc serves all of them. A root that is
 * gone is left out of the answer.
 */
export function processTreeUsage(roots: readonly number[], procDir = "/proc"): Map<number, TreeUsage> {
  // Zombies hold no memory and run no more: they are not counted.
  const entries = new Map([...readProcessTable(procDir)].filter(([, stat]) => stat.state !== "Z" && stat.state !== "X"));
  const wanted = new Set(roots.filter((root) => entries.has(root)));
  const owner = workloadOwner(entries, wanted);
  const usage = new Map<number, TreeUsage>();
  for (const root of wanted) usage.set(root, { processes: 0, cpuSeconds: 0, rssBytes: 0 });
  for (const [pid, entry] of entries) {
    const root = owner(pid);
    if (root === null) continue;
    const total = usage.get(root);
    if (!total) continue;
    total.processes += 1;
    total.cpuSeconds += (Number.isFinite(entry.cpuTicks) ? entry.cpuTicks : 0) / USER_HZ;
    total.rssBytes += (residentKb(pid, procDir) ?? 0) * 1024;
  }
  for (const total of usage.values()) total.cpuSeconds = Math.round(total.cpuSeconds * 100) / 100;
  return usage;
}
