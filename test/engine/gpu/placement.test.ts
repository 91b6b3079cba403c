import { describe, expect, test } from "bun:test";
import {
  checkPossible,
  describeAllocation,
  type GpuAllocation,
  type GpuDevice,
  type GpuRequest,
  parseDeclaredGpus,
  planPlacement,
} from "../../../src/engine/gpu";
import { AppError } from "../../../src/lib/errors";
import { migDevice } from "./devices";

// gpu returns nvidia-smi GPU `index` with a uuid whose short form is GPU-0000000<index>.
function gpu(index: number, memory_total_mb = 81559, name = "NVIDIA H100 80GB HBM3"): GpuDevice {
  const uuid = `GPU-0000000${index}-1111-4222-8333-44445555666${index}`;
  return {
    index,
    uuid,
    name,
    memory_total_mb,
    memory_used_mb: 0,
    utilization_pct: 0,
    source: "nvidia-smi",
    mig: false,
    mig_profile: null,
    visible_id: uuid,
  };
}

function migInstance(index: number, device: number, profile: string, memory_total_mb: number): GpuDevice {
  const uuid = `MIG-0000000${device}-aaaa-5bbb-8ccc-dddd0000000${device}`;
  return migDevice(index, uuid, "NVIDIA A100-SXM4-80GB", profile, memory_total_mb);
}

const H100 = [gpu(0), gpu(1)];
const U0 = gpu(0).uuid;
const U1 = gpu(1).uuid;

function wholeGpus(id: string, gpus: number, submitted_at: number, priority = 0): GpuRequest {
  return { id, gpus, gpu_memory_mb: 0, priority, submitted_at };
}

function memory(id: string, gpu_memory_mb: number, submitted_at: number, priority = 0): GpuRequest {
  return { id, gpus: 0, gpu_memory_mb, priority, submitted_at };
}

function holdsWhole(request_id: string, devices: GpuDevice[]): GpuAllocation {
  return {
    request_id,
    device_uuids: devices.map((device) => device.uuid),
    whole: true,
    memory_mb: Math.min(...devices.map((d) => d.memory_total_mb)),
  };
}

function holdsMemory(request_id: string, device: GpuDevice, memory_mb: number): GpuAllocation {
  return { request_id, device_uuids: [device.uuid], whole: false, memory_mb };
}

interface PossibleCase {
  name: string;
  devices: GpuDevice[];
  request: GpuRequest;
  message: string | null;
}

describe("checkPossible", () => {
  test.each<PossibleCase>([
    { name: "whole GPUs that exist", devices: H100, request: wholeGpus("a", 2, 0), message: null },
    { name: "memory that fits the largest GPU", devices: H100, request: memory("a", 81559, 0), message: null },
    { name: "no GPU on a host without GPUs", devices: [], request: wholeGpus("a", 0, 0), message: null },
    {
      name: "more GPUs than the host declares",
      devices: parseDeclaredGpus("2"),
      request: wholeGpus("a", 4, 0),
      message: "requested 4 GPUs but this host has 2 (declared)",
    },
    {
      name: "more GPUs than nvidia-smi reports, MIG instances included",
      devices: [migInstance(0, 0, "3g.40gb", 40960), migInstance(0, 1, "3g.40gb", 40960), gpu(1)],
      request: wholeGpus("a", 4, 0),
      message: "requested 4 GPUs but this host has 3 (nvidia-smi, 2 of them MIG instances)",
    },
    {
      name: "a GPU on a host without GPUs",
      devices: [],
      request: wholeGpus("a", 1, 0),
      message: "requested 1 GPU but this host has no GPUs",
    },
    {
      name: "memory on a host without GPUs",
      devices: [],
      request: memory("a", 1024, 0),
      message: "requested 1024 MiB of GPU memory but this host has no GPUs",
    },
    {
      name: "memory bigger than the largest GPU",
      devices: [gpu(0, 24564, "NVIDIA GeForce RTX 4090"), gpu(1, 40960, "NVIDIA A100-SXM4-40GB")],
      request: memory("a", 50000, 0),
      message: "requested 50000 MiB of GPU memory but the largest GPU on this host, GPU 1 (GPU-00000001), has 40960 MiB",
    },
    {
      name: "both whole GPUs and memory",
      devices: H100,
      request: { id: "a", gpus: 1, gpu_memory_mb: 1024, priority: 0, submitted_at: 0 },
      message: "requested 1 GPU and 1024 MiB of GPU memory; ask for whole GPUs or for memory on a shared GPU, not both",
    },
    {
      name: "a fraction of a GPU",
      devices: H100,
      request: wholeGpus("a", 0.5, 0),
      message: "gpus must be a whole number of at least 0, not 0.5",
    },
    {
      name: "negative memory",
      devices: H100,
      request: memory("a", -1, 0),
      message: "gpu_memory_mb must be a whole number of at least 0, not -1",
    },
  ])("$name", ({ devices, request, message }) => {
    expect(checkPossible(devices, request)).toBe(message);
  });
});

