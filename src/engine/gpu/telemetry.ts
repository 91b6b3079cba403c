import { existsSync } from "node:fs";
import { runCommand } from "./inventory";

/**
 * NVIDIA_SMI_TELEMETRY is the argv of the metrics' per-sample GPU query: what the DCGM
 * exporter's default counters show (utilization, framebuffer used/free/total, temperature,
 * power), with the PCI bus id it labels series with. It is separate from the inventory's
 * query, which runs once a minute and feeds placement (docs/decisions.md 333).
 */
export const NVIDIA_SMI_TELEMETRY: readonly string[] = [
  "--query-gpu=index,uuid,name,pci.bus_id,utilization.gpu,memory.used,memory.free,memory.total,temperature.gpu,power.draw",
  "--format=csv,noheader,nounits",
];

/** NVIDIA_SMI_COMPUTE_APPS is the argv that lists the processes holding GPU memory. */
export const NVIDIA_SMI_COMPUTE_APPS: readonly string[] = [
  "--query-compute-apps=pid,used_memory,gpu_uuid",
  "--format=csv,noheader,nounits",
];

/** GpuReading is one GPU as one telemetry query saw it; a value nvidia-smi did not have is null. */
export interface GpuReading {
  index: number;
  uuid: string;
  name: string;
  pci_bus_id: string | null;
  utilization_pct: number | null;
  memory_used_mb: number | null;
  memory_free_mb: number | null;
  memory_total_mb: number | null;
  temperature_c: number | null;
  power_w: number | null;
}

/** ComputeApp is one process holding memory on one GPU. */
export interface ComputeApp {
  pid: number;
  /** used_memory_mb is null where nvidia-smi cannot say (`[N/A]`: MIG, or no permission). */
  used_memory_mb: number | null;
  gpu_uuid: string;
}

/** GpuTelemetry is one sample's GPU readings and GPU processes, and what went wrong getting them. */
export interface GpuTelemetry {
  readings: GpuReading[];
  apps: ComputeApp[];
  warnings: string[];
}

const READING_TAIL_FIELDS = 7;

function numberOf(field: string | undefined): number | null {
  if (field === undefined) return null;
  const match = /^(-?\d+(?:\.\d+)?)\s*(?:MiB|%|W|C)?$/i.exec(field.trim());
  return match ? Number(match[1]) : null;
}

/**
 * parseTelemetryCsv reads the output of NVIDIA_SMI_TELEMETRY. The name may hold commas, so it
 * is what lies between the two leading and the seven trailing fields; `[N/A]`, `[Not
 * Supported]` and the like become null; a line that is no GPU row (an "Unable to determine
 * the device handle" line of a lost GPU, a header) is skipped with a warning, never thrown on.
 */
export function parseTelemetryCsv(text: string): { readings: GpuReading[]; warnings: string[] } {
  const readings: GpuReading[] = [];
  const warnings: string[] = [];
  for (const line of text.split(/\r?\n/)) {
    const trimmed = line.trim();
    if (trimmed === "" || /^No devices were found/i.test(trimmed)) continue;
    const fields = trimmed.split(",").map((field) => field.trim());
    const index = numberOf(fields[0]);
    const uuid = fields[1] ?? "";
    if (fields.length < 2 + READING_TAIL_FIELDS + 1 || index === null || !Number.isInteger(index) || !/^GPU-/i.test(uuid)) {
      warnings.push(`skipped an nvidia-smi line that is not a GPU reading: ${trimmed}`);
      continue;
    }
    const tail = fields.slice(fields.length - READING_TAIL_FIELDS);
    const [bus, utilization, used, free, total, temperature, power] = tail as [string, string, string, string, string, string, string];
    readings.push({
      index,
      uuid,
      name: fields.slice(2, fields.length - READING_TAIL_FIELDS).join(", "),
      pci_bus_id: /^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$/i.test(bus) ? bus : null,
      utilization_pct: numberOf(utilization),
      memory_used_mb: numberOf(used),
      memory_free_mb: numberOf(free),
      memory_total_mb: numberOf(total),
      temperature_c: numberOf(temperature),
      power_w: numberOf(power),
    });
  }
  return { readings, warnings };
}

/**
 * parseComputeApps reads the output of NVIDIA_SMI_COMPUTE_APPS: `pid, used_memory, gpu_uuid`
 * lines. Lines it cannot read ("No running processes found", a header) are ignored.
 */
export function parseComputeApps(text: string): ComputeApp[] {
  const apps: ComputeApp[] = [];
  for (const line of text.split(/\r?\n/)) {
    const fields = line.split(",").map((field) => field.trim());
    if (fields.length !== 3) continue;
    const pid = numberOf(fields[0]);
    const uuid = fields[2] as string;
    if (pid === null || !Number.isInteger(pid) || pid <= 0 || !/^(GPU|MIG)-/i.test(uuid)) continue;
    apps.push({ pid, used_memory_mb: numberOf(fields[1]), gpu_uuid: uuid });
  }
  return apps;
}

/**
 * readGpuTelemetry runs the two queries (one after the other: nvidia-smi serialises on the
 * driver anyway) and never throws: a missing nvidia-smi gives nothing, a failing or hanging one
 * gives what it could read and a warning.
 */
export async function readGpuTelemetry(nvidiaSmiPath: string | undefined, timeoutMs = 5000): Promise<GpuTelemetry> {
  const path = nvidiaSmiPath ?? Bun.which("nvidia-smi") ?? undefined;
  if (!path || !existsSync(path)) return { readings: [], apps: [], warnings: [] };
  const warnings: string[] = [];
  const query = await runCommand([path, ...NVIDIA_SMI_TELEMETRY], timeoutMs);
  if (query.timedOut) return { readings: [], apps: [], warnings: [`nvidia-smi did not answer within ${timeoutMs} ms`] };
  const parsed = parseTelemetryCsv(query.stdout);
  // A lost GPU makes nvidia-smi exit non-zero while it still prints the others' rows.
  if (query.exitCode !== 0) warnings.push(`nvidia-smi exited with ${query.exitCode}`);
  warnings.push(...parsed.warnings);
  if (parsed.readings.length === 0) return { readings: [], apps: [], warnings };
  const listing = await runCommand([path, ...NVIDIA_SMI_COMPUTE_APPS], timeoutMs);
  if (listing.timedOut) warnings.push(`nvidia-smi --query-compute-apps did not answer within ${timeoutMs} ms`);
  else if (listing.exitCode !== 0) warnings.push(`nvidia-smi --query-compute-apps exited with ${listing.exitCode}`);
  return { readings: parsed.readings, apps: listing.timedOut ? [] : parseComputeApps(listing.stdout), warnings };
}
