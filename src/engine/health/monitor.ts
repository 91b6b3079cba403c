import { runProbe } from "./probe";
import { checkHealthSpec, type HealthSpec, type ProbeResult, type ProbeTarget } from "./spec";

/** HealthState is what a monitor knows about a service's health. */
export interface HealthState {
  /** healthy is whether the latest probe passed; null until the first probe has finished. */
  healthy: boolean | null;
  /** consecutive_failures counts failed probes since the last pass. */
  consecutive_failures: number;
  last: ProbeResult | null;
  /** observations are the latest probes, oldest first, as "<at> ok|fail <detail> (<n> ms)". */
  observations: string[];
  /** threshold_reached is whether consecutive_failures is at least the spec's failure_threshold. */
  threshold_reached: boolean;
}

/** HealthHooks receives a monitor's changes. */
export interface HealthHooks {
  /**
   * onChange is called, at most once per probe and after the state is updated, when the probe
   * made `healthy` differ from its previous value (the first probe counts: null becomes true or
   * false) or made `consecutive_failures` equal the failure_threshold. It is therefore called
   * once per failure streak when the threshold is reached, not again on further failures, and
   * once when a pass ends the streak. It must not throw; an exception is caught and dropped so
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
}

const DEFAULT_MAX_OBSERVATIONS = 20;

/**
 * HealthMonitor probes one target repeatedly. The first probe runs as soon as start() is
 * called; each next one starts interval_s after the previous one started, or right after it
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
  #state: HealthState = { healthy: null, consecutive_failures: 0, last: null, observations: [], threshold_reached: false };
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
  }

  /** start begins probing, with a first probe at once; it does nothing if the monitor is running. */
  start(): void {
    if (this.#running) return;
    this.#running = true;
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
    return { ...this.#state, observations: [...this.#state.observations] };
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
    const consecutiveFailures = result.ok ? 0 : previous.consecutive_failures + 1;
    const observation = `${result.at} ${result.ok ? "ok" : "fail"} ${result.detail} (${result.duration_ms} ms)`;
    this.#state = {
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
