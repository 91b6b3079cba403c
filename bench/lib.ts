/**
 * Shared bench helpers. Benchmarks print each figure next to its anchor measured in the same
 * run, as a ratio: this machine is small and noisy, so ratios are what we compare.
 */
import { readdirSync, readFileSync } from "node:fs";
import { type MountEntry, parseMountInfo } from "../src/engine/supervisor/cgroup";
import { PURGE_DELAY_VAR } from "../src/lib/allocator";
import { freePort } from "../test/helpers";
export interface LoadResult {
  requests: number;
  errors: number;
  rps: number;
  p50: number;
  p99: number;
}

function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? Number.NaN;
}

/**
 * loadTest drives `url` with `concurrency` keep-alive loops for `durationMs` (bounded in time
 * and count) and reports throughput and latency percentiles in milliseconds.
 */
export async function loadTest(
  url: string,
  { headers = {}, concurrency = 32, durationMs = 3000, maxRequests = 200_000, warmupMs = 500 } = {},
): Promise<LoadResult> {
  const run = async (ms: number, record: boolean) => {
    const latencies: number[] = [];
    let errors = 0;
    let sent = 0;
    const deadline = performance.now() + ms;
    const loop = async () => {
      while (performance.now() < deadline && sent < maxRequests) {
        sent++;
        const start = performance.now();
        try {
          const response = await fetch(url, { headers });
          await response.arrayBuffer();
          if (!response.ok) errors++;
        } catch {
          errors++;
        }
        if (record) latencies.push(performance.now() - start);
      }
    };
    const started = performance.now();
    await Promise.all(Array.from({ length: concurrency }, loop));
    return { latencies, errors, elapsed: performance.now() - started };
  };
  await run(warmupMs, false);
  const { latencies, errors, elapsed } = await run(durationMs, true);
  latencies.sort((a, b) => a - b);
  return {
    requests: latencies.length,
    errors,
    rps: (latencies.length / elapsed) * 1000,
    p50: percentile(latencies, 50),
    p99: percentile(latencies, 99),
  };
}

/** waitForHttp polls a URL until it answers, or throws after the deadline. */
export async function waitForHttp(url: string, timeoutMs = 20000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    try {
      await fetch(url);
      return;
    } catch {
      await Bun.sleep(50);
    }
  }
  throw new Error(`${url} did not answer within ${timeoutMs} ms`);
}

export { freePort };

/**
 * runtimeOptions are this process's `BUN_JSC_*` settings, which a bench passes on to the engine
 * it starts (and the engine to its proxy processes), so that a run measures one of the runtime's
 * options: `BUN_JSC_useFTLJIT=0 bun bench/scheduler.ts`. The engine's own environment is
 * otherwise the test helpers' clean one.
 */
export function runtimeOptions(env: Record<string, string | undefined> = process.env): Record<string, string> {
  const options: Record<string, string> = {};
  for (const [name, value] of Object.entries(env)) if (name.startsWith("BUN_JSC_") && value !== undefined) options[name] = value;
  return options;
}

/** numericArg reads `--name N` from the command line: a whole number of at least `min` (1 unless said), else the fallback. */
export function numericArg(name: string, fallback: number, min = 1): number {
  const index = process.argv.indexOf(name);
  const value = index >= 0 ? Number(process.argv[index + 1]) : fallback;
  return Number.isFinite(value) && value >= min ? Math.floor(value) : fallback;
}

export function fmt(n: number, digits = 2): string {
  return Number.isFinite(n) ? n.toFixed(digits) : "n/a";
}

export function printRows(title: string, columns: string[], rows: (string | number)[][]): void {
  const cells = rows.map((r) => r.map(String));
  const widths = columns.map((c, i) => Math.max(c.length, ...cells.map((r) => (r[i] ?? "").length)));
  console.log(`\n${title}`);
  console.log(columns.map((c, i) => c.padEnd(widths[i] ?? 0)).join("  "));
  for (const row of cells) console.log(row.map((c, i) => c.padEnd(widths[i] ?? 0)).join("  "));
}

/** median is the middle value (the lower one of an even count); NaN for none. */
export function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted.length === 0 ? Number.NaN : (sorted[Math.floor((sorted.length - 1) / 2)] ?? Number.NaN);
}

/** POLL_INTERVAL_MS is the pause between a Poller's requests. */
export const POLL_INTERVAL_MS = 2;
/** POLL_TIMEOUT_MS bounds one poll, so a connection the old process never answers counts as a failure. */
const POLL_TIMEOUT_MS = 1000;

interface Sample {
  sent: number;
  answered: number;
  ok: boolean;
}

/**
 * Poller sends GET `url` back to back with POLL_INTERVAL_MS between requests and records
 * every outcome, until stopped: the outage of a restart is read from its samples.
 */
export class Poller {
  readonly samples: Sample[] = [];
  private running = true;
  private readonly done: Promise<void>;

