import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { eventually, freePort, REPO_ROOT, startTestEngine, type TestEngine, workloadBun } from "../../helpers";
import { ServiceClient } from "./harness";

const FAKE_NVIDIA_SMI = join(REPO_ROOT, "test", "fixtures", "gpu", "nvidia-smi");

let engine: TestEngine;
let api: ServiceClient;
beforeAll(async () => {
  // The fake prints real nvidia-smi output for two H100s; the engine runs it as it would the real one.
  process.env.FAKE_NVIDIA_SMI_SCENARIO = "two-h100";
  engine = await startTestEngine({ nvidiaSmi: FAKE_NVIDIA_SMI });
  api = new ServiceClient(engine);
});
afterAll(async () => {
  await engine.close();
});

/**
 * ownFile is a file in a service's own data dir: as root, the engine runs each workload as a
 * user of its own, which may write there and nowhere else in the engine's data dir.
 */
const ownFile = (service: string, file: string) => join(engine.dataDir, "data", service, file);

/** gpuCommand writes the GPUs a workload was given to `gpus` in its data dir, then stays up. */
const gpuCommand = () => `printf '%s|%s' "$CUDA_VISIBLE_DEVICES" "$NVIDIA_VISIBLE_DEVICES" > "$SERVICE_DATA_DIR/gpus"; exec sleep 300`;

describe("GPUs (fake nvidia-smi, real format)", () => {
  test("the inventory comes from nvidia-smi and whole GPUs are assigned one service each", async () => {
    const inventory = await engine.json<{ source: string; devices: { uuid: string; memory_total_mb: number }[] }>("GET", "/api/gpus");
    expect(inventory.status).toBe(200);
    expect(inventory.body.source).toBe("nvidia-smi");
    expect(inventory.body.devices.map((d) => d.memory_total_mb)).toEqual([81559, 81559]);
    const [first, second] = inventory.body.devices.map((d) => d.uuid);

    await api.deploy({ name: "gpu-a", command: gpuCommand(), gpus: 1 });
    await api.deploy({ name: "gpu-b", command: gpuCommand(), gpus: 1 });
    await api.waitFor("gpu-a", "running");
    await api.waitFor("gpu-b", "running");
    await eventually(() => existsSync(ownFile("gpu-a", "gpus")) && existsSync(ownFile("gpu-b", "gpus")));
    const seen = [readFileSync(ownFile("gpu-a", "gpus"), "utf8"), readFileSync(ownFile("gpu-b", "gpus"), "utf8")].sort();
    expect(seen).toEqual([`${first}|${first}`, `${second}|${second}`].sort());

    // A third whole-GPU service waits, with a placement message, until one is free.
    await api.deploy({ name: "gpu-c", command: gpuCommand(), gpus: 1 });
    const waiting = await api.waitFor("gpu-c", "pending", (r) => (r.status_message ?? "").includes("GPU"));
    expect(waiting.status_message).toMatch(/waiting/);
    expect((await api.diagnose("gpu-c")).remediation?.code).toBe("wait_for_gpu");
    const held = await engine.json<{ devices: { holders: { service: string }[] }[] }>("GET", "/api/gpus");
    expect(held.body.devices.flatMap((d) => d.holders.map((h) => h.service)).sort()).toEqual(["gpu-a", "gpu-b"]);

    await api.control("gpu-a", "stop");
    await api.waitFor("gpu-c", "running");
    await eventually(() => existsSync(ownFile("gpu-c", "gpus")));
    expect(readFileSync(ownFile("gpu-c", "gpus"), "utf8")).toBe(readFileSync(ownFile("gpu-a", "gpus"), "utf8"));
    for (const name of ["gpu-b", "gpu-c"]) await api.control(name, "stop");
    // The next test places on both GPUs free: it starts once their holds are gone, not while the stops settle.
    for (const name of ["gpu-b", "gpu-c"]) await api.waitFor(name, "stopped");
    await eventually(async () => {
      const after = await engine.json<{ devices: { holders: unknown[] }[] }>("GET", "/api/gpus");
      return after.body.devices.every((device) => device.holders.length === 0);
    });
  });

  test("memory-based sharing packs several services onto one GPU", async () => {
    for (const name of ["share-1", "share-2", "share-3"]) {
      expect((await api.deploy({ name, command: gpuCommand(), gpu_memory_mb: 20000 })).status).toBe(201);
    }
    for (const name of ["share-1", "share-2", "share-3"]) await api.waitFor(name, "running");
    await eventually(() => ["share-1", "share-2", "share-3"].every((name) => existsSync(ownFile(name, "gpus"))));
    const devices = new Set(["share-1", "share-2", "share-3"].map((name) => readFileSync(ownFile(name, "gpus"), "utf8")));
    expect(devices.size).toBe(1); // best fit: all three on the same GPU
    const inventory = await engine.json<{ devices: { reserved_mb: number; holders: unknown[] }[] }>("GET", "/api/gpus");
    expect(inventory.body.devices.map((d) => d.reserved_mb).sort()).toEqual([0, 60000]);
    for (const name of ["share-1", "share-2", "share-3"]) await api.control(name, "stop");
  });

  test("a request larger than the host is refused at once with 409", async () => {
    const tooMany = await api.deploy({ name: "gpu-huge", command: ["true"], gpus: 3 });
    expect(tooMany.status).toBe(409);
    expect(JSON.stringify(tooMany.body)).toContain("requested 3 GPUs but this host has 2");
    const tooBig = await api.deploy({ name: "gpu-fat", command: ["true"], gpu_memory_mb: 100000 });
    expect(tooBig.status).toBe(409);
  });
});

