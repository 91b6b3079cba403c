import { describeAllocation, type GpuAllocation, type GpuDevice, type GpuRequest, planPlacement, queueOrder } from "../gpu";
import type { GpuHold } from "../services/store";

/** TokenCaps are the limits of the token that deployed a service, as its row recorded them at the deploy. */
export interface TokenCaps {
  max_concurrent_jobs: number | null;
  max_gpus: number | null;
}

/**
 * PendingService is a service waiting to be launched, as a placement pass sees it: what it
 * asks of the GPUs (a GpuRequest, so it queues as placement does), whose token it counts
 * against, and what its bindings still wait for (gathered from the store by the caller).
 */
export interface PendingService extends GpuRequest {
  /** owner is the token the service counts against ("local" for the socket's own deploys). */
  owner: string;
  caps: TokenCaps;
  /** bindingWaits says, one line per bound service that is not ready, what it waits for; any: it waits. */
  bindingWaits: string[];
}

/**
 * Holding is a service that holds something a pending one may want: GPUs (`hold`) and, when
 * `active` (live or launching), one of its token's concurrent jobs.
 */
export interface Holding {
  id: string;
  owner: string;
  active: boolean;
  hold: GpuHold | null;
}

/** gpuRequestOf is what a service's spec asks of the GPUs, queued by priority and then by `submittedAt` (ms). */
export function gpuRequestOf(id: string, spec: Pick<GpuRequest, "gpus" | "gpu_memory_mb" | "priority">, submittedAt: number): GpuRequest {
  return { id, gpus: spec.gpus, gpu_memory_mb: spec.gpu_memory_mb, priority: spec.priority, submitted_at: submittedAt };
}

/** LaunchPlan is the outcome of one pass: who starts now with which GPUs, and who waits for what. */
export interface LaunchPlan {
  launch: { id: string; hold: GpuHold | null }[];
  waiting: { id: string; message: string }[];
}

/**
 * planLaunches decides one placement pass. Pending services are served in queue order (priority
 * desc, submitted_at asc, then id); each waits, with the first reason that holds, for its
 * bindings, its token's max_concurrent_jobs, its token's max_gpus, then for GPUs
 * (planPlacement, which reserves devices for the head of the queue). A service admitted past
 * the caps counts against its token for the rest of the pass, even if it then waits for GPUs:
 * a later one of the same token may not overtake it. The function is pure: the caller gathers
 * the inputs from the store and applies the plan.
 */
export function planLaunches(pending: readonly PendingService[], holdings: readonly Holding[], devices: readonly GpuDevice[]): LaunchPlan {
  const plan: LaunchPlan = { launch: [], waiting: [] };
  if (pending.length === 0) return plan;
  const allocations: GpuAllocation[] = [];
  const usageByOwner = new Map<string, { jobs: number; gpus: number }>();
  for (const holding of holdings) {
    const { hold } = holding;
    if (hold) allocations.push({ request_id: holding.id, device_uuids: hold.device_uuids, whole: hold.whole, memory_mb: hold.memory_mb });
    if (!holding.active) continue;
    const usage = usageOf(usageByOwner, holding.owner);
    usage.jobs += 1;
    usage.gpus += hold?.whole ? hold.device_uuids.length : 0;
  }

  const admitted: PendingService[] = [];
  for (const service of [...pending].sort(queueOrder)) {
    const usage = usageOf(usageByOwner, service.owner);
    const { max_concurrent_jobs: maxJobs, max_gpus: maxGpus } = service.caps;
    let message: string | null = null;
    if (service.bindingWaits.length > 0) message = service.bindingWaits.join("; ");
    else if (maxJobs !== null && usage.jobs >= maxJobs) {
      message = `waiting for the token cap: ${usage.jobs} of max_concurrent_jobs ${maxJobs} running`;
    } else if (maxGpus !== null && usage.gpus + service.gpus > maxGpus) {
      message = `waiting for the token cap: ${usage.gpus} GPUs held, max_gpus ${maxGpus}`;
    }
    if (message !== null) {
      plan.waiting.push({ id: service.id, message });
      continue;
    }
    usage.jobs += 1;
    usage.gpus += service.gpus;
    admitted.push(service);
  }

  const needsGpu = (service: PendingService) => service.gpus > 0 || service.gpu_memory_mb > 0;
  const gpuRequests = admitted.filter(needsGpu);
  const placement = gpuRequests.length > 0 ? planPlacement(devices, allocations, gpuRequests) : { placed: [], waiting: [] };
  const placed = new Map(placement.placed.map((allocation) => [allocation.request_id, allocation]));
  const waitingGpu = new Map(placement.waiting.map((waiting) => [waiting.request_id, waiting.message]));
  for (const service of admitted) {
    const allocation = placed.get(service.id);
    if (!needsGpu(service)) plan.launch.push({ id: service.id, hold: null });
    else if (allocation) plan.launch.push({ id: service.id, hold: holdOf(devices, allocation) });
    else plan.waiting.push({ id: service.id, message: waitingGpu.get(service.id) ?? "waiting for GPUs" });
  }
  return plan;
}

function usageOf(usageByOwner: Map<string, { jobs: number; gpus: number }>, owner: string): { jobs: number; gpus: number } {
  let usage = usageByOwner.get(owner);
  if (!usage) {
    usage = { jobs: 0, gpus: 0 };
    usageByOwner.set(owner, usage);
  }
  return usage;
}

/** holdOf is what a run records of its allocation: the devices and the ids CUDA_VISIBLE_DEVICES names them by. */
function holdOf(devices: readonly GpuDevice[], allocation: GpuAllocation): GpuHold {
  const visible = describeAllocation(devices, allocation).CUDA_VISIBLE_DEVICES;
  return {
    device_uuids: allocation.device_uuids,
    visible_ids: visible.split(","),
    whole: allocation.whole,
    memory_mb: allocation.memory_mb,
  };
}
