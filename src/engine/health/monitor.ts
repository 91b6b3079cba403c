import { runProbe } from "./probe";
import { checkHealthSpec, type HealthSpec, type ProbeResult, type ProbeTarget } from "./spec";

/** HealthState is what a monitor knows about a service's health. */
export interface HealthState {
  /**
   * healthy is whether the latest probe that counts passed; null until one has finished. A
   * failure in the start period does not count, so it leaves healthy null.
   */
  healthy: boolean | null;
  /** consecutive_failures counts failed probes since the last pass, leaving out those of the start period. */
  consecutive_failures: number;
  /** last is the latest probe, counted or not. */
  last: ProbeResult | null;
  /**
   * observations are the latest probes, oldest first, as "<at> ok|fail <detail> (<n> ms)"; a
   * failure the start period did not count ends in " [start period: not counted]".
   */
  observations: string[];
  /** threshold_reached is whether consecutive_failures is at least the spec's failure_threshold. */
  threshold_reached: boolean;
  /** in_start_period is whether the start period is on: it has not run out and no probe has passed yet. */
  in_start_period: boolean;
  /**
   * start_period_ends_at is when the start period runs out (a pass ends it sooner), as an ISO
   * 8601 date-time; null when the spec has none (start_period_s absent or 0) or before start().
   */
  start_period_ends_at: string | null;
  /** start_period_failures counts the failed probes the start period kept from counting. */
  start_period_failures: number;
}

/** HealthHooks receives a monitor's changes. */
export interface HealthHooks {
  /**
   * onChange is called, at most once per probe and after the state is updated, when the probe
   * made `healthy` differ from its previous value (the first probe counts: null becomes true or
   * false) or made `consecutive_failures` equal the failure_threshold. It is therefore called
   * once per failure streak when the threshold is reached, not again on further failures, and
   * once when a pass ends the streak. A failure in the start period changes neither, so it is
   * not reported; the pass that ends the start period is (null becomes true). It must not throw; an exception is caught and dropped so
   * that a faulty subscriber cannot stop the probing.
   */
  onChange(state: HealthState): void;
}

export interface HealthMonitorOptions {
  /** maxObservations bounds HealthState.observations; it defaults to 20. */
  maxObservations?: number;
  /** setTimer schedules the next probe; it defaults to setTimeout. */
  setTimer?: (callback: () => void, ms: number) => unknown;
  /** clearTimer cancels what setTimer returned; it defaults to clearTimeout. */
  clearTimer?: (handle: unknown) => void;
  /** now is the clock of the start period, in ms since the epoch; it defaults to Date.now. */
  now?: () => number;
  /**
   * startedAt is when the workload started, on now's clock: the start period counts from it, so
   * a monitor started again for a workload that has long been up (after a pause, or when the
   * daemon adopts a running service) gives it no new grace. It defaults to the first start().
   */
  startedAt?: number;
}

const DEFAULT_MAX_OBSERVATIONS = 20;

/**
 * HealthMonitor probes one target repeatedly. The first probe runs as soon as start() is
 * called. Until the spec's start_period_s has passed since the workload started, or a probe
 * has passed, failures are recorded but do not count (HealthState.in_start_period); each next one starts interval_s after the previous one started, or right after it
 * finished if it took longer, so probes never overlap. stop() cancels the probe in flight (an
 * exec probe's process group is killed) and discards its result; start() after stop() resumes
 * with the state kept.
 */
