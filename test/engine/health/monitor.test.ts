import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { HealthMonitor, type HealthSpec, type HealthState } from "../../../src/engine/health";
import { AppError } from "../../../src/lib/errors";
import { eventually, freePort, stopGently, tempDir } from "../../helpers";
import { isAlive, readPids } from "./processes";

let status = 200;
let requests = 0;
let inFlight = 0;
let maxInFlight = 0;
let delayMs = 0;
/** arrived and abandoned list request paths, so a test can tell its own requests from a previous test's. */
const arrived: string[] = [];
const abandoned: string[] = [];
let server: ReturnType<typeof Bun.serve>;
let scratch: string;

beforeAll(() => {
  server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(request) {
      const path = new URL(request.url).pathname;
      arrived.push(path);
      requests++;
      inFlight++;
      maxInFlight = Math.max(maxInFlight, inFlight);
      try {
        if (delayMs > 0) {
          const gone = new Promise<boolean>((resolve) => request.signal.addEventListener("abort", () => resolve(true)));
          if (await Promise.race([Bun.sleep(delayMs).then(() => false), gone])) abandoned.push(path);
        }
        return new Response(null, { status });
      } finally {
        inFlight--;
      }
    },
  });
  scratch = tempDir("health-monitor-");
});

afterAll(() => {
  server.stop(true);
  rmSync(scratch, { recursive: true, force: true });
});

const monitors: HealthMonitor[] = [];
afterEach(() => {
  while (monitors.length > 0) monitors.pop()?.stop();
  status = 200;
  requests = 0;
  maxInFlight = 0;
  delayMs = 0;
});

const fast: HealthSpec = { type: "http", path: "/health", interval_s: 0.05, timeout_s: 1, failure_threshold: 3 };

function monitor(spec: HealthSpec, options: ConstructorParameters<typeof HealthMonitor>[3] = {}) {
  const changes: HealthState[] = [];
  const instance = new HealthMonitor(
    spec,
    { host: "127.0.0.1", port: server.port! },
    { onChange: (state) => changes.push(state) },
    options,
  );
  monitors.push(instance);
  return { instance, changes };
}

const summary = (state: HealthState) => [state.healthy, state.consecutive_failures, state.threshold_reached];

