import { afterEach, describe, expect, test } from "bun:test";
import type { ServiceRecord } from "../../../src/contract/engine";
import { MetricsCollector } from "../../../src/engine/metrics/collector";
import { createLogger } from "../../../src/lib/logger";
import { eventually } from "../../helpers";

const log = createLogger({ level: "silent", stdout: false }).log;

let collector: MetricsCollector | null = null;
afterEach(() => collector?.stop());

/** counting is a collector over no services whose GPU reads are counted: one read a sample. */
function counting(): { collector: MetricsCollector; reads: () => number } {
  let reads = 0;
  const made = new MetricsCollector({
    services: { liveWorkloads: () => [] },
    gpusDeclared: false,
    log,
    intervalMs: 60_000,
    readGpus: async () => {
      reads++;
      return { readings: [], apps: [], warnings: [] };
    },
  });
  return { collector: made, reads: () => reads };
}

describe("MetricsCollector.start", () => {
  test("takes its first sample at once by default", async () => {
    const made = counting();
    collector = made.collector;
    collector.start();
    expect(made.reads()).toBe(1);
    await eventually(() => collector?.latest() ?? null, { intervalMs: 5 });
  });

  test("puts the first sample off by what it is given, then samples as usual", async () => {
    const made = counting();
    collector = made.collector;
    const startedAt = performance.now();
    collector.start(300);
    await Bun.sleep(100);
    expect(made.reads()).toBe(0);
    expect(collector.latest()).toBeNull();
    await eventually(() => collector?.latest() ?? null, { intervalMs: 5 });
    expect(performance.now() - startedAt).toBeGreaterThanOrEqual(290);
    expect(made.reads()).toBe(1);
  });

  test("a stop before the first sample leaves it untaken", async () => {
    const made = counting();
    collector = made.collector;
    collector.start(50);
    collector.stop();
    await Bun.sleep(150);
    expect(made.reads()).toBe(0);
  });
});

describe("MetricsCollector.sample", () => {
  /** self is this test process as a service's workload: a process /proc has, with memory to measure. */
  const self = { id: "svc_self", name: "self", pid: process.pid };
  const record = { id: self.id, name: self.name } as ServiceRecord;

  test("measures the services with a process, and a deleted one's series go when it is forgotten", async () => {
    collector = new MetricsCollector({ services: { liveWorkloads: () => [self] }, gpusDeclared: true, log, intervalMs: 60_000 });
    await collector.sample();
    const measured = collector.latest()?.services.get(self.id);
    expect(measured?.workload).toBe(process.pid);
    expect(measured?.rssBytes).toBeGreaterThan(0);
    expect(collector.historyOf(undefined, [record]).services[0]?.rss_bytes.some((value) => value !== null && value > 0)).toBe(true);
    collector.forget(self.id);
    expect(collector.historyOf(undefined, [record]).services[0]?.rss_bytes.every((value) => value === null)).toBe(true);
  });

  test("keeps no entry for a service whose process has gone", async () => {
    collector = new MetricsCollector({
      services: { liveWorkloads: () => [{ id: "svc_gone", name: "gone", pid: 2 ** 22 + 1 }] },
      gpusDeclared: true,
      log,
      intervalMs: 60_000,
    });
    await collector.sample();
    expect(collector.latest()?.services.size).toBe(0);
  });
});
