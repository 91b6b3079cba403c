import { expect, test } from "bun:test";
import { gpuHook } from "../../../../src/engine/scheduler/hooks/gpu";
import type { GpuHold } from "../../../../src/engine/services/store";
import { hostOf, launchOf } from "./launch";

test.each<{ name: string; hold: GpuHold | null; gpu: Record<string, string> }>([
  { name: "no hold: neither variable", hold: null, gpu: {} },
  {
    name: "whole GPUs: both variables name the visible ids, in order",
    hold: { device_uuids: ["GPU-b", "GPU-a"], visible_ids: ["1", "0"], whole: true, memory_mb: 81559 },
    gpu: { CUDA_VISIBLE_DEVICES: "1,0", NVIDIA_VISIBLE_DEVICES: "1,0" },
  },
  {
    name: "a MIG share: its instance's uuid",
    hold: { device_uuids: ["MIG-1"], visible_ids: ["MIG-1"], whole: false, memory_mb: 10_000 },
    gpu: { CUDA_VISIBLE_DEVICES: "MIG-1", NVIDIA_VISIBLE_DEVICES: "MIG-1" },
  },
])("$name", ({ hold, gpu }) => {
  const launch = launchOf("/nonexistent", {}, { hold });
  gpuHook.run(launch, hostOf("/nonexistent"));
  expect(launch.parts.gpu).toEqual(gpu);
});
