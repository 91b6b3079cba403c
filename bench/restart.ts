/**
 * bench/restart.ts: what a drain-and-restart (POST /api/daemon/restart, drain_timeout_s 0)
 * of the compiled binary costs with 20 running services. While a poller sends GET /api/health
 * every 2 ms, it measures the API's unavailability window (send time of the first failed
 * request to the answer of the first success after it), the services whose pid changed
 * (must be 0: workloads are adopted, not restarted) and the time from the restart request
 * until all services are reported running again. The anchor is a bare Bun.serve process
 * killed and started again on the same port (spawn to first answer), measured by the same
 * poller in the same run; the ratios are to that anchor's window.
 *
 * Usage: bun bench/restart.ts [--rounds 3] [--services 20] [--rebuild]
 */
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { reapWorkloads } from "../test/helpers";
import { fmt, freePort, measureKillAnchor, median, POLL_INTERVAL_MS, Poller, printRows, waitForHttp } from "./lib";

const root = join(import.meta.dir, "..");
const arg = (name: string, fallback: number) => {
  const index = process.argv.indexOf(name);
  return index >= 0 ? Number(process.argv[index + 1]) : fallback;
};
const rounds = arg("--rounds", 3);
const serviceCount = arg("--services", 20);
/** REQUEST_TIMEOUT_MS bounds one list request while the engine restarts. */
const REQUEST_TIMEOUT_MS = 1000;

const binary = join(root, "dist", "engine");
if (!existsSync(binary) || process.argv.includes("--rebuild")) {
  const build = Bun.spawnSync([process.execPath, join(root, "build.ts")], { stdout: "inherit", stderr: "inherit" });
  if (build.exitCode !== 0) process.exit(1);
}

interface EngineRound {
  windowMs: number;
  allRunningMs: number;
  pidsChanged: number;
}

/** measureEngine deploys the services, then restarts the engine `rounds` times while polling it. */
async function measureEngine(): Promise<EngineRound[]> {
  const dataDir = mkdtempSync(join(tmpdir(), "engine-bench-"));
  const port = await freePort();
  const engine = Bun.spawn([binary, "serve", "--data-dir", dataDir, "--port", String(port), "--log-level", "warn"], {
    stdout: "ignore",
    stderr: "inherit",
  });
  const base = `http://127.0.0.1:${port}`;
  const results: EngineRound[] = [];
  try {
    const exited = engine.exited.then((code) => {
      throw new Error(`the engine exited with ${code}`);
    });
    await Promise.race([waitForHttp(`${base}/api/health`), exited]);
    const token = readFileSync(join(dataDir, "admin.token"), "utf8").trim();
    const headers = { authorization: `Bearer ${token}`, "content-type": "application/json" };
    const names = Array.from({ length: serviceCount }, (_, index) => `sleeper-${index}`);
    for (const name of names) {
      const response = await fetch(`${base}/api/services`, {
        method: "POST",
        headers,
        body: JSON.stringify({ name, command: "exec sleep 600" }),
      });
      if (response.status !== 201) throw new Error(`deploy ${name}: ${response.status} ${await response.text()}`);
    }
    /** runningPids answers the pids of running services by name, or null while the API does not answer. */
    const runningPids = async (): Promise<Map<string, number> | null> => {
      try {
        const response = await fetch(`${base}/api/services`, { headers, signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS) });
        if (!response.ok) return null;
        const list = (await response.json()) as { name: string; status: string; pid: number | null }[];
        return new Map(list.filter((s) => s.status === "running" && s.pid !== null).map((s) => [s.name, s.pid ?? 0]));
      } catch {
        return null;
      }
    };
    const allRunning = async (timeoutMs: number): Promise<Map<string, number>> => {
      const deadline = Date.now() + timeoutMs;
      while (Date.now() < deadline) {
        const pids = await runningPids();
        if (pids && pids.size === names.length) return pids;
        await Bun.sleep(10);
      }
      throw new Error(`not all ${names.length} services were running within ${timeoutMs} ms`);
    };
    let pids = await allRunning(30_000);
    const enginePid = engine.pid;

    const poller = new Poller(`${base}/api/health`);
    try {
      for (let round = 0; round < rounds; round++) {
        await Bun.sleep(100); // a few successes before the restart
        const since = performance.now();
        const response = await fetch(`${base}/api/daemon/restart`, {
          method: "POST",
          headers,
          body: JSON.stringify({ drain_timeout_s: 0 }),
        });
        if (response.status !== 202) throw new Error(`restart: ${response.status} ${await response.text()}`);
        await poller.recovered(since);
        const after = await allRunning(30_000);
        const allRunningMs = performance.now() - since;
        const health = (await (await fetch(`${base}/api/health`)).json()) as { pid: number };
        if (health.pid !== enginePid) throw new Error(`the engine's pid changed from ${enginePid} to ${health.pid}`);
        results.push({
          windowMs: poller.outage(since)?.windowMs ?? Number.NaN,
          allRunningMs,
          pidsChanged: names.filter((name) => after.get(name) !== pids.get(name)).length,
        });
        pids = after;
      }
    } finally {
      await poller.stop();
    }
  } finally {
    engine.kill("SIGTERM");
    await engine.exited;
    reapWorkloads(dataDir);
    rmSync(dataDir, { recursive: true, force: true });
  }
  return results;
}

const anchorWindows = await measureKillAnchor(rounds);
const engineRounds = await measureEngine();
const anchorMs = median(anchorWindows);
const windowMs = median(engineRounds.map((round) => round.windowMs));
const allRunningMs = median(engineRounds.map((round) => round.allRunningMs));
const pidsChanged = engineRounds.reduce((sum, round) => sum + round.pidsChanged, 0);
const each = (values: number[]) => values.map((value) => fmt(value, 0)).join(" / ");

printRows(
  `Restart (compiled binary, ${serviceCount} services, GET /api/health every ${POLL_INTERVAL_MS} ms; median of ${rounds} rounds)`,
  ["target", "ms (median)", "rounds ms", "ratio to anchor", "services restarted"],
  [
    ["bare Bun.serve: kill, spawn, first answer", fmt(anchorMs, 1), each(anchorWindows), "1.00", "-"],
    [
      "engine: API unavailable during drain-and-restart",
      fmt(windowMs, 1),
      each(engineRounds.map((round) => round.windowMs)),
      fmt(windowMs / anchorMs),
      String(pidsChanged),
    ],
    [
      `engine: restart request until all ${serviceCount} running`,
      fmt(allRunningMs, 1),
      each(engineRounds.map((round) => round.allRunningMs)),
      fmt(allRunningMs / anchorMs),
      "-",
    ],
  ],
);
if (pidsChanged > 0) {
  console.error(`restart: ${pidsChanged} services were restarted by a daemon restart; they must be adopted`);
  process.exit(1);
}
