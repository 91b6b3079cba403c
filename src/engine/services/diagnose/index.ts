import type { Diagnosis, LogLine } from "../../../contract/engine";
import type { LastDump } from "../../databases";
import type { HealthState } from "../../health";
import { restartsInWindow } from "../restart-policy";
import type { Forensics, RunRow, ServiceRow, VersionRow } from "../store";
import { causeRule } from "./causes";

export {
  causeRule,
  findLogCause,
  KEY_LINE_MAX,
  KEY_SCAN_BYTES,
  KEY_SCAN_LINES,
  LOG_CAUSES,
  type LogCause,
  type PortHolder,
  portsInArgs,
  redactor,
} from "./causes";
export { CrashReader, type CrashReaderContext, type LiveRun, serviceOfPid } from "./crash";
export { explainPortClash, findPortHolder, freePortNear } from "./ports";

/** DiagnosisInput is everything the engine knows about one service, gathered by the manager. */
export interface DiagnosisInput {
  service: ServiceRow;
  /** version is the version the service runs (or will run); latest may be a newer one still building or failed. */
  version: VersionRow;
  latest: VersionRow;
  runs: RunRow[];
  healthState: HealthState | null;
  bindingMessages: string[];
  pendingEnvKeys: string[];
  envSource: string;
  logs: LogLine[];
  nowMs: number;
  /** lastDump is the last restore into a database service (null when none, and for other kinds). */
  lastDump?: LastDump | null;
  /** user is the OS user the workload runs as; null when the engine does not switch users for it. */
  user?: string | null;
  /** cwd is the directory the workload runs in (its build, its cwd setting or its data dir). */
  cwd?: string;
}

/** updateCommand is the CLI command that changes a service's settings, as a remediation prints it. */
const updateCommand = (name: string, flags: string) => `\`engine services update ${name} ${flags}\``;

type Remediation = { code: string; detail: string };

/**
 * remediationFor names what to do about a service, the most specific cause first: the
 * build, a missing binding, GPUs, a command that cannot run, memory, GPU memory, the cause
 * its output names (LOG_CAUSES), a crash loop, a failing health check. It returns null for a
 * service that needs nothing. A remediation that changes a setting prints the command.
 */
export function remediationFor(input: DiagnosisInput): Remediation | null {
  const { service, latest, version } = input;
  const spec = version.spec;
  const f: Forensics = service.forensics;
  if (latest.build_result === "failed") {
    const keeps = latest.version !== service.version ? ` Version ${service.version} keeps running.` : "";
    return {
      code: "fix_build",
      detail: `The build of version ${latest.version} failed: ${latest.build_reason}. Fix the repository or the build command and redeploy.${keeps}`,
    };
  }
  if (service.status === "pending" && input.bindingMessages.length > 0) {
    return {
      code: "wait_for_binding",
      detail: `${input.bindingMessages.join("; ")}. Start or fix the bound services; this one starts when they are ready.`,
    };
  }
  if (service.status === "pending" && service.status_message?.includes("GPU")) {
    const less =
      spec.gpus > 1
        ? `: ${updateCommand(service.name, `--gpus ${spec.gpus - 1}`)}`
        : spec.gpu_memory_mb > 0
          ? ` (${updateCommand(service.name, "--gpu-memory-mb <MiB>")})`
          : "";
    return {
      code: "wait_for_gpu",
      detail: `${service.status_message}. \`engine gpus\` shows who holds them: stop one (\`engine services stop <service>\`), or ask for less${less}.`,
    };
  }
  if (service.status === "pending" && service.status_message?.includes("token cap")) {
    return {
      code: "raise_token_cap",
      detail: `${service.status_message}. Wait for the token's other services to finish or use a token with higher caps.`,
    };
  }
  const troubled =
    service.status === "failed" || service.status === "restarting" || service.status === "retrying" || service.status === "degraded";
  if (!troubled) return null;
  if (f.priv_denied) {
    return {
      code: "fix_permissions",
      detail: `The process was denied permission (${f.exec_error ?? "Permission denied in its output"}). Make the command executable (chmod +x) and its files readable by the engine's user.`,
    };
  }
  if (f.exec_error === "ENOENT" || f.last_exit_code === 127) {
    return {
      code: "fix_command",
      detail: `The command ${JSON.stringify(spec.command.join(" "))} could not be found. Check the program name, PATH and cwd.`,
    };
  }
  if (f.oom_killed) {
    const limit = spec.memory_mb;
    const raise = limit ? `: ${updateCommand(service.name, `--memory-mb ${limit * 2}`)}` : "";
    return {
      code: "raise_memory_limit",
      detail: `The kernel killed the process at its memory limit (memory_mb ${limit}). Raise memory_mb${limit ? ` above ${limit}` : ""}${raise}, or make the workload use less memory.${gaveUp(input)}`,
    };
  }
  if (f.gpu_oom) {
    const more = spec.gpus > 0 ? `: ${updateCommand(service.name, `--gpus ${spec.gpus + 1}`)}` : "";
    return {
      code: "reduce_batch_or_gpu_memory",
      detail: `The process ran out of GPU memory. Lower the batch size, context length or KV-cache share (e.g. vLLM --gpu-memory-utilization, --max-model-len), or ask for more GPUs${more}.${gaveUp(input)}`,
    };
  }
  const cause = f.log_cause;
  const rule = cause && f.error?.class === cause.class ? causeRule(cause) : null;
  if (cause && rule) {
    const detail = rule.detail({
      name: service.name,
      cause,
      declaredPort: spec.port,
      gpus: spec.gpus,
      gpuMemoryMb: spec.gpu_memory_mb,
      cwd: input.cwd ?? spec.cwd ?? "its data dir",
      user: input.user ?? null,
    });
    return { code: rule.remediation, detail: `${detail}${detail.includes("engine services start") ? "" : gaveUp(input)}` };
  }
  if (f.error?.class === "crash_loop") {
    return {
      code: "crash_loop",
      detail: `It failed ${spec.restart.max_restarts + 1} times within ${spec.restart.window_seconds} s and the engine stopped restarting it. Read its last log lines for the cause, fix it, then start it again: \`engine services start ${service.name}\`.`,
    };
  }
  if (service.status === "degraded" || f.error?.class === "health_check_failed") {
    return {
      code: "check_health",
      detail: `The health check is failing (${input.healthState?.last?.detail ?? "see observations"}). Check that the service listens where the probe looks.`,
    };
  }
  if (service.status === "failed")
    return { code: "inspect_logs", detail: `${service.status_message ?? "It failed"}. Its last log lines say why.` };
  return null;
}

