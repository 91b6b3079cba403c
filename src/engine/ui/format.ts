/**
 * format.ts holds the web UI's pure rules: how a health probe, a restore or a size reads, which
 * service actions apply in which status, what the deploy form's GPU count starts at, and the
 * text badge that stands in for an emoji the browser cannot draw. app.ts renders what these
 * return; test/engine/ui/format.test.ts checks them with tables. Nothing here touches the DOM.
 */

/** plural writes "1 failure", "3 failures". */
function plural(count: number, noun: string): string {
  return `${count} ${noun}${count === 1 ? "" : "s"}`;
}

/** seconds writes a duration the way the rest of the UI does: "10 s", "0.5 s". */
function seconds(value: unknown): string {
  return `${typeof value === "number" ? Number(value.toFixed(3)) : String(value)} s`;
}

/** commandText writes an exec probe's command as it would be typed: `/bin/sh -c X` as X, an argv joined by spaces. */
function commandText(command: unknown): string {
  if (typeof command === "string") return command;
  if (!Array.isArray(command)) return "";
  if (command.length === 3 && command[0] === "/bin/sh" && command[1] === "-c") return String(command[2]);
  return command.map(String).join(" ");
}

/**
 * describeHealthSpec writes a service's health probe as one line:
 * "HTTP GET :8000/health every 10 s, timeout 2 s, 3 failures" (the failures in a row that
 * count the service as down). An http or tcp probe without its own port probes the service's
 * port, passed as servicePort.
 */
export function describeHealthSpec(spec: Record<string, unknown>, servicePort: number | null): string {
  const port = typeof spec.port === "number" ? spec.port : servicePort;
  const at = port === null ? "the service's port" : `:${port}`;
  let what: string;
  if (spec.type === "http") {
    const path = typeof spec.path === "string" ? spec.path : "/";
    what = port === null ? `HTTP GET ${path} on the service's port` : `HTTP GET ${at}${path}`;
  } else if (spec.type === "tcp") what = `TCP connect to ${at}`;
  else if (spec.type === "exec") what = `run ${commandText(spec.command)}`;
  else what = String(spec.type);
  const parts = [what];
  if (spec.interval_s !== undefined) parts[0] += ` every ${seconds(spec.interval_s)}`;
  if (spec.timeout_s !== undefined) parts.push(`timeout ${seconds(spec.timeout_s)}`);
  if (typeof spec.failure_threshold === "number") parts.push(plural(spec.failure_threshold, "failure"));
  if (typeof spec.start_period_s === "number" && spec.start_period_s > 0) parts.push(`start period ${seconds(spec.start_period_s)}`);
  return parts.join(", ");
}

/**
 * describeProbe writes the last probe's outcome: "failed at <time> (connect ECONNREFUSED …,
 * 3 ms); 2 consecutive failures". `when` formats the probe's time.
 */
export function describeProbe(probe: Record<string, unknown>, when: (iso: string) => string): string {
  const outcome = probe.ok === true ? "passed" : "failed";
  const at = typeof probe.at === "string" ? ` at ${when(probe.at)}` : "";
  const details = [
    typeof probe.detail === "string" ? probe.detail : null,
    typeof probe.duration_ms === "number" ? `${probe.duration_ms} ms` : null,
  ]
    .filter((part) => part !== null)
    .join(", ");
  const failures =
    typeof probe.consecutive_failures === "number" && probe.consecutive_failures > 0
      ? `; ${plural(probe.consecutive_failures, "consecutive failure")}`
      : "";
  return `${outcome}${at}${details ? ` (${details})` : ""}${failures}`;
}

/** formatBytes writes a size in binary units: "512 B", "1.5 KiB", "20.0 MiB". */
export function formatBytes(bytes: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
}

/** LastDumpView is Diagnosis' last_dump as the UI reads it (src/engine/databases/restore.ts LastDump). */
export interface LastDumpView {
  dump?: unknown;
  format?: unknown;
  engine?: unknown;
  started_at?: unknown;
  finished_at?: unknown;
  duration_s?: unknown;
  bytes?: unknown;
  total_bytes?: unknown;
  result?: unknown;
  message?: unknown;
}

/**
 * describeLastDump turns a database's last restore into labelled rows: "Last dump" as
 * "<file>, <size>, <time>", then how it went and what it was. `when` formats times.
 */
export function describeLastDump(dump: LastDumpView, when: (iso: string) => string): [string, string][] {
  const bytes = typeof dump.bytes === "number" ? dump.bytes : null;
  const total = typeof dump.total_bytes === "number" ? dump.total_bytes : null;
  const size =
    dump.result === "running" && bytes !== null
      ? `${formatBytes(bytes)} read${total === null ? "" : ` of ${formatBytes(total)}`}`
      : total !== null
        ? formatBytes(total)
        : bytes !== null
          ? formatBytes(bytes)
          : "size unknown";
  const time = typeof dump.finished_at === "string" ? dump.finished_at : typeof dump.started_at === "string" ? dump.started_at : null;
  const summary = [String(dump.dump ?? "?"), size, time === null ? null : when(time)].filter((part) => part !== null).join(", ");
  const duration = typeof dump.duration_s === "number" ? ` in ${seconds(dump.duration_s)}` : "";
  const result =
    dump.result === "ok"
      ? `restored${duration}`
      : dump.result === "running"
        ? "restoring now"
        : dump.result === "timeout"
          ? `stopped at its timeout${duration}; the database was left as it was`
          : `${String(dump.result ?? "unknown")}${duration}${typeof dump.message === "string" && dump.message ? `: ${dump.message}` : ""}`;
  const rows: [string, string][] = [
    ["Last dump", summary],
    ["Result", result],
  ];
  const what = [typeof dump.format === "string" ? dump.format : null, typeof dump.engine === "string" ? `into ${dump.engine}` : null]
    .filter((part) => part !== null)
    .join(" ");
  if (what) rows.push(["Format", what]);
  if (dump.result === "ok" && typeof dump.message === "string" && dump.message) rows.push(["Note", dump.message]);
  return rows;
}