describe("HealthMonitor", () => {
  test("healthy, then unhealthy once the threshold is reached, then healthy again", async () => {
    const { instance, changes } = monitor(fast);
    expect(instance.state()).toEqual({
      healthy: null,
      consecutive_failures: 0,
      last: null,
      observations: [],
      threshold_reached: false,
      in_start_period: false,
      start_period_ends_at: null,
      start_period_failures: 0,
    });
    instance.start();
    await eventually(() => instance.state().healthy === true);

    status = 503;
    await eventually(() => instance.state().threshold_reached);
    // Further failures past the threshold are not news.
    await eventually(() => instance.state().consecutive_failures >= 5);
    expect(changes.map(summary)).toEqual([
      [true, 0, false],
      [false, 1, false],
      [false, 3, true],
    ]);
    expect(instance.state().last).toMatchObject({ ok: false, detail: "HTTP 503" });

    status = 200;
    await eventually(() => instance.state().healthy === true);
    expect(changes.map(summary)).toEqual([
      [true, 0, false],
      [false, 1, false],
      [false, 3, true],
      [true, 0, false],
    ]);
    expect(changes.at(-1)?.last).toMatchObject({ ok: true, detail: "HTTP 200" });
  });

  test("observations are a bounded ring, newest last", async () => {
    const { instance } = monitor(fast, { maxObservations: 5 });
    instance.start();
    await eventually(() => requests >= 8);
    const state = instance.state();
    expect(state.observations).toHaveLength(5);
    for (const line of state.observations) expect(line).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ok HTTP 200 \(\d+ ms\)$/);
    expect(state.observations.at(-1)).toStartWith(`${state.last!.at} ok`);
    const times = state.observations.map((line) => line.split(" ")[0]!);
    expect([...times].sort()).toEqual(times);
  });

  test("the first probe runs at start and the next waits for the timer", async () => {
    const timers: { callback: () => void; ms: number }[] = [];
    const { instance } = monitor(
      { ...fast, interval_s: 30 },
      { setTimer: (callback, ms) => timers.push({ callback, ms }), clearTimer: () => undefined },
    );
    instance.start();
    await eventually(() => timers.length === 1);
    expect(requests).toBe(1);
    expect(timers[0]!.ms).toBeGreaterThan(29_000);
    expect(timers[0]!.ms).toBeLessThanOrEqual(30_000);
    timers[0]!.callback();
    await eventually(() => timers.length === 2);
    expect(requests).toBe(2);
    expect(instance.state().observations).toHaveLength(2);
  });

  test("probes never overlap when they take longer than the interval", async () => {
    delayMs = 120;
    const { instance } = monitor({ ...fast, interval_s: 0.02 });
    instance.start();
    await eventually(() => requests >= 4, { timeoutMs: 5000 });
    expect(maxInFlight).toBe(1);
  });

  test("stop() cancels a probe in flight and discards its result", async () => {
    delayMs = 5000;
    const { instance, changes } = monitor({ ...fast, path: "/cancelled", timeout_s: 10 });
    instance.start();
    await eventually(() => arrived.includes("/cancelled"));
    instance.stop();
    // The server sees the client hang up long before its 5 s answer.
    await eventually(() => abandoned.includes("/cancelled"));
    expect(instance.state().last).toBeNull();
    expect(changes).toEqual([]);
    instance.stop();
  });

  test("stop() kills an exec probe's processes", async () => {
    const pidFile = join(scratch, "stop.pids");
    const { instance } = monitor({
      type: "exec",
      command: `echo $$ >> ${pidFile}; sleep 5`,
      interval_s: 1,
      timeout_s: 10,
      failure_threshold: 1,
    });
    instance.start();
    await eventually(() => readPids(pidFile).length === 1);
    const pids = readPids(pidFile);
    instance.stop();
    await eventually(() => pids.every((pid) => !isAlive(pid)));
    expect(instance.state().last).toBeNull();
  });

  test("a failure_threshold of 1 reports the first failure once", async () => {
    status = 503;
    const { instance, changes } = monitor({ ...fast, failure_threshold: 1 });
    instance.start();
    await eventually(() => instance.state().consecutive_failures >= 3);
    expect(changes.map(summary)).toEqual([[false, 1, true]]);
  });

  test("start() after stop() resumes with the state kept; onChange may stop the monitor", async () => {
    let calls = 0;
    const instance = new HealthMonitor(
      fast,
      { host: "127.0.0.1", port: server.port! },
      {
        onChange() {
          calls++;
          instance.stop();
        },
      },
    );
    monitors.push(instance);
    instance.start();
    await eventually(() => calls === 1);
    const after = requests;
    status = 503;
    instance.start();
    await eventually(() => calls === 2);
    expect(requests).toBe(after + 1);
    expect(instance.state().observations).toHaveLength(2);
  });

  test("an exception in onChange does not stop the probing", async () => {
    const instance = new HealthMonitor(
      fast,
      { host: "127.0.0.1", port: server.port! },
      {
        onChange() {
          throw new Error("subscriber bug");
        },
      },
    );
    monitors.push(instance);
    instance.start();
    await eventually(() => instance.state().observations.length >= 3);
  });

  test.each<[string, Partial<HealthSpec>]>([
    ["a zero interval", { interval_s: 0 }],
    ["a negative start period", { start_period_s: -1 }],
    ["a start period that is not a number", { start_period_s: Number.NaN }],
    ["a negative timeout", { timeout_s: -1 }],
    ["a fractional threshold", { failure_threshold: 1.5 }],
  ])("rejects %s", (_name, change) => {
    expect(() => new HealthMonitor({ ...fast, ...change }, { host: "127.0.0.1", port: 1 }, { onChange() {} })).toThrow(AppError);
  });
});

