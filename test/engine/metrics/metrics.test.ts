import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { MetricsHistory, ServiceRecord } from "../../../src/contract/engine";
import { fakeNvidiaSmiIn } from "../../fixtures/gpu/fake";
import { createToken, eventually, startTestEngine, type TestEngine, tempDir, workloadBun } from "../../helpers";
import { parseExposition, promtoolCheck, seriesValue } from "./exposition";

/**
 * GET /metrics and GET /api/metrics/history of a real engine (issue 18): the answer passes
 * `promtool check metrics`, its values follow a service that starts, is killed and restarts,
 * and dies for good, the GPU series come from the fake nvidia-smi, and the GPU memory a
 * process holds is counted for the service that process belongs to.
 */

const GPU0 = "GPU-3f9e1b62-c07a-4d58-e913-6a2b8c4d0f17";

let engine: TestEngine;
let appsFile = "";
const dirs: string[] = [];

beforeAll(async () => {
  const dir = tempDir("engine-metrics-");
  dirs.push(dir);
  appsFile = join(dir, "apps.csv");
  writeFileSync(appsFile, "");
  // The engine runs nvidia-smi as a user would point it at one (ENGINE_NVIDIA_SMI): a wrapper
  // that sets the fake's scenario and where it reads its compute apps from.
  const wrapper = fakeNvidiaSmiIn(dir, { FAKE_NVIDIA_SMI_SCENARIO: "two-h100", FAKE_NVIDIA_SMI_APPS: appsFile });
  engine = await startTestEngine({ nvidiaSmi: wrapper });
});
afterAll(async () => {
  await engine?.close();
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

async function scrape(token?: string | null): Promise<{ status: number; text: string; type: string | null }> {
  const response = await engine.call("GET", "/metrics", token === undefined ? {} : { token });
  return { status: response.status, text: await response.text(), type: response.headers.get("content-type") };
}

/** fresh takes a sample now (the collector's 5 s would do the same, later) and scrapes. */
async function fresh(): Promise<string> {
  await engine.daemon.metrics.sampleNow();
  return (await scrape()).text;
}

async function deploy(body: Record<string, unknown>): Promise<ServiceRecord> {
  const { status, body: record } = await engine.json<ServiceRecord>("POST", "/api/services", { body });
  expect(status).toBe(201);
  return record;
}

async function service(name: string): Promise<ServiceRecord> {
  return (await engine.json<ServiceRecord>("GET", `/api/services/${name}`)).body;
}

describe("GET /metrics", () => {
  test("the Prometheus text format, which promtool checks with no problem, with the fake nvidia-smi's GPUs", async () => {
    const { status, text, type } = await scrape();
    expect(status).toBe(200);
    expect(type).toBe("text/plain; version=0.0.4; charset=utf-8");
    expect(text).toContain('engine_build_info{version="');
    const text2 = await fresh();
    expect(await promtoolCheck(text2)).toEqual({ code: 0, output: "" });
    const series = parseExposition(text2);
    const gpu0 = { gpu: "0", UUID: GPU0, device: "nvidia0", pci_bus_id: "00000000:19:00.0" };
    expect(seriesValue(series, "DCGM_FI_DEV_GPU_UTIL", gpu0)).toBe(0);
    expect(seriesValue(series, "DCGM_FI_DEV_FB_USED", gpu0)).toBe(1);
    expect(seriesValue(series, "DCGM_FI_DEV_FB_FREE", gpu0)).toBe(81080);
    expect(seriesValue(series, "DCGM_FI_DEV_FB_TOTAL", gpu0)).toBe(81559);
    expect(seriesValue(series, "DCGM_FI_DEV_GPU_TEMP", gpu0)).toBe(33);
    expect(seriesValue(series, "DCGM_FI_DEV_POWER_USAGE", gpu0)).toBe(68.54);
    expect(seriesValue(series, "DCGM_FI_DEV_GPU_UTIL", { gpu: "1" })).toBe(0);
    expect(series.find((s) => s.name === "DCGM_FI_DEV_GPU_UTIL")?.labels.Hostname).toBeTruthy();
    expect(seriesValue(series, "engine_gpu_info", { gpu: "0", UUID: GPU0, model_name: "NVIDIA H100 80GB HBM3" })).toBe(1);
    expect(text2).toContain("# TYPE DCGM_FI_DEV_GPU_UTIL gauge");
    expect(text2).toContain("# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).");
  });

  test("needs a token: any role may scrape, and a scoped token sees its services only", async () => {
    expect((await scrape(null)).status).toBe(401);
    expect((await scrape("eng_not_a_token")).status).toBe(401);
    const reader = await createToken(engine, { name: "prometheus", role: "readonly" });
    expect((await scrape(reader.secret)).status).toBe(200);
    await deploy({ name: "scoped-a", command: [workloadBun(), "-e", "setInterval(() => {}, 1000)"] });
    await deploy({ name: "scoped-b", command: [workloadBun(), "-e", "setInterval(() => {}, 1000)"] });
    // One shim launcher holds both runs (decision 508): each service counts its own process only.
    await eventually(async () => {
      const series = parseExposition(await fresh());
      return ["scoped-a", "scoped-b"].every((service) => seriesValue(series, "engine_service_processes", { service }) === 1);
    });
    const scoped = await createToken(engine, { name: "team-a", role: "readonly", scope_services: ["scoped-a"] });
    const seen = parseExposition((await scrape(scoped.secret)).text);
    const services = new Set(seen.filter((s) => s.labels.service !== undefined).map((s) => s.labels.service));
    expect([...services]).toEqual(["scoped-a"]);
    expect(seen.some((s) => s.name.startsWith("DCGM_"))).toBe(false);
    await engine.json("DELETE", "/api/services/scoped-a");
    await engine.json("DELETE", "/api/services/scoped-b");
  });

  test("outside the API contract: /api/openapi.json has the history but not /metrics", async () => {
    const doc = (await engine.json<{ paths: Record<string, unknown> }>("GET", "/api/openapi.json", { token: null })).body;
    expect(Object.keys(doc.paths)).toContain("/api/metrics/history");
    expect(Object.keys(doc.paths)).not.toContain("/metrics");
  });

  test("values change when a service starts, is killed and restarts, and dies for good", async () => {
    // A workload that holds some memory and spends some CPU, so both show.
    const busy =
      "const keep = Buffer.alloc(32 * 1024 * 1024, 1); setInterval(() => { let x = 0; for (let i = 0; i < 2e6; i++) x += i; keep[0] = x & 1; }, 50);";
    await deploy({ name: "web", command: [workloadBun(), "-e", busy], restart: { policy: "always", backoff_s: 0 } });
    const running = await eventually(async () => {
      const series = parseExposition(await fresh());
      const rss = seriesValue(series, "engine_service_memory_rss_bytes", { service: "web" });
      return seriesValue(series, "engine_service_status", { service: "web", status: "running" }) === 1 && rss !== undefined && rss > 32e6
        ? series
        : null;
    });
    expect(seriesValue(running, "engine_service_status", { service: "web", status: "pending" })).toBe(0);
    expect(seriesValue(running, "engine_service_restarts_total", { service: "web" })).toBe(0);
    // Its own process only: the shim launcher that holds it is no service's (decision 508).
    expect(seriesValue(running, "engine_service_processes", { service: "web" })).toBe(1);
    const cpuBefore = seriesValue(running, "engine_service_cpu_seconds_total", { service: "web" }) as number;
    await eventually(
      async () => (seriesValue(parseExposition(await fresh()), "engine_service_cpu_seconds_total", { service: "web" }) ?? 0) > cpuBefore,
    );
    const startedBefore = seriesValue(running, "engine_service_start_time_seconds", { service: "web" });

    // Killed: the restart policy starts it again, and the counter says so.
    const pid = (await service("web")).pid as number;
    process.kill(pid, "SIGKILL");
    const restarted = await eventually(async () => {
      const series = parseExposition(await fresh());
      const record = await service("web");
      return seriesValue(series, "engine_service_restarts_total", { service: "web" }) === 1 &&
        record.status === "running" &&
        record.pid !== pid &&
        seriesValue(series, "engine_service_status", { service: "web", status: "running" }) === 1
        ? series
        : null;
    });
    expect(seriesValue(restarted, "engine_service_start_time_seconds", { service: "web" })).not.toBe(startedBefore);

    // A batch job that fails with no restart: failed, and no process series left.
    await deploy({ name: "job", kind: "batch", command: ["sh", "-c", "exit 3"], restart: { policy: "never" } });
    const failed = await eventually(async () => {
      const series = parseExposition(await fresh());
      return seriesValue(series, "engine_service_status", { service: "job", status: "failed" }) === 1 ? series : null;
    });
    expect(seriesValue(failed, "engine_service_memory_rss_bytes", { service: "job" })).toBeUndefined();
    expect(await promtoolCheck(await fresh())).toEqual({ code: 0, output: "" });
  });

  test("GPU memory a service's process holds is counted for that service", async () => {
    const web = await service("web");
    writeFileSync(appsFile, `${web.pid}, 40418, ${GPU0}\n999999, 512, ${GPU0}\n`);
    const series = await eventually(async () => {
      const parsed = parseExposition(await fresh());
      return seriesValue(parsed, "engine_service_gpu_memory_bytes", { service: "web" }) === 40418 * 1024 * 1024 ? parsed : null;
    });
    expect(seriesValue(series, "DCGM_FI_DEV_FB_USED", { gpu: "0" })).toBe(40419 + 512);
    expect(seriesValue(series, "DCGM_FI_DEV_GPU_UTIL", { gpu: "0" })).toBe(87);
    expect(seriesValue(series, "engine_gpu_memory_unattributed_bytes", { gpu: "0" })).toBe(512 * 1024 * 1024);
    expect(seriesValue(series, "engine_service_gpu_memory_bytes", { service: "job" })).toBe(0);
  });
});

describe("restore durations", () => {
  test("each finished restore is observed in the histogram, by result", async () => {
    await deploy({ name: "notes", engine: "sqlite" });
    await eventually(async () => (await service("notes")).status === "running", { timeoutMs: 30_000 });
    const dir = tempDir("engine-metrics-dump-");
    dirs.push(dir);
    const dump = join(dir, "notes.sql");
    writeFileSync(dump, "PRAGMA foreign_keys=OFF;\nBEGIN TRANSACTION;\nCREATE TABLE t (x INTEGER);\nINSERT INTO t VALUES(1);\nCOMMIT;\n");
    const restored = await engine.json("POST", "/api/databases/notes/restore", { body: { dump, timeout_s: 60 } });
    expect(restored.status).toBe(200);
    const broken = join(dir, "broken.sql");
    writeFileSync(broken, "PRAGMA foreign_keys=OFF;\nBEGIN TRANSACTION;\nCREATE TABLE t (x INTEGER);\nTHIS IS NOT SQL;\nCOMMIT;\n");
    const failed = await engine.json("POST", "/api/databases/notes/restore", { body: { dump: broken, timeout_s: 60 } });
    expect(failed.status).not.toBe(200);
    const series = parseExposition((await scrape()).text);
    const ok = { service: "notes", engine: "sqlite", result: "ok" };
    expect(seriesValue(series, "engine_database_restore_duration_seconds_count", ok)).toBe(1);
    expect(seriesValue(series, "engine_database_restore_duration_seconds_bucket", { ...ok, le: "+Inf" })).toBe(1);
    expect(seriesValue(series, "engine_database_restore_duration_seconds_count", { ...ok, result: "failed" })).toBe(1);
    await engine.json("DELETE", "/api/services/notes");
  }, 60_000);
});

describe("GET /api/metrics/history", () => {
  test("columnar series, one value per time, GPUs and services", async () => {
    await engine.daemon.metrics.sampleNow();
    const { status, body } = await engine.json<MetricsHistory>("GET", "/api/metrics/history");
    expect(status).toBe(200);
    expect(body.interval_s).toBe(5);
    expect(body.window_s).toBe(3600);
    expect(body.times.length).toBeGreaterThan(3);
    expect([...body.times].sort((a, b) => a - b)).toEqual(body.times);
    expect(body.gpus.map((gpu) => gpu.index)).toEqual([0, 1]);
    for (const gpu of body.gpus) {
      expect(gpu.utilization_pct).toHaveLength(body.times.length);
      expect(gpu.memory_used_mb).toHaveLength(body.times.length);
      expect(gpu.memory_total_mb).toBe(81559);
    }
    expect(body.gpus[0]?.memory_used_mb.at(-1)).toBe(40419 + 512);
    const web = body.services.find((s) => s.name === "web");
    expect(web).toBeDefined();
    expect(web?.rss_bytes).toHaveLength(body.times.length);
    expect(web?.rss_bytes.at(-1)).toBeGreaterThan(32e6);
    expect(web?.gpu_memory_mb.at(-1)).toBe(40418);
    expect(web?.cpu_pct.some((value) => value !== null && value > 0)).toBe(true);
    const job = body.services.find((s) => s.name === "job");
    expect(job?.rss_bytes.at(-1)).toBeNull();

    // since: only what is newer; service: only that one.
    const last = body.times.at(-2) as number;
    const newer = (await engine.json<MetricsHistory>("GET", `/api/metrics/history?since=${last}&service=web`)).body;
    expect(newer.times).toEqual(body.times.slice(-1));
    expect(newer.services.map((s) => s.name)).toEqual(["web"]);
    expect(newer.services[0]?.rss_bytes).toHaveLength(1);
  });

  test("bad input, an unknown service, a service out of scope, no token", async () => {
    expect((await engine.json("GET", "/api/metrics/history?since=yesterday")).status).toBe(422);
    expect((await engine.json("GET", "/api/metrics/history?service=nobody")).status).toBe(404);
    const scoped = await createToken(engine, { name: "team-job", role: "readonly", scope_services: ["job"] });
    expect((await engine.json("GET", "/api/metrics/history?service=web", { token: scoped.secret })).status).toBe(403);
    const mine = (await engine.json<MetricsHistory>("GET", "/api/metrics/history", { token: scoped.secret })).body;
    expect(mine.services.map((s) => s.name)).toEqual(["job"]);
    expect((await engine.json("GET", "/api/metrics/history", { token: null })).status).toBe(401);
  });
});
