import { existsSync } from "node:fs";
import { AppError } from "../../lib/errors";

/**
 * GpuDevice is one schedulable GPU: a whole GPU, or one MIG instance of a GPU that has MIG
 * enabled. `visible_id` is the value that goes into CUDA_VISIBLE_DEVICES and
 * NVIDIA_VISIBLE_DEVICES for a process that gets this device: the GPU uuid, the MIG uuid, or
 * the index of a declared GPU.
 */
export interface GpuDevice {
  /** index is nvidia-smi's GPU index; a MIG instance carries the index of its GPU. */
  index: number;
  uuid: string;
  name: string;
  memory_total_mb: number;
  memory_used_mb: number | null;
  utilization_pct: number | null;
  source: "nvidia-smi" | "declared";
  /** mig is true for a GPU whose current MIG mode is Enabled and for each of its MIG instances. */
  mig: boolean;
  /** mig_profile is the MIG profile of a MIG instance, such as `3g.40gb`; null for a whole GPU. */
  mig_profile: string | null;
  visible_id: string;
}

/** GpuSnapshot is the inventory as of one refresh. */
export interface GpuSnapshot {
  devices: GpuDevice[];
  source: "nvidia-smi" | "declared" | "none";
  warnings: string[];
  refreshed_at: string;
}

/** GpuParse is what a parser of nvidia-smi output found: the devices and what it had to skip. */
export interface GpuParse {
  devices: GpuDevice[];
  warnings: string[];
}

/** MigInstance is one MIG device listed by `nvidia-smi -L` under its GPU. */
export interface MigInstance {
  uuid: string;
  /** device is the MIG device number within its GPU (`Device  0`). */
  device: number;
  profile: string;
  /** memory_mb is the profile's `<N>gb` part as MiB (N * 1024); 0 when the profile names no memory. */
  memory_mb: number;
}

/** GpuListing is one GPU line of `nvidia-smi -L` with the MIG devices listed under it. */
export interface GpuListing {
  index: number;
  uuid: string;
  name: string;
  mig_devices: MigInstance[];
}

/** NVIDIA_SMI_QUERY is the argv (after the executable) of the inventory's nvidia-smi query. */
export const NVIDIA_SMI_QUERY: readonly string[] = [
  "--query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu,mig.mode.current",
  "--format=csv,noheader,nounits",
];

/** NVIDIA_SMI_LIST is the argv of the call that lists GPUs with their MIG devices. */
export const NVIDIA_SMI_LIST: readonly string[] = ["-L"];

/** DECLARED_GPU_DEFAULT_MB is the memory of a GPU declared by count alone (`ENGINE_GPUS=2`): 80 GiB. */
export const DECLARED_GPU_DEFAULT_MB = 81920;

/** DECLARED_GPU_MAX_COUNT bounds a declared count, so `ENGINE_GPUS=24576` (a size typed as a count) is refused. */
export const DECLARED_GPU_MAX_COUNT = 64;

const QUERY_FIELDS = 7;

// nvidia-smi prints these in place of a value it does not have; they mean "unknown", not "broken".
const UNKNOWN_VALUES = new Set(["", "n/a", "[n/a]", "[not supported]", "[insufficient permissions]", "[unknown error]"]);

// These field values mean the GPU itself is unusable, so the whole row is skipped.
const BROKEN_VALUES = new Set(["[gpu requires reset]", "[gpu is lost]"]);

// nvidia-smi prints this instead of a row for a GPU that fell off the bus or is otherwise unreachable,
// e.g. "Unable to determine the device handle for GPU0000:01:00.0: GPU is lost.  Reboot the system to recover this GPU".
const UNREACHABLE_GPU = /^Unable to determine the device handle for GPU/i;

const SKIPPED_UNREACHABLE = "skipped a GPU nvidia-smi cannot reach: ";
const SKIPPED_NOT_A_ROW = "skipped an nvidia-smi line that is not a GPU row: ";

