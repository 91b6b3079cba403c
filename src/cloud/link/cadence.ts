/** CadenceDecision is one poll's outcome: on time, or too early with the new interval. */
export interface CadenceDecision {
  allowed: boolean;
  /** intervalS is the interval the poller must keep from now on, in seconds. */
  intervalS: number;
}

export interface PollCadenceOptions {
  /** initialIntervalS is the interval every device request is created with (RFC 8628 `interval`). */
  initialIntervalS: number;
  /** stepS is what a `slow_down` adds to the interval: RFC 8628 §3.5 says 5 s. */
  stepS: number;
  /** maxIntervalS caps the interval a misbehaving poller can be pushed to. */
  maxIntervalS: number;
  /**
   * toleranceMs forgives polls that arrive this early: real clients drift (timers rounded
   * down, a WSL clock that jumps, `gh` measuring from the previous answer rather than its
   * request), and punishing a poll 200 ms early with `slow_down` only makes them slower.
   */
  toleranceMs: number;
  /** maxEntries bounds the map: beyond it the least recently polled string is forgotten. */
  maxEntries: number;
}

export const DEFAULT_CADENCE: PollCadenceOptions = {
  initialIntervalS: 5,
  stepS: 5,
  maxIntervalS: 60,
  toleranceMs: 1000,
  maxEntries: 100_000,
};

/**
 * PollCadence enforces RFC 8628's polling interval from this process's memory only, so a
 * poll that comes too fast is answered `slow_down` without touching the database — the
 * contract's rule, and what keeps a polling storm off the database.
 *
 * It is keyed by a hash of the presented string, whatever it is: a real device code and an
 * invented one are treated identically, so the answer reveals nothing about which codes
 * exist. Every poll, early or not, restarts the wait (a client that hammers never gets
 * through); each early poll adds `stepS` to that string's interval, which it keeps.
 *
 * The map is bounded (least recently polled first out). A forgotten string simply gets its
 * next poll through to the lookup, which the rate limits already bound. With several
 * replicas each keeps its own map: a poller alternating between them can poll once per
 * interval per replica, which the per-device rate limit still caps.
 */
export class PollCadence {
  readonly #entries = new Map<string, { lastAt: number; intervalS: number }>();

  constructor(private readonly options: PollCadenceOptions = DEFAULT_CADENCE) {}

  /** check records a poll of `key` at `now` (ms) and says whether it kept the interval. */
  check(key: string, now: number): CadenceDecision {
    const entry = this.#entries.get(key);
    let decision: CadenceDecision;
    if (!entry) {
      decision = { allowed: true, intervalS: this.options.initialIntervalS };
      if (this.#entries.size >= this.options.maxEntries) {
        const oldest = this.#entries.keys().next().value;
        if (oldest !== undefined) this.#entries.delete(oldest);
      }
    } else {
      this.#entries.delete(key);
      const early = now - entry.lastAt < entry.intervalS * 1000 - this.options.toleranceMs;
      decision = early
        ? { allowed: false, intervalS: Math.min(entry.intervalS + this.options.stepS, this.options.maxIntervalS) }
        : { allowed: true, intervalS: entry.intervalS };
    }
    // Re-inserting keeps the map in least-recently-polled order for eviction.
    this.#entries.set(key, { lastAt: now, intervalS: decision.intervalS });
    return decision;
  }

  /** size is how many strings are remembered (for tests and the bench). */
  get size(): number {
    return this.#entries.size;
  }
}