/** ServiceActionName is a control action of POST /api/services/{ident}/{action}. */
export type ServiceActionName = "start" | "stop" | "restart" | "pause" | "resume";

/** ActionButton is one service action as the service page offers it. */
export interface ActionButton {
  action: ServiceActionName;
  label: string;
  /** disabledReason says why the action cannot apply now (the button's title); null when it can. */
  disabledReason: string | null;
}

/** LIVE_STATUSES hold (or are about to hold) a process, as the service manager counts them. */
const LIVE_STATUSES = new Set(["scheduled", "running", "degraded", "paused"]);
/** ENDED_STATUSES have no process and nothing pending: stop has nothing to do. */
const ENDED_STATUSES = new Set(["stopped", "failed", "completed", "cancelled"]);

/**
 * serviceActions lists the service page's action buttons for a status and kind, each disabled
 * with the reason where the engine would refuse it (409 invalid_transition in the service
 * manager's control) or where it would do nothing useful: Stop on a service that already ended
 * (on a completed job it would only relabel it cancelled), Pause on one with no running process.
 * Pause and Resume share a place: Resume shows on a paused service.
 */
export function serviceActions(status: string, kind: string): ActionButton[] {
  const it = kind === "batch" ? "the job" : "the service";
  const It = kind === "batch" ? "The job" : "The service";
  const startReason =
    status === "building"
      ? `${It} is building: wait for the build`
      : LIVE_STATUSES.has(status)
        ? `${It} is ${status}: stop it first, or use Restart`
        : null;
  const stopReason = !ENDED_STATUSES.has(status)
    ? null
    : status === "completed"
      ? `${It} has completed: nothing runs to stop`
      : status === "failed"
        ? `${It} has failed: nothing runs to stop`
        : `${It} is already ${status}`;
  const restartReason = status === "building" ? `${It} is building: wait for the build` : null;
  const pause: ActionButton =
    status === "paused"
      ? { action: "resume", label: "Resume", disabledReason: null }
      : {
          action: "pause",
          label: "Pause",
          disabledReason: status === "running" || status === "degraded" ? null : `Only a running process can be paused; ${it} is ${status}`,
        };
  return [
    { action: "start", label: "Start", disabledReason: startReason },
    { action: "stop", label: "Stop", disabledReason: stopReason },
    { action: "restart", label: "Restart", disabledReason: restartReason },
    pause,
  ];
}

/** GpuDefault is the deploy form's starting GPU count and the hint beside it. */
export interface GpuDefault {
  value: number;
  hint: string | null;
}

/**
 * gpuDefault chooses the template deploy form's GPU count: the template's default, but 0 on a
 * host without GPUs (a deploy asking for one would wait forever) and never more than the host
 * has. deviceCount is null when the GPU inventory could not be read: the template's default
 * stands, without a hint.
 */
export function gpuDefault(templateGpus: number, deviceCount: number | null): GpuDefault {
  if (deviceCount === null) return { value: templateGpus, hint: null };
  const suggests = templateGpus > 0 ? ` (the template suggests ${templateGpus})` : "";
  if (deviceCount === 0) return { value: 0, hint: `no GPUs on this host${suggests}` };
  const onHost = `${plural(deviceCount, "GPU")} on this host`;
  if (templateGpus > deviceCount) return { value: deviceCount, hint: `${onHost}${suggests}` };
  return { value: templateGpus, hint: onHost };
}

/**
 * initials makes the text badge that stands in for a template's icon: the first letters of
 * the name's first two words ("Open WebUI" → "OW", "llama.cpp" → "LC"), or of a one-word name
 * its first two characters ("Hello" → "He", "vLLM" → "VL").
 */
export function initials(name: string): string {
  const words = name.split(/[^\p{L}\p{N}]+/u).filter((word) => word !== "");
  const first = words[0];
  if (first === undefined) return "?";
  const second = words[1];
  const letters = second === undefined ? Array.from(first).slice(0, 2) : [Array.from(first)[0] ?? "", Array.from(second)[0] ?? ""];
  return letters.map((letter, index) => (index === 0 || second !== undefined ? letter.toUpperCase() : letter)).join("");
}

/**
 * hasColour says whether RGBA pixels (a canvas's getImageData) hold colour. Text drawn black on
 * a transparent canvas stays grey through anti-aliasing, and a missing glyph's box is black; a
 * colour emoji font ignores the fill and paints in colour. A few coloured pixels could be noise
 * (some browsers add it to canvas reads), so it takes at least `minPixels` clearly coloured ones.
 */
export function hasColour(rgba: ArrayLike<number>, minPixels = 8): boolean {
  let coloured = 0;
  for (let i = 0; i + 3 < rgba.length; i += 4) {
    if ((rgba[i + 3] ?? 0) < 64) continue;
    const r = rgba[i] ?? 0;
    const g = rgba[i + 1] ?? 0;
    const b = rgba[i + 2] ?? 0;
    if (Math.max(r, g, b) - Math.min(r, g, b) > 48) coloured += 1;
    if (coloured >= minPixels) return true;
  }
  return false;
}
