import { AppError } from "../../lib/errors";
import { deviceLabel, type GpuDevice } from "./inventory";

/**
 * GpuRequest is what one service asks for: `gpus` whole GPUs, or `gpu_memory_mb` MiB on one
 * shared GPU. Both 0 means it needs no GPU. Higher `priority` goes first; among equal
 * priorities the earlier `submitted_at` (ms) goes first.
 */
export interface GpuRequest {
  id: string;
  gpus: number;
  gpu_memory_mb: number;
  priority: number;
  submitted_at: number;
}

/**
 * GpuAllocation is what a request holds. A whole allocation holds its devices alone and its
 * `memory_mb` is the smallest total memory among them (what each device guarantees); a shared
 * allocation holds `memory_mb` MiB on its one device.
 */
export interface GpuAllocation {
  request_id: string;
  device_uuids: string[];
  whole: boolean;
  memory_mb: number;
}

/** WaitingRequest is a request that could not be placed in this pass, and what it waits for. */
export interface WaitingRequest {
  request_id: string;
  message: string;
}

/** PlacementPlan is the outcome of one planPlacement pass. */
export interface PlacementPlan {
  placed: GpuAllocation[];
  waiting: WaitingRequest[];
}

/** GpuEnvironment is the environment that shows a process only its allocated devices. */
export interface GpuEnvironment {
  CUDA_VISIBLE_DEVICES: string;
  NVIDIA_VISIBLE_DEVICES: string;
}

function plural(count: number, one: string, many = `${one}s`): string {
  return `${count} ${count === 1 ? one : many}`;
}

function describeHost(devices: readonly GpuDevice[]): string {
  const source = devices[0]?.source ?? "none";
  const migCount = devices.filter((device) => device.mig_profile !== null).length;
  const mig = migCount > 0 ? `, ${migCount} of them MIG instances` : "";
  return `${devices.length} (${source}${mig})`;
}

function isWholeNumber(value: number): boolean {
  return Number.isInteger(value) && value >= 0;
}

/**
 * checkPossible returns why a request can never be placed on this host, or null when it could
 * be once enough is free. The caller answers 409 with the message.
 */
export function checkPossible(devices: readonly GpuDevice[], request: GpuRequest): string | null {
  if (!isWholeNumber(request.gpus)) return `gpus must be a whole number of at least 0, not ${request.gpus}`;
  if (!isWholeNumber(request.gpu_memory_mb)) return `gpu_memory_mb must be a whole number of at least 0, not ${request.gpu_memory_mb}`;
  if (request.gpus > 0 && request.gpu_memory_mb > 0) {
    return `requested ${plural(request.gpus, "GPU")} and ${request.gpu_memory_mb} MiB of GPU memory; ask for whole GPUs or for memory on a shared GPU, not both`;
  }
  if (request.gpus > 0) {
    if (devices.length === 0) return `requested ${plural(request.gpus, "GPU")} but this host has no GPUs`;
    if (request.gpus > devices.length) return `requested ${plural(request.gpus, "GPU")} but this host has ${describeHost(devices)}`;
    return null;
  }
  if (request.gpu_memory_mb > 0) {
    if (devices.length === 0) return `requested ${request.gpu_memory_mb} MiB of GPU memory but this host has no GPUs`;
    const largest = devices.reduce((best, device) => (device.memory_total_mb > best.memory_total_mb ? device : best));
    if (request.gpu_memory_mb > largest.memory_total_mb) {
      return `requested ${request.gpu_memory_mb} MiB of GPU memory but the largest GPU on this host, ${deviceLabel(largest)}, has ${largest.memory_total_mb} MiB`;
    }
  }
  return null;
}

/** queueOrder sorts requests the way planPlacement serves them: priority desc, submitted_at asc, then id. */
export function queueOrder(a: GpuRequest, b: GpuRequest): number {
  return b.priority - a.priority || a.submitted_at - b.submitted_at || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);
}

interface Share {
  request_id: string;
  memory_mb: number;
}

