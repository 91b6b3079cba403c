import { readdirSync, readFileSync } from "node:fs";

/** ProcessUsage is what one /proc/<pid>/stat line says about a process's cost. */
export interface ProcessUsage {
  pid: number;
  session: number;
  /** cpuTicks is utime + stime + cutime + cstime: its own CPU time and that of the children it reaped. */
  cpuTicks: number;
  rssPages: number;
}

/**
 * parseStatLine reads the fields the metrics need from one /proc/<pid>/stat text, or null when
 * it is not one. The command name (field 2) may hold spaces and parentheses, so fields are
 * counted from the last ')' (proc(5): field N is at index N - 3 after it).
 */
export function parseStatLine(pid: number, text: string): ProcessUsage | null {
  const close = text.lastIndexOf(")");
  if (close < 0) return null;
  const fields = text.slice(close + 2).split(" ");
  const session = Number(fields[3]);
  const ticks = Number(fields[11]) + Number(fields[12]) + Number(fields[13]) + Number(fields[14]);
  const rss = Number(fields[21]);
  if (!Number.isFinite(session) || !Number.isFinite(ticks) || !Number.isFinite(rss)) return null;
  return { pid, session, cpuTicks: ticks, rssPages: Math.max(0, rss) };
}

/** SessionUsage is the summed cost of every process of one session. */
export interface SessionUsage {
  cpuTicks: number;
  rssPages: number;
  processes: number;
}

/** ProcessTable is one scan of /proc: each process's session, and the sessions asked for, summed. */
export interface ProcessTable {
  sessionOf: Map<number, number>;
  sessions: Map<number, SessionUsage>;
}

/**
 * scanProcesses reads /proc/<pid>/stat of every process once and sums, per session, the CPU
 * ticks and resident pages of its members (docs/decisions.md 332: a run's processes are the
 * shim's session); `wanted` limits the sums to some sessions. Processes that end during the
 * scan are skipped.
 */
export function scanProcesses(wanted?: ReadonlySet<number>, root = "/proc"): ProcessTable {
  const sessionOf = new Map<number, number>();
  const sessions = new Map<number, SessionUsage>();
  let entries: string[];
  try {
    entries = readdirSync(root);
  } catch {
    return { sessionOf, sessions };
  }
  for (const entry of entries) {
    const first = entry.charCodeAt(0);
    if (first < 48 || first > 57) continue;
    const pid = Number(entry);
    let text: string;
    try {
      text = readFileSync(`${root}/${entry}/stat`, "latin1");
    } catch {
      continue;
    }
    const usage = parseStatLine(pid, text);
    if (!usage) continue;
    sessionOf.set(pid, usage.session);
    if (wanted && !wanted.has(usage.session)) continue;
    const sum = sessions.get(usage.session);
    if (sum) {
      sum.cpuTicks += usage.cpuTicks;
      sum.rssPages += usage.rssPages;
      sum.processes += 1;
    } else sessions.set(usage.session, { cpuTicks: usage.cpuTicks, rssPages: usage.rssPages, processes: 1 });
  }
  return { sessionOf, sessions };
}

/** sessionOfPid reads one process's session id, or null when it is gone. */
export function sessionOfPid(pid: number, root = "/proc"): number | null {
  try {
    return parseStatLine(pid, readFileSync(`${root}/${pid}/stat`, "latin1"))?.session ?? null;
  } catch {
    return null;
  }
}

/** SystemUnits are the kernel's clock tick rate (USER_HZ) and page size, read once. */
export interface SystemUnits {
  ticksPerSecond: number;
  pageBytes: number;
}

/** systemUnits asks getconf for CLK_TCK and PAGESIZE, falling back to Linux's usual 100 and 4096. */
export function systemUnits(): SystemUnits {
  const ask = (name: string, fallback: number) => {
    try {
      const result = Bun.spawnSync(["getconf", name], { stdout: "pipe", stderr: "ignore" });
      const value = Number(result.stdout.toString().trim());
      return result.exitCode === 0 && Number.isInteger(value) && value > 0 ? value : fallback;
    } catch {
      return fallback;
    }
  };
  return { ticksPerSecond: ask("CLK_TCK", 100), pageBytes: ask("PAGESIZE", 4096) };
}

/** ownCpuTicks is this process's own CPU time and its reaped children's, from /proc/self/stat (bench/metrics.ts). */
export function ownCpuTicks(): { self: number; children: number } {
  const text = readFileSync("/proc/self/stat", "latin1");
  const fields = text.slice(text.lastIndexOf(")") + 2).split(" ");
  return { self: Number(fields[11]) + Number(fields[12]), children: Number(fields[13]) + Number(fields[14]) };
}