/** shortUuid returns the part of a uuid people recognise: `GPU-5d5ba0d6` of `GPU-5d5ba0d6-d33d-…`. */
export function shortUuid(uuid: string): string {
  const match = /^((?:GPU|MIG)-[0-9a-f]{8})/i.exec(uuid);
  return match ? match[1]! : uuid;
}

/** deviceLabel names a device in messages by index and short uuid, and MIG profile for a MIG instance. */
export function deviceLabel(device: GpuDevice): string {
  const mig = device.mig_profile ? ` MIG ${device.mig_profile}` : "";
  return `GPU ${device.index}${mig} (${shortUuid(device.uuid)})`;
}

function splitLines(text: string): string[] {
  return text
    .split(/\r?\n|\r/)
    .map((line) => line.trim())
    .filter((line) => line.length > 0);
}

function isUnknown(value: string): boolean {
  return UNKNOWN_VALUES.has(value.toLowerCase());
}

// readNumber accepts "81559", "81559 MiB" and "0 %": nvidia-smi adds units unless asked for nounits.
function readNumber(value: string): number | null {
  if (isUnknown(value)) return null;
  const match = /^(\d+(?:\.\d+)?)\s*(?:MiB|%)?$/i.exec(value);
  return match ? Number(match[1]) : null;
}

function isHeader(fields: string[]): boolean {
  return fields[0]?.toLowerCase() === "index" && (fields[1]?.toLowerCase() ?? "").startsWith("uuid");
}

/**
 * parseNvidiaSmiCsv parses the output of `nvidia-smi` run with NVIDIA_SMI_QUERY. It trims
 * fields, accepts CRLF, blank lines, a header line and values with units, and turns `[N/A]`,
 * `[Not Supported]` and `N/A` into null. A GPU nvidia-smi cannot reach (its "Unable to determine
 * the device handle" line, or a `[GPU requires reset]` field) is skipped with a warning, as is
 * any line it cannot read; it never throws. A GPU whose MIG mode is Enabled is returned whole
 * with `mig: true`: applyMigInstances replaces it with its MIG instances.
 */
export function parseNvidiaSmiCsv(text: string): GpuParse {
  const devices: GpuDevice[] = [];
  const warnings: string[] = [];
  for (const line of splitLines(text)) {
    if (UNREACHABLE_GPU.test(line)) {
      warnings.push(`${SKIPPED_UNREACHABLE}${line}`);
      continue;
    }
    if (/^No devices were found/i.test(line)) continue;
    const raw = line.split(",").map((field) => field.trim());
    if (isHeader(raw)) continue;
    if (raw.length < QUERY_FIELDS) {
      warnings.push(`${SKIPPED_NOT_A_ROW}${line}`);
      continue;
    }
    // The name is the only field that could hold a comma, so it takes whatever is between the
    // two leading and the four trailing fields.
    const index = raw[0]!;
    const uuid = raw[1]!;
    const name = raw.slice(2, raw.length - 4).join(",");
    const [memoryTotal, memoryUsed, utilization, migMode] = raw.slice(raw.length - 4) as [string, string, string, string];
    const broken = raw.find((field) => BROKEN_VALUES.has(field.toLowerCase()));
    if (broken) {
      warnings.push(`skipped GPU ${index} (${shortUuid(uuid)}): nvidia-smi reports ${broken}`);
      continue;
    }
    const indexNumber = readNumber(index);
    const totalNumber = readNumber(memoryTotal);
    if (indexNumber === null || !Number.isInteger(indexNumber) || isUnknown(uuid) || totalNumber === null) {
      warnings.push(`skipped an nvidia-smi GPU row without an index, uuid or total memory: ${line}`);
      continue;
    }
    devices.push({
      index: indexNumber,
      uuid,
      name,
      memory_total_mb: totalNumber,
      memory_used_mb: readNumber(memoryUsed),
      utilization_pct: readNumber(utilization),
      source: "nvidia-smi",
      mig: migMode.toLowerCase() === "enabled",
      mig_profile: null,
      visible_id: uuid,
    });
  }
  return { devices, warnings };
}