interface DeviceState {
  device: GpuDevice;
  order: number;
  wholeHolder: string | null;
  shares: Share[];
  reservedFor: string | null;
}

function freeMb(state: DeviceState): number {
  if (state.wholeHolder !== null) return 0;
  return state.device.memory_total_mb - state.shares.reduce((sum, share) => sum + share.memory_mb, 0);
}

function holderCount(state: DeviceState): number {
  return state.wholeHolder !== null ? 1 : state.shares.length;
}

function isIdle(state: DeviceState): boolean {
  return state.wholeHolder === null && state.shares.length === 0;
}

function describeHolders(state: DeviceState): string {
  if (state.wholeHolder !== null) return `held by ${state.wholeHolder}`;
  return `held by ${state.shares.map((share) => `${share.request_id} (${share.memory_mb} MiB)`).join(", ")}`;
}

// describeBlocker says why a device cannot be used by `requestId` now: its holders, and a
// reservation by an earlier request.
function describeBlocker(state: DeviceState, requestId: string): string {
  const reasons: string[] = [];
  if (!isIdle(state)) reasons.push(describeHolders(state));
  if (state.reservedFor !== null && state.reservedFor !== requestId) {
    reasons.push(`reserved for ${state.reservedFor}, which is ahead in the queue`);
  }
  return `${deviceLabel(state.device)} ${reasons.join(" and ")}`;
}

function placeWhole(states: DeviceState[], request: GpuRequest): GpuAllocation | string {
  const wanted = request.gpus;
  const available = states.filter((state) => isIdle(state) && state.reservedFor === null);
  if (available.length >= wanted) {
    // Any idle devices do; device order keeps placements stable and predictable.
    const chosen = available.slice(0, wanted);
    for (const state of chosen) state.wholeHolder = request.id;
    return {
      request_id: request.id,
      device_uuids: chosen.map((state) => state.device.uuid),
      whole: true,
      memory_mb: Math.min(...chosen.map((state) => state.device.memory_total_mb)),
    };
  }
  // Reserve the devices that will drain soonest, by the fewest holders and then the least
  // memory held, so that nothing younger lands on them and the request eventually runs. When
  // earlier requests already reserved too much, this one reserves nothing and waits its turn.
  const unreserved = states.filter((state) => state.reservedFor === null);
  if (unreserved.length >= wanted) {
    const drainOrder = [...unreserved].sort(
      (a, b) =>
        holderCount(a) - holderCount(b) ||
        a.device.memory_total_mb - freeMb(a) - (b.device.memory_total_mb - freeMb(b)) ||
        a.order - b.order,
    );
    for (const state of drainOrder.slice(0, wanted)) state.reservedFor = request.id;
  }
  const idleCount = states.filter(isIdle).length;
  const blockers = states.filter((state) => !isIdle(state) || (state.reservedFor !== null && state.reservedFor !== request.id));
  const head = `waiting for ${plural(wanted, "free GPU")}: ${idleCount} of ${states.length} free`;
  return [head, ...blockers.map((state) => describeBlocker(state, request.id))].join("; ");
}

function placeShared(states: DeviceState[], request: GpuRequest): GpuAllocation | string {
  const wanted = request.gpu_memory_mb;
  // Best fit: of the devices with room, take the one left with the least free memory. That
  // keeps the large free spaces whole for large requests, where first fit would chip at
  // whichever device comes first. Ties go to device order.
  let best: DeviceState | undefined;
  for (const state of states) {
    if (state.wholeHolder !== null || state.reservedFor !== null || freeMb(state) < wanted) continue;
    if (!best || freeMb(state) < freeMb(best)) best = state;
  }
  if (best) {
    best.shares.push({ request_id: request.id, memory_mb: wanted });
    return { request_id: request.id, device_uuids: [best.device.uuid], whole: false, memory_mb: wanted };
  }
  // Reserve the device that is closest to having room, so that it only drains from now on.
  const head = `waiting for ${wanted} MiB on one GPU`;
  const mostFree = (candidates: DeviceState[]) =>
    candidates.reduce<DeviceState | undefined>((top, state) => (!top || freeMb(state) > freeMb(top) ? state : top), undefined);
  const target = mostFree(states.filter((state) => state.reservedFor === null && state.device.memory_total_mb >= wanted));
  if (target) target.reservedFor = request.id;
  // A device with room that was not used is reserved for an earlier request.
  const roomButReserved = mostFree(
    states.filter((state) => state.reservedFor !== null && state.reservedFor !== request.id && freeMb(state) >= wanted),
  );
  if (roomButReserved) {
    return `${head}: ${deviceLabel(roomButReserved.device)} has ${freeMb(roomButReserved)} MiB free but is reserved for ${roomButReserved.reservedFor}, which is ahead in the queue`;
  }
  const top = mostFree(states)!;
  const holders = isIdle(top) ? "" : `, ${describeHolders(top)}`;
  return `${head}: most free is ${freeMb(top)} MiB on ${deviceLabel(top.device)}${holders}`;
}

