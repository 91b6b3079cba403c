/**
 * bench/metrics.ts: what metrics cost the daemon (issue 18). Two compiled engines run side by
 * side in the same run, each with 50 services (`sleep`) and 8 GPUs from the fake nvidia-smi
 * (test/fixtures/gpu/nvidia-smi, scenario eight-h100): one samples every 5 s as shipped, the
 * other with sampling off (ENGINE_METRICS_INTERVAL_S=0), the idle anchor. Printed:
 *
 * - one GET /metrics scrape of the sampling engine: p50/p99 over sequential scrapes;
 * - each daemon's own CPU time (utime + stime of its process) over the same window, and the
 *   difference in % of one core (goal: < 1 %), with the CPU of the nvidia-smi processes it
 *   started (reaped children: cutime + cstime) beside it. The fake nvidia-smi is a bash
 *   script; a real one costs more per call, in its own process, not the daemon's.
 *
 * Usage: bun bench/metrics.ts [--seconds 60] [--scrapes 300] [--services 50]
 */
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fmt, freePort, numericArg, printRows, waitForHttp } from "./lib";

const root = join(import.meta.dir, "..");
const seconds = numericArg("--seconds", 60);
const scrapes = numericArg("--scrapes", 300);
const serviceCount = numericArg("--services", 50);

const binary = join(root, "dist", "engine");
if (!existsSync(binary) || process.argv.includes("--rebuild")) {
  const build = Bun.spawnSync([process.execPath, join(root, "build.ts")], { stdout: "inherit", stderr: "inherit" });
  if (build.exitCode !== 0) process.exit(1);
}

const work = mkdtempSync(join(tmpdir(), "engine-bench-metrics-"));
const wrapper = join(work, "nvidia-smi");
writeFileSync(
  wrapper,
  `#!/usr/bin/env bash\nexport FAKE_NVIDIA_SMI_SCENARIO=eight-h100\nexec ${JSON.stringify(join(root, "test", "fixtures", "gpu", "nvidia-smi"))} "$@"\n`,
);
chmodSync(wrapper, 0o755);

interface Engine {
  name: string;
  proc: ReturnType<typeof Bun.spawn>;
  base: string;
  headers: Record<string, string>;
  dataDir: string;
}

async function startEngine(name: string, intervalS: number): Promise<Engine> {
  const dataDir = join(work, name);
  const port = await freePort();
  const proc = Bun.spawn([binary, "serve", "--data-dir", dataDir, "--port", String(port), "--log-level", "warn"], {
    env: {
      PATH: process.env.PATH ?? "/usr/bin:/bin",
      HOME: process.env.HOME ?? "/tmp",
      ENGINE_PROXY: "off",
      ENGINE_NVIDIA_SMI: wrapper,
      ENGINE_METRICS_INTERVAL_S: String(intervalS),
    },
    stdout: "ignore",
    stderr: "inherit",
  });
  const base = `http://127.0.0.1:${port}`;
  await waitForHttp(`${base}/api/health`);
  const token = readFileSync(join(dataDir, "admin.token"), "utf8").trim();
  return { name, proc, base, headers: { authorization: `Bearer ${token}` }, dataDir };
}

async function deployServices(engine: Engine): Promise<void> {
  for (let i = 0; i < serviceCount; i++) {
    const response = await fetch(`${engine.base}/api/services`, {
      method: "POST",
      headers: { ...engine.headers, "content-type": "application/json" },
      body: JSON.stringify({ name: `svc-${i}`, command: ["sleep", "3600"] }),
    });
    if (response.status !== 201) throw new Error(`${engine.name}: deploy svc-${i} answered ${response.status}: ${await response.text()}`);
  }
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    const list = (await (await fetch(`${engine.base}/api/services`, { headers: engine.headers })).json()) as { status: string }[];
    if (list.filter((service) => service.status === "running").length === serviceCount) return;
    await Bun.sleep(200);
  }
  throw new Error(`${engine.name}: the services did not all start`);
}

/** cpuTicks reads a process's own CPU and its reaped children's from /proc/<pid>/stat. */
function cpuTicks(pid: number): { self: number; children: number } {
  const text = readFileSync(`/proc/${pid}/stat`, "latin1");
  const fields = text.slice(text.lastIndexOf(")") + 2).split(" ");
  return { self: Number(fields[11]) + Number(fields[12]), children: Number(fields[13]) + Number(fields[14]) };
}