// "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-8e100991-ce97-6694-b8eb-b8b1ff5053af)"
const LIST_GPU_LINE = /^GPU\s+(\d+):\s+(.*?)\s+\(UUID:\s*(GPU-[^)\s]+)\)$/;
// "  MIG 3g.40gb     Device  0: (UUID: MIG-dcf43e8e-5d19-5fa8-8b1d-8aaca1e467f0)"; drivers before
// R470 printed "MIG-GPU-<gpu uuid>/<gi>/<ci>", which the same pattern accepts.
const LIST_MIG_LINE = /^MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s*(MIG-[^)\s]+)\)$/;

/** migProfileMemoryMb returns the memory a MIG profile names (`3g.40gb` → 40960 MiB), or 0 when it names none. */
export function migProfileMemoryMb(profile: string): number {
  const match = /(?:^|\.)(\d+)gb/i.exec(profile);
  return match ? Number(match[1]) * 1024 : 0;
}

/**
 * parseNvidiaSmiList parses `nvidia-smi -L`: each GPU with its index, name and uuid, and the MIG
 * devices listed under it. Lines it does not recognise are ignored.
 */
export function parseNvidiaSmiList(text: string): GpuListing[] {
  const gpus: GpuListing[] = [];
  for (const line of splitLines(text)) {
    const gpu = LIST_GPU_LINE.exec(line);
    if (gpu) {
      gpus.push({ index: Number(gpu[1]), name: gpu[2]!, uuid: gpu[3]!, mig_devices: [] });
      continue;
    }
    const mig = LIST_MIG_LINE.exec(line);
    const owner = gpus.at(-1);
    if (mig && owner) {
      const profile = mig[1]!;
      owner.mig_devices.push({ uuid: mig[3]!, device: Number(mig[2]), profile, memory_mb: migProfileMemoryMb(profile) });
    }
  }
  return gpus;
}

/**
 * applyMigInstances replaces each MIG-enabled GPU by its MIG instances from an `nvidia-smi -L`
 * listing. Each instance is a device of its own whose visible_id is its MIG uuid; the GPU itself
 * is not offered, since CUDA cannot use a MIG-enabled GPU whole. A MIG-enabled GPU without
 * instances offers nothing and is reported in the warnings.
 */
export function applyMigInstances(devices: readonly GpuDevice[], listing: readonly GpuListing[]): GpuParse {
  const byUuid = new Map(listing.map((gpu) => [gpu.uuid, gpu]));
  const result: GpuDevice[] = [];
  const warnings: string[] = [];
  for (const device of devices) {
    if (!device.mig) {
      result.push(device);
      continue;
    }
    const instances = byUuid.get(device.uuid)?.mig_devices ?? [];
    if (instances.length === 0) {
      warnings.push(`${deviceLabel(device)} has MIG enabled but no MIG instances, so it offers nothing to schedule`);
      continue;
    }
    for (const instance of instances) {
      result.push({
        index: device.index,
        uuid: instance.uuid,
        name: `${device.name} MIG ${instance.profile}`,
        memory_total_mb: instance.memory_mb,
        memory_used_mb: null,
        utilization_pct: null,
        source: device.source,
        mig: true,
        mig_profile: instance.profile,
        visible_id: instance.uuid,
      });
    }
  }
  return { devices: result, warnings };
}

function declaredError(spec: string, problem: string, part: string): AppError {
  return new AppError("gpu_inventory_failed", `ENGINE_GPUS ${JSON.stringify(spec)}: ${problem}`, { setting: "ENGINE_GPUS", part });
}

function declaredDevice(index: number, name: string, memoryMb: number): GpuDevice {
  return {
    index,
    uuid: `declared-${index}`,
    name,
    memory_total_mb: memoryMb,
    memory_used_mb: null,
    utilization_pct: null,
    source: "declared",
    mig: false,
    mig_profile: null,
    visible_id: String(index),
  };
}

