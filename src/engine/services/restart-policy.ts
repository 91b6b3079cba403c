/**
 * The restart policy decides what happens when a run ends. It follows systemd's start limit
 * (at most `max_restarts` within `window_seconds`, after which the unit is failed) with
 * Nomad's sliding window (failures older than the window are forgotten) and exponential
 * backoff from `backoff_s`, capped and jittered so that crashing services do not restart
 * in lockstep.
 */
import type { RestartPolicyName, ServiceKind } from "../../contract/engine";

export interface RestartPolicy {
  policy: RestartPolicyName;
  max_restarts: number;
  window_seconds: number;
  backoff_s: number;
}

/** RestartState is what the store keeps between runs, in ISO times. */
export interface RestartState {
  /** restarts are the times of counted restarts, oldest first; only those in the window matter. */
  restarts: string[];
  last_exit_at: string | null;
  next_retry_at: string | null;
  /** backoff_s is the delay chosen for the latest restart, in whole seconds. */
  backoff_s: number | null;
}

export const EMPTY_RESTART_STATE: RestartState = { restarts: [], last_exit_at: null, next_retry_at: null, backoff_s: null };

/** BACKOFF_CAP_S bounds the exponential backoff (systemd's RestartMaxDelaySec, here 5 minutes). */
export const BACKOFF_CAP_S = 300;
/** JITTER is the relative spread of a backoff delay: ±10 %. */
export const JITTER = 0.1;

/** defaultRestartPolicy is a kind's policy when a deploy names none. */
export function defaultRestartPolicy(kind: ServiceKind): RestartPolicy {
  if (kind === "batch") return { policy: "on-failure", max_restarts: 3, window_seconds: 600, backoff_s: 1 };
  if (kind === "model") return { policy: "always", max_restarts: 5, window_seconds: 600, backoff_s: 5 };
  return { policy: "always", max_restarts: 5, window_seconds: 300, backoff_s: 1 };
}

/**
 * startsAgainSoon says whether a service's run is likely to be followed by another of the same
 * service: a long-running kind whose policy restarts it, or a batch job that has already been
 * restarted (one that succeeds the first time, the common case, never starts again). The shim
 * then prepares the next run's directory while this one runs.
 */
export function startsAgainSoon(kind: ServiceKind, policy: RestartPolicy, state: RestartState): boolean {
  if (policy.policy === "never") return false;
  return kind !== "batch" || state.restarts.length > 0;
}

/** restartsInWindow returns the counted restarts that fall inside the window ending at `nowMs`. */
export function restartsInWindow(policy: RestartPolicy, state: RestartState, nowMs: number): string[] {
  const since = nowMs - policy.window_seconds * 1000;
  return state.restarts.filter((at) => Date.parse(at) > since);
}

export type ExitDecision =
  | { action: "restart"; delayMs: number; state: RestartState }
  | { action: "settle"; status: "completed" | "failed"; budgetSpent: boolean; state: RestartState };

/**
 * decideAfterExit applies the policy to a run that ended on its own (not stopped by a user).
 * `succeeded` is exit code 0. A batch job that succeeds always completes; `always` restarts
 * any other ending; `on-failure` restarts failures; `never` restarts nothing.
 */
export function decideAfterExit(
  kind: ServiceKind,
  policy: RestartPolicy,
  state: RestartState,
  succeeded: boolean,
  nowMs: number,
  random: () => number = Math.random,
): ExitDecision {
  const now = new Date(nowMs).toISOString();
  const inWindow = restartsInWindow(policy, state, nowMs);
  const base: RestartState = { ...state, restarts: inWindow, last_exit_at: now, next_retry_at: null };
  const wantsRestart = !(kind === "batch" && succeeded) && (policy.policy === "always" || (policy.policy === "on-failure" && !succeeded));
  if (!wantsRestart) return { action: "settle", status: succeeded ? "completed" : "failed", budgetSpent: false, state: base };
  if (inWindow.length >= policy.max_restarts) return { action: "settle", status: "failed", budgetSpent: true, state: base };
  const delayMs = backoffDelayMs(policy.backoff_s, inWindow.length, random);
  return {
    action: "restart",
    delayMs,
    state: {
      restarts: [...inWindow, now],
      last_exit_at: now,
      next_retry_at: new Date(nowMs + delayMs).toISOString(),
      backoff_s: Math.round(delayMs / 1000),
    },
  };
}

/** backoffDelayMs is backoff_s × 2^attempt, capped at BACKOFF_CAP_S (or backoff_s if larger), ±JITTER. */
export function backoffDelayMs(backoffS: number, attempt: number, random: () => number = Math.random): number {
  if (backoffS <= 0) return 0;
  const capped = Math.min(backoffS * 2 ** attempt, Math.max(BACKOFF_CAP_S, backoffS));
  const jittered = capped * (1 - JITTER + 2 * JITTER * random());
  return Math.round(jittered * 1000);
}
