/**
 * What happens when a service exits, in one place.
 *
 * 1. The shim records the exit status; the supervisor reports it (ServiceManager queues it, so
 *    an exit the store refuses on a full disk is tried again every second, issue 13).
 * 2. The service's ServiceRunner (runner.ts, `onExit`) gathers the run's output and its own
 *    state (was it being stopped on purpose, killed by its health check, forced with SIGKILL)
 *    and calls planExit below, which decides everything before anything is written:
 *    - a run ended on purpose (stop, restart, redeploy, delete: someone waits for it) only
 *      records how it ended; whoever stopped it decides what follows;
 *    - a service stopped by request meanwhile becomes stopped (a batch job cancelled);
 *    - a launch refused for lack of disk space is pending again, no crash and no restart counted;
 *    - an exec that failed (no such program, permission denied) fails: it would fail every time;
 *    - otherwise the restart policy (services/restart-policy.ts) says restart after a backoff
 *      (restarting, or retrying for a batch job) or settle as completed or failed, and a
 *      crash loop that spent its budget keeps its cause (an OOM kill stays oom_killed).
 *    A crash's forensics name why it ended (classify): the engine's own facts first (OOM kill,
 *    exec failure, GPU memory, permission, health kill, lost shim), then the cause its output
 *    names (services/diagnose LOG_CAUSES), else how it exited.
 * 3. The runner writes the run's end and the service's row in one transaction, then forgets the
 *    process (handle, GPU hold, health monitor), wakes whoever waits in `stop`, arms the retry
 *    timer (or the disk-full requeue), and asks for a placement pass: the GPUs and the token's
 *    slot it held are free for the next pending service.
 */
import type { LogLine } from "../../contract/engine";
import { findGpuOom, findPermissionDenied } from "../gpu";
import type { LogCause } from "../services/diagnose";
import { causeRule } from "../services/diagnose";
import { decideAfterExit } from "../services/restart-policy";
import type { ServiceSpec } from "../services/spec";
import type { Forensics, RunRow, ServiceRow } from "../services/store";
import type { ExitRecord } from "../supervisor";

/** ExitFacts is what the runner knows of a run that ended: the rows, the exit, its output and its own state. */
export interface ExitFacts {
  service: ServiceRow;
  spec: ServiceSpec;
  run: RunRow;
  exit: ExitRecord;
  /** output is the run's own lines of the service's log (the last KEY_SCAN_LINES). */
  output: LogLine[];
  /** stopping: the run was ended on purpose; waited: someone waits in stop() for the exit. */
  stopping: boolean;
  waited: boolean;
  healthKill: boolean;
  forcedKill: boolean;
  stopMethod: string | null;
  nowMs: number;
  /** crashCause reads a crashed run's output for its cause (secrets redacted); asked only for a crash. */
  crashCause(output: LogLine[]): LogCause | null;
}

/** ExitPlan is everything the exit changes, decided before any of it is written. */
export interface ExitPlan {
  endReason: "stopped" | "health" | "lost" | "exit";
  /** runExit is what the run's row records of its end. */
  runExit: NonNullable<RunRow["exit"]>;
  patch: Partial<ServiceRow>;
  /** retryDelayMs: restart after this backoff (the restart policy's); null: no restart. */
  retryDelayMs: number | null;
  /** requeue: pending again, scheduled again a moment later (a launch refused for lack of disk space). */
  requeue: boolean;
}

/** planExit decides what follows a run's end; see the file's comment for the order of the rules. */
export function planExit(facts: ExitFacts): ExitPlan {
  const { service, spec, run, exit, stopping } = facts;
  const logTail = facts.output.map((line) => line.line);
  const gpuOom = findGpuOom(logTail) !== null;
  const privDenied = exit.execError === "EACCES" || exit.execError === "EPERM" || findPermissionDenied(logTail) !== null;
  const endReason = stopping ? "stopped" : facts.healthKill ? "health" : exit.lost ? "lost" : "exit";
  const endedAt = exit.endedAt;
  const stopped = stopping ? { forced_kill: facts.forcedKill, stop_method: facts.stopMethod } : {};
  const runExit = { ...exit, gpu_oom: gpuOom, priv_denied: privDenied, ...stopped };
  const succeeded = exit.exitCode === 0 && !exit.lost;
  const crashed = !succeeded && !stopping;
  const logCause = crashed ? facts.crashCause(facts.output) : null;
  const forensics: Forensics = crashed
    ? {
        last_exit_code: exit.exitCode,
        last_signal: exit.signal,
        oom_killed: exit.oomKilled,
        gpu_oom: gpuOom,
        priv_denied: privDenied,
        exec_error: exit.execError,
        last_crash_at: endedAt,
        error: classify(exit, gpuOom, privDenied, facts.healthKill, spec.memory_mb, logCause, service.name),
        log_cause: logCause,
      }
    : { ...service.forensics, last_exit_code: exit.exitCode, last_signal: exit.signal };
  const plan = (patch: Partial<ServiceRow>, retryDelayMs: number | null = null, requeue = false): ExitPlan => ({
    endReason,
    runExit,
    patch,
    retryDelayMs,
    requeue,
  });

  if (facts.waited || stopping) return plan({ forensics, current_run_id: run.id });
  if (service.desired_state === "stopped") {
    return plan({ forensics, status: service.kind === "batch" ? "cancelled" : "stopped", status_message: "stopped" });
  }
  if (exit.execError === "ENOSPC" && exit.execStage === "setup") {
    // Never started for lack of space: no crash, no restart counted; pending again, and
    // scheduled again until the disk has room (issue 13).
    return plan({ status: "pending", status_message: "could not start: the disk is full; trying again when it has room" }, null, true);
  }
  // An exec that failed (no such program, permission denied) fails the same way every time.
  const decision = exit.execError
    ? ({
        action: "settle",
        status: "failed",
        budgetSpent: false,
        state: { ...service.restart_state, last_exit_at: endedAt, next_retry_at: null },
      } as const)
    : decideAfterExit(service.kind, spec.restart, service.restart_state, succeeded, Date.parse(endedAt) || facts.nowMs);
  const { restart } = spec;
  if (decision.action === "restart") {
    const retryDelayMs = Math.max(0, Date.parse(decision.state.next_retry_at ?? endedAt) - facts.nowMs);
    return plan(
      {
        forensics,
        restart_state: decision.state,
        status: service.kind === "batch" ? "retrying" : "restarting",
        status_message: `${describeExit(exit)}; restarting in ${(retryDelayMs / 1000).toFixed(1)} s (restart ${decision.state.restarts.length} of ${restart.max_restarts} in ${restart.window_seconds} s)`,
      },
      retryDelayMs,
    );
  }
  const message = decision.budgetSpent
    ? `${describeExit(exit)}; gave up after ${restart.max_restarts} restarts in ${restart.window_seconds} s`
    : describeExit(exit);
  return plan({
    forensics: decision.budgetSpent ? { ...forensics, error: crashLoopError(forensics.error, message, restart) } : forensics,
    restart_state: decision.state,
    status: decision.status,
    desired_state: decision.status === "completed" ? "completed" : service.desired_state,
    status_message: message,
  });
}

