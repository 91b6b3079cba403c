import { afterEach, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  applyMigInstances,
  type GpuDevice,
  GpuInventory,
  type GpuListing,
  type GpuSnapshot,
  migProfileMemoryMb,
  NVIDIA_SMI_QUERY,
  parseDeclaredGpus,
  parseNvidiaSmiCsv,
  parseNvidiaSmiList,
} from "../../../src/engine/gpu";
import { AppError } from "../../../src/lib/errors";
import { fakeNvidiaSmiIn } from "../../fixtures/gpu/fake";
import { migDevice } from "./devices";

const H100_0 = "GPU-3f9e1b62-c07a-4d58-e913-6a2b8c4d0f17";
const H100_1 = "GPU-9c3f1e47-8a2b-4f6d-b1e0-3d7a6c5b2e91";
const A100_MIG = "GPU-7b2d90c4-1e5a-63f8-a0d7-c4e2f9b13a58";
const A100_WHOLE = "GPU-2c6e8a13-f47b-9d05-3e1a-8b5d0c7f62e4";

function smi(
  index: number,
  uuid: string,
  name: string,
  memory_total_mb: number,
  memory_used_mb: number | null,
  utilization_pct: number | null,
  mig = false,
): GpuDevice {
  return {
    index,
    uuid,
    name,
    memory_total_mb,
    memory_used_mb,
    utilization_pct,
    source: "nvidia-smi",
    mig,
    mig_profile: null,
    visible_id: uuid,
  };
}

function declared(index: number, name: string, memory_total_mb: number): GpuDevice {
  return {
    index,
    uuid: `declared-${index}`,
    name,
    memory_total_mb,
    memory_used_mb: null,
    utilization_pct: null,
    source: "declared",
    mig: false,
    mig_profile: null,
    visible_id: String(index),
  };
}

const LOST_LINE = "Unable to determine the device handle for GPU0000:41:00.0: GPU is lost.  Reboot the system to recover this GPU";

interface CsvCase {
  name: string;
  text: string;
  devices: GpuDevice[];
  warnings: string[];
}

interface ListCase {
  name: string;
  text: string;
  gpus: GpuListing[];
}

interface DeclaredCase {
  spec: string;
  devices: GpuDevice[];
}

