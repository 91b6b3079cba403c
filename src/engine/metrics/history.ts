/**
 * History is the engine's in-process metrics history (docs/decisions.md 331): a ring of the
 * last `capacity` sample times, and for each series a ring of the same size, so memory is
 * fixed (720 samples × 8 bytes per series) and nothing is written to disk. A value not
 * measured at a sample is NaN inside and null outside.
 */
export class History {
  private readonly times: Float64Array;
  /** head is the slot the next sample goes to; count how many slots hold samples. */
  private head = 0;
  private count = 0;
  private readonly series = new Map<string, Float64Array>();

  constructor(readonly capacity: number) {
    this.times = new Float64Array(capacity);
  }

  /**
   * push records one sample at `timeS` (Unix seconds): `values` maps series keys to their
   * value; every other series gets NaN at this sample, and a new key starts a series whose
   * earlier samples are NaN.
   */
  push(timeS: number, values: ReadonlyMap<string, number>): void {
    const slot = this.head;
    this.times[slot] = timeS;
    for (const [key, ring] of this.series) ring[slot] = values.get(key) ?? Number.NaN;
    for (const [key, value] of values) {
      if (this.series.has(key)) continue;
      const ring = new Float64Array(this.capacity).fill(Number.NaN);
      ring[slot] = value;
      this.series.set(key, ring);
    }
    this.head = (slot + 1) % this.capacity;
    this.count = Math.min(this.count + 1, this.capacity);
  }

  /** forget drops the series whose keys `drop` says to drop (a deleted service's, say). */
  forget(drop: (key: string) => boolean): void {
    for (const key of [...this.series.keys()]) if (drop(key)) this.series.delete(key);
  }

  /** has says whether a series has ever been pushed (and not forgotten). */
  has(key: string): boolean {
    return this.series.has(key);
  }

  /** slots returns the ring slots of the samples taken after `sinceS`, oldest first. */
  slots(sinceS = Number.NEGATIVE_INFINITY): number[] {
    const slots: number[] = [];
    const oldest = (this.head - this.count + this.capacity) % this.capacity;
    for (let i = 0; i < this.count; i++) {
      const slot = (oldest + i) % this.capacity;
      if ((this.times[slot] as number) > sinceS) slots.push(slot);
    }
    return slots;
  }

  timesAt(slots: readonly number[]): number[] {
    return slots.map((slot) => this.times[slot] as number);
  }

  /** valuesAt returns a series' values at the slots, null where not measured (or for an unknown key). */
  valuesAt(key: string, slots: readonly number[], round: (value: number) => number = (value) => value): (number | null)[] {
    const ring = this.series.get(key);
    return slots.map((slot) => {
      const value = ring ? (ring[slot] as number) : Number.NaN;
      return Number.isNaN(value) ? null : round(value);
    });
  }
}