describe("HealthMonitor start period", () => {
  /** clock is the start period's clock: the probes run in real time, the grace runs out when a test says. */
  let clock = Date.parse("2030-01-01T00:00:00.000Z");
  const now = () => clock;

  test("failures in the start period are recorded but do not count; after it they do", async () => {
    status = 503;
    const { instance, changes } = monitor({ ...fast, start_period_s: 30 }, { now });
    instance.start();
    await eventually(() => instance.state().start_period_failures >= 4);
    const during = instance.state();
    expect(during).toMatchObject({
      healthy: null,
      consecutive_failures: 0,
      threshold_reached: false,
      in_start_period: true,
      start_period_ends_at: "2030-01-01T00:00:30.000Z",
      last: { ok: false, detail: "HTTP 503" },
    });
    for (const line of during.observations) expect(line).toMatch(/ fail HTTP 503 \(\d+ ms\) \[start period: not counted\]$/);
    expect(changes).toEqual([]);

    clock += 30_000;
    expect(instance.state().in_start_period).toBe(false);
    await eventually(() => instance.state().threshold_reached);
    expect(changes.map(summary)).toEqual([
      [false, 1, false],
      [false, 3, true],
    ]);
    expect(instance.state().observations.at(-1)).toMatch(/ fail HTTP 503 \(\d+ ms\)$/);
    expect(instance.state().start_period_failures).toBeGreaterThanOrEqual(4);
  });

  test("a pass ends the start period at once: healthy, and later failures count", async () => {
    status = 503;
    const { instance, changes } = monitor({ ...fast, start_period_s: 3600 }, { now });
    instance.start();
    await eventually(() => instance.state().start_period_failures >= 2);
    status = 200;
    await eventually(() => instance.state().healthy === true);
    expect(instance.state().in_start_period).toBe(false);
    expect(changes.map(summary)).toEqual([[true, 0, false]]);
    status = 503;
    await eventually(() => instance.state().threshold_reached);
    expect(changes.map(summary)).toEqual([
      [true, 0, false],
      [false, 1, false],
      [false, 3, true],
    ]);
    expect(instance.state().in_start_period).toBe(false);
  });

  test("the start period counts from the workload's start: one long past gives no grace", async () => {
    status = 503;
    const { instance, changes } = monitor({ ...fast, start_period_s: 60, failure_threshold: 1 }, { now, startedAt: clock - 61_000 });
    instance.start();
    await eventually(() => changes.length === 1);
    expect(changes.map(summary)).toEqual([[false, 1, true]]);
    expect(instance.state()).toMatchObject({ in_start_period: false, start_period_failures: 0 });
  });

  test.each<[string, Partial<HealthSpec>]>([
    ["a start period of 0", { start_period_s: 0 }],
    ["no start period", {}],
  ])("%s: the first failure counts", async (_name, change) => {
    status = 503;
    const { instance, changes } = monitor({ ...fast, ...change, failure_threshold: 1 }, { now });
    instance.start();
    await eventually(() => changes.length === 1);
    expect(changes.map(summary)).toEqual([[false, 1, true]]);
    expect(instance.state()).toMatchObject({ in_start_period: false, start_period_ends_at: null, start_period_failures: 0 });
  });

  test("a server that binds its port late is healthy at once, never unhealthy", async () => {
    // A real program that listens only after 1.5 s; until then every probe is refused.
    const port = await freePort();
    const late = Bun.spawn(
      [
        process.execPath,
        "-e",
        `await Bun.sleep(1500); Bun.serve({ port: ${port}, hostname: "127.0.0.1", fetch: () => new Response("up") });`,
      ],
      { stdin: "ignore", stdout: "ignore", stderr: "ignore" },
    );
    try {
      const changes: HealthState[] = [];
      const instance = new HealthMonitor(
        { type: "http", path: "/", interval_s: 0.1, timeout_s: 1, failure_threshold: 1, start_period_s: 30 },
        { host: "127.0.0.1", port },
        { onChange: (state) => changes.push(state) },
      );
      monitors.push(instance);
      instance.start();
      await eventually(() => instance.state().healthy === true, { timeoutMs: 15_000 });
      expect(changes.map(summary)).toEqual([[true, 0, false]]);
      const state = instance.state();
      expect(state.start_period_failures).toBeGreaterThan(0);
      expect(state.observations.some((line) => line.includes(`connect ECONNREFUSED 127.0.0.1:${port}`))).toBe(true);
    } finally {
      await stopGently(late);
    }
  });
});