  constructor(url: string) {
    this.done = (async () => {
      while (this.running) {
        const sent = performance.now();
        let ok = false;
        try {
          const response = await fetch(url, { signal: AbortSignal.timeout(POLL_TIMEOUT_MS) });
          await response.arrayBuffer();
          ok = response.ok;
        } catch {
          ok = false;
        }
        this.samples.push({ sent, answered: performance.now(), ok });
        await Bun.sleep(POLL_INTERVAL_MS);
      }
    })();
  }

  /**
   * outage is the window from the first failure answered after `since` (sent then, or in flight
   * at that moment: a poll the kill cut off is the outage's first sign, and the only one when
   * the new process answers the poll after it) to the first success answered after it, counted
   * from `since` at the earliest; 0 if none failed.
   */
  outage(since: number): { windowMs: number; failures: number } | null {
    const after = this.samples.filter((sample) => sample.answered >= since);
    const firstFailure = after.findIndex((sample) => !sample.ok);
    if (firstFailure < 0) return { windowMs: 0, failures: 0 };
    const recovery = after.findIndex((sample, index) => index > firstFailure && sample.ok);
    if (recovery < 0) return null;
    return {
      windowMs: (after[recovery]?.answered ?? Number.NaN) - Math.max(since, after[firstFailure]?.sent ?? Number.NaN),
      failures: recovery - firstFailure,
    };
  }

  /** recovered waits until a success was answered after a failure sent after `since`. */
  async recovered(since: number, timeoutMs = 30_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline) {
      const outage = this.outage(since);
      if (outage && outage.failures > 0) return;
      await Bun.sleep(5);
    }
    throw new Error(`the API did not go down and come back within ${timeoutMs} ms`);
  }

  async stop(): Promise<void> {
    this.running = false;
    await this.done;
  }
}

/**
 * measureKillAnchor is the anchor of the restart benches: a bare Bun.serve process killed with
 * SIGKILL and spawned again on the same port, `rounds` times; each window runs from the first
 * failed poll to the first answer of the new process.
 */
export async function measureKillAnchor(rounds: number): Promise<number[]> {
  const port = await freePort();
  const source = `Bun.serve({ port: ${port}, hostname: "127.0.0.1", fetch: () => Response.json({ status: "ok" }) });`;
  const spawnAnchor = () => Bun.spawn([process.execPath, "-e", source], { stdout: "ignore", stderr: "inherit" });
  let anchor = spawnAnchor();
  const url = `http://127.0.0.1:${port}/api/health`;
  const windows: number[] = [];
  try {
    await waitForHttp(url);
    const poller = new Poller(url);
    try {
      for (let round = 0; round < rounds; round++) {
        await Bun.sleep(100); // a few successes before the kill
        const since = performance.now();
        anchor.kill("SIGKILL");
        await anchor.exited;
        anchor = spawnAnchor();
        await poller.recovered(since);
        windows.push(poller.outage(since)?.windowMs ?? Number.NaN);
      }
    } finally {
      await poller.stop();
    }
  } finally {
    anchor.kill("SIGKILL");
    await anchor.exited;
  }
  return windows;
}

/**
 * fileSystemOf names the file system that holds `path` as /proc/self/mountinfo lists it, and for
 * ext4 whether it has a journal (a jbd2 entry under /proc/fs/jbd2 for its device). It matters
 * to figures that create and delete many files: ext4 without a journal checks every candidate
 * inode for a recent deletion (`recently_deleted`), a scan that grows with what was deleted in
 * the last minutes (decision 473).
 */
export function fileSystemOf(path: string): { description: string; scansRecentDeletions: boolean } {
  let best: MountEntry | null = null;
  try {
    for (const mount of parseMountInfo(readFileSync("/proc/self/mountinfo", "utf8"))) {
      const holds = path === mount.mountPoint || path.startsWith(mount.mountPoint === "/" ? "/" : `${mount.mountPoint}/`);
      if (holds && mount.mountPoint.length >= (best?.mountPoint.length ?? 0)) best = mount;
    }
  } catch {
    // no /proc
  }
  if (!best) return { description: "unknown", scansRecentDeletions: false };
  if (best.fsType !== "ext4") return { description: `${best.fsType} at ${best.mountPoint}`, scansRecentDeletions: false };
  const device = best.source.split("/").pop() ?? "";
  let journal = false;
  try {
    journal = readdirSync("/proc/fs/jbd2").some((entry) => entry.startsWith(`${device}-`));
  } catch {
    // no jbd2 entries at all: no ext4 here has a journal
  }
  return {
    description: `ext4 ${journal ? "with" : "without"} a journal (${best.source}) at ${best.mountPoint}`,
    scansRecentDeletions: !journal,
  };
}