interface PlacementCase {
  name: string;
  devices: GpuDevice[];
  allocations: GpuAllocation[];
  pending: GpuRequest[];
  placed: GpuAllocation[];
  waiting: { request_id: string; message: string }[];
}

const PLACEMENT_CASES: PlacementCase[] = [
  {
    name: "whole GPUs go to free devices in device order",
    devices: H100,
    allocations: [],
    pending: [wholeGpus("svc-a", 1, 1), wholeGpus("svc-b", 1, 2)],
    placed: [holdsWhole("svc-a", [gpu(0)]), holdsWhole("svc-b", [gpu(1)])],
    waiting: [],
  },
  {
    name: "a two-GPU request takes both free devices",
    devices: H100,
    allocations: [],
    pending: [wholeGpus("train", 2, 1)],
    placed: [holdsWhole("train", H100)],
    waiting: [],
  },
  {
    name: "a whole-GPU allocation's memory is the smallest of its devices",
    devices: [gpu(0, 24564, "NVIDIA GeForce RTX 4090"), gpu(1, 81559)],
    allocations: [],
    pending: [wholeGpus("train", 2, 1)],
    placed: [{ request_id: "train", device_uuids: [U0, U1], whole: true, memory_mb: 24564 }],
    waiting: [],
  },
  {
    name: "a whole GPU is not taken from under a memory holder",
    devices: H100,
    allocations: [holdsMemory("embed", gpu(0), 4096)],
    pending: [wholeGpus("train", 1, 1)],
    placed: [holdsWhole("train", [gpu(1)])],
    waiting: [],
  },
  {
    name: "a whole-GPU request waits and says who holds what",
    devices: H100,
    allocations: [holdsWhole("svc-b", [gpu(1)])],
    pending: [wholeGpus("train", 2, 1)],
    placed: [],
    waiting: [{ request_id: "train", message: "waiting for 2 free GPUs: 1 of 2 free; GPU 1 (GPU-00000001) held by svc-b" }],
  },
  {
    name: "three services pack onto one GPU by memory",
    devices: [gpu(0)],
    allocations: [],
    pending: [memory("llm", 40000, 1), memory("embed", 8000, 2), memory("whisper", 10000, 3)],
    placed: [holdsMemory("llm", gpu(0), 40000), holdsMemory("embed", gpu(0), 8000), holdsMemory("whisper", gpu(0), 10000)],
    waiting: [],
  },
  {
    name: "memory goes where it leaves the least free (best fit), keeping the big space whole",
    devices: [gpu(0, 81559), gpu(1, 24564, "NVIDIA GeForce RTX 4090")],
    allocations: [],
    pending: [memory("embed", 20000, 1), memory("llm", 70000, 2)],
    placed: [holdsMemory("embed", gpu(1, 24564, "NVIDIA GeForce RTX 4090"), 20000), holdsMemory("llm", gpu(0), 70000)],
    waiting: [],
  },
  {
    name: "best fit counts the memory already reserved",
    devices: H100,
    allocations: [holdsMemory("llm", gpu(0), 50000)],
    pending: [memory("embed", 25000, 1)],
    placed: [holdsMemory("embed", gpu(0), 25000)],
    waiting: [],
  },
  {
    name: "memory is not placed on a GPU held whole",
    devices: H100,
    allocations: [holdsWhole("train", [gpu(0)])],
    pending: [memory("embed", 1000, 1)],
    placed: [holdsMemory("embed", gpu(1), 1000)],
    waiting: [],
  },
  {
    name: "memory packs onto MIG instances like any device",
    devices: [migInstance(0, 0, "3g.40gb", 40960), migInstance(0, 1, "1g.10gb", 10240)],
    allocations: [],
    pending: [memory("embed", 8000, 1), memory("llm", 30000, 2)],
    placed: [
      holdsMemory("embed", migInstance(0, 1, "1g.10gb", 10240), 8000),
      holdsMemory("llm", migInstance(0, 0, "3g.40gb", 40960), 30000),
    ],
    waiting: [],
  },
  {
    name: "a memory request waits and says what is most free",
    devices: [gpu(0)],
    allocations: [holdsMemory("svc-a", gpu(0), 61559)],
    pending: [memory("llm", 30000, 1)],
    placed: [],
    waiting: [
      {
        request_id: "llm",
        message: "waiting for 30000 MiB on one GPU: most free is 20000 MiB on GPU 0 (GPU-00000000), held by svc-a (61559 MiB)",
      },
    ],
  },
  {
    name: "a request that can never fit waits with the reason and reserves nothing",
    devices: parseDeclaredGpus("2"),
    allocations: [],
    pending: [wholeGpus("huge", 4, 1), wholeGpus("small", 1, 2)],
    placed: [{ request_id: "small", device_uuids: ["declared-0"], whole: true, memory_mb: 81920 }],
    waiting: [{ request_id: "huge", message: "requested 4 GPUs but this host has 2 (declared)" }],
  },
  {
    name: "higher priority goes first, whatever its age",
    devices: [gpu(0)],
    allocations: [],
    pending: [wholeGpus("batch", 1, 1, 0), wholeGpus("chat", 1, 2, 10)],
    placed: [holdsWhole("chat", [gpu(0)])],
    waiting: [{ request_id: "batch", message: "waiting for 1 free GPU: 0 of 1 free; GPU 0 (GPU-00000000) held by chat" }],
  },
  {
    name: "among equal priorities the older goes first",
    devices: [gpu(0)],
    allocations: [],
    pending: [wholeGpus("young", 1, 20), wholeGpus("old", 1, 10)],
    placed: [holdsWhole("old", [gpu(0)])],
    waiting: [{ request_id: "young", message: "waiting for 1 free GPU: 0 of 1 free; GPU 0 (GPU-00000000) held by old" }],
  },
  {
    name: "a waiting two-GPU request reserves both devices, so a younger one-GPU request cannot take the free one",
    devices: H100,
    allocations: [holdsWhole("small-1", [gpu(0)])],
    pending: [wholeGpus("small-2", 1, 20), wholeGpus("big", 2, 10)],
    placed: [],
    waiting: [
      { request_id: "big", message: "waiting for 2 free GPUs: 1 of 2 free; GPU 0 (GPU-00000000) held by small-1" },
      {
        request_id: "small-2",
        message:
          "waiting for 1 free GPU: 1 of 2 free; GPU 0 (GPU-00000000) held by small-1 and reserved for big, which is ahead in the queue; " +
          "GPU 1 (GPU-00000001) reserved for big, which is ahead in the queue",
      },
    ],
  },
  {
    name: "waiting memory requests reserve the devices closest to having room, which then only drain",
    devices: H100,
    allocations: [holdsMemory("svc-a", gpu(0), 50000), holdsMemory("svc-b", gpu(1), 78000)],
    pending: [memory("llm", 40000, 1), memory("embed", 10000, 2), memory("whisper", 3000, 3)],
    placed: [],
    waiting: [
      {
        request_id: "llm",
        message: "waiting for 40000 MiB on one GPU: most free is 31559 MiB on GPU 0 (GPU-00000000), held by svc-a (50000 MiB)",
      },
      {
        request_id: "embed",
        message:
          "waiting for 10000 MiB on one GPU: GPU 0 (GPU-00000000) has 31559 MiB free but is reserved for llm, which is ahead in the queue",
      },
      {
        request_id: "whisper",
        message:
          "waiting for 3000 MiB on one GPU: GPU 0 (GPU-00000000) has 31559 MiB free but is reserved for llm, which is ahead in the queue",
      },
    ],
  },
  {
    name: "a request that needs no GPU is placed with no devices",
    devices: [],
    allocations: [],
    pending: [wholeGpus("web", 0, 1)],
    placed: [{ request_id: "web", device_uuids: [], whole: false, memory_mb: 0 }],
    waiting: [],
  },
  {
    name: "allocations of a GPU that is gone are ignored",
    devices: [gpu(0)],
    allocations: [holdsWhole("ghost", [gpu(5)])],
    pending: [wholeGpus("svc-a", 1, 1)],
    placed: [holdsWhole("svc-a", [gpu(0)])],
    waiting: [],
  },
];