describe("parseNvidiaSmiCsv", () => {
  test.each<CsvCase>([
    {
      name: "two H100s, noheader and nounits",
      text: `0, ${H100_0}, NVIDIA H100 80GB HBM3, 81559, 0, 0, Disabled\n1, ${H100_1}, NVIDIA H100 80GB HBM3, 81559, 1, 37, Disabled\n`,
      devices: [smi(0, H100_0, "NVIDIA H100 80GB HBM3", 81559, 0, 0), smi(1, H100_1, "NVIDIA H100 80GB HBM3", 81559, 1, 37)],
      warnings: [],
    },
    {
      name: "a header line, units, CRLF and blank lines",
      text:
        "index, uuid, name, memory.total [MiB], memory.used [MiB], utilization.gpu [%], mig.mode.current\r\n" +
        "\r\n" +
        "0, GPU-a8d3c5e1-42b7-19f0-6c2d-e5b7a9f3d081, NVIDIA A100-SXM4-40GB, 40960 MiB, 4 MiB, 0 %, Disabled\r\n" +
        "   \r\n",
      devices: [smi(0, "GPU-a8d3c5e1-42b7-19f0-6c2d-e5b7a9f3d081", "NVIDIA A100-SXM4-40GB", 40960, 4, 0)],
      warnings: [],
    },
    {
      name: "[N/A], [Not Supported] and N/A become null",
      text:
        "0, GPU-0e6f2b9a-7c41-d583-1a2e-9f4b6c8d3e70, NVIDIA GeForce RTX 4090, 24564, [Not Supported], N/A, [N/A]\n" +
        "1, GPU-6d1c8e4f-93a2-b7e5-0f3d-2c9a5b7e1d46, Tesla T4, 15360, 0, [N/A], [N/A]\n",
      devices: [
        smi(0, "GPU-0e6f2b9a-7c41-d583-1a2e-9f4b6c8d3e70", "NVIDIA GeForce RTX 4090", 24564, null, null),
        smi(1, "GPU-6d1c8e4f-93a2-b7e5-0f3d-2c9a5b7e1d46", "Tesla T4", 15360, 0, null),
      ],
      warnings: [],
    },
    {
      name: "MIG mode Enabled marks the GPU",
      text: `0, ${A100_MIG}, NVIDIA A100-SXM4-80GB, 81920, 13, [N/A], Enabled\n1, ${A100_WHOLE}, NVIDIA A100-SXM4-80GB, 81920, 0, 0, Disabled\n`,
      devices: [smi(0, A100_MIG, "NVIDIA A100-SXM4-80GB", 81920, 13, null, true), smi(1, A100_WHOLE, "NVIDIA A100-SXM4-80GB", 81920, 0, 0)],
      warnings: [],
    },
    {
      name: "a GPU that fell off the bus is skipped with a warning",
      text: `0, ${H100_0}, NVIDIA H100 80GB HBM3, 81559, 0, 0, Disabled\n${LOST_LINE}\n`,
      devices: [smi(0, H100_0, "NVIDIA H100 80GB HBM3", 81559, 0, 0)],
      warnings: [`skipped a GPU nvidia-smi cannot reach: ${LOST_LINE}`],
    },
    {
      name: "a GPU that requires a reset is skipped with a warning",
      text: `1, ${H100_1}, NVIDIA H100 80GB HBM3, [GPU requires reset], [GPU requires reset], [GPU requires reset], [GPU requires reset]\n`,
      devices: [],
      warnings: ["skipped GPU 1 (GPU-9c3f1e47): nvidia-smi reports [GPU requires reset]"],
    },
    {
      name: "a row without total memory is skipped with a warning",
      text: `0, ${H100_0}, NVIDIA H100 80GB HBM3, [Unknown Error], 0, 0, Disabled\n`,
      devices: [],
      warnings: [
        `skipped an nvidia-smi GPU row without an index, uuid or total memory: 0, ${H100_0}, NVIDIA H100 80GB HBM3, [Unknown Error], 0, 0, Disabled`,
      ],
    },
    {
      name: "a line that is not a row is skipped with a warning",
      text: "Failed to initialize NVML: Driver/library version mismatch\n",
      devices: [],
      warnings: ["skipped an nvidia-smi line that is not a GPU row: Failed to initialize NVML: Driver/library version mismatch"],
    },
    { name: "no devices", text: "No devices were found\n", devices: [], warnings: [] },
    { name: "empty output", text: "", devices: [], warnings: [] },
  ])("$name", ({ text, devices, warnings }) => {
    expect(parseNvidiaSmiCsv(text)).toEqual({ devices, warnings });
  });
});

describe("parseNvidiaSmiList", () => {
  test.each<ListCase>([
    {
      name: "GPUs without MIG",
      text: `GPU 0: NVIDIA H100 80GB HBM3 (UUID: ${H100_0})\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: ${H100_1})\n`,
      gpus: [
        { index: 0, name: "NVIDIA H100 80GB HBM3", uuid: H100_0, mig_devices: [] },
        { index: 1, name: "NVIDIA H100 80GB HBM3", uuid: H100_1, mig_devices: [] },
      ],
    },
    {
      name: "MIG devices under their GPU, CRLF",
      text:
        `GPU 0: NVIDIA A100-SXM4-80GB (UUID: ${A100_MIG})\r\n` +
        "  MIG 3g.40gb     Device  0: (UUID: MIG-a41f6c2d-8e37-5b90-9c14-2f7d3e0b6a85)\r\n" +
        "  MIG 1g.10gb     Device  1: (UUID: MIG-5e0b8d34-a2c6-5f17-8d49-e6c3b1a7f903)\r\n" +
        `GPU 1: NVIDIA A100-SXM4-80GB (UUID: ${A100_WHOLE})\r\n`,
      gpus: [
        {
          index: 0,
          name: "NVIDIA A100-SXM4-80GB",
          uuid: A100_MIG,
          mig_devices: [
            { uuid: "MIG-a41f6c2d-8e37-5b90-9c14-2f7d3e0b6a85", device: 0, profile: "3g.40gb", memory_mb: 40960 },
            { uuid: "MIG-5e0b8d34-a2c6-5f17-8d49-e6c3b1a7f903", device: 1, profile: "1g.10gb", memory_mb: 10240 },
          ],
        },
        { index: 1, name: "NVIDIA A100-SXM4-80GB", uuid: A100_WHOLE, mig_devices: [] },
      ],
    },
    {
      name: "the MIG uuid format of drivers before R470",
      text:
        "GPU 0: A100-SXM4-40GB (UUID: GPU-a8d3c5e1-42b7-19f0-6c2d-e5b7a9f3d081)\n" +
        "  MIG 3g.20gb Device 0: (UUID: MIG-GPU-a8d3c5e1-42b7-19f0-6c2d-e5b7a9f3d081/1/0)\n" +
        "  MIG 1g.5gb Device 1: (UUID: MIG-GPU-a8d3c5e1-42b7-19f0-6c2d-e5b7a9f3d081/7/0)\n",
      gpus: [
        {
          index: 0,
          name: "A100-SXM4-40GB",
          uuid: "GPU-a8d3c5e1-42b7-19f0-6c2d-e5b7a9f3d081",
          mig_devices: [
            { uuid: "MIG-GPU-a8d3c5e1-42b7-19f0-6c2d-e5b7a9f3d081/1/0", device: 0, profile: "3g.20gb", memory_mb: 20480 },
            { uuid: "MIG-GPU-a8d3c5e1-42b7-19f0-6c2d-e5b7a9f3d081/7/0", device: 1, profile: "1g.5gb", memory_mb: 5120 },
          ],
        },
      ],
    },
    { name: "output that is not a listing", text: "No devices were found\n", gpus: [] },
  ])("$name", ({ text, gpus }) => {
    expect(parseNvidiaSmiList(text)).toEqual(gpus);
  });

  test.each([
    ["3g.40gb", 40960],
    ["1g.5gb", 5120],
    ["7g.80gb", 81920],
    ["1g.10gb+me", 10240],
    ["1c.3g.20gb", 20480],
    ["3g", 0],
  ])("profile %s has %d MiB", (profile, memoryMb) => {
    expect(migProfileMemoryMb(profile)).toBe(memoryMb);
  });
});

