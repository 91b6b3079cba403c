import type { PrepareHook } from "./types";

/**
 * gpuHook shows the run the GPUs placement gave it, and only those: CUDA_VISIBLE_DEVICES for
 * CUDA, NVIDIA_VISIBLE_DEVICES for the NVIDIA container runtime, both by the devices' visible
 * ids (a MIG instance's uuid). A run that holds no GPU gets neither (as Nomad's device hook).
 */
export const gpuHook: PrepareHook = {
  name: "gpu",
  run(launch) {
    if (!launch.hold) return;
    const visible = launch.hold.visible_ids.join(",");
    launch.parts.gpu = { CUDA_VISIBLE_DEVICES: visible, NVIDIA_VISIBLE_DEVICES: visible };
  },
};
