import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import { parseComputeApps, parseTelemetryCsv, readGpuTelemetry } from "../../../src/engine/gpu";

/** The metrics' GPU readings (docs/decisions.md 333) from nvidia-smi's real output forms. */

const H100 = "GPU-3f9e1b62-c07a-4d58-e913-6a2b8c4d0f17";

describe("parseTelemetryCsv", () => {
  test.each([
    [
      "an idle H100",
      `0, ${H100}, NVIDIA H100 80GB HBM3, 00000000:19:00.0, 0, 1, 81080, 81559, 33, 68.54`,
      {
        index: 0,
        uuid: H100,
        name: "NVIDIA H100 80GB HBM3",
        pci_bus_id: "00000000:19:00.0",
        utilization_pct: 0,
        memory_used_mb: 1,
        memory_free_mb: 81080,
        memory_total_mb: 81559,
        temperature_c: 33,
        power_w: 68.54,
      },
    ],
    [
      "a name with a comma, units, and values nvidia-smi does not have",
      `1, ${H100}, Tesla T4, rev 2, 00000000:3B:00.0, [N/A], 1024 MiB, [Not Supported], 15360 MiB, 41, [N/A]`,
      {
        index: 1,
        uuid: H100,
        name: "Tesla T4, rev 2",
        pci_bus_id: "00000000:3B:00.0",
        utilization_pct: null,
        memory_used_mb: 1024,
        memory_free_mb: null,
        memory_total_mb: 15360,
        temperature_c: 41,
        power_w: null,
      },
    ],
  ])("%s", (_label, line, reading) => {
    expect(parseTelemetryCsv(`${line}\r\n`)).toEqual({ readings: [reading], warnings: [] });
  });

  test("a lost GPU's line and a header are skipped with a warning; nothing throws", () => {
    const lost = "Unable to determine the device handle for GPU0000:41:00.0: GPU is lost.  Reboot the system to recover this GPU";
    const parsed = parseTelemetryCsv(`index, uuid, name\n${lost}\n\n`);
    expect(parsed.readings).toEqual([]);
    expect(parsed.warnings).toHaveLength(2);
  });
});

describe("parseComputeApps", () => {
  test.each([
    ["one process", `3471, 40418, ${H100}\n`, [{ pid: 3471, used_memory_mb: 40418, gpu_uuid: H100 }]],
    ["memory nvidia-smi cannot read (MIG)", `12, [N/A], ${H100}`, [{ pid: 12, used_memory_mb: null, gpu_uuid: H100 }]],
    ["none", "", []],
    ["nvidia-smi's words for none", "No running processes found\n", []],
    ["a header", "pid, used_gpu_memory [MiB], gpu_uuid\n", []],
  ])("%s", (_label, text, apps) => {
    expect(parseComputeApps(text)).toEqual(apps);
  });
});

test("readGpuTelemetry runs the fake nvidia-smi's two queries; a missing one gives nothing", async () => {
  const fake = join(import.meta.dir, "..", "..", "fixtures", "gpu", "nvidia-smi");
  const telemetry = await readGpuTelemetry(fake);
  expect(telemetry.readings.map((reading) => reading.index)).toEqual([0, 1]);
  expect(telemetry.apps).toEqual([]);
  expect(telemetry.warnings).toEqual([]);
  expect(await readGpuTelemetry("/nonexistent/nvidia-smi")).toEqual({ readings: [], apps: [], warnings: [] });
});
