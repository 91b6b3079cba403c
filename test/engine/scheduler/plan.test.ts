import { describe, expect, test } from "bun:test";
import type { GpuDevice } from "../../../src/engine/gpu";
import { type Holding, type LaunchPlan, type PendingService, planLaunches } from "../../../src/engine/scheduler/plan";
import { migDevice } from "../gpu/devices";

// Two whole 80 GB GPUs whose visible ids are their indexes' uuids.
const gpu = (index: number): GpuDevice => ({
  ...migDevice(index, `GPU-${index}`, "H100", "-", 81559),
  name: "H100",
  mig: false,
  mig_profile: null,
});
const TWO_GPUS = [gpu(0), gpu(1)];
const NO_CAPS = { max_concurrent_jobs: null, max_gpus: null };

function pending(id: string, fields: Partial<PendingService> = {}): PendingService {
  return { id, gpus: 0, gpu_memory_mb: 0, priority: 0, submitted_at: 0, owner: "local", caps: NO_CAPS, bindingWaits: [], ...fields };
}

function holding(id: string, fields: Partial<Holding> = {}): Holding {
  return { id, owner: "local", active: true, hold: null, ...fields };
}

const wholeHold = (index: number) => ({ device_uuids: [`GPU-${index}`], visible_ids: [`GPU-${index}`], whole: true, memory_mb: 81559 });

interface Case {
  name: string;
  pending: PendingService[];
  holdings?: Holding[];
  devices?: GpuDevice[];
  plan: LaunchPlan;
}

const cases: Case[] = [
  { name: "nothing pending plans nothing", pending: [], holdings: [holding("a")], plan: { launch: [], waiting: [] } },
  {
    name: "a service without GPUs or caps launches with no hold",
    pending: [pending("a")],
    plan: { launch: [{ id: "a", hold: null }], waiting: [] },
  },
  {
    name: "queue order: priority first, then the earlier submission, then the id",
    pending: [
      pending("late", { submitted_at: 2 }),
      pending("urgent", { priority: 5, submitted_at: 3 }),
      pending("b", { submitted_at: 1 }),
      pending("a", { submitted_at: 1 }),
    ],
    plan: { launch: ["urgent", "a", "b", "late"].map((id) => ({ id, hold: null })), waiting: [] },
  },
  {
    name: "a service whose bindings are not ready waits for them, every reason said",
    pending: [pending("app", { bindingWaits: ["waiting for db: it is pending", "waiting for cache: no such service is deployed yet"] })],
    plan: {
      launch: [],
      waiting: [{ id: "app", message: "waiting for db: it is pending; waiting for cache: no such service is deployed yet" }],
    },
  },
  {
    name: "max_concurrent_jobs counts the token's active services",
    pending: [pending("job", { owner: "t1", caps: { max_concurrent_jobs: 1, max_gpus: null } })],
    holdings: [holding("running", { owner: "t1" })],
    plan: { launch: [], waiting: [{ id: "job", message: "waiting for the token cap: 1 of max_concurrent_jobs 1 running" }] },
  },
  {
    name: "inactive holdings and other tokens' services do not count against the cap",
    pending: [pending("job", { owner: "t1", caps: { max_concurrent_jobs: 1, max_gpus: null } })],
    holdings: [holding("restarting", { owner: "t1", active: false }), holding("other", { owner: "t2" })],
    plan: { launch: [{ id: "job", hold: null }], waiting: [] },
  },
  {
    name: "a service admitted in the pass counts against its token for the rest of it",
    pending: ["j1", "j2", "j3"].map((id, at) =>
      pending(id, { owner: "t1", submitted_at: at, caps: { max_concurrent_jobs: 2, max_gpus: null } }),
    ),
    plan: {
      launch: [
        { id: "j1", hold: null },
        { id: "j2", hold: null },
      ],
      waiting: [{ id: "j3", message: "waiting for the token cap: 2 of max_concurrent_jobs 2 running" }],
    },
  },
  {
    name: "max_gpus counts whole GPUs held by the token's active services",
    pending: [pending("train", { gpus: 1, owner: "t1", caps: { max_concurrent_jobs: null, max_gpus: 1 } })],
    holdings: [holding("other", { owner: "t1", hold: wholeHold(0) })],
    devices: TWO_GPUS,
    plan: { launch: [], waiting: [{ id: "train", message: "waiting for the token cap: 1 GPUs held, max_gpus 1" }] },
  },
  {
    name: "a whole GPU goes to the first free device, named by its visible id",
    pending: [pending("train", { gpus: 1 })],
    holdings: [holding("other", { hold: wholeHold(0) })],
    devices: TWO_GPUS,
    plan: { launch: [{ id: "train", hold: wholeHold(1) }], waiting: [] },
  },
  {
    name: "a hold of a service that is not active still holds its GPU",
    pending: [pending("train", { gpus: 2 })],
    holdings: [holding("restarting", { active: false, hold: wholeHold(1) })],
    devices: TWO_GPUS,
    plan: { launch: [], waiting: [{ id: "train", message: "waiting for 2 free GPUs: 1 of 2 free; GPU 1 (GPU-1) held by restarting" }] },
  },
  {
    name: "GPU memory shares one device; a service that needs none launches beside",
    pending: [pending("infer", { gpu_memory_mb: 20_000 }), pending("web", { submitted_at: 1 })],
    devices: TWO_GPUS,
    plan: {
      launch: [
        { id: "infer", hold: { device_uuids: ["GPU-0"], visible_ids: ["GPU-0"], whole: false, memory_mb: 20_000 } },
        { id: "web", hold: null },
      ],
      waiting: [],
    },
  },
  {
    name: "a request the host can never meet waits with why",
    pending: [pending("huge", { gpus: 3 })],
    devices: TWO_GPUS,
    plan: { launch: [], waiting: [{ id: "huge", message: "requested 3 GPUs but this host has 2 (nvidia-smi)" }] },
  },
];

describe("planLaunches", () => {
  test.each(cases)("$name", ({ pending: queue, holdings = [], devices = [], plan }) => {
    expect(planLaunches(queue, holdings, devices)).toEqual(plan);
  });
});