/**
 * planPlacement places as many pending requests as fit next to the current allocations, in
 * queue order (priority desc, submitted_at asc). Whole-GPU requests take devices nobody holds;
 * memory requests share devices not held whole, by free memory (total minus the memory
 * reservations, not nvidia-smi's live usage), best fit. A request that cannot be placed now
 * reserves the devices it would need, and no later request in the pass may use them: reserved
 * devices only drain, so a big request is not starved by a stream of small ones. Requests that
 * can never fit wait with checkPossible's message and reserve nothing. A request that needs no
 * GPU is placed with no devices. The function is pure; allocations of devices no longer in the
 * inventory are ignored.
 */
export function planPlacement(
  devices: readonly GpuDevice[],
  allocations: readonly GpuAllocation[],
  pending: readonly GpuRequest[],
): PlacementPlan {
  const states: DeviceState[] = devices.map((device, order) => ({ device, order, wholeHolder: null, shares: [], reservedFor: null }));
  const byUuid = new Map(states.map((state) => [state.device.uuid, state]));
  for (const allocation of allocations) {
    for (const uuid of allocation.device_uuids) {
      const state = byUuid.get(uuid);
      if (!state) continue;
      if (allocation.whole) state.wholeHolder = allocation.request_id;
      else state.shares.push({ request_id: allocation.request_id, memory_mb: allocation.memory_mb });
    }
  }
  const placed: GpuAllocation[] = [];
  const waiting: WaitingRequest[] = [];
  for (const request of [...pending].sort(queueOrder)) {
    const impossible = checkPossible(devices, request);
    if (impossible !== null) {
      waiting.push({ request_id: request.id, message: impossible });
      continue;
    }
    let outcome: GpuAllocation | string;
    if (request.gpus > 0) outcome = placeWhole(states, request);
    else if (request.gpu_memory_mb > 0) outcome = placeShared(states, request);
    else outcome = { request_id: request.id, device_uuids: [], whole: false, memory_mb: 0 };
    if (typeof outcome === "string") waiting.push({ request_id: request.id, message: outcome });
    else placed.push(outcome);
  }
  return { placed, waiting };
}

/**
 * describeAllocation returns the environment that shows a process its allocated devices: their
 * visible_ids joined with commas, in allocation order. An allocation without devices gets empty
 * values, which hide every GPU from CUDA and from the NVIDIA container runtime. A device no
 * longer in the inventory throws AppError `gpu_inventory_failed`.
 */
export function describeAllocation(devices: readonly GpuDevice[], allocation: GpuAllocation): GpuEnvironment {
  const byUuid = new Map(devices.map((device) => [device.uuid, device]));
  const ids = allocation.device_uuids.map((uuid) => {
    const device = byUuid.get(uuid);
    if (!device) {
      throw new AppError("gpu_inventory_failed", `GPU ${uuid} allocated to ${allocation.request_id} is no longer in the GPU inventory`, {
        request_id: allocation.request_id,
        device_uuid: uuid,
      });
    }
    return device.visible_id;
  });
  const value = ids.join(",");
  return { CUDA_VISIBLE_DEVICES: value, NVIDIA_VISIBLE_DEVICES: value };
}
