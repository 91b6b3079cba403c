import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { parseExposition, promtoolCheck, seriesValue } from "../../engine/metrics/exposition";
import { describeEachDialect, startTestCloud, type TestCloud } from "../helpers";

/**
 * The console's GET /metrics (docs/decisions.md 330, 337): requests by route pattern and
 * status, rate-limit refusals by limit, device-flow outcomes, sessions and nodes, in a text
 * that promtool checks with no problem; and who may read it.
 */

const DEVICE = { hostname: "box", os: "linux", version: "0.7.0" };

async function scrape(cloud: TestCloud, headers: Record<string, string> = {}) {
  const response = await fetch(`${cloud.url}/metrics`, { headers });
  return { status: response.status, text: await response.text(), type: response.headers.get("content-type") };
}

describeEachDialect("console metrics", (dialect) => {
  let cloud: TestCloud;
  beforeAll(async () => {
    cloud = await startTestCloud(dialect);
  });
  afterAll(() => cloud?.close());

  test("requests by route and status, device-flow outcomes, sessions, rate-limit refusals", async () => {
    const started = await cloud.api("POST", "/api/link/device", { body: DEVICE });
    expect(started.status).toBe(201);
    const polls = [];
    for (let i = 0; i < 3; i++)
      polls.push((await cloud.api("POST", "/api/link/device/poll", { body: { device_code: started.body.device_code } })).status);
    expect(
      (await cloud.api("POST", "/api/link/device/poll", { body: { device_code: "dev_0000000000000000.x" } })).status,
    ).toBeGreaterThanOrEqual(400);
    expect((await cloud.api("GET", "/api/no/such/route")).status).toBe(404);
    await cloud.signIn("metrics@example.com");
    const { token } = await cloud.signIn("metrics@example.com");
    expect((await cloud.api("GET", "/api/nodes", { token })).status).toBe(200);
    // Device requests are limited per address: the 11th within the burst is refused.
    let refused = 0;
    for (let i = 0; i < 12; i++) if ((await cloud.api("POST", "/api/link/device", { body: DEVICE })).status === 429) refused++;
    expect(refused).toBeGreaterThan(0);

    const { status, text, type } = await scrape(cloud);
    expect(status).toBe(200);
    expect(type).toBe("text/plain; version=0.0.4; charset=utf-8");
    expect(await promtoolCheck(text)).toEqual({ code: 0, output: "" });
    const series = parseExposition(text);
    expect(seriesValue(series, "engine_cloud_http_requests_total", { route: "/api/link/device", method: "POST", code: "201" })).toBe(
      13 - refused,
    );
    expect(seriesValue(series, "engine_cloud_http_requests_total", { route: "/api/nodes", method: "GET", code: "200" })).toBe(1);
    expect(seriesValue(series, "engine_cloud_http_requests_total", { route: "unmatched", method: "GET", code: "404" })).toBe(1);
    expect(seriesValue(series, "engine_cloud_device_flow_total", { outcome: "started" })).toBe(13 - refused);
    expect(seriesValue(series, "engine_cloud_device_flow_total", { outcome: "polled_refused" })).toBe(1);
    const pollOutcomes = ["polled_pending", "polled_slow_down"].map(
      (outcome) => seriesValue(series, "engine_cloud_device_flow_total", { outcome }) ?? 0,
    );
    expect(pollOutcomes[0]! + pollOutcomes[1]!).toBe(polls.length);
    const limits = series.filter((s) => s.name === "engine_cloud_rate_limited_total");
    expect(limits.reduce((sum, s) => sum + s.value, 0)).toBe(refused);
    expect(seriesValue(series, "engine_cloud_sessions_active")).toBe(2);
    expect(seriesValue(series, "engine_cloud_nodes")).toBe(0);
    expect(seriesValue(series, "engine_cloud_nodes_online")).toBe(0);
  });

  test("without a metrics token only a direct loopback peer is answered; a forwarded request is not", async () => {
    expect((await scrape(cloud)).status).toBe(200);
    expect((await scrape(cloud, { "x-forwarded-for": "203.0.113.9" })).status).toBe(404);
    expect((await scrape(cloud, { forwarded: "for=203.0.113.9" })).status).toBe(404);
  });
});

describe("with ENGINE_CLOUD_METRICS_TOKEN", () => {
  const secret = "metrics-secret-0123456789";
  let cloud: TestCloud;
  beforeAll(async () => {
    cloud = await startTestCloud("sqlite", { metricsToken: secret });
  });
  afterAll(() => cloud?.close());

  test("only its bearer is answered, loopback or not", async () => {
    expect((await scrape(cloud)).status).toBe(404);
    expect((await scrape(cloud, { authorization: "Bearer wrong-secret-0123456789" })).status).toBe(404);
    const answered = await scrape(cloud, { authorization: `Bearer ${secret}` });
    expect(answered.status).toBe(200);
    expect(answered.text).toContain("engine_cloud_sessions_active 0");
    expect(answered.text).not.toContain(secret);
  });

  test("a short token fails the start, naming its length only", async () => {
    await expect(startTestCloud("sqlite", { metricsToken: "short" })).rejects.toThrow(/metrics_token.*5 characters/);
  });
});