/** gaveUp says, for a failed service, that the engine stopped and how to start it again. */
function gaveUp({ service }: DiagnosisInput): string {
  return service.status === "failed"
    ? ` The engine stopped restarting it: once the cause is fixed, \`engine services start ${service.name}\` starts it again.`
    : "";
}

/** buildDiagnosis assembles the spec's Diagnosis record; every field comes from a recorded fact. */
export function buildDiagnosis(input: DiagnosisInput): Diagnosis {
  const { service, version, latest, runs, nowMs } = input;
  const spec = version.spec;
  const state = service.restart_state;
  const inWindow = restartsInWindow(spec.restart, state, nowMs);
  const nextRetry = state.next_retry_at ? Math.max(0, Math.ceil((Date.parse(state.next_retry_at) - nowMs) / 1000)) : null;
  const lastRun = runs[0] ?? null;
  const f = service.forensics;
  return {
    service_name: service.name,
    kind: service.kind,
    status: service.status as Diagnosis["status"],
    error:
      f.error && service.status !== "running" && service.status !== "completed"
        ? { class: f.error.class, message: f.error.message, key_line: f.error.key_line ?? null }
        : null,
    forensics: {
      last_exit_code: f.last_exit_code,
      oom_killed: f.oom_killed,
      gpu_oom: f.gpu_oom,
      priv_denied: f.priv_denied,
      last_crash_at: f.last_crash_at,
    },
    restarts: {
      max_restarts: spec.restart.max_restarts,
      window_seconds: spec.restart.window_seconds,
      policy: spec.restart.policy,
      count: inWindow.length,
      window_start: inWindow[0] ?? null,
      last_exit_at: state.last_exit_at,
      backoff_s: state.backoff_s ?? spec.restart.backoff_s,
      next_retry_in_s: service.status === "restarting" || service.status === "retrying" ? nextRetry : null,
    },
    health: {
      spec: spec.health ? { ...spec.health } : null,
      probe: input.healthState?.last ? probeView(input.healthState, nowMs) : null,
      observations: input.healthState?.observations ?? [],
    },
    bindings: { waiting: input.bindingMessages.length > 0 && service.status === "pending", messages: input.bindingMessages },
    build: {
      last_result: latest.build_result,
      version: latest.version,
      reason: latest.build_reason,
    },
    injected_env_keys_source: input.envSource,
    remediation: remediationFor(input),
    desired_state: service.desired_state,
    last_deploy: {
      version: latest.version,
      running_version: service.version,
      at: latest.created_at,
      template_id: latest.spec.template_id,
      build_commit: latest.build_commit,
      secret_keys: latest.spec.secret_keys,
    },
    last_run: lastRun
      ? {
          id: lastRun.id,
          version: lastRun.version,
          pid: lastRun.pid,
          started_at: lastRun.started_at,
          ended_at: lastRun.ended_at,
          exit_code: lastRun.exit?.exitCode ?? null,
          signal: lastRun.exit?.signal ?? null,
          exec_error: lastRun.exit?.execError ?? null,
          end_reason: lastRun.end_reason,
          gpu_devices: lastRun.gpus?.visible_ids ?? [],
          // How a stop asked it to end ("pg_ctl stop -m fast", "SIGTERM") and whether SIGKILL had to follow.
          stop_method: lastRun.exit?.stop_method ?? null,
          forced_kill: lastRun.exit?.forced_kill ?? false,
        }
      : null,
    last_dump: input.lastDump ? { ...input.lastDump } : null,
    injected_env_keys: lastRun?.env_keys ?? [],
    pending_env_keys: input.pendingEnvKeys,
    logs: input.logs.map((line) => ({ ...line })),
    user: input.user ?? null,
  };
}

/**
 * probeView is the latest probe with the monitor's verdict on it, and where the start period
 * stands: on or not, whole seconds left while on, and the failures it kept from counting.
 */
function probeView(state: HealthState, nowMs: number): Record<string, unknown> {
  const endsAt = state.start_period_ends_at ? Date.parse(state.start_period_ends_at) : null;
  return {
    ...state.last,
    healthy: state.healthy,
    consecutive_failures: state.consecutive_failures,
    threshold_reached: state.threshold_reached,
    in_start_period: state.in_start_period,
    start_period_left_s: state.in_start_period && endsAt !== null ? Math.max(0, Math.ceil((endsAt - nowMs) / 1000)) : null,
    start_period_failures: state.start_period_failures,
  };
}
