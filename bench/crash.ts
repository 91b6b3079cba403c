/**
 * bench/crash.ts: the daemon killed with -9 and started again, `--kills` times, with services
 * running. PM2 and supervisord orphan their workloads here, lose their output and start
 * duplicates (DESIGN.md); the engine must adopt every workload. Each round kills the daemon
 * with SIGKILL, starts it again on the same data dir and measures:
 *
 *   - back to healthy: from the new daemon's spawn until the API answers and every service is
 *     reported running with the pid it had before the kill (adopted, not restarted);
 *   - adopted / restarted / lost: services with the same pid, a new pid, or not running;
 *   - duplicates: processes beyond one per service, counted in /proc by each workload's own
 *     argv (a restart beside an orphan would show here);
 *   - output: a ticker service prints a counter every 20 ms through every kill; at the end its
 *     log must hold every number once, in order (the shim, not the daemon, holds the pipe);
 *   - exit codes: a batch job that ends with code 7 while the daemon is dead must be reported
 *     failed with exit code 7 once the daemon is back.
 *
 * The anchor is a bare Bun.serve process killed and spawned again (spawn to first answer),
 * measured in the same run; the ratio is to that anchor.
 *
 * Usage: bun bench/crash.ts [--kills 30] [--services 10] [--compiled]
 */
import { existsSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { reapWorkloads, type SpawnedEngine, spawnEngine, tempDir } from "../test/helpers";
import { fmt, measureKillAnchor, median, numericArg, printRows } from "./lib";

const KILLS = numericArg("--kills", 30);
const SERVICES = numericArg("--services", 10);
const useCompiled = process.argv.includes("--compiled");
const binary = join(import.meta.dir, "..", "dist", "engine");
if (useCompiled && !existsSync(binary)) {
  console.error(`--compiled: ${binary} does not exist; run bun build.ts first`);
  process.exit(1);
}
/** HEALTHY_DEADLINE_MS bounds one round's recovery: no round may hang the bench. */
const HEALTHY_DEADLINE_MS = 20_000;
/** TICK_MS is the ticker's period: many lines are written while each daemon is dead. */
const TICK_MS = 20;

interface ServiceView {
  name: string;
  status: string;
  pid: number | null;
}

/** sleeperArgv gives each sleeper a unique argv, so /proc tells its processes apart. */
const sleeperArgv = (index: number) => ["sleep", `${6000 + index}.5`];

/** countProcesses counts live processes whose argv is exactly `argv`. */
function countProcesses(argv: string[]): number {
  const wanted = `${argv.join("\0")}\0`;
  let count = 0;
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (readFileSync(`/proc/${entry}/cmdline`, "utf8") === wanted) count++;
    } catch {
      // the process ended while we looked
    }
  }
  return count;
}

interface Round {
  healthyMs: number;
  adopted: number;
  restarted: number;
  lost: number;
  duplicates: number;
}

