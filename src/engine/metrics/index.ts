/**
 * Package metrics is what the engine knows about how busy the machine is (docs/decisions.md
 * 330–336): a collector that samples GPUs and each service's processes every 5 s into an
 * hour-long in-memory history (GET /api/metrics/history, the web UI's charts), and the
 * Prometheus answer of GET /metrics.
 */
import type { GpuInventoryRecord, MetricsHistory, ServiceRecord } from "../../contract/engine";
import type { Logger } from "../../lib/logger";
import { bucketIndex } from "../../lib/prometheus";
import { inScope, type Principal } from "../auth";
import type { GpuTelemetry } from "../gpu";
import type { RouteCounts } from "../proxy";
import type { LiveWorkload, ServiceChange, ServiceChangeListener } from "../services";
import { MetricsCollector } from "./collector";
import { RESTORE_BOUNDS_S, type RestoreStats, renderEngineMetrics } from "./exposition";

export { MetricsCollector, type Sample, type ServiceSample } from "./collector";
export { RESTORE_BOUNDS_S, renderEngineMetrics, SERVICE_STATUSES } from "./exposition";
export { History } from "./history";
export { ownCpuTicks, parseStatLine, scanProcesses } from "./procfs";
export { type MetricsRouteDeps, metricsRoutes } from "./routes";

/** RESTARTING_STATUSES are those a service enters when the restart policy restarts it. */
const RESTARTING_STATUSES = new Set(["restarting", "retrying"]);

/** MetricsServices is what the metrics read of the services module (the manager implements it). */
export interface MetricsServices {
  list(): ServiceRecord[];
  liveWorkloads(): LiveWorkload[];
  get(ident: string): ServiceRecord;
  gpuInventory(): GpuInventoryRecord;
  subscribe(listener: ServiceChangeListener): () => void;
}

export interface EngineMetricsOptions {
  version: string;
  hostname: string;
  log: Logger;
  nvidiaSmiPath?: string;
  gpusDeclared: boolean;
  /** proxyCounts reads the proxy's request counts (none while the proxy is off or starting). */
  proxyCounts?: () => RouteCounts[];
  intervalMs?: number;
  /** readGpus replaces the nvidia-smi reader (bench). */
  readGpus?: () => Promise<GpuTelemetry>;
}

/**
 * EngineMetrics owns the collector and the counters no other module keeps: restarts made by
 * the restart policy (seen as moves into `restarting`/`retrying`) and restore durations. It
 * starts after the services (it subscribes to their changes) and stops before them.
 */
export class EngineMetrics {
  private services: MetricsServices | null = null;
  private collector: MetricsCollector | null = null;
  private unsubscribe: (() => void) | null = null;
  private readonly lastStatus = new Map<string, string>();
  private readonly restarts = new Map<string, number>();
  private readonly restores = new Map<string, RestoreStats & { counts: number[] }>();

  constructor(private readonly o: EngineMetricsOptions) {}

  /** start samples from now on; the first sample comes `firstSampleInMs` from now (at once by default). */
  start(services: MetricsServices, firstSampleInMs = 0): void {
    this.services = services;
    for (const service of services.list()) this.lastStatus.set(service.id, service.status);
    this.unsubscribe = services.subscribe((id, change) => this.noticeChange(id, change));
    this.collector = new MetricsCollector({
      services,
      nvidiaSmiPath: this.o.nvidiaSmiPath,
      gpusDeclared: this.o.gpusDeclared,
      log: this.o.log,
      intervalMs: this.o.intervalMs,
      readGpus: this.o.readGpus,
    });
    this.collector.start(firstSampleInMs);
  }

  stop(): void {
    this.collector?.stop();
    this.unsubscribe?.();
    this.unsubscribe = null;
  }

  /** sampleNow takes a sample at once (tests, bench). */
  async sampleNow(): Promise<void> {
    await this.collector?.sample();
  }

  private noticeChange(id: string, change: ServiceChange): void {
    const status = change?.status ?? null; // null: deleted
    const before = this.lastStatus.get(id);
    if (status === null) {
      this.lastStatus.delete(id);
      this.restarts.delete(id);
      this.collector?.forget(id); // its series go with it
      return;
    }
    this.lastStatus.set(id, status);
    if (RESTARTING_STATUSES.has(status) && !RESTARTING_STATUSES.has(before ?? "")) {
      this.restarts.set(id, (this.restarts.get(id) ?? 0) + 1);
    }
  }

  /** restoreEnded records a restore that finished (ok, failed or timeout) and how long it took. */
  restoreEnded(service: string, engine: string, result: string, durationS: number): void {
    const key = `${service}\n${engine}\n${result}`;
    let stats = this.restores.get(key);
    if (!stats) {
      stats = { service, engine, result, counts: new Array(RESTORE_BOUNDS_S.length + 1).fill(0), sum: 0 };
      this.restores.set(key, stats);
    }
    stats.counts[bucketIndex(RESTORE_BOUNDS_S, durationS)]! += 1;
    stats.sum += durationS;
  }

  /** render answers GET /metrics for a caller: a scoped token sees its services only (decision 330). */
  render(principal: Principal): string {
    const services = this.services;
    if (!services) return "";
    const visible = visibleTo(principal);
    const host = principal.scopeServices.length === 0;
    return renderEngineMetrics({
      version: this.o.version,
      hostname: this.o.hostname,
      sample: this.collector?.latest() ?? null,
      services: services.list().filter((service) => visible(service.name)),
      host,
      inventory: host ? services.gpuInventory() : null,
      proxy: (this.o.proxyCounts?.() ?? []).filter((item) => (item.service === "" ? host : visible(item.service))),
      restarts: this.restarts,
      restores: [...this.restores.values()].filter((restore) => visible(restore.service)),
      collector: { samples: this.collector?.samples ?? 0 },
    });
  }

  /** history answers GET /api/metrics/history for a caller, for one service or all it may see. */
  history(principal: Principal, sinceS: number | undefined, service: ServiceRecord | null): MetricsHistory {
    const visible = visibleTo(principal);
    const services = service ? [service] : (this.services?.list() ?? []).filter((record) => visible(record.name));
    const empty: MetricsHistory = { interval_s: 5, window_s: 3600, now: Date.now() / 1000, times: [], gpus: [], services: [] };
    return this.collector?.historyOf(sinceS, services) ?? empty;
  }
}

function visibleTo(principal: Principal): (service: string) => boolean {
  return (service) => inScope(principal, service);
}
