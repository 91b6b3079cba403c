import { expect, test } from "bun:test";
import { DEFAULT_CADENCE, PollCadence } from "../../../src/cloud/link";

const t0 = 1_000_000;

test("the defaults: 5 s interval, +5 s per slow_down (RFC 8628 §3.5), capped at 60 s, 1 s early tolerated", () => {
  expect(DEFAULT_CADENCE).toMatchObject({ initialIntervalS: 5, stepS: 5, maxIntervalS: 60, toleranceMs: 1000 });
});

test.each([
  // [ms after the previous poll, allowed]
  [0, false],
  [1000, false],
  [3999, false],
  [4000, true], // 1 s early: forgiven
  [4500, true],
  [5000, true],
  [60_000, true],
])("a second poll %p ms after the first is allowed: %p", (gap, allowed) => {
  const cadence = new PollCadence();
  expect(cadence.check("k", t0)).toEqual({ allowed: true, intervalS: 5 });
  expect(cadence.check("k", t0 + gap)).toEqual({ allowed, intervalS: allowed ? 5 : 10 });
});

test("each early poll adds 5 s, remembered for that string only, and every poll restarts the wait", () => {
  const cadence = new PollCadence();
  cadence.check("a", t0);
  expect(cadence.check("a", t0 + 100)).toEqual({ allowed: false, intervalS: 10 });
  expect(cadence.check("a", t0 + 200)).toEqual({ allowed: false, intervalS: 15 });
  // 14.1 s after the last (early) poll is within 15 s less the tolerance: allowed, and the interval stays 15.
  expect(cadence.check("a", t0 + 200 + 14_000)).toEqual({ allowed: true, intervalS: 15 });
  expect(cadence.check("a", t0 + 200 + 14_000 + 5000)).toEqual({ allowed: false, intervalS: 20 });
  // Another string is untouched.
  expect(cadence.check("b", t0)).toEqual({ allowed: true, intervalS: 5 });
});

test("the interval is capped", () => {
  const cadence = new PollCadence();
  let decision = cadence.check("k", t0);
  for (let i = 1; i < 40; i++) decision = cadence.check("k", t0 + i);
  expect(decision).toEqual({ allowed: false, intervalS: 60 });
});

test("the map is bounded: the least recently polled string is forgotten first", () => {
  const cadence = new PollCadence({ ...DEFAULT_CADENCE, maxEntries: 3 });
  for (const key of ["a", "b", "c"]) cadence.check(key, t0);
  cadence.check("a", t0 + 5000); // a is now the most recent
  cadence.check("d", t0 + 5000); // evicts b
  expect(cadence.size).toBe(3);
  expect(cadence.check("a", t0 + 5001).allowed).toBe(false);
  expect(cadence.check("b", t0 + 5001).allowed).toBe(true); // forgotten: treated as a first poll
});
