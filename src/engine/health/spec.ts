import { AppError } from "../../lib/errors";
import type { WorkloadUser } from "../users";

/** HealthSpec describes how and how often a service's health is probed. */
export interface HealthSpec {
  type: "http" | "tcp" | "exec";
  /** path is the request path of an http probe; it defaults to "/". */
  path?: string;
  /** port overrides the service's port for http and tcp probes. */
  port?: number;
  /** command is what an exec probe runs: a string goes through `/bin/sh -c`, an array is the argv. */
  command?: string | string[];
  /** interval_s is the time between the starts of two probes; it may be fractional. */
  interval_s: number;
  /** timeout_s bounds one probe; a probe that takes longer fails. */
  timeout_s: number;
  /** failure_threshold is how many consecutive failures make a service count as down. */
  failure_threshold: number;
  /**
   * start_period_s is the grace after the workload starts during which failed probes do not
   * count (Docker's --health-start-period): the service is neither unhealthy nor degraded for
   * them, and the first pass ends the grace at once. Absent, as in versions stored before it
   * existed: 0, no grace.
   */
  start_period_s?: number;
}

/** ProbeTarget is where a probe goes: the service's host and port, and the cwd and env of exec probes. */
export interface ProbeTarget {
  host: string;
  port: number | null;
  cwd?: string;
  /** env is the environment of exec probes, on top of what they inherit of the daemon's (inheritedEnv: PATH, HOME, LANG, ...). */
  env?: Record<string, string>;
  /** inherited is the daemon's environment exec probes inherit from (config.workloadEnv); this process's by default. */
  inherited?: Record<string, string | undefined>;
  /** user runs exec probes as the workload's user (through setpriv); null or absent: the engine's own user. */
  user?: WorkloadUser | null;
}

/** ProbeResult is the outcome of one probe. */
export interface ProbeResult {
  ok: boolean;
  /** at is when the probe started, as an ISO 8601 date-time. */
  at: string;
  duration_ms: number;
  /** detail says what happened: "HTTP 200", "connect ECONNREFUSED 127.0.0.1:8080", "timed out after 2000 ms", "exit 1: ...". */
  detail: string;
}

/** The defaults of a health check written as template shorthand. */
export const SHORTHAND_DEFAULTS = { interval_s: 10, timeout_s: 5, failure_threshold: 3 } as const;

/**
 * parseHealthShorthand turns an app template's `health` field into a spec: "/path" is an
 * http probe of that path on the service port, "tcp" a tcp probe of the service port, and ""
 * means no health check (null). Both use SHORTHAND_DEFAULTS. Any other text is a defect of the
 * template and throws AppError("internal"), since bundled templates are checked when they load.
 */
export function parseHealthShorthand(text: string, port: number | null): HealthSpec | null {
  const shorthand = text.trim();
  if (shorthand === "") return null;
  const portField = port === null ? {} : { port };
  if (shorthand.startsWith("/")) return { type: "http", path: shorthand, ...portField, ...SHORTHAND_DEFAULTS };
  if (shorthand === "tcp") return { type: "tcp", ...portField, ...SHORTHAND_DEFAULTS };
  throw new AppError("internal", `health shorthand ${JSON.stringify(text)} is neither "", "tcp" nor a path starting with "/"`);
}

/** checkHealthSpec throws AppError("internal") when a spec's numbers cannot drive a monitor. */
export function checkHealthSpec(spec: HealthSpec): void {
  const problems: string[] = [];
  if (!(spec.interval_s > 0)) problems.push(`interval_s must be positive, got ${spec.interval_s}`);
  if (!(spec.timeout_s > 0)) problems.push(`timeout_s must be positive, got ${spec.timeout_s}`);
  if (!Number.isInteger(spec.failure_threshold) || spec.failure_threshold < 1) {
    problems.push(`failure_threshold must be an integer of at least 1, got ${spec.failure_threshold}`);
  }
  const startPeriod = spec.start_period_s ?? 0;
  if (!(Number.isFinite(startPeriod) && startPeriod >= 0)) problems.push(`start_period_s must be 0 or more, got ${spec.start_period_s}`);
  if (problems.length > 0) throw new AppError("internal", `invalid health spec: ${problems.join("; ")}`);
}
