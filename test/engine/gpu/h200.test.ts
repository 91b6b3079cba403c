import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import {
  applyMigInstances,
  findGpuOom,
  parseComputeApps,
  parseNvidiaSmiCsv,
  parseNvidiaSmiList,
  parseTelemetryCsv,
} from "../../../src/engine/gpu";
import { REPO_ROOT } from "../../helpers";

/** The parsers on the real output of nvidia-smi and PyTorch, captured on an H200 (test/fixtures/gpu/h200/README.md). */

const captured = (file: string) => readFileSync(join(REPO_ROOT, "test", "fixtures", "gpu", "h200", file), "utf8");
const UUID = "GPU-97fbb5a7-1a13-ec2a-0b92-4490cd2b390a";

describe("an H200's nvidia-smi", () => {
  test("the inventory query gives one whole GPU, idle and in use", () => {
    const idle = parseNvidiaSmiCsv(captured("query.txt"));
    expect(idle.warnings).toEqual([]);
    expect(idle.devices).toEqual([
      expect.objectContaining({
        index: 0,
        uuid: UUID,
        name: "NVIDIA H200",
        source: "nvidia-smi",
        memory_total_mb: 143771,
        memory_used_mb: 0,
        utilization_pct: 0,
        mig: false,
        mig_profile: null,
      }),
    ]);
    const busy = parseNvidiaSmiCsv(captured("query-busy.txt"));
    expect(busy.devices.map((d) => [d.memory_used_mb, d.utilization_pct])).toEqual([[2575, 1]]);
  });

  test("-L lists the GPU without MIG instances, and leaves the inventory as it is", () => {
    const listing = parseNvidiaSmiList(captured("list.txt"));
    expect(listing).toEqual([{ index: 0, name: "NVIDIA H200", uuid: UUID, mig_devices: [] }]);
    const devices = parseNvidiaSmiCsv(captured("query.txt")).devices;
    expect(applyMigInstances(devices, listing).devices).toEqual(devices);
  });

  test("telemetry reads free memory as nvidia-smi reports it, not as total minus used", () => {
    const idle = parseTelemetryCsv(captured("telemetry.txt"));
    expect(idle.warnings).toEqual([]);
    expect(idle.readings).toEqual([
      {
        index: 0,
        uuid: UUID,
        name: "NVIDIA H200",
        pci_bus_id: "00000000:00:06.0",
        utilization_pct: 0,
        memory_used_mb: 0,
        memory_free_mb: 143156,
        memory_total_mb: 143771,
        temperature_c: 38,
        power_w: 79.23,
      },
    ]);
    const busy = parseTelemetryCsv(captured("telemetry-busy.txt")).readings[0];
    expect([busy?.memory_used_mb, busy?.memory_free_mb, busy?.power_w]).toEqual([2575, 140582, 88.94]);
  });

  test("compute apps: none when idle (an empty answer), the PyTorch process and its memory when busy", () => {
    expect(captured("apps-idle.txt")).toBe("");
    expect(parseComputeApps(captured("apps-idle.txt"))).toEqual([]);
    expect(parseComputeApps(captured("apps-busy.txt"))).toEqual([{ pid: 542, used_memory_mb: 2566, gpu_uuid: UUID }]);
  });
});

describe("PyTorch's CUDA out-of-memory error on an H200", () => {
  test("is found by its exception line, not by the traceback around it", () => {
    const lines = captured("pytorch-oom.stderr").split("\n");
    const match = findGpuOom(lines);
    expect(match?.signature).toBe("pytorch_cuda_oom");
    expect(match?.line).toStartWith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 GiB.");
  });
});
