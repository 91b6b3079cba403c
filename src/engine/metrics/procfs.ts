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

/** AT_PAGESZ and AT_CLKTCK are the auxiliary vector's keys for the page size and USER_HZ (<linux/auxvec.h>, elf.h). */
const AT_PAGESZ = 6n;
const AT_CLKTCK = 17n;

/**
 * systemUnits reads CLK_TCK and PAGESIZE where the C library's sysconf reads them: the
 * auxiliary vector the kernel gave this process (`/proc/self/auxv`, pairs of native words),
 * falling back to Linux's usual 100 and 4096. It used to start `getconf` twice, 3 ms each of a
 * daemon's start on a PVM guest, with the event loop held (decision 515).
 */
export function systemUnits(auxvPath = "/proc/self/auxv"): SystemUnits {
  const units = { ticksPerSecond: 100, pageBytes: 4096 };
  let auxv: Buffer;
  try {
    auxv = readFileSync(auxvPath);
  } catch {
    return units;
  }
  const view = new DataView(auxv.buffer, auxv.byteOffset, auxv.byteLength);
  for (let offset = 0; offset + 16 <= auxv.byteLength; offset += 16) {
    const key = view.getBigUint64(offset, true);
    if (key === 0n) break; // AT_NULL ends the vector
    const value = Number(view.getBigUint64(offset + 8, true));
    if (!Number.isInteger(value) || value <= 0) continue;
    if (key === AT_CLKTCK) units.ticksPerSecond = value;
    else if (key === AT_PAGESZ) units.pageBytes = value;
  }
  return units;
}

/** ownCpuTicks is this process's own CPU time and its reaped children's, from /proc/self/stat (bench/metrics.ts). */
export function ownCpuTicks(): { self: number; children: number } {
  const text = readFileSync("/proc/self/stat", "latin1");
  const fields = text.slice(text.lastIndexOf(")") + 2).split(" ");
  return { self: Number(fields[11]) + Number(fields[12]), children: Number(fields[13]) + Number(fields[14]) };
}