describe("planPlacement", () => {
  test.each<PlacementCase>(PLACEMENT_CASES)("$name", ({ devices, allocations, pending, placed, waiting }) => {
    expect(planPlacement(devices, allocations, pending)).toEqual({ placed, waiting });
  });

  test("a two-GPU request is not starved by one-GPU jobs that keep arriving", () => {
    // Each tick a one-GPU job arrives and runs for two ticks once placed; at tick 1 a two-GPU
    // job arrives too. Without reservations the one-GPU jobs would overlap forever and the
    // two-GPU job would never see both GPUs free.
    const runTicks = 2;
    const big = wholeGpus("big", 2, 15);
    let pending: GpuRequest[] = [];
    let running: { allocation: GpuAllocation; endsAt: number }[] = [];
    const timeline: string[][] = [];
    for (let tick = 0; tick < 6; tick++) {
      running = running.filter((job) => job.endsAt > tick);
      pending.push(wholeGpus(`small-${tick}`, 1, tick * 10));
      if (tick === 1) pending.push(big);
      const plan = planPlacement(
        H100,
        running.map((job) => job.allocation),
        pending,
      );
      for (const allocation of plan.placed) running.push({ allocation, endsAt: tick + runTicks });
      pending = pending.filter((request) => !plan.placed.some((allocation) => allocation.request_id === request.id));
      timeline.push(plan.placed.map((allocation) => allocation.request_id));
    }
    expect(timeline).toEqual([["small-0"], ["small-1"], [], ["big"], [], ["small-2", "small-3"]]);
  });

  test("the input is not changed", () => {
    const allocations = [holdsMemory("svc-a", gpu(0), 1000)];
    const pending = [memory("b", 1000, 2), memory("a", 1000, 1)];
    const before = structuredClone({ allocations, pending });
    planPlacement(H100, allocations, pending);
    expect({ allocations, pending }).toEqual(before);
  });
});