describe("health probes", () => {
  /** A real HTTP server (Bun) whose answer follows a flag file: 503 while the file exists. */
  const server = (flag: string) => [
    workloadBun(),
    "-e",
    `Bun.serve({ port: Number(process.env.PORT), hostname: "127.0.0.1", fetch: () => new Response("x", { status: require("node:fs").existsSync(${JSON.stringify(flag)}) ? 503 : 200 }) })`,
  ];

  test("http: failing turns the service degraded, then restarts it past the threshold; passing again is running", async () => {
    const flag = ownFile("probed", "unhealthy");
    await api.deploy({
      name: "probed",
      command: server(flag),
      port: 18311,
      health: { type: "http", path: "/health", interval_s: 0.1, timeout_s: 1, failure_threshold: 3 },
      restart: { policy: "always", max_restarts: 10, window_seconds: 60, backoff_s: 0 },
    });
    const first = await api.waitFor("probed", "running", (r) => r.pid !== null);
    await eventually(async () => (await api.diagnose("probed")).health.probe?.ok === true);
    writeFileSync(flag, "");
    await api.waitFor("probed", "degraded", () => true, 5000);
    const degraded = await api.diagnose("probed");
    expect(degraded.health.observations.some((o) => o.includes("HTTP 503"))).toBe(true);
    expect(degraded.remediation?.code).toBe("check_health");
    // past the threshold the engine restarts it: a new pid, one restart counted
    await eventually(async () => {
      const record = await api.get("probed");
      return record.pid !== null && record.pid !== first.pid && record.restarts >= 1;
    });
    rmSync(flag);
    await api.waitFor("probed", "running");
    await eventually(async () => (await api.diagnose("probed")).health.probe?.ok === true);
    await api.control("probed", "stop");
  });

  test("start period: a server that listens only after 1.5 s is never degraded, never restarted", async () => {
    const port = await freePort();
    // With one failure to fail and restart always, a single counted failure would show: degraded, a new pid.
    await api.deployed({
      name: "slow-start",
      command: [
        workloadBun(),
        "-e",
        `await Bun.sleep(1500); Bun.serve({ port: ${port}, hostname: "127.0.0.1", fetch: () => new Response("up") })`,
      ],
      port,
      health: { type: "http", path: "/", interval_s: 0.1, timeout_s: 1, failure_threshold: 1, start_period_s: 30 },
      restart: { policy: "always", max_restarts: 10, window_seconds: 60, backoff_s: 0 },
    });
    const first = await api.waitFor("slow-start", "running", (r) => r.pid !== null);
    const seen = new Set<string>();
    const during = await eventually(
      async () => {
        seen.add((await api.get("slow-start")).status);
        const diagnosis = await api.diagnose("slow-start");
        return diagnosis.health.probe?.in_start_period && Number(diagnosis.health.probe.start_period_failures) >= 2 ? diagnosis : null;
      },
      { timeoutMs: 10_000 },
    );
    expect(during.status).toBe("running");
    expect(during.remediation).toBeNull();
    expect(during.health.spec).toMatchObject({ start_period_s: 30 });
    expect(Number(during.health.probe?.start_period_left_s)).toBeGreaterThan(0);
    expect(Number(during.health.probe?.start_period_left_s)).toBeLessThanOrEqual(30);
    expect(
      during.health.observations.some(
        (o) => o.includes(`connect ECONNREFUSED 127.0.0.1:${port}`) && o.endsWith("[start period: not counted]"),
      ),
    ).toBe(true);
    const healthy = await eventually(
      async () => {
        seen.add((await api.get("slow-start")).status);
        const diagnosis = await api.diagnose("slow-start");
        return diagnosis.health.probe?.ok === true ? diagnosis : null;
      },
      { timeoutMs: 15_000 },
    );
    expect(healthy.health.probe).toMatchObject({
      healthy: true,
      in_start_period: false,
      start_period_left_s: null,
      consecutive_failures: 0,
    });
    expect([...seen]).toEqual(["running"]);
    const record = await api.get("slow-start");
    expect(record).toMatchObject({ status: "running", status_message: null, pid: first.pid, restarts: 0 });
    await api.control("slow-start", "stop");
  });

  test("start period: failures after it still make the service degraded", async () => {
    const port = await freePort();
    await api.deployed({
      name: "never-listens",
      command: "exec sleep 300",
      port,
      health: { type: "http", path: "/", interval_s: 0.1, timeout_s: 1, failure_threshold: 100, start_period_s: 1 },
    });
    const degraded = await api.waitFor("never-listens", "degraded", () => true, 10_000);
    expect(degraded.status_message).toBe(`health check failing: connect ECONNREFUSED 127.0.0.1:${port}`);
    const diagnosis = await api.diagnose("never-listens");
    expect(diagnosis.health.probe).toMatchObject({ healthy: false, in_start_period: false });
    expect(Number(diagnosis.health.probe?.start_period_failures)).toBeGreaterThan(0);
    expect(diagnosis.remediation?.code).toBe("check_health");
    await api.control("never-listens", "stop");
  });

  test("start period 0: the first failed probe counts, as before", async () => {
    const port = await freePort();
    await api.deployed({
      name: "no-grace",
      command: "exec sleep 300",
      port,
      health: { type: "tcp", interval_s: 0.1, timeout_s: 1, failure_threshold: 100, start_period_s: 0 },
    });
    await api.waitFor("no-grace", "degraded");
    const diagnosis = await api.diagnose("no-grace");
    expect(diagnosis.health.probe).toMatchObject({ in_start_period: false, start_period_failures: 0, start_period_left_s: null });
    expect(diagnosis.health.observations.some((o) => o.includes("not counted"))).toBe(false);
    await api.control("no-grace", "stop");
  });

  test.each<[string, unknown, string]>([
    ["a negative", -1, "greater_than_equal"],
    ["a fractional", 1.5, "int_type"],
    ["a longer than a day", 86401, "less_than_equal"],
    ["a string as", "10", "int_type"],
  ])("%s start period is refused with 422 and nothing is created", async (_name, value, type) => {
    const name = `bad-grace-${type.replaceAll("_", "-")}`;
    const response = await engine.json<{ detail: { loc: unknown[]; type: string }[] }>("POST", "/api/services", {
      body: { name, command: ["true"], port: 8080, health: { type: "http", start_period_s: value } },
    });
    expect(response.status).toBe(422);
    expect(response.body.detail[0]).toMatchObject({ loc: ["body", "health", "start_period_s"], type });
    expect((await engine.call("GET", `/api/services/${name}`)).status).toBe(404);
  });

  test("a probe without a type and no template probe to change is refused with 422", async () => {
    const response = await engine.json<{ detail: { loc: unknown[]; type: string }[] }>("POST", "/api/services", {
      body: { name: "typeless", command: ["true"], port: 8080, health: { start_period_s: 5 } },
    });
    expect(response.status).toBe(422);
    expect(response.body.detail[0]).toMatchObject({ loc: ["body", "health", "type"], type: "missing" });
    expect((await engine.call("GET", "/api/services/typeless")).status).toBe(404);
  });

  test("tcp and exec probes", async () => {
    await api.deploy({
      name: "tcp-probed",
      command: server(ownFile("tcp-probed", "never")),
      port: 18312,
      health: { type: "tcp", interval_s: 0.1, timeout_s: 1, failure_threshold: 2 },
    });
    await eventually(async () => (await api.diagnose("tcp-probed")).health.probe?.ok === true);
    // The exec probe runs as the workload's user: it looks in the service's own data dir.
    const okFile = ownFile("exec-probed", "exec-ok");
    await api.deploy({
      name: "exec-probed",
      command: 'touch "$SERVICE_DATA_DIR/exec-ok"; exec sleep 300',
      health: { type: "exec", command: `test -f ${okFile}`, interval_s: 0.1, timeout_s: 1, failure_threshold: 50 },
    });
    await eventually(async () => (await api.diagnose("exec-probed")).health.probe?.ok === true);
    rmSync(okFile);
    await api.waitFor("exec-probed", "degraded");
    expect((await api.diagnose("exec-probed")).health.probe?.ok).toBe(false);
    for (const name of ["tcp-probed", "exec-probed"]) await api.control(name, "stop");
  });
});

