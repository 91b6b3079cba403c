import { type GpuInventoryRecord, SERVICE_STATUSES, type ServiceRecord } from "../../contract/engine";
import { type HistogramData, type Labels, MetricsText, type Sample as Series } from "../../lib/prometheus";
import { PROXY_LATENCY_BOUNDS_S, type RouteCounts } from "../proxy";
import type { Sample } from "./collector";

/** SERVICE_STATUSES are every status a service can be in; each service gets a 0/1 series per status (as kube-state-metrics does). */
export { SERVICE_STATUSES };

/** RESTORE_BOUNDS_S are the upper bounds of the restore-duration histogram, in seconds. */
export const RESTORE_BOUNDS_S: readonly number[] = [1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200];

/** RestoreStats are the restores into one service that ended one way. */
export interface RestoreStats {
  service: string;
  engine: string;
  result: string;
  counts: readonly number[];
  sum: number;
}

/** ExpositionInput is everything one scrape shows, already filtered to what the caller may see. */
export interface ExpositionInput {
  version: string;
  hostname: string;
  sample: Sample | null;
  services: readonly ServiceRecord[];
  /** host is true when the caller sees the whole host (no service scope): GPUs, the queue and unrouted requests. */
  host: boolean;
  inventory: GpuInventoryRecord | null;
  proxy: readonly RouteCounts[];
  restarts: ReadonlyMap<string, number>;
  restores: readonly RestoreStats[];
  collector: { samples: number };
}

const MIB = 1024 * 1024;

/**
 * renderEngineMetrics writes the engine's /metrics answer (docs/decisions.md 330–336): GPU
 * series under the DCGM exporter's names, then the engine's own `engine_*` families.
 */
export function renderEngineMetrics(input: ExpositionInput): string {
  const text = new MetricsText();
  text.gauge("engine_build_info", "The engine's version; always 1.", [{ labels: { version: input.version }, value: 1 }]);
  const sample = input.sample;
  if (input.host) writeGpus(text, input);
  writeServices(text, input);
  if (input.host) {
    const pending = input.services.filter((service) => service.status === "pending" && service.desired_state === "running");
    text.gauge("engine_scheduler_queue_length", "Services waiting to be scheduled (for GPUs, caps or bindings).", [
      { labels: {}, value: pending.length },
    ]);
    text.gauge("engine_scheduler_queue_gpus", "GPUs the waiting services ask for, together.", [
      { labels: {}, value: pending.reduce((sum, service) => sum + service.gpus, 0) },
    ]);
  }
  writeProxy(text, input.proxy);
  text.histogram(
    "engine_database_restore_duration_seconds",
    "How long database restores took, by service, engine and result (ok, failed, timeout).",
    RESTORE_BOUNDS_S,
    input.restores.map((restore) => ({
      labels: { service: restore.service, engine: restore.engine, result: restore.result },
      counts: restore.counts,
      sum: restore.sum,
    })),
  );
  if (input.host) {
    text.counter("engine_metrics_samples_total", "Samples the metrics collector has taken (one every 5 s).", [
      { labels: {}, value: input.collector.samples },
    ]);
    if (sample) {
      text.gauge("engine_metrics_sample_duration_seconds", "How long the latest sample took (nvidia-smi and the /proc scan).", [
        { labels: {}, value: round(sample.durationS, 6) },
      ]);
      text.gauge("engine_metrics_sample_timestamp_seconds", "When the latest sample was taken (Unix seconds).", [
        { labels: {}, value: sample.atMs / 1000 },
      ]);
    }
  }
  return text.toString();
}

function round(value: number, digits: number): number {
  const scale = 10 ** digits;
  return Math.round(value * scale) / scale;
}

function writeGpus(text: MetricsText, input: ExpositionInput): void {
  const readings = input.sample?.gpus ?? [];
  const labelsOf = (reading: (typeof readings)[number]): Labels => ({
    gpu: String(reading.index),
    UUID: reading.uuid,
    device: `nvidia${reading.index}`,
    ...(reading.pci_bus_id ? { pci_bus_id: reading.pci_bus_id } : {}),
    Hostname: input.hostname,
  });
  const dcgm = (name: string, help: string, value: (reading: (typeof readings)[number]) => number | null) => {
    const samples: Series[] = [];
    for (const reading of readings) {
      const measured = value(reading);
      if (measured !== null) samples.push({ labels: labelsOf(reading), value: measured });
    }
    text.gauge(name, help, samples);
  };
  // The DCGM exporter's names and help texts (etc/default-counters.csv), so its dashboards work.
  dcgm("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", (reading) => reading.utilization_pct);
  dcgm("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", (reading) => reading.memory_used_mb);
  dcgm("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", (reading) => reading.memory_free_mb);
  dcgm("DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory total (in MiB).", (reading) => reading.memory_total_mb);
  dcgm("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", (reading) => reading.temperature_c);
  dcgm("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", (reading) => reading.power_w);
  const devices = input.inventory?.devices ?? [];
  text.gauge(
    "engine_gpu_info",
    "A GPU (or MIG instance) of the engine's inventory; always 1. model_name is the DCGM exporter's modelName.",
    devices.map((device) => ({
      labels: { gpu: String(device.index), UUID: device.uuid, model_name: device.name, source: device.source },
      value: 1,
    })),
  );
  text.gauge(
    "engine_gpu_reserved_bytes",
    "GPU memory placement has given to services on the device (whole GPUs count their total).",
    devices.map((device) => ({ labels: { gpu: String(device.index), UUID: device.uuid }, value: device.reserved_mb * MIB })),
  );
  if (input.sample?.gpuSource) {
    text.gauge(
      "engine_gpu_memory_unattributed_bytes",
      "GPU memory held by processes that belong to no service (nvidia-smi --query-compute-apps).",
      readings.map((reading) => ({
        labels: { gpu: String(reading.index), UUID: reading.uuid },
        value: (input.sample?.unattributedGpuMb.get(reading.uuid) ?? 0) * MIB,
      })),
    );
  }
}