function declaredCount(spec: string, part: string): number {
  const count = Number(part);
  if (count > DECLARED_GPU_MAX_COUNT) {
    throw declaredError(
      spec,
      `${part} GPUs is more than ${DECLARED_GPU_MAX_COUNT}; to give a size write <count>x<MiB>, e.g. 1x${part}`,
      part,
    );
  }
  return count;
}

function declaredMemory(spec: string, part: string, where: string): number {
  if (!/^\d+$/.test(part) || Number(part) === 0) {
    throw declaredError(spec, `${JSON.stringify(part)} ${where} is not a positive whole number of MiB`, part);
  }
  return Number(part);
}

/**
 * parseDeclaredGpus parses the `ENGINE_GPUS` setting, which declares GPUs on a host that lacks
 * them (or overrides what nvidia-smi would say). Three forms are accepted: a count (`"2"`, each
 * an 80 GiB "declared GPU"), a count and size in MiB (`"2x24576"`), and a comma list of
 * `name:MiB` (`"RTX 4090:24564,A100:40960"`). `"0"` declares no GPUs. Declared devices have
 * uuid `declared-<index>` and visible_id `<index>`. A bad spec throws AppError
 * `gpu_inventory_failed` naming the bad part.
 */
export function parseDeclaredGpus(spec: string): GpuDevice[] {
  const trimmed = spec.trim();
  if (trimmed === "") throw declaredError(spec, "is empty; write a count, <count>x<MiB> or name:MiB,name:MiB", spec);
  if (/^\d+$/.test(trimmed)) {
    const count = declaredCount(spec, trimmed);
    return Array.from({ length: count }, (_, index) => declaredDevice(index, "declared GPU", DECLARED_GPU_DEFAULT_MB));
  }
  const sized = /^(\d+)\s*[xX]\s*(\S+)$/.exec(trimmed);
  if (sized) {
    const count = declaredCount(spec, sized[1]!);
    const memoryMb = declaredMemory(spec, sized[2]!, "after the x");
    return Array.from({ length: count }, (_, index) => declaredDevice(index, "declared GPU", memoryMb));
  }
  if (!trimmed.includes(":")) {
    throw declaredError(spec, "is neither a count, <count>x<MiB> nor a list of name:MiB", trimmed);
  }
  return trimmed.split(",").map((rawPart, index) => {
    const part = rawPart.trim();
    const colon = part.lastIndexOf(":");
    if (part === "") throw declaredError(spec, `GPU ${index + 1} of the list is empty`, part);
    if (colon < 0) throw declaredError(spec, `${JSON.stringify(part)} is not name:MiB`, part);
    const name = part.slice(0, colon).trim();
    if (name === "") throw declaredError(spec, `${JSON.stringify(part)} has no name before the colon`, part);
    return declaredDevice(index, name, declaredMemory(spec, part.slice(colon + 1).trim(), `in ${JSON.stringify(part)}`));
  });
}

/** GpuInventoryLog is the part of a logger the inventory uses. */
export interface GpuInventoryLog {
  warn(obj: object, msg: string): void;
}

/** GpuInventoryOptions configures a GpuInventory. */
export interface GpuInventoryOptions {
  /** nvidiaSmiPath is the nvidia-smi executable; by default it is looked up on PATH at each refresh. */
  nvidiaSmiPath?: string;
  /** declared is the ENGINE_GPUS value; when set (and not blank) it wins over nvidia-smi. */
  declared?: string;
  log?: GpuInventoryLog;
  clock?: { now(): Date };
  /** timeoutMs bounds each nvidia-smi call; 5000 by default. */
  timeoutMs?: number;
}

export interface CommandResult {
  exitCode: number | null;
  stdout: string;
  stderr: string;
  timedOut: boolean;
}

