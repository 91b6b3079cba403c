import type { GpuDevice } from "../../../src/engine/gpu";

/** migDevice is the GpuDevice a MIG instance is expected to become: its own uuid as the visible id. */
export function migDevice(index: number, uuid: string, parentName: string, profile: string, memory_total_mb: number): GpuDevice {
  return {
    index,
    uuid,
    name: `${parentName} MIG ${profile}`,
    memory_total_mb,
    memory_used_mb: null,
    utilization_pct: null,
    source: "nvidia-smi",
    mig: true,
    mig_profile: profile,
    visible_id: uuid,
  };
}