describe("bindings", () => {
  test("a service waits for its binding, then starts with the binding's variables", async () => {
    const out = ownFile("app", "bound-env");
    await api.deploy({
      name: "app",
      kind: "batch",
      command: `printf '%s:%s' "$CACHE_HOST" "$CACHE_PORT" > "$SERVICE_DATA_DIR/bound-env"`,
      bindings: ["cache"],
    });
    const waiting = await api.waitFor("app", "pending", (r) => (r.status_message ?? "").includes("cache"));
    expect(waiting.status_message).toContain("no such service");
    const diagnosis = await api.diagnose("app");
    expect(diagnosis.bindings.waiting).toBe(true);
    expect(diagnosis.bindings.messages[0]).toContain("cache");
    expect(diagnosis.pending_env_keys).toEqual(["CACHE_HOST", "CACHE_PORT"]);
    expect(diagnosis.remediation?.code).toBe("wait_for_binding");

    await api.deploy({ name: "cache", command: "exec sleep 300", port: 16379 });
    await api.waitFor("app", "completed");
    expect(readFileSync(out, "utf8")).toBe("127.0.0.1:16379");
    const after = await api.diagnose("app");
    expect(after.bindings.waiting).toBe(false);
    expect(after.injected_env_keys).toEqual(expect.arrayContaining(["CACHE_HOST", "CACHE_PORT", "CACHE_URL"]));
    expect(after.injected_env_keys_source).toContain("bindings:cache");
    await api.control("cache", "stop");
  });
});