/** runCommand runs nvidia-smi (or another short command) with a deadline; the telemetry reader shares it. */
export async function runCommand(argv: string[], timeoutMs: number): Promise<CommandResult> {
  const proc = Bun.spawn(argv, { stdin: "ignore", stdout: "pipe", stderr: "pipe" });
  const collected = Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  let timer: ReturnType<typeof setTimeout> | undefined;
  // A GPU driver in trouble can leave nvidia-smi blocked in the kernel, where even SIGKILL does
  // not end it at once; the timer answers without waiting for its pipes to close.
  const timedOut = new Promise<"timeout">((resolve) => {
    timer = setTimeout(() => resolve("timeout"), timeoutMs);
  });
  try {
    const outcome = await Promise.race([collected, timedOut]);
    if (outcome === "timeout") {
      proc.kill("SIGKILL");
      return { exitCode: null, stdout: "", stderr: "", timedOut: true };
    }
    const [stdout, stderr, exitCode] = outcome;
    return { exitCode, stdout, stderr, timedOut: false };
  } finally {
    clearTimeout(timer);
  }
}

function firstLine(...texts: string[]): string {
  for (const text of texts) {
    const line = splitLines(text)[0];
    if (line) return line;
  }
  return "(no output)";
}

/**
 * GpuInventory knows the host's GPUs. When ENGINE_GPUS is set the declared GPUs are the
 * inventory and nvidia-smi is never run; otherwise each refresh runs nvidia-smi (and
 * `nvidia-smi -L` when some GPU has MIG enabled). Failures never throw: a missing nvidia-smi
 * gives source "none", a failing one gives no devices and a warning. A GPU or MIG device seen
 * by an earlier refresh and missing now is reported in the warnings of every refresh until it
 * returns. Only a bad ENGINE_GPUS throws, from the constructor, so start-up fails early.
 */
export class GpuInventory {
  readonly #nvidiaSmiPath: string | undefined;
  readonly #declared: GpuDevice[] | undefined;
  readonly #log: GpuInventoryLog | undefined;
  readonly #clock: { now(): Date };
  readonly #timeoutMs: number;
  readonly #seen = new Map<string, string>();
  #snapshot: GpuSnapshot;
  /** #refreshedAt is when the last refresh ended (performance.now()), null before the first. */
  #refreshedAt: number | null = null;

  constructor(options: GpuInventoryOptions = {}) {
    this.#nvidiaSmiPath = options.nvidiaSmiPath;
    this.#log = options.log;
    this.#clock = options.clock ?? { now: () => new Date() };
    this.#timeoutMs = options.timeoutMs ?? 5000;
    const declared = options.declared?.trim();
    this.#declared = declared ? parseDeclaredGpus(declared) : undefined;
    this.#snapshot = this.#declared
      ? this.#declaredSnapshot()
      : { devices: [], source: "none", warnings: ["the GPU inventory has not been refreshed yet"], refreshed_at: this.#now() };
  }

  /** snapshot returns the inventory of the last refresh (the declared GPUs when ENGINE_GPUS is set). */
  snapshot(): GpuSnapshot {
    return this.#snapshot;
  }

  /** refresh asks nvidia-smi again, unless GPUs are declared, and returns the new snapshot. */
  async refresh(): Promise<GpuSnapshot> {
    this.#snapshot = this.#declared ? this.#declaredSnapshot() : await this.#detect();
    this.#refreshedAt = performance.now();
    return this.#snapshot;
  }

  /** refreshedWithin says whether a refresh ended less than `ms` ago. */
  refreshedWithin(ms: number): boolean {
    return this.#refreshedAt !== null && performance.now() - this.#refreshedAt < ms;
  }

  #now(): string {
    return this.#clock.now().toISOString();
  }

  #declaredSnapshot(): GpuSnapshot {
    return { devices: this.#declared!, source: "declared", warnings: [], refreshed_at: this.#now() };
  }