/**
 * machineOf says what the bench runs on, for figures that create processes: the hypervisor the
 * kernel found (its boot log, where this user may read it; else whether the CPU flags a VM),
 * and what a fresh anonymous page costs at its first write, measured here. Process creation is
 * mostly page-table work, and its price depends on the hypervisor far more than on the CPU: in
 * a PVM guest (shadow paging, no nested EPT) a first touch costs ~14 µs against ~0.5 on bare
 * metal, and a fork 0.75 ms (decision 504), so a figure with two processes a job (the shim and
 * its workload) falls further than its one-process anchor.
 */
export function machineOf(): { hypervisor: string; pageFaultUs: number } {
  let hypervisor = "none flagged";
  try {
    if (/^flags\s*:.*\bhypervisor\b/m.test(readFileSync("/proc/cpuinfo", "utf8"))) hypervisor = "a VM (hypervisor not named)";
  } catch {
    // no /proc
  }
  const dmesg = Bun.which("dmesg") ? Bun.spawnSync(["dmesg"], { stdout: "pipe", stderr: "ignore" }) : null;
  const detected = dmesg?.success ? /Hypervisor detected: (\S+)/.exec(dmesg.stdout.toString()) : null;
  if (detected?.[1]) hypervisor = detected[1];
  return { hypervisor, pageFaultUs: firstTouchUs() };
}

/**
 * spawnBesideBusyCore times a loop of `true` spawns (Bun.spawn, each awaited, as the scheduler
 * bench's anchor) alone, again while a shell loop keeps another core busy, and again while
 * another core starts processes too (a shell loop of /bin/true), in ms a spawn (medians of 3
 * rounds each way). The anchor runs one process at a time and leaves the other core idle; the
 * engine's jobs keep every core busy, and their workloads start and end on both cores at once.
 * Where the later figures are much higher, the machine charges a process's creation for what
 * its other cores do, and a ratio against the anchor says more about the VM than about the
 * scheduler (decisions 512, 520).
 */
export async function spawnBesideBusyCore(spawns = 150): Promise<{ aloneMs: number; besideBusyMs: number; besideSpawningMs: number }> {
  const loop = async () => {
    const start = performance.now();
    for (let i = 0; i < spawns; i++) {
      await Bun.spawn(["true"], { stdin: "ignore", stdout: "ignore", stderr: "ignore" }).exited;
    }
    return (performance.now() - start) / spawns;
  };
  const rounds = async () => {
    const figures: number[] = [];
    for (let round = 0; round < 3; round++) figures.push(await loop());
    return median(figures);
  };
  /** beside times the rounds while `script` runs in a shell of its own. */
  const beside = async (script: string) => {
    const neighbour = Bun.spawn(["sh", "-c", script], { stdin: "ignore", stdout: "ignore", stderr: "ignore" });
    try {
      await Bun.sleep(100);
      return await rounds();
    } finally {
      neighbour.kill("SIGKILL");
      await neighbour.exited;
    }
  };
  const aloneMs = await rounds();
  // A shell's `:` is a builtin: the loop makes no system call and touches no new page.
  const besideBusyMs = await beside("while :; do :; done");
  // The shell forks and execs each /bin/true: page-table work on the other core, as the jobs' workloads make.
  const besideSpawningMs = await beside("while :; do /bin/true; done");
  return { aloneMs, besideBusyMs, besideSpawningMs };
}

/** firstTouchUs is the median over 5 rounds of the time a first write to a fresh 4 KiB page takes, in µs (64 MiB a round). */
function firstTouchUs(): number {
  const pages = 16_384;
  const rounds: number[] = [];
  for (let round = 0; round < 5; round++) {
    // A buffer this large is mapped, not taken from the heap: each page faults at its first write.
    const buffer = new Uint8Array(pages * 4096);
    const start = performance.now();
    for (let page = 0; page < pages; page++) buffer[page * 4096] = 1;
    rounds.push(((performance.now() - start) * 1000) / pages);
  }
  return median(rounds);
}

/** systemCounts is the machine's page faults and context switches so far (/proc/vmstat, /proc/stat); zeros where they cannot be read. */
export function systemCounts(): { faults: number; switches: number } {
  try {
    const faults = Number(/^pgfault (\d+)$/m.exec(readFileSync("/proc/vmstat", "utf8"))?.[1] ?? 0);
    const switches = Number(/^ctxt (\d+)$/m.exec(readFileSync("/proc/stat", "utf8"))?.[1] ?? 0);
    return { faults, switches };
  } catch {
    return { faults: 0, switches: 0 };
  }
}

/**
 * allocatorSettingOf is the allocator setting a process runs with (`MIMALLOC_PURGE_DELAY=…` from
 * its environment, decision 526), as a bench prints it beside its figures.
 */
export function allocatorSettingOf(pid: number | undefined): string {
  try {
    const environ = readFileSync(`/proc/${pid}/environ`, "utf8").split("\0");
    return environ.find((entry) => entry.startsWith(`${PURGE_DELAY_VAR}=`)) ?? `${PURGE_DELAY_VAR} unset`;
  } catch {
    return "environment unreadable";
  }
}
