import { readFileSync } from "node:fs";
import { type ProcessStat, parseStat, readProcessTable, workloadOwner } from "../supervisor/procfs";

/** ProcessUsage is what one /proc/<pid>/stat line says about a process's place and cost. */
export interface ProcessUsage {
  pid: number;
  ppid: number;
  /** pgid is its process group: a workload leads its own. */
  pgid: number;
  /** cpuTicks is utime + stime + cutime + cstime: its own CPU time and that of the children it reaped. */
  cpuTicks: number;
  rssPages: number;
}

/**
 * parseStatLine reads the fields the metrics need from one /proc/<pid>/stat text (the
 * supervisor's parseStat), or null when it is not one or a field is missing.
 */
export function parseStatLine(pid: number, text: string): ProcessUsage | null {
  const stat = parseStat(text);
  return stat && usageOf(pid, stat);
}

/** usageOf is a process's place and cost from its stat fields; null when one is missing. */
function usageOf(pid: number, { ppid, pgid, cpuTicks, rssPages }: ProcessStat): ProcessUsage | null {
  if (![ppid, pgid, cpuTicks, rssPages].every(Number.isFinite)) return null;
  return { pid, ppid, pgid, cpuTicks, rssPages: Math.max(0, rssPages) };
}

/** WorkloadUsage is the summed cost of every process of one workload. */
export interface WorkloadUsage {
  cpuTicks: number;
  rssPages: number;
  processes: number;
}

/** ProcessTable is one scan of /proc: the workload each process belongs to, and each workload's processes summed. */
export interface ProcessTable {
  ownerOf: Map<number, number>;
  workloads: Map<number, WorkloadUsage>;
}

/**
 * scanProcesses reads /proc/<pid>/stat of every process once and sums, per workload named by
 * its pid, the CPU ticks and resident pages of its processes: the workload's process group
 * and every descendant of it, one that made a group or session of its own included (as the
 * supervisor's processTreeUsage counts them; decision 508: the runs of a daemon share the shim
 * launcher's session, so a session no longer tells them apart). Processes that end during the
 * scan are skipped.
 */
export function scanProcesses(workloads: ReadonlySet<number>, root = "/proc"): ProcessTable {
  const ownerOf = new Map<number, number>();
  const sums = new Map<number, WorkloadUsage>();
  const processes = new Map<number, ProcessUsage>();
  for (const [pid, stat] of readProcessTable(root)) {
    const usage = usageOf(pid, stat);
    if (usage) processes.set(pid, usage);
  }
  const owner = workloadOwner(processes, new Set([...workloads].filter((pid) => processes.has(pid))));
  for (const [pid, usage] of processes) {
    const workload = owner(pid);
    if (workload === null) continue;
    ownerOf.set(pid, workload);
    const sum = sums.get(workload);
    if (sum) {
      sum.cpuTicks += usage.cpuTicks;
      sum.rssPages += usage.rssPages;
      sum.processes += 1;
    } else sums.set(workload, { cpuTicks: usage.cpuTicks, rssPages: usage.rssPages, processes: 1 });
  }
  return { ownerOf, workloads: sums };
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