interface EnvironmentCase {
  name: string;
  devices: GpuDevice[];
  allocation: GpuAllocation;
  value: string;
}

describe("describeAllocation", () => {
  test.each<EnvironmentCase>([
    { name: "whole nvidia-smi GPUs by uuid", devices: H100, allocation: holdsWhole("train", H100), value: `${U0},${U1}` },
    {
      name: "declared GPUs by index",
      devices: parseDeclaredGpus("2x24576"),
      allocation: { request_id: "train", device_uuids: ["declared-1", "declared-0"], whole: true, memory_mb: 24576 },
      value: "1,0",
    },
    {
      name: "a MIG instance by its MIG uuid",
      devices: [migInstance(0, 2, "1g.10gb", 10240)],
      allocation: holdsMemory("embed", migInstance(0, 2, "1g.10gb", 10240), 4096),
      value: "MIG-00000002-aaaa-5bbb-8ccc-dddd00000002",
    },
    {
      name: "no devices hides every GPU",
      devices: H100,
      allocation: { request_id: "web", device_uuids: [], whole: false, memory_mb: 0 },
      value: "",
    },
  ])("$name", ({ devices, allocation, value }) => {
    expect(describeAllocation(devices, allocation)).toEqual({ CUDA_VISIBLE_DEVICES: value, NVIDIA_VISIBLE_DEVICES: value });
  });

  test("a device no longer in the inventory is an error", () => {
    expect(() => describeAllocation([gpu(0)], holdsWhole("train", [gpu(1)]))).toThrow(AppError);
    try {
      describeAllocation([gpu(0)], holdsWhole("train", [gpu(1)]));
    } catch (error) {
      expect((error as AppError).code).toBe("gpu_inventory_failed");
    }
  });
});