async function measureEngine(): Promise<{ rounds: Round[]; tickerGaps: number; tickerLines: number; batchExit: string }> {
  const dataDir = tempDir("engine-bench-crash-");
  const command = useCompiled ? { command: [binary] } : {};
  let engine: SpawnedEngine = await spawnEngine(dataDir, command);
  const token = readFileSync(join(dataDir, "admin.token"), "utf8").trim();
  const headers = { authorization: `Bearer ${token}`, "content-type": "application/json" };
  const api = (path: string, init: RequestInit = {}) =>
    fetch(`${engine.url}${path}`, { ...init, headers, signal: AbortSignal.timeout(2000) });
  const names = Array.from({ length: SERVICES }, (_, index) => `sleeper-${index}`);
  const rounds: Round[] = [];
  try {
    for (const [index, name] of names.entries()) {
      const response = await api("/api/services", { method: "POST", body: JSON.stringify({ name, command: sleeperArgv(index) }) });
      if (response.status !== 201) throw new Error(`deploy ${name}: ${response.status} ${await response.text()}`);
    }
    const ticker = await api("/api/services", {
      method: "POST",
      body: JSON.stringify({ name: "ticker", command: `i=0; while :; do i=$((i+1)); echo "tick $i"; sleep ${TICK_MS / 1000}; done` }),
    });
    if (ticker.status !== 201) throw new Error(`deploy ticker: ${ticker.status} ${await ticker.text()}`);
    const all = [...names, "ticker"];

    /** runningPids answers the running services' pids, or null while the API does not answer. */
    const runningPids = async (): Promise<Map<string, number> | null> => {
      try {
        const response = await api("/api/services");
        if (!response.ok) return null;
        const list = (await response.json()) as ServiceView[];
        return new Map(list.filter((s) => s.status === "running" && s.pid !== null).map((s) => [s.name, s.pid ?? 0]));
      } catch {
        return null;
      }
    };
    const waitAllRunning = async (): Promise<Map<string, number>> => {
      const deadline = Date.now() + HEALTHY_DEADLINE_MS;
      for (;;) {
        const pids = await runningPids();
        if (pids && all.every((name) => pids.has(name))) return pids;
        if (Date.now() > deadline) throw new Error(`not every service was running within ${HEALTHY_DEADLINE_MS} ms`);
        await Bun.sleep(5);
      }
    };
    let pids = await waitAllRunning();

    // Round 0 also carries a batch job that ends (code 7) while the daemon is dead.
    const batch = await api("/api/services", {
      method: "POST",
      body: JSON.stringify({ name: "ends-while-away", kind: "batch", command: "sleep 0.3; exit 7", restart: { policy: "never" } }),
    });
    if (batch.status !== 201) throw new Error(`deploy batch: ${batch.status} ${await batch.text()}`);

    for (let round = 0; round < KILLS; round++) {
      await Bun.sleep(round === 0 ? 50 : 100);
      engine.proc.kill("SIGKILL");
      await engine.proc.exited;
      // Give the workloads time to write while nobody supervises them (and the batch job to end).
      await Bun.sleep(round === 0 ? 600 : 100);
      const spawnedAt = performance.now();
      engine = await spawnEngine(dataDir, command);
      const after = await waitAllRunning();
      const healthyMs = performance.now() - spawnedAt;
      const adopted = all.filter((name) => after.get(name) === pids.get(name)).length;
      const restarted = all.filter((name) => after.has(name) && after.get(name) !== pids.get(name)).length;
      const lost = all.filter((name) => !after.has(name)).length;
      const duplicates = names.reduce((sum, _, index) => sum + Math.max(0, countProcesses(sleeperArgv(index)) - 1), 0);
      rounds.push({ healthyMs, adopted, restarted, lost, duplicates });
      pids = after;
    }

    const diagnosis = (await (await api("/api/services/ends-while-away/diagnose")).json()) as {
      status: string;
      forensics: { last_exit_code: number | null };
    };
    const batchExit = `${diagnosis.status}, exit code ${diagnosis.forensics.last_exit_code}`;

    // Every tick printed through all the kills must be in the log once, in order.
    const logs = await (await api("/api/services/ticker/logs?tail=100000")).text();
    const ticks = [...logs.matchAll(/tick (\d+)/g)].map((match) => Number(match[1]));
    let gaps = 0;
    for (let i = 1; i < ticks.length; i++) if (ticks[i] !== (ticks[i - 1] ?? 0) + 1) gaps++;
    if ((ticks[0] ?? 1) !== 1) gaps++;
    return { rounds, tickerGaps: gaps, tickerLines: ticks.length, batchExit };
  } finally {
    await engine.stop();
    reapWorkloads(dataDir);
    rmSync(dataDir, { recursive: true, force: true });
  }
}

const anchorWindows = await measureKillAnchor(5);
const { rounds, tickerGaps, tickerLines, batchExit } = await measureEngine();
const anchorMs = median(anchorWindows);
const healthy = rounds.map((round) => round.healthyMs);
const mean = healthy.reduce((sum, value) => sum + value, 0) / Math.max(1, healthy.length);
const total = (key: keyof Round) => rounds.reduce((sum, round) => sum + round[key], 0);
const sorted = [...healthy].sort((a, b) => a - b);

printRows(
  `Daemon kill -9 (${useCompiled ? "compiled binary" : "from source"}, ${SERVICES} sleepers + a ticker, ${KILLS} kills)`,
  ["target", "ms median", "ms mean", "ms p99", "ratio to anchor (median)"],
  [
    ["bare Bun.serve: kill -9, spawn, first answer", fmt(anchorMs, 1), "-", "-", "1.00"],
    [
      "engine: kill -9, spawn, every service running and adopted",
      fmt(median(healthy), 1),
      fmt(mean, 1),
      fmt(sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * 0.99))] ?? Number.NaN, 1),
      fmt(median(healthy) / anchorMs),
    ],
  ],
);
printRows(
  "Daemon kill -9: what the workloads kept",
  ["adopted", "restarted", "lost", "duplicates", "ticker lines", "ticker gaps", "batch ended while away"],
  [[total("adopted"), total("restarted"), total("lost"), total("duplicates"), tickerLines, tickerGaps, batchExit]],
);
if (total("restarted") + total("lost") + total("duplicates") + tickerGaps > 0 || !batchExit.includes("exit code 7")) {
  console.error("crash: a workload was restarted, lost or duplicated, output was lost, or an exit code was not kept");
  process.exit(1);
}
