import type { Logger } from "../../lib/logger";
import type { GpuInventory } from "../gpu";
import { type BoundService, bindingVariables, envPrefix } from "../services/env";
import type { ServiceSpec } from "../services/spec";
import { LIVE_STATUSES, type ServiceRow, type ServiceStore } from "../services/store";
import { gpuRequestOf, type Holding, type PendingService, planLaunches } from "./plan";
import type { ServiceRunner } from "./runner";

/** PlacementContext is what a placement pass reads and changes besides the store: the runners, the GPUs, the bound services. */
export interface PlacementContext {
  store: ServiceStore;
  gpus: GpuInventory;
  log: Logger;
  /** runner is a service's runner, made on first use; made() answers one only where it was made. */
  runner(serviceId: string): ServiceRunner;
  made(serviceId: string): ServiceRunner | undefined;
  /** boundService is what a binding to `service` hands over (its variables name what a waiting service will be given). */
  boundService(service: ServiceRow): BoundService;
  /** note writes a waiting service's status message, and tells the subscribers. */
  note(serviceId: string, message: string): void;
  /** held says that no pass may run now: the daemon hands over or drains (a drain that does not go through schedules one when it resumes). */
  held(): boolean;
}

/**
 * Placement decides which pending services launch, on the rules of scheduler/plan.ts: it runs
 * one pass soon after anything that may free a slot or satisfy a binding asks for one
 * (schedule), gathers the pass's inputs from the store and the runners, and applies the plan:
 * the waits' messages, and each launch through its runner.
 */
export class Placement {
  private queued = false;

  constructor(private readonly ctx: PlacementContext) {}

  /**
   * schedule runs one placement pass soon: once the event loop has run what this turn of it
   * found ready (setImmediate), so that the deploys of one turn (16 POSTs read at once, say) and
   * the exits it was told of share a pass, its store reads and its one commit.
   */
  schedule(): void {
    if (this.queued || this.ctx.held()) return;
    this.queued = true;
    setImmediate(() => {
      this.queued = false;
      // A hand-over or a drain may have begun in this turn, after the call: no pass then.
      if (this.ctx.held()) return;
      try {
        this.pass();
      } catch (error) {
        this.ctx.log.error({ err: error }, "scheduling pass failed");
      }
    });
  }

  /**
   * pass gathers what a pass needs from the store and the runners, plans it (plan.ts) and
   * applies the plan. It reads only the pending rows (the store's listPendingServices), and the
   * live ones only when a pending service has a token cap or wants GPUs, the only rules that
   * look at what others hold: a flood of batch jobs no longer makes every pass parse every live
   * row. Its writes (the waits' messages, each launch's run record and `scheduled`) are one
   * transaction, committed before the pass returns and before any of its launches spawns a
   * process (decision 453).
   */
  private pass(): void {
    const { store, gpus } = this.ctx;
    const pending: PendingService[] = [];
    const byId = new Map<string, ServiceRow>();
    for (const service of store.listPendingServices()) {
      if (this.ctx.made(service.id)?.launching) continue;
      byId.set(service.id, service);
      const { spec } = store.currentVersion(service);
      const waiting = this.bindingWait(spec);
      this.ctx.runner(service.id).waitingOn(waiting.messages, waiting.pendingKeys);
      pending.push({
        ...gpuRequestOf(service.id, spec, Date.parse(service.submitted_at)),
        owner: ownerKey(service),
        caps: { max_concurrent_jobs: service.owner.max_concurrent_jobs, max_gpus: service.owner.max_gpus },
        bindingWaits: waiting.messages,
      });
    }
    if (pending.length === 0) return;
    const plan = planLaunches(pending, this.holdings(pending), gpus.snapshot().devices);
    store.transaction(() => {
      for (const { id, message } of plan.waiting) {
        const service = byId.get(id);
        if (service && service.status_message !== message) this.ctx.note(id, message);
      }
      for (const { id, hold } of plan.launch) this.ctx.runner(id).start(hold);
    });
  }

  /**
   * holdings are what the live and launching services hold (GPUs, a token's concurrent jobs),
   * read only when a pending service's plan depends on them: a token cap or a GPU request.
   * Settled services (stopped, failed, completed, cancelled) hold nothing and are left out.
   */
  private holdings(pending: readonly PendingService[]): Holding[] {
    const capped = pending.some(
      (service) =>
        service.caps.max_concurrent_jobs !== null || service.caps.max_gpus !== null || service.gpus > 0 || service.gpu_memory_mb > 0,
    );
    if (!capped) return [];
    return this.ctx.store.listUnsettledServices().map((service) => {
      const runner = this.ctx.made(service.id);
      return {
        id: service.id,
        owner: ownerKey(service),
        active: LIVE_STATUSES.has(service.status) || Boolean(runner?.launching),
        hold: runner?.gpuHold ?? null,
      };
    });
  }

  /**
   * bindingWait says what a service's bindings still wait for: a bound service not deployed
   * yet, not running, or whose health check has not passed; and the variables those would give.
   */
  private bindingWait(spec: ServiceSpec): { messages: string[]; pendingKeys: string[] } {
    const { store } = this.ctx;
    const messages: string[] = [];
    const pendingKeys: string[] = [];
    for (const name of spec.bindings) {
      const bound = store.findService(name);
      if (!bound) {
        messages.push(`waiting for ${name}: no such service is deployed yet`);
        pendingKeys.push(`${envPrefix(name)}_HOST`, `${envPrefix(name)}_PORT`);
        continue;
      }
      const health = this.ctx.made(bound.id)?.healthState;
      const hasProbe = store.currentVersion(bound).spec.health !== null;
      const ready = bound.status === "running" && (!hasProbe || health?.healthy === true);
      if (!ready) {
        const why = bound.status === "running" ? "its health check has not passed yet" : `it is ${bound.status}`;
        messages.push(`waiting for ${name}: ${why}`);
        pendingKeys.push(...Object.keys(bindingVariables(this.ctx.boundService(bound))));
      }
    }
    return { messages, pendingKeys: [...new Set(pendingKeys)].sort() };
  }
}

/** ownerKey is the token a service counts against: "local" for the socket's own deploys. */
function ownerKey(service: ServiceRow): string {
  return service.owner.token_id ?? "local";
}