const ticksPerSecond = Number(Bun.spawnSync(["getconf", "CLK_TCK"]).stdout.toString().trim()) || 100;
const engines: Engine[] = [];
try {
  const sampling = await startEngine("sampling", 5);
  engines.push(sampling);
  const idle = await startEngine("idle", 0);
  engines.push(idle);
  await deployServices(sampling);
  await deployServices(idle);

  // The scrape: what Prometheus pays every scrape interval, after a sample has been taken.
  const metrics = `${sampling.base}/metrics`;
  const waitSample = Date.now() + 15_000;
  while (
    Date.now() < waitSample &&
    !(await (await fetch(metrics, { headers: sampling.headers })).text()).includes("DCGM_FI_DEV_GPU_UTIL")
  ) {
    await Bun.sleep(200);
  }
  const latencies: number[] = [];
  let bytes = 0;
  for (let i = 0; i < scrapes + 20; i++) {
    const started = performance.now();
    const text = await (await fetch(metrics, { headers: sampling.headers })).text();
    if (i >= 20) latencies.push(performance.now() - started);
    bytes = text.length;
  }
  latencies.sort((a, b) => a - b);
  const at = (p: number) => latencies[Math.min(latencies.length - 1, Math.floor((p / 100) * latencies.length))] ?? Number.NaN;
  const series = (await (await fetch(metrics, { headers: sampling.headers })).text())
    .split("\n")
    .filter((line) => line && !line.startsWith("#"));
  printRows(
    `GET /metrics with ${serviceCount} services and 8 GPUs (compiled binary, ${scrapes} sequential scrapes)`,
    ["target", "p50 ms", "p99 ms", "bytes", "series"],
    [["engine /metrics", fmt(at(50)), fmt(at(99)), bytes, series.length]],
  );

  // The collector's cost: both daemons over the same window, with nothing else asked of them.
  const before = engines.map((engine) => cpuTicks(engine.proc.pid));
  const started = performance.now();
  await Bun.sleep(seconds * 1000);
  const elapsedS = (performance.now() - started) / 1000;
  const after = engines.map((engine) => cpuTicks(engine.proc.pid));
  const pct = (ticks: number) => (ticks / ticksPerSecond / elapsedS) * 100;
  const own = engines.map((_, i) => pct((after[i]?.self ?? 0) - (before[i]?.self ?? 0)));
  const children = engines.map((_, i) => pct((after[i]?.children ?? 0) - (before[i]?.children ?? 0)));
  printRows(
    `Daemon CPU over ${fmt(elapsedS, 0)} s, ${serviceCount} services and 8 GPUs each (% of one core; ${ticksPerSecond} ticks/s)`,
    ["daemon", "own CPU %", "nvidia-smi children CPU %"],
    [
      ["idle (ENGINE_METRICS_INTERVAL_S=0)", fmt(own[1] ?? 0, 3), fmt(children[1] ?? 0, 3)],
      ["sampling every 5 s", fmt(own[0] ?? 0, 3), fmt(children[0] ?? 0, 3)],
      ["collecting history costs", fmt((own[0] ?? 0) - (own[1] ?? 0), 3), fmt((children[0] ?? 0) - (children[1] ?? 0), 3)],
    ],
  );
  console.log(`goal: collecting costs the daemon < 1 % of one core: ${(own[0] ?? 0) - (own[1] ?? 0) < 1 ? "met" : "NOT met"}`);
} finally {
  for (const engine of engines) {
    // Stop every service first: workloads outlive the daemon by design.
    await fetch(`${engine.base}/api/services`, { headers: engine.headers })
      .then((response) => response.json() as Promise<{ name: string }[]>)
      .then((list) =>
        Promise.all(
          list.map((service) => fetch(`${engine.base}/api/services/${service.name}`, { method: "DELETE", headers: engine.headers })),
        ),
      )
      .catch(() => undefined);
    engine.proc.kill("SIGTERM");
    await engine.proc.exited;
  }
  rmSync(work, { recursive: true, force: true });
}