/** describeExit says in words how a run ended: "exited with code 3", "killed by SIGKILL (OOM)". */
export function describeExit(exit: ExitRecord): string {
  if (exit.lost) return "the process was lost: its shim ended without recording an exit";
  if (exit.execError) return `could not start: ${exit.execMessage ?? exit.execError} (${exit.execError})`;
  // A shell between the engine and the workload turns the OOM kill into exit code 137.
  const oom = exit.oomKilled ? " (out of memory)" : "";
  if (exit.signal) return `killed by ${exit.signal}${oom}`;
  return `exited with code ${exit.exitCode}${oom}`;
}

type ErrorCause = NonNullable<Forensics["error"]>;

/**
 * classify names why a run ended, the engine's own facts first: an OOM kill, an exec failure,
 * GPU memory, a denied permission, a health kill, a lost shim, the shell's 127; then the cause
 * the run's output names (LOG_CAUSES); else how it exited. The key line comes along whatever
 * the class, so even an OOM kill shows the last thing the process said.
 */
function classify(
  exit: ExitRecord,
  gpuOom: boolean,
  privDenied: boolean,
  healthKill: boolean,
  memoryMb: number | null,
  logCause: LogCause | null,
  serviceName: string,
): ErrorCause {
  const key_line = logCause?.key_line ?? null;
  const cause = (errorClass: string, message: string): ErrorCause => ({ class: errorClass, message, key_line });
  if (exit.oomKilled) return cause("oom_killed", `the kernel's OOM killer ended the process at its memory limit of ${memoryMb} MiB`);
  if (exit.execError === "ENOENT") return cause("command_not_found", describeExit(exit));
  if (exit.execError) return cause(privDenied ? "permission_denied" : "exec_failed", describeExit(exit));
  if (gpuOom) return cause("gpu_oom", `the process ran out of GPU memory (${describeExit(exit)})`);
  if (privDenied) return cause("permission_denied", `the process hit "Permission denied" (${describeExit(exit)})`);
  if (healthKill) return cause("health_check_failed", `restarted after its health check kept failing (${describeExit(exit)})`);
  if (exit.lost) return cause("lost", describeExit(exit));
  if (exit.exitCode === 127) return cause("command_not_found", `${describeExit(exit)}: the shell could not find the command`);
  const rule = logCause ? causeRule(logCause) : null;
  if (logCause?.class && rule) return cause(logCause.class, `${rule.summary(logCause, serviceName)}; ${describeExit(exit)}`);
  if (exit.signal) return cause("signal", describeExit(exit));
  return cause("exit_code", describeExit(exit));
}

/** GENERIC_CAUSES say only how a run ended; a crash loop of them is reported as crash_loop. */
const GENERIC_CAUSES = new Set(["exit_code", "signal", "lost", "health_check_failed"]);

/**
 * crashLoopError is the error of a service the engine gave up restarting. A known cause keeps
 * its class (an OOM kill stays oom_killed, a port clash port_in_use), with the give-up added to
 * its message; a run that only exited becomes crash_loop, naming its last cause.
 */
function crashLoopError(last: Forensics["error"], message: string, restart: { max_restarts: number; window_seconds: number }): ErrorCause {
  if (last && !GENERIC_CAUSES.has(last.class))
    return { ...last, message: `${last.message}; gave up after ${restart.max_restarts} restarts in ${restart.window_seconds} s` };
  return { class: "crash_loop", message: `${message} (last cause: ${last?.class ?? "exit"})`, key_line: last?.key_line ?? null };
}
