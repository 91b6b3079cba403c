import { afterAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { latestGpuMemory, useColor } from "../../cli/commands/top";
import { bytes, cpuShares, cut, duration, renderTop, type TopSnapshot } from "../../cli/top-view";
import type { GpuInventoryRecord, ServiceRecord, ServiceStatsRecord } from "../../src/contract/engine";
import { runCli, tempDir } from "../helpers";

const AT = new Date("2026-05-01T12:00:00Z");
const GIB = 1024 * 1024 * 1024;

function service(name: string, fields: Partial<ServiceRecord> = {}): ServiceRecord {
  return {
    id: `svc_${name}`,
    name,
    kind: "service",
    status: "running",
    status_message: null,
    desired_state: "running",
    version: 1,
    pid: 1000 + name.length,
    port: null,
    command: ["sleep", "600"],
    template_id: null,
    cwd: null,
    env: {},
    secret_keys: [],
    gpus: 0,
    gpu_memory_mb: 0,
    gpu_devices: [],
    memory_mb: null,
    priority: 0,
    restart: { policy: "on-failure", max_restarts: 5, window_seconds: 300, backoff_s: 1 },
    health: null,
    build: null,
    bindings: [],
    restarts: 0,
    user: null,
    connection: null,
    created_at: "2026-05-01T10:00:00Z",
    updated_at: "2026-05-01T10:00:00Z",
    started_at: "2026-05-01T11:00:00Z",
    ...fields,
  };
}

const H100 = { name: "NVIDIA H100 80GB HBM3", source: "nvidia-smi", memory_total_mb: 81559, mig_profile: null, reserved_mb: 0 };
const GPUS: GpuInventoryRecord = {
  source: "nvidia-smi",
  refreshed_at: AT.toISOString(),
  warnings: [],
  devices: [
    {
      ...H100,
      index: 0,
      uuid: "GPU-0",
      visible_id: "GPU-0",
      memory_used_mb: 61440,
      utilization_pct: 87,
      holders: [{ service: "train", whole: true, memory_mb: 81559 }],
    },
    {
      ...H100,
      index: 1,
      uuid: "GPU-1",
      visible_id: "GPU-1",
      memory_used_mb: 8192,
      utilization_pct: 12,
      holders: [{ service: "vllm", whole: false, memory_mb: 20480 }],
    },
  ],
};

const SERVICES = [
  service("train", { pid: 4242, restarts: 1 }),
  service("vllm", { kind: "model", pid: 4343, memory_mb: 16384 }),
  service("db", { kind: "database", status: "failed", pid: null, status_message: "exited with code 1; gave up after 5 restarts in 300 s" }),
];
const STATS: ServiceStatsRecord = {
  sampled_at: AT.toISOString(),
  services: [
    { name: "train", pid: 4242, processes: 3, cpu_seconds: 100, rss_bytes: 12 * GIB },
    { name: "vllm", pid: 4343, processes: 1, cpu_seconds: 10, rss_bytes: 3.5 * GIB },
  ],
};

function snapshot(fields: Partial<TopSnapshot> = {}): TopSnapshot {
  return {
    target: "/var/lib/engine/engine.sock",
    at: AT,
    intervalS: 2,
    services: SERVICES,
    gpus: GPUS,
    stats: STATS,
    cpuPercent: new Map([
      ["train", 250],
      ["vllm", 3.25],
    ]),
    error: null,
    ...fields,
  };
}

const plain = { height: Number.POSITIVE_INFINITY, color: false, interactive: false };
const ESCAPE = /\x1b\[[0-9;?]*[A-Za-z]/g;
const visible = (line: string) => line.replace(ESCAPE, "");

/** headersOf finds a table's header line by its first column and splits it into column names. */
function headersOf(lines: string[], first: string): string[] {
  const header = lines.find((line) => line.startsWith(`${first} `) || line === first) ?? "";
  return header.split(/ {2,}/).filter(Boolean);
}

describe("engine top's frame", () => {
  test("GPU MEM shows what the engine measured beside the reservation, where it measured it", () => {
    const lines = renderTop(snapshot({ gpuUsedMb: new Map([["train", 61440]]) }), { ...plain, width: 160 });
    expect(lines.find((line) => line.startsWith("train "))).toMatch(/^train +running +250\.0% +12G +60G\/80G gpu0 +1 /);
    // Not measured: the reservation alone, as before.
    expect(lines.find((line) => line.startsWith("vllm "))).toMatch(/ +20G gpu1 +0 +4343 /);
  });

  test("the newest measured GPU memory of each service is read from the history", () => {
    const history = {
      interval_s: 5,
      window_s: 3600,
      now: 100,
      times: [90, 95, 100],
      gpus: [],
      services: [
        { id: "svc_a", name: "train", cpu_pct: [], rss_bytes: [], gpu_memory_mb: [100, 61440, null] },
        { id: "svc_b", name: "idle", cpu_pct: [], rss_bytes: [], gpu_memory_mb: [null, null, null] },
      ],
    };
    expect(latestGpuMemory(history)).toEqual(new Map([["train", 61440]]));
    expect(latestGpuMemory(null)).toEqual(new Map());
  });

  test("a wide terminal shows every column, the GPUs with bars and who holds them, the services with their use", () => {
    const lines = renderTop(snapshot(), { ...plain, width: 160 });
    expect(lines[0]).toStartWith("engine top  ");
    expect(lines[0]).toContain("2/3 running");
    expect(lines[0]).toEndWith("/var/lib/engine/engine.sock");
    expect(headersOf(lines, "GPU")).toEqual(["GPU", "NAME", "UTIL", "MEMORY", "HELD BY"]);
    expect(headersOf(lines, "NAME")).toEqual(["NAME", "STATUS", "CPU", "MEM", "GPU MEM", "RESTARTS", "PID", "KIND", "UPTIME", "MESSAGE"]);
    const gpu0 = lines.find((line) => line.startsWith("0 ")) ?? "";
    expect(gpu0).toMatch(/NVIDIA H100 80GB HBM3 +\[\|+ +\] 87% +\[\|+ +\] +60G\/80G +train$/);
    expect(lines.find((line) => line.startsWith("1 "))).toMatch(/ 12% .* 8\.0G\/80G +vllm \(20G\)$/);
    expect(lines.find((line) => line.startsWith("train "))).toMatch(/^train +running +250\.0% +12G +80G gpu0 +1 +4242 +service +1h00m$/);
    expect(lines.find((line) => line.startsWith("vllm "))).toMatch(/^vllm +running +3\.3% +3\.5G\/16G +20G gpu1 +0 +4343 +model +1h00m$/);
    expect(lines.find((line) => line.startsWith("db "))).toMatch(
      /^db +failed +- +- +- +0 +- +database +- +exited with code 1; gave up after 5 restarts in 300 s$/,
    );
  });

  // The stated order: MESSAGE, UPTIME, KIND, PID, RESTARTS, GPU MEM, MEM, CPU go in turn;
  // NAME and STATUS stay. For the GPUs HELD BY goes, then NAME; bars give way to figures.
  test.each([
    { width: 160, services: ["NAME", "STATUS", "CPU", "MEM", "GPU MEM", "RESTARTS", "PID", "KIND", "UPTIME", "MESSAGE"] },
    { width: 80, services: ["NAME", "STATUS", "CPU", "MEM", "GPU MEM", "RESTARTS", "PID", "KIND", "UPTIME"] },
    { width: 70, services: ["NAME", "STATUS", "CPU", "MEM", "GPU MEM", "RESTARTS", "PID", "KIND"] },
    { width: 64, services: ["NAME", "STATUS", "CPU", "MEM", "GPU MEM", "RESTARTS", "PID"] },
    { width: 52, services: ["NAME", "STATUS", "CPU", "MEM", "GPU MEM", "RESTARTS"] },
    { width: 46, services: ["NAME", "STATUS", "CPU", "MEM", "GPU MEM"] },
    { width: 40, services: ["NAME", "STATUS", "CPU", "MEM"] },
    { width: 30, services: ["NAME", "STATUS", "CPU"] },
    { width: 20, services: ["NAME", "STATUS"] },
  ])("at $width columns the services show $services, and no line is wider", ({ width, services }) => {
    const lines = renderTop(snapshot(), { ...plain, width });
    expect(headersOf(lines, "NAME")).toEqual([...services]);
    for (const line of lines) expect(line.length).toBeLessThanOrEqual(width);
    // A shown status is never cut; a cell that does not fit loses its whole column instead.
    expect(lines.find((line) => line.startsWith("train "))).toContain("running");
  });

  test.each([
    { width: 160, gpus: ["GPU", "NAME", "UTIL", "MEMORY", "HELD BY"], bars: true },
    { width: 52, gpus: ["GPU", "NAME", "UTIL", "MEMORY", "HELD BY"], bars: false },
    { width: 30, gpus: ["GPU", "NAME", "UTIL", "MEMORY"], bars: false },
    { width: 20, gpus: ["GPU", "UTIL", "MEMORY"], bars: false },
  ])("at $width columns the GPUs show $gpus", ({ width, gpus, bars }) => {
    const lines = renderTop(snapshot(), { ...plain, width });
    expect(headersOf(lines, "GPU")).toEqual([...gpus]);
    const gpu0 = lines.find((line) => line.startsWith("0 ")) ?? "";
    expect(gpu0).toContain("87%");
    expect(gpu0).toContain("60G/80G");
    expect(gpu0.includes("[")).toBe(bars);
  });

  test("colour is escape codes around cells only: the same text and widths without them, none at all when off", () => {
    const coloured = renderTop(snapshot(), { ...plain, width: 100, color: true });
    const uncoloured = renderTop(snapshot(), { ...plain, width: 100 });
    expect(coloured.join("\n")).toMatch(ESCAPE);
    expect(coloured.map(visible)).toEqual(uncoloured);
    expect(uncoloured.join("\n")).not.toContain("\x1b");
    // The failed status is red, a running one green.
    expect(coloured.find((line) => visible(line).startsWith("db "))).toContain("\x1b[31mfailed\x1b[0m");
    expect(coloured.find((line) => visible(line).startsWith("train "))).toContain("\x1b[32mrunning\x1b[0m");
  });

  test("a short terminal keeps the header and says how many services did not fit", () => {
    const many = Array.from({ length: 30 }, (_, index) => service(`svc-${String(index).padStart(2, "0")}`));
    const lines = renderTop(snapshot({ services: many }), { ...plain, width: 100, height: 15 });
    expect(lines.length).toBe(15);
    expect(lines.at(-1)).toMatch(/^… and \d+ more \(a taller terminal shows them\)$/);
    const shown = lines.filter((line) => line.startsWith("svc-")).length;
    expect(lines.at(-1)).toContain(`and ${30 - shown} more`);
  });

  test("an interactive frame names the interval and q; a failed refresh is said under the title, the old data kept", () => {
    const lines = renderTop(snapshot({ error: "cannot reach the engine at /x/engine.sock; retrying every 2s" }), {
      ...plain,
      width: 120,
      interactive: true,
    });
    expect(lines[0]).toContain("every 2s, q quits");
    expect(lines[1]).toBe("cannot reach the engine at /x/engine.sock; retrying every 2s");
    expect(lines.some((line) => line.startsWith("train "))).toBe(true);
  });

  test.each([
    {
      name: "no GPUs",
      fields: { gpus: { ...GPUS, devices: [], source: "none" } },
      line: "GPUs: none (nvidia-smi found none and ENGINE_GPUS declares none)",
    },
    {
      name: "declared GPUs have no utilization",
      fields: {
        gpus: {
          ...GPUS,
          source: "declared",
          devices: GPUS.devices.map((d) => ({ ...d, source: "declared", utilization_pct: null, memory_used_mb: null })),
        },
      },
      line: "declared with ENGINE_GPUS, not detected",
    },
    { name: "no services", fields: { services: [] }, line: "no services yet: `engine services deploy` starts one" },
    {
      name: "an engine without /api/stats",
      fields: { stats: null },
      line: "CPU and MEM need an engine with GET /api/stats (restart the daemon after upgrading)",
    },
  ])("$name", ({ fields, line }) => {
    const lines = renderTop(snapshot(fields as Partial<TopSnapshot>), { ...plain, width: 120 });
    expect(lines).toContain(line);
  });

  test("declared GPUs read n/a for utilization and their total for memory", () => {
    const declared = {
      ...GPUS,
      source: "declared",
      devices: GPUS.devices.map((d) => ({ ...d, utilization_pct: null, memory_used_mb: null })),
    };
    const gpu0 = renderTop(snapshot({ gpus: declared }), { ...plain, width: 120 }).find((line) => line.startsWith("0 "));
    expect(gpu0).toMatch(/ n\/a +80G total +train$/);
  });
});

describe("cpuShares", () => {
  const at = (iso: string, services: ServiceStatsRecord["services"]): ServiceStatsRecord => ({ sampled_at: iso, services });
  const row = (name: string, pid: number, cpu: number) => ({ name, pid, processes: 1, cpu_seconds: cpu, rss_bytes: 0 });
  test.each([
    {
      name: "CPU seconds over wall seconds, in % of one core",
      previous: at("2026-05-01T12:00:00Z", [row("a", 1, 10), row("b", 2, 5)]),
      current: at("2026-05-01T12:00:02Z", [row("a", 1, 13), row("b", 2, 5.5)]),
      expected: { a: 150, b: 25 },
    },
    {
      name: "a restarted service (a new pid) and a new one have no share yet",
      previous: at("2026-05-01T12:00:00Z", [row("a", 1, 10)]),
      current: at("2026-05-01T12:00:02Z", [row("a", 7, 0.1), row("c", 3, 1)]),
      expected: {},
    },
    {
      name: "a counter that went down (a child reparented away) reads 0, never negative",
      previous: at("2026-05-01T12:00:00Z", [row("a", 1, 10)]),
      current: at("2026-05-01T12:00:01Z", [row("a", 1, 9)]),
      expected: { a: 0 },
    },
    { name: "no earlier sample", previous: null, current: at("2026-05-01T12:00:02Z", [row("a", 1, 1)]), expected: {} },
  ])("$name", ({ previous, current, expected }) => {
    expect(Object.fromEntries(cpuShares(previous, current))).toEqual(expected as Record<string, number>);
  });
});

describe("formats", () => {
  test.each([
    [0, "0B"],
    [512, "512B"],
    [1536, "1.5K"],
    [3.5 * GIB, "3.5G"],
    [12 * GIB, "12G"],
  ])("bytes(%p) is %p", (value, text) => expect(bytes(value)).toBe(text));
  test.each([
    [5, "5s"],
    [125, "2m"],
    [3 * 3600 + 5 * 60, "3h05m"],
    [4 * 86400 + 2 * 3600, "4d02h"],
  ])("duration(%p) is %p", (value, text) => expect(duration(value)).toBe(text));
  test("cut marks what it cut", () => {
    expect(cut("restarting", 6)).toBe("resta…");
    expect(cut("ok", 6)).toBe("ok");
  });
  test.each([
    { env: {}, tty: true, color: true },
    { env: { NO_COLOR: "1" }, tty: true, color: false },
    { env: { NO_COLOR: "" }, tty: true, color: true },
    { env: { TERM: "dumb" }, tty: true, color: false },
    { env: {}, tty: false, color: false },
  ])("colour with $env on a terminal: $tty → $color", ({ env, tty, color }) => {
    expect(useColor(env, tty)).toBe(color);
  });
});

describe("engine top's options", () => {
  const nowhere = tempDir();
  afterAll(() => rmSync(nowhere, { recursive: true, force: true }));
  test.each(["0.1", "abc", "4000", "-1"])("--interval %p is refused before the engine is asked", async (interval) => {
    const refused = await runCli(["--data-dir", nowhere, "top", "--interval", interval]);
    expect(refused).toEqual({
      code: 1,
      stdout: "",
      stderr: `engine: --interval takes seconds from 0.5 to 3600 (got ${JSON.stringify(interval)})\n`,
    });
  });
});
