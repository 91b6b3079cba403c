import { describe, expect, test } from "bun:test";
import { PROXY_LATENCY_BOUNDS_S, ProxyMeter, ProxyTotals, type RouteCounts } from "../../../src/engine/proxy/meter";
import type { RouteEntry } from "../../../src/engine/proxy/snapshot";

/** The proxy's request counts (docs/decisions.md 335): per route and status class, and totals that never go down. */

const route = (host: string, pathPrefix = "/"): RouteEntry => ({
  host,
  pathPrefix,
  service: "web",
  upstream: "http://127.0.0.1:1",
  state: "up",
  status: "running",
  retryAfterS: 1,
});

describe("ProxyMeter", () => {
  test("counts by service, route and status class, with bytes and a latency bucket", () => {
    const meter = new ProxyMeter();
    const api = route("web.localhost", "/api");
    meter.record(api, 200, 100, 1000, 0.003);
    meter.record(api, 204, 50, 20, 0.2);
    // A new snapshot's route object with the same label adds to the same counts.
    meter.record(route("web.localhost", "/api"), 503, 10, 30, 400);
    meter.record(null, 404, 70, 200, 0.001);
    const counts = Object.fromEntries(meter.report().map((item) => [`${item.service}|${item.route}|${item.code}`, item]));
    const ok = counts["web|web.localhost/api|2xx"] as RouteCounts;
    expect(ok).toMatchObject({ requests: 2, request_bytes: 150, response_bytes: 1020 });
    expect(ok.latency[0]).toBe(1);
    expect(ok.latency[PROXY_LATENCY_BOUNDS_S.indexOf(0.25)]).toBe(1);
    expect(counts["web|web.localhost/api|5xx"]?.latency.at(-1)).toBe(1);
    expect(counts["|unrouted|4xx"]).toMatchObject({ requests: 1, request_bytes: 70 });
  });
});

describe("ProxyTotals", () => {
  const report = (requests: number): RouteCounts[] => [
    {
      service: "web",
      route: "web.localhost",
      code: "2xx",
      requests,
      request_bytes: requests,
      response_bytes: requests,
      latency: [requests, 0],
      latency_sum_s: 0,
    },
  ];

  test("live reports are replaced, an ended process's last report is kept", () => {
    const totals = new ProxyTotals();
    totals.update(1, report(5));
    totals.update(2, report(3));
    totals.update(1, report(7));
    expect(totals.totals()[0]?.requests).toBe(10);
    totals.retire(1);
    totals.update(3, report(1));
    expect(totals.totals()[0]?.requests).toBe(11);
    expect(totals.totals()[0]?.latency).toEqual([11, 0]);
    totals.retire(42);
    expect(totals.totals()[0]?.requests).toBe(11);
  });
});