export class HealthMonitor {
  readonly #spec: HealthSpec;
  readonly #target: ProbeTarget;
  readonly #hooks: HealthHooks;
  readonly #maxObservations: number;
  readonly #setTimer: (callback: () => void, ms: number) => unknown;
  readonly #clearTimer: (handle: unknown) => void;
  readonly #now: () => number;
  readonly #startedAt: number | undefined;
  #state: HealthState = {
    healthy: null,
    consecutive_failures: 0,
    last: null,
    observations: [],
    threshold_reached: false,
    in_start_period: false,
    start_period_ends_at: null,
    start_period_failures: 0,
  };
  /** startPeriodEndsMs is when the start period runs out, on #now's clock; null without one, or before start(). */
  #startPeriodEndsMs: number | null = null;
  /** passed is whether a probe has passed since the monitor was made: a pass ends the start period for good. */
  #passed = false;
  #running = false;
  // generation changes on every start and stop, so a probe finishing after stop() is recognised and dropped.
  #generation = 0;
  #timer: unknown = null;
  #inFlight: AbortController | null = null;

  constructor(spec: HealthSpec, target: ProbeTarget, hooks: HealthHooks, options: HealthMonitorOptions = {}) {
    checkHealthSpec(spec);
    this.#spec = spec;
    this.#target = target;
    this.#hooks = hooks;
    this.#maxObservations = Math.max(1, options.maxObservations ?? DEFAULT_MAX_OBSERVATIONS);
    this.#setTimer = options.setTimer ?? ((callback, ms) => setTimeout(callback, ms));
    this.#clearTimer = options.clearTimer ?? ((handle) => clearTimeout(handle as ReturnType<typeof setTimeout>));
    this.#now = options.now ?? Date.now;
    this.#startedAt = options.startedAt;
  }

  /** start begins probing, with a first probe at once; it does nothing if the monitor is running. */
  start(): void {
    if (this.#running) return;
    this.#running = true;
    const startPeriodMs = (this.#spec.start_period_s ?? 0) * 1000;
    if (this.#startPeriodEndsMs === null && startPeriodMs > 0) {
      this.#startPeriodEndsMs = (this.#startedAt ?? this.#now()) + startPeriodMs;
      this.#state = { ...this.#state, start_period_ends_at: new Date(this.#startPeriodEndsMs).toISOString() };
    }
    const generation = ++this.#generation;
    void this.#probe(generation);
  }

  /** stop ends probing and cancels a probe in flight; it is safe to call at any time. */
  stop(): void {
    if (!this.#running) return;
    this.#running = false;
    this.#generation++;
    if (this.#timer !== null) this.#clearTimer(this.#timer);
    this.#timer = null;
    this.#inFlight?.abort();
    this.#inFlight = null;
  }

  /** state returns a copy of the current health state. */
  state(): HealthState {
    return { ...this.#state, observations: [...this.#state.observations], in_start_period: this.#inStartPeriod() };
  }

  #inStartPeriod(): boolean {
    return this.#startPeriodEndsMs !== null && !this.#passed && this.#now() < this.#startPeriodEndsMs;
  }

  async #probe(generation: number): Promise<void> {
    this.#timer = null;
    const controller = new AbortController();
    this.#inFlight = controller;
    const result = await runProbe(this.#spec, this.#target, { signal: controller.signal });
    if (generation !== this.#generation) return;
    this.#inFlight = null;
    this.#record(result);
    // onChange may have stopped the monitor.
    if (generation !== this.#generation) return;
    const delay = Math.max(0, this.#spec.interval_s * 1000 - result.duration_ms);
    this.#timer = this.#setTimer(() => void this.#probe(generation), delay);
  }

  #record(result: ProbeResult): void {
    const previous = this.#state;
    const observation = `${result.at} ${result.ok ? "ok" : "fail"} ${result.detail} (${result.duration_ms} ms)`;
    if (!result.ok && this.#inStartPeriod()) {
      // Kept for the diagnosis, but nothing a subscriber acts on changes: no onChange.
      this.#state = {
        ...previous,
        last: result,
        observations: [...previous.observations, `${observation} [start period: not counted]`].slice(-this.#maxObservations),
        start_period_failures: previous.start_period_failures + 1,
      };
      return;
    }
    if (result.ok) this.#passed = true;
    const consecutiveFailures = result.ok ? 0 : previous.consecutive_failures + 1;
    this.#state = {
      ...previous,
      healthy: result.ok,
      consecutive_failures: consecutiveFailures,
      last: result,
      observations: [...previous.observations, observation].slice(-this.#maxObservations),
      threshold_reached: consecutiveFailures >= this.#spec.failure_threshold,
    };
    const flipped = previous.healthy !== result.ok;
    const reachedThreshold = consecutiveFailures === this.#spec.failure_threshold;
    if (!flipped && !reachedThreshold) return;
    try {
      this.#hooks.onChange(this.state());
    } catch {
      // Documented on HealthHooks.onChange: a subscriber's exception must not stop the probing.
    }
  }
}
