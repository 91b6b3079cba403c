import { FFIType, ptr } from "bun:ffi";
import { readFileSync } from "node:fs";
import { openLibc } from "./libc";

/**
 * CPU affinity for the proxy's processes (docs/decisions.md 521): the daemon reads the CPUs it
 * may run on, and each proxy process pins its own event-loop thread to one of them, the way
 * nginx's `worker_cpu_affinity auto` binds worker N to CPU N.
 */

/** MAX_CPUS bounds a CPU list this module reads or a mask it writes (the kernel's default NR_CPUS is 8192 at most). */
const MAX_CPUS = 8192;

/**
 * parseCpuList reads the kernel's list format ("0-3,8,10-11", as in `Cpus_allowed_list` and
 * cpuset.cpus) into the CPUs it names, ascending; null for text that is not one.
 */
export function parseCpuList(text: string): number[] | null {
  const cpus = new Set<number>();
  for (const part of text.trim().split(",")) {
    const match = /^(\d+)(?:-(\d+))?$/.exec(part);
    if (!match) return null;
    const first = Number(match[1]);
    const last = match[2] === undefined ? first : Number(match[2]);
    if (last < first || last >= MAX_CPUS) return null;
    for (let cpu = first; cpu <= last; cpu++) cpus.add(cpu);
  }
  return [...cpus].sort((a, b) => a - b);
}

/**
 * allowedCpus is the CPUs this process may run on (its affinity, which a cpuset, `taskset` or
 * systemd's `CPUAffinity=` narrows), from /proc/self/status; null where that cannot be read.
 */
export function allowedCpus(statusText?: string): number[] | null {
  let text = statusText;
  if (text === undefined) {
    try {
      text = readFileSync("/proc/self/status", "utf8");
    } catch {
      return null;
    }
  }
  const line = /^Cpus_allowed_list:\s*(\S+)\s*$/m.exec(text);
  return line?.[1] ? parseCpuList(line[1]) : null;
}

let setAffinity: ((tid: number, size: number, mask: unknown) => number) | null | undefined;

/**
 * pinCallingThread binds the calling thread (the event loop's, for a proxy process) to `cpu`
 * with sched_setaffinity(2). Threads it starts afterwards inherit that; those already running
 * (the runtime's helpers: the collector's, the JIT's) keep the process's set, so a collection
 * can still use another core. False, changing nothing, where the C library or the kernel
 * refuses (a CPU outside the allowed set, no glibc).
 */
export function pinCallingThread(cpu: number): boolean {
  if (!Number.isInteger(cpu) || cpu < 0 || cpu >= MAX_CPUS) return false;
  if (setAffinity === undefined) {
    const symbols = openLibc({ sched_setaffinity: { args: [FFIType.i32, FFIType.u64, FFIType.ptr], returns: FFIType.i32 } });
    setAffinity = symbols ? (symbols.sched_setaffinity as unknown as typeof setAffinity) : null;
  }
  if (!setAffinity) return false;
  // A cpu_set_t of whole 64-bit words, as glibc's CPU_ALLOC_SIZE makes it.
  const mask = new Uint8Array(Math.ceil((cpu + 1) / 64) * 8);
  mask[cpu >> 3] = 1 << (cpu & 7);
  return setAffinity(0, mask.length, ptr(mask)) === 0;
}

/**
 * cpuOfSlot is the CPU for the proxy process in `slot` (0, 1, ...): the slot-th of the allowed
 * CPUs, round the list again where there are more processes than CPUs.
 */
export function cpuOfSlot(cpus: readonly number[], slot: number): number | null {
  return cpus.length === 0 ? null : (cpus[slot % cpus.length] ?? null);
}