function writeServices(text: MetricsText, input: ExpositionInput): void {
  const services = input.services;
  const sampled = (service: ServiceRecord) => input.sample?.services.get(service.id) ?? null;
  const statusSamples: Series[] = [];
  for (const service of services) {
    for (const status of SERVICE_STATUSES) {
      statusSamples.push({ labels: { service: service.name, kind: service.kind, status }, value: service.status === status ? 1 : 0 });
    }
  }
  text.gauge("engine_service_status", "The service's status: 1 for the status it is in, 0 for the others.", statusSamples);
  text.counter(
    "engine_service_restarts_total",
    "Restarts the restart policy made since the daemon started.",
    services.map((service) => ({ labels: { service: service.name }, value: input.restarts.get(service.id) ?? 0 })),
  );
  text.gauge(
    "engine_service_restarts_in_window",
    "Restarts counted in the restart policy's current window (the API's restarts).",
    services.map((service) => ({ labels: { service: service.name }, value: service.restarts })),
  );
  text.gauge(
    "engine_service_start_time_seconds",
    "When the service's current run started (Unix seconds); absent without a process.",
    services
      .filter((service) => service.started_at)
      .map((service) => ({
        labels: { service: service.name },
        value: Date.parse(service.started_at as string) / 1000,
      })),
  );
  const live = services.flatMap((service) => {
    const measured = sampled(service);
    return measured ? [{ service, measured }] : [];
  });
  text.gauge(
    "engine_service_processes",
    "Processes of the service's current run (its workload's process group and descendants).",
    live.map(({ service, measured }) => ({ labels: { service: service.name }, value: measured.processes })),
  );
  text.counter(
    "engine_service_cpu_seconds_total",
    "CPU time of the current run's processes, user and system, ended children included; restarts from 0 with each run.",
    live.map(({ service, measured }) => ({ labels: { service: service.name }, value: round(measured.cpuSeconds, 2) })),
  );
  text.gauge(
    "engine_service_memory_rss_bytes",
    "Resident memory of the current run's processes, summed.",
    live.map(({ service, measured }) => ({ labels: { service: service.name }, value: measured.rssBytes })),
  );
  if (input.sample?.gpuSource) {
    text.gauge(
      "engine_service_gpu_memory_bytes",
      "GPU memory the service's processes hold (nvidia-smi --query-compute-apps).",
      services.map((service) => ({ labels: { service: service.name }, value: (sampled(service)?.gpuMemoryMb ?? 0) * MIB })),
    );
  }
}

function writeProxy(text: MetricsText, counts: readonly RouteCounts[]): void {
  const labels = (item: RouteCounts): Labels => ({ service: item.service, route: item.route, code: item.code });
  text.counter(
    "engine_proxy_requests_total",
    "Requests the proxy answered, by service, route and status class.",
    counts.map((item) => ({ labels: labels(item), value: item.requests })),
  );
  text.counter(
    "engine_proxy_request_bytes_total",
    "Bytes of requests (head and body) the proxy read from clients.",
    counts.map((item) => ({ labels: labels(item), value: item.request_bytes })),
  );
  text.counter(
    "engine_proxy_response_bytes_total",
    "Bytes of answers (head and body) the proxy wrote to clients.",
    counts.map((item) => ({ labels: labels(item), value: item.response_bytes })),
  );
  const histograms: HistogramData[] = counts.map((item) => ({
    labels: labels(item),
    counts: item.latency,
    sum: round(item.latency_sum_s, 6),
  }));
  text.histogram(
    "engine_proxy_request_duration_seconds",
    "Time from a request's head to the last byte of its answer (a websocket: to the 101).",
    PROXY_LATENCY_BOUNDS_S,
    histograms,
  );
}