  async #detect(): Promise<GpuSnapshot> {
    const path = this.#nvidiaSmiPath ?? Bun.which("nvidia-smi") ?? undefined;
    if (!path) return { devices: [], source: "none", warnings: [], refreshed_at: this.#now() };
    if (!existsSync(path)) {
      return { devices: [], source: "none", warnings: [`nvidia-smi not found at ${path}`], refreshed_at: this.#now() };
    }
    const { devices: rows, warnings } = await this.#query(path);
    let devices = rows;
    if (rows.some((device) => device.mig)) {
      const list = await runCommand([path, ...NVIDIA_SMI_LIST], this.#timeoutMs);
      if (list.timedOut) warnings.push(`nvidia-smi -L did not answer within ${this.#timeoutMs} ms`);
      else if (list.exitCode !== 0) warnings.push(`nvidia-smi -L exited with ${list.exitCode}: ${firstLine(list.stderr, list.stdout)}`);
      const applied = applyMigInstances(rows, list.exitCode === 0 ? parseNvidiaSmiList(list.stdout) : []);
      devices = applied.devices;
      warnings.push(...applied.warnings);
    }
    warnings.push(...this.#trackVanished(rows, devices));
    // A lasting problem is logged when it appears, not at every refresh.
    const previous = new Set(this.#snapshot.warnings);
    for (const warning of warnings) if (!previous.has(warning)) this.#log?.warn({ nvidia_smi: path }, warning);
    return { devices, source: "nvidia-smi", warnings, refreshed_at: this.#now() };
  }

  async #query(path: string): Promise<GpuParse> {
    const result = await runCommand([path, ...NVIDIA_SMI_QUERY], this.#timeoutMs);
    if (result.timedOut) return { devices: [], warnings: [`nvidia-smi did not answer within ${this.#timeoutMs} ms`] };
    // A lost GPU makes nvidia-smi exit non-zero (15) while it still prints the rows of the
    // others, so the rows are read whatever the exit status. The unreachable-GPU line can come
    // on either stream.
    const parsed = parseNvidiaSmiCsv(result.stdout);
    const lost = splitLines(result.stderr).filter((line) => UNREACHABLE_GPU.test(line));
    parsed.warnings.push(...lost.map((line) => `${SKIPPED_UNREACHABLE}${line}`));
    if (result.exitCode === 0) return parsed;
    const first = firstLine(result.stderr, result.stdout);
    const exited = `nvidia-smi exited with ${result.exitCode}: ${first}`;
    if (parsed.devices.length > 0) {
      return parsed.warnings.length > 0 ? parsed : { devices: parsed.devices, warnings: [exited] };
    }
    // Nothing usable came back. The exit line says why (e.g. "NVIDIA-SMI has failed because it
    // couldn't communicate with the NVIDIA driver"), so the lines that are not rows are not
    // repeated; skipped GPUs other than the one the exit line names still are.
    const others = parsed.warnings.filter((warning) => !warning.startsWith(SKIPPED_NOT_A_ROW) && !warning.endsWith(first));
    return { devices: [], warnings: [exited, ...others] };
  }

  // trackVanished compares this refresh with every GPU and MIG device seen before. GPUs are
  // tracked by their rows, not by the schedulable devices, so switching MIG on does not make
  // the GPU look lost; MIG instances are tracked too, so a deleted instance is reported.
  #trackVanished(rows: GpuDevice[], devices: GpuDevice[]): string[] {
    const present = new Map<string, string>();
    for (const row of rows) present.set(row.uuid, `GPU ${row.uuid} (index ${row.index})`);
    for (const device of devices) {
      if (device.mig_profile) present.set(device.uuid, `MIG device ${device.uuid} (GPU ${device.index}, ${device.mig_profile})`);
    }
    const warnings: string[] = [];
    for (const [uuid, label] of this.#seen) {
      if (!present.has(uuid)) warnings.push(`${label} is no longer reported by nvidia-smi`);
    }
    for (const [uuid, label] of present) this.#seen.set(uuid, label);
    return warnings;
  }
}
