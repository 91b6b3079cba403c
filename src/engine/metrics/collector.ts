import { HISTORY_INTERVAL_S, HISTORY_WINDOW_S, type MetricsHistory, type ServiceRecord } from "../../contract/engine";
import type { Logger } from "../../lib/logger";
import { type ComputeApp, type GpuReading, type GpuTelemetry, readGpuTelemetry } from "../gpu";
import type { LiveWorkload } from "../services";
import { History } from "./history";
import { type ProcessTable, type SystemUnits, scanProcesses, systemUnits } from "./procfs";

/** ServiceSample is one service's processes as one sample measured them. */
export interface ServiceSample {
  id: string;
  name: string;
  /** workload is the run's workload pid (its processes: its group and descendants). */
  workload: number;
  processes: number;
  cpuSeconds: number;
  /** cpuPct is CPU time over the interval before this sample, in percent of one core; null for a run's first sample. */
  cpuPct: number | null;
  rssBytes: number;
  /** gpuMemoryMb is the GPU memory its processes hold; null when no GPU telemetry was read. */
  gpuMemoryMb: number | null;
}

/** Sample is everything one collection measured. */
export interface Sample {
  atMs: number;
  gpus: GpuReading[];
  /** gpuSource says whether nvidia-smi answered: GPU and GPU memory series exist only then. */
  gpuSource: boolean;
  gpuWarnings: string[];
  /** services are the services that had a process when sampled, by id: one without has nothing to measure. */
  services: Map<string, ServiceSample>;
  /** unattributedGpuMb is GPU memory held by processes of no service, per GPU uuid. */
  unattributedGpuMb: Map<string, number>;
  durationS: number;
}

/** CollectorOptions are what the collector reads. */
export interface CollectorOptions {
  /** services names the services with a process, and its pid; the manager. */
  services: { liveWorkloads(): LiveWorkload[] };
  /** nvidiaSmiPath is the nvidia-smi to ask (config ENGINE_NVIDIA_SMI); undefined: look it up on PATH. */
  nvidiaSmiPath?: string;
  /** gpusDeclared is true when ENGINE_GPUS declares the GPUs: nvidia-smi is then never run. */
  gpusDeclared: boolean;
  log: Logger;
  /** intervalMs is the sampling period; 5000 (HISTORY_INTERVAL_S) by default. */
  intervalMs?: number;
  /** procRoot is where /proc is (tests may point elsewhere). */
  procRoot?: string;
  /** readGpus replaces the nvidia-smi reader (bench). */
  readGpus?: () => Promise<GpuTelemetry>;
}

/**
 * MetricsCollector samples the host every 5 s (docs/decisions.md 331–334): the GPUs through
 * nvidia-smi, each service's processes through one /proc scan, and the GPU memory each holds
 * through `--query-compute-apps`. It keeps the newest sample for /metrics and pushes each one
 * into the hour-long in-memory history the UI draws.
 */
export class MetricsCollector {
  private readonly history: History;
  private readonly units: SystemUnits;
  private timer: ReturnType<typeof setInterval> | null = null;
  /** first is the timer of a first sample put off (start's `firstInMs`). */
  private first: ReturnType<typeof setTimeout> | null = null;
  private running: Promise<void> | null = null;
  private latestSample: Sample | null = null;
  /** previous holds each workload's CPU ticks and time at the last sample, for the CPU rate. */
  private previous = new Map<number, { ticks: number; atMs: number }>();
  private readonly gpuMeta = new Map<string, { index: number; name: string; totalMb: number | null }>();
  samples = 0;
  stopped = false;

  constructor(private readonly o: CollectorOptions) {
    const intervalS = (o.intervalMs || HISTORY_INTERVAL_S * 1000) / 1000;
    this.history = new History(Math.max(1, Math.round(HISTORY_WINDOW_S / intervalS)));
    this.units = systemUnits();
  }

  /**
   * start takes a first sample `firstInMs` from now (at once by default, without waiting for it)
   * and then one every interval; an interval of 0 samples nothing.
   */
  start(firstInMs = 0): void {
    if (this.o.intervalMs === 0) return;
    const every = this.o.intervalMs ?? HISTORY_INTERVAL_S * 1000;
    const begin = () => {
      this.first = null;
      if (this.stopped) return;
      void this.sample();
      this.timer = setInterval(() => void this.sample(), every);
      this.timer.unref?.();
    };
    if (firstInMs > 0) {
      this.first = setTimeout(begin, firstInMs);
      this.first.unref?.();
    } else begin();
  }

  stop(): void {
    this.stopped = true;
    if (this.first) clearTimeout(this.first);
    if (this.timer) clearInterval(this.timer);
    this.first = null;
    this.timer = null;
  }

  /** latest is the newest sample, null before the first has finished. */
  latest(): Sample | null {
    return this.latestSample;
  }

  /** sample measures once; a call while one is under way waits for that one instead (nvidia-smi may be slow). */
  sample(): Promise<void> {
    this.running ??= this.collect()
      .catch((error) => this.o.log.warn({ err: error }, "metrics: a sample failed"))
      .finally(() => {
        this.running = null;
      });
    return this.running;
  }