describe("applyMigInstances", () => {
  test("a MIG-enabled GPU without instances offers nothing and is reported", () => {
    const gpu = smi(0, A100_MIG, "NVIDIA A100-SXM4-80GB", 81920, 13, null, true);
    const listing = parseNvidiaSmiList(`GPU 0: NVIDIA A100-SXM4-80GB (UUID: ${A100_MIG})\n`);
    expect(applyMigInstances([gpu], listing)).toEqual({
      devices: [],
      warnings: ["GPU 0 (GPU-7b2d90c4) has MIG enabled but no MIG instances, so it offers nothing to schedule"],
    });
  });
});

describe("parseDeclaredGpus", () => {
  test.each<DeclaredCase>([
    { spec: "2", devices: [declared(0, "declared GPU", 81920), declared(1, "declared GPU", 81920)] },
    { spec: " 2x24576 ", devices: [declared(0, "declared GPU", 24576), declared(1, "declared GPU", 24576)] },
    { spec: "1X40960", devices: [declared(0, "declared GPU", 40960)] },
    { spec: "RTX 4090:24564,A100:40960", devices: [declared(0, "RTX 4090", 24564), declared(1, "A100", 40960)] },
    { spec: "RTX 4090 : 24564 , A100:40960", devices: [declared(0, "RTX 4090", 24564), declared(1, "A100", 40960)] },
    { spec: "H100:81559", devices: [declared(0, "H100", 81559)] },
    { spec: "0", devices: [] },
  ])("$spec", ({ spec, devices }) => {
    expect(parseDeclaredGpus(spec)).toEqual(devices);
  });

  test.each([
    { spec: "", part: "" },
    { spec: "two", part: "two" },
    { spec: "2x", part: "2x" },
    { spec: "2xlots", part: "lots" },
    { spec: "2x0", part: "0" },
    { spec: "100", part: "100" },
    { spec: "RTX 4090", part: "RTX 4090" },
    { spec: "RTX 4090:", part: "" },
    { spec: "RTX 4090:24GB", part: "24GB" },
    { spec: ":40960", part: ":40960" },
    { spec: "A100:40960,,H100:81559", part: "" },
    { spec: "A100:40960,H100", part: "H100" },
  ])("rejects %j", ({ spec, part }) => {
    let thrown: unknown;
    try {
      parseDeclaredGpus(spec);
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(AppError);
    expect((thrown as AppError).code).toBe("gpu_inventory_failed");
    expect((thrown as AppError).message).toStartWith(`ENGINE_GPUS ${JSON.stringify(spec)}: `);
    expect((thrown as AppError).details).toEqual({ setting: "ENGINE_GPUS", part });
    if (part !== "") expect((thrown as AppError).message).toContain(part);
  });
});

describe("GpuInventory", () => {
  const FIXED_NOW = new Date("2031-05-04T10:00:00.000Z");
  const clock = { now: () => FIXED_NOW };
  let dir = "";

  afterEach(() => {
    if (dir) rmSync(dir, { recursive: true, force: true });
    dir = "";
  });

  // fakeNvidiaSmi writes a wrapper that runs the fixture for one scenario and records its calls.
  function fakeNvidiaSmi(scenario: string): { path: string; calls: () => string[] } {
    dir = mkdtempSync(join(tmpdir(), "engine-gpu-"));
    const log = join(dir, "calls.log");
    const path = fakeNvidiaSmiIn(dir, { FAKE_NVIDIA_SMI_SCENARIO: scenario, FAKE_NVIDIA_SMI_LOG: log });
    const calls = () => (existsSync(log) ? readFileSync(log, "utf8").trim().split("\n").filter(Boolean) : []);
    return { path, calls };
  }

  function recordingLog() {
    const lines: string[] = [];
    return { lines, warn: (_obj: object, msg: string) => void lines.push(msg) };
  }

  const QUERY_CALL = NVIDIA_SMI_QUERY.join(" ");

  test("two H100s are detected without asking for MIG devices", async () => {
    const fake = fakeNvidiaSmi("two-h100");
    const inventory = new GpuInventory({ nvidiaSmiPath: fake.path, clock });
    expect(await inventory.refresh()).toEqual({
      devices: [smi(0, H100_0, "NVIDIA H100 80GB HBM3", 81559, 0, 0), smi(1, H100_1, "NVIDIA H100 80GB HBM3", 81559, 1, 0)],
      source: "nvidia-smi",
      warnings: [],
      refreshed_at: "2031-05-04T10:00:00.000Z",
    });
    expect(inventory.snapshot().devices).toHaveLength(2);
    expect(fake.calls()).toEqual([QUERY_CALL]);
  });

  test("a MIG-enabled A100 is offered as its MIG instances", async () => {
    const fake = fakeNvidiaSmi("mig-a100");
    const snapshot = await new GpuInventory({ nvidiaSmiPath: fake.path, clock }).refresh();
    const name = "NVIDIA A100-SXM4-80GB";
    expect(snapshot.devices).toEqual([
      migDevice(0, "MIG-a41f6c2d-8e37-5b90-9c14-2f7d3e0b6a85", name, "3g.40gb", 40960),
      migDevice(0, "MIG-c9e25b71-04d8-5a6f-b3e2-7d1a9f40c2b6", name, "2g.20gb", 20480),
      migDevice(0, "MIG-5e0b8d34-a2c6-5f17-8d49-e6c3b1a7f903", name, "1g.10gb", 10240),
      migDevice(0, "MIG-f283c6a0-7d1e-54b9-a6f5-0b9e4d2c8137", name, "1g.10gb", 10240),
      smi(1, A100_WHOLE, name, 81920, 0, 0),
    ]);
    expect(snapshot.warnings).toEqual([]);
    expect(fake.calls()).toEqual([QUERY_CALL, "-L"]);
  });

  test("a lost GPU and one that needs a reset are skipped with warnings; the healthy one stays", async () => {
    const fake = fakeNvidiaSmi("lost-gpu");
    const log = recordingLog();
    const snapshot = await new GpuInventory({ nvidiaSmiPath: fake.path, log, clock }).refresh();
    expect(snapshot.source).toBe("nvidia-smi");
    expect(snapshot.devices).toEqual([smi(0, H100_0, "NVIDIA H100 80GB HBM3", 81559, 0, 0)]);
    expect(snapshot.warnings).toEqual([
      `skipped a GPU nvidia-smi cannot reach: ${LOST_LINE}`,
      "skipped GPU 2 (GPU-1f4a7c2e): nvidia-smi reports [GPU requires reset]",
    ]);
    expect(log.lines).toEqual(snapshot.warnings);
  });

  test("when every GPU is lost the exit status leads the warnings", async () => {
    const fake = fakeNvidiaSmi("all-lost");
    const snapshot = await new GpuInventory({ nvidiaSmiPath: fake.path, clock }).refresh();
    expect(snapshot.devices).toEqual([]);
    expect(snapshot.warnings).toEqual([
      `nvidia-smi exited with 15: ${LOST_LINE}`,
      `skipped a GPU nvidia-smi cannot reach: ${LOST_LINE.replace("41:00.0", "61:00.0")}`,
    ]);
  });

  test("a driver failure gives no devices and a warning with nvidia-smi's message", async () => {
    const fake = fakeNvidiaSmi("driver-failure");
    const snapshot = await new GpuInventory({ nvidiaSmiPath: fake.path, clock }).refresh();
    expect(snapshot).toEqual({
      devices: [],
      source: "nvidia-smi",
      warnings: [
        "nvidia-smi exited with 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.",
      ],
      refreshed_at: "2031-05-04T10:00:00.000Z",
    });
  });

  test("a host whose driver finds no devices says so", async () => {
    const fake = fakeNvidiaSmi("no-devices");
    const snapshot = await new GpuInventory({ nvidiaSmiPath: fake.path, clock }).refresh();
    expect(snapshot.devices).toEqual([]);
    expect(snapshot.warnings).toEqual(["nvidia-smi exited with 6: No devices were found"]);
  });

  test("a GPU that vanishes is reported at every refresh while it is gone, and logged once", async () => {
    const fake = fakeNvidiaSmi("vanish");
    const log = recordingLog();
    const inventory = new GpuInventory({ nvidiaSmiPath: fake.path, log, clock });
    expect((await inventory.refresh()).devices.map((device) => device.uuid)).toEqual([H100_0, H100_1]);
    const vanished = `GPU ${H100_1} (index 1) is no longer reported by nvidia-smi`;
    for (let refresh = 0; refresh < 2; refresh++) {
      const snapshot = await inventory.refresh();
      expect(snapshot.devices.map((device) => device.uuid)).toEqual([H100_0]);
      expect(snapshot.warnings).toEqual([vanished]);
    }
    expect(log.lines).toEqual([vanished]);
  });

  test("an nvidia-smi that does not answer is given up on after the timeout", async () => {
    const fake = fakeNvidiaSmi("hang");
    const snapshot = await new GpuInventory({ nvidiaSmiPath: fake.path, timeoutMs: 200, clock }).refresh();
    expect(snapshot.devices).toEqual([]);
    expect(snapshot.warnings).toEqual(["nvidia-smi did not answer within 200 ms"]);
  });

  test("a missing nvidia-smi gives source none", async () => {
    const snapshot = await new GpuInventory({ nvidiaSmiPath: "/nonexistent/bin/nvidia-smi", clock }).refresh();
    expect(snapshot).toEqual({
      devices: [],
      source: "none",
      warnings: ["nvidia-smi not found at /nonexistent/bin/nvidia-smi"],
      refreshed_at: "2031-05-04T10:00:00.000Z",
    });
  });

  test("declared GPUs win over nvidia-smi, which is never run", async () => {
    const fake = fakeNvidiaSmi("two-h100");
    const inventory = new GpuInventory({ nvidiaSmiPath: fake.path, declared: "RTX 4090:24564", clock });
    const expected: GpuSnapshot = {
      devices: [declared(0, "RTX 4090", 24564)],
      source: "declared",
      warnings: [],
      refreshed_at: "2031-05-04T10:00:00.000Z",
    };
    expect(inventory.snapshot()).toEqual(expected);
    expect(await inventory.refresh()).toEqual(expected);
    expect(fake.calls()).toEqual([]);
  });

  test("a blank ENGINE_GPUS counts as unset", async () => {
    const fake = fakeNvidiaSmi("two-h100");
    const snapshot = await new GpuInventory({ nvidiaSmiPath: fake.path, declared: "  ", clock }).refresh();
    expect(snapshot.source).toBe("nvidia-smi");
  });

  test("a bad ENGINE_GPUS fails at construction", () => {
    expect(() => new GpuInventory({ declared: "2xlots" })).toThrow(AppError);
  });

  test("before the first refresh the snapshot is empty and says so", () => {
    const inventory = new GpuInventory({ nvidiaSmiPath: "/nonexistent/bin/nvidia-smi", clock });
    expect(inventory.snapshot()).toEqual({
      devices: [],
      source: "none",
      warnings: ["the GPU inventory has not been refreshed yet"],
      refreshed_at: "2031-05-04T10:00:00.000Z",
    });
  });
});
