import { afterAll, beforeAll, expect, test } from "bun:test";
import { DatabaseBuckets, type Limit, MemoryBuckets, RateLimiter } from "../../../src/cloud/ratelimit";
import { isAppError } from "../../../src/lib/errors";
import { describeEachDialect, startTestCloud, type TestCloud } from "../helpers";

const LIMIT: Limit = { name: "test.limit", burst: 3, perMinute: 6 };

async function refusal(run: () => Promise<void>): Promise<{ code: string; retry: unknown } | null> {
  try {
    await run();
    return null;
  } catch (error) {
    if (!isAppError(error)) throw error;
    return { code: error.code, retry: error.details?.retry_after_s };
  }
}

test("a memory bucket serves its burst, refuses with a retry time, and refills with time", async () => {
  let now = 1_000_000;
  const limiter = new RateLimiter(new MemoryBuckets(), () => now);
  for (let i = 0; i < 3; i++) expect(await refusal(() => limiter.charge([LIMIT, "a"]))).toBeNull();
  expect(await refusal(() => limiter.charge([LIMIT, "a"]))).toEqual({ code: "rate_limited", retry: 10 });
  // Another key has its own bucket.
  expect(await refusal(() => limiter.charge([LIMIT, "b"]))).toBeNull();
  now += 10_000; // 6 a minute: one token every 10 s
  expect(await refusal(() => limiter.charge([LIMIT, "a"]))).toBeNull();
  expect((await refusal(() => limiter.charge([LIMIT, "a"])))?.code).toBe("rate_limited");
});

test("a charge of several buckets stops at the first empty one", async () => {
  const limiter = new RateLimiter(new MemoryBuckets(), () => 0);
  const tight: Limit = { name: "tight", burst: 1, perMinute: 1 };
  await limiter.charge([tight, "x"], [LIMIT, "y"]);
  expect((await refusal(() => limiter.charge([tight, "x"], [LIMIT, "y"])))?.code).toBe("rate_limited");
  // The second bucket was charged once only, by the first call.
  await limiter.charge([LIMIT, "y"]);
  await limiter.charge([LIMIT, "y"]);
  expect((await refusal(() => limiter.charge([LIMIT, "y"])))?.code).toBe("rate_limited");
});

test("the memory store forgets the least recently charged key when full", async () => {
  const limiter = new RateLimiter(new MemoryBuckets(2), () => 0);
  const once: Limit = { name: "once", burst: 1, perMinute: 1 };
  await limiter.charge([once, "a"]);
  await limiter.charge([once, "b"]);
  await limiter.charge([once, "c"]); // evicts a
  expect(await refusal(() => limiter.charge([once, "a"]))).toBeNull();
  expect((await refusal(() => limiter.charge([once, "c"])))?.code).toBe("rate_limited");
});

describeEachDialect("database buckets", (dialect) => {
  let cloud: TestCloud;
  beforeAll(async () => {
    cloud = await startTestCloud(dialect);
  });
  afterAll(async () => {
    await cloud?.close();
  });

  test("replicas sharing the database share the bucket, and concurrent charges never overspend it", async () => {
    const now = Date.now();
    const replicaA = new RateLimiter(new DatabaseBuckets(cloud.deps.db), () => now);
    const replicaB = new RateLimiter(new DatabaseBuckets(cloud.deps.db), () => now);
    const limit: Limit = { name: `shared.${dialect}`, burst: 10, perMinute: 1 };
    const outcomes = await Promise.all(
      Array.from({ length: 30 }, (_, i) => refusal(() => (i % 2 ? replicaA : replicaB).charge([limit, "k"]))),
    );
    expect(outcomes.filter((o) => o === null).length).toBe(10);
    expect(outcomes.filter((o) => o?.code === "rate_limited").length).toBe(20);
  });
});

test("a charge whose clock reading is older than the bucket's never loses tokens", async () => {
  let now = 2_000_000;
  const limiter = new RateLimiter(new MemoryBuckets(), () => now);
  await limiter.charge([LIMIT, "skew"]);
  now -= 5_000; // a request that read the clock earlier commits later
  await limiter.charge([LIMIT, "skew"]);
  await limiter.charge([LIMIT, "skew"]);
  expect((await refusal(() => limiter.charge([LIMIT, "skew"])))?.code).toBe("rate_limited");
});