  private async collect(): Promise<void> {
    const started = performance.now();
    const telemetry = this.o.gpusDeclared
      ? { readings: [], apps: [], warnings: [] }
      : await (this.o.readGpus?.() ?? readGpuTelemetry(this.o.nvidiaSmiPath));
    if (this.stopped) return;
    const atMs = Date.now();
    // The services with a process, not every record: a store of 10,000 settled jobs made each
    // sample build 10,000 records to find the few it measures.
    const workloads = this.o.services.liveWorkloads();
    const table = scanProcesses(new Set(workloads.map((service) => service.pid)), this.o.procRoot);
    const gpuSource = telemetry.readings.length > 0;
    const sample: Sample = {
      atMs,
      gpus: telemetry.readings,
      gpuSource,
      gpuWarnings: telemetry.warnings,
      services: new Map(),
      unattributedGpuMb: new Map(),
      durationS: 0,
    };
    const serviceOfWorkload = new Map<number, string>();
    const previous = new Map<number, { ticks: number; atMs: number }>();
    for (const { id, name, pid: workload } of workloads) {
      const usage = table.workloads.get(workload);
      if (!usage) continue;
      serviceOfWorkload.set(workload, id);
      const before = this.previous.get(workload);
      previous.set(workload, { ticks: usage.cpuTicks, atMs });
      const elapsedS = before ? (atMs - before.atMs) / 1000 : 0;
      const cpuPct =
        before && elapsedS > 0 ? Math.max(0, ((usage.cpuTicks - before.ticks) / this.units.ticksPerSecond / elapsedS) * 100) : null;
      sample.services.set(id, {
        id,
        name,
        workload,
        processes: usage.processes,
        cpuSeconds: usage.cpuTicks / this.units.ticksPerSecond,
        cpuPct: cpuPct === null ? null : Math.round(cpuPct * 10) / 10,
        rssBytes: usage.rssPages * this.units.pageBytes,
        gpuMemoryMb: gpuSource ? 0 : null,
      });
    }
    this.previous = previous;
    attributeGpuMemory(telemetry.apps, table, serviceOfWorkload, sample);
    sample.durationS = (performance.now() - started) / 1000;
    this.latestSample = sample;
    this.samples += 1;
    this.record(sample);
  }

  /** forget drops a deleted service's series. */
  forget(serviceId: string): void {
    const prefix = `svc\n${serviceId}\n`;
    this.history.forget((key) => key.startsWith(prefix));
  }

  private record(sample: Sample): void {
    const values = new Map<string, number>();
    for (const reading of sample.gpus) {
      this.gpuMeta.set(reading.uuid, { index: reading.index, name: reading.name, totalMb: reading.memory_total_mb });
      if (reading.utilization_pct !== null) values.set(`gpu\n${reading.uuid}\nutil`, reading.utilization_pct);
      if (reading.memory_used_mb !== null) values.set(`gpu\n${reading.uuid}\nmem`, reading.memory_used_mb);
    }
    for (const service of sample.services.values()) {
      if (service.cpuPct !== null) values.set(`svc\n${service.id}\ncpu`, service.cpuPct);
      values.set(`svc\n${service.id}\nrss`, service.rssBytes);
      if (service.gpuMemoryMb !== null) values.set(`svc\n${service.id}\ngpu`, service.gpuMemoryMb);
    }
    this.history.push(sample.atMs / 1000, values);
  }

  /**
   * historyOf answers GET /api/metrics/history: the samples after `sinceS`, for the GPUs seen in
   * the window and the given services (the caller filters them: scope, `service`).
   */
  historyOf(sinceS: number | undefined, services: readonly ServiceRecord[]): MetricsHistory {
    const slots = this.history.slots(sinceS);
    const gpus = [...this.gpuMeta.entries()]
      .filter(([uuid]) => this.history.has(`gpu\n${uuid}\nutil`) || this.history.has(`gpu\n${uuid}\nmem`))
      .sort((a, b) => a[1].index - b[1].index)
      .map(([uuid, meta]) => ({
        index: meta.index,
        uuid,
        name: meta.name,
        memory_total_mb: meta.totalMb === null ? null : Math.round(meta.totalMb),
        utilization_pct: this.history.valuesAt(`gpu\n${uuid}\nutil`, slots, Math.round),
        memory_used_mb: this.history.valuesAt(`gpu\n${uuid}\nmem`, slots, Math.round),
      }));
    return {
      interval_s: Math.max(1, Math.round((this.o.intervalMs || HISTORY_INTERVAL_S * 1000) / 1000)),
      window_s: HISTORY_WINDOW_S,
      now: Date.now() / 1000,
      times: this.history.timesAt(slots),
      gpus,
      services: [...services]
        .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
        .map((service) => ({
          id: service.id,
          name: service.name,
          cpu_pct: this.history.valuesAt(`svc\n${service.id}\ncpu`, slots),
          rss_bytes: this.history.valuesAt(`svc\n${service.id}\nrss`, slots, Math.round),
          gpu_memory_mb: this.history.valuesAt(`svc\n${service.id}\ngpu`, slots, Math.round),
        })),
    };
  }
}

/**
 * attributeGpuMemory adds each GPU process's memory to the service whose workload it belongs to; a
 * process of no service (another user's job, a pid from another pid namespace) counts as
 * unattributed on its GPU.
 */
function attributeGpuMemory(apps: ComputeApp[], table: ProcessTable, serviceOfWorkload: Map<number, string>, sample: Sample): void {
  for (const app of apps) {
    const memory = app.used_memory_mb ?? 0;
    const workload = table.ownerOf.get(app.pid);
    const serviceId = workload === undefined ? undefined : serviceOfWorkload.get(workload);
    const service = serviceId === undefined ? undefined : sample.services.get(serviceId);
    if (service) service.gpuMemoryMb = (service.gpuMemoryMb ?? 0) + memory;
    else sample.unattributedGpuMb.set(app.gpu_uuid, (sample.unattributedGpuMb.get(app.gpu_uuid) ?? 0) + memory);
  }
}
