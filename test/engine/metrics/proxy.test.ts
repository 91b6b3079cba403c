import { afterAll, beforeAll, expect, test } from "bun:test";
import { join } from "node:path";
import { eventually, freePort, REPO_ROOT, startTestEngine, type TestEngine, waitProxied, workloadBun, workloadPath } from "../../helpers";
import { parseExposition, promtoolCheck, seriesValue } from "./exposition";

/**
 * The proxy's counts reach /metrics from its separate processes (docs/decisions.md 335): per
 * route and status class, with bytes and a latency histogram, and they do not go down when a
 * proxy process dies and is respawned.
 */

const UPSTREAM = join(REPO_ROOT, "test", "fixtures", "proxy", "upstream.ts");

let engine: TestEngine;
let httpPort = 0;

beforeAll(async () => {
  engine = await startTestEngine({ proxy: true, httpsPort: 0, httpPort: 0, proxyProcesses: 2, mdns: "off", hostname: "box" });
  httpPort = (await engine.json<{ tls: { http_port: number } }>("GET", "/api/proxy/status")).body.tls.http_port;
  const port = await freePort();
  const { status } = await engine.json("POST", "/api/services", {
    body: { name: "web", port, command: [workloadBun(), workloadPath(UPSTREAM)], env: { SERVICE_NAME: "web" } },
  });
  expect(status).toBe(201);
  await waitProxied(httpPort, "web.localhost", "web");
});
afterAll(() => engine?.close());

async function series() {
  return parseExposition(await (await engine.call("GET", "/metrics")).text());
}

test("requests, bytes and latency per route and status class, from the proxy processes", async () => {
  const before = (await series()).length;
  expect(before).toBeGreaterThan(0);
  for (let i = 0; i < 10; i++) {
    const response = await fetch(`http://127.0.0.1:${httpPort}/hello`, { headers: { host: "web.localhost" } });
    expect(response.status).toBe(200);
    await response.text();
  }
  const missing = await fetch(`http://127.0.0.1:${httpPort}/`, { headers: { host: "nobody.localhost" } });
  expect(missing.status).toBe(404);
  await missing.text();
  // The processes report every 5 s.
  const seen = await eventually(
    async () => {
      const all = await series();
      const ok = seriesValue(all, "engine_proxy_requests_total", { service: "web", route: "web.localhost", code: "2xx" }) ?? 0;
      const unrouted = seriesValue(all, "engine_proxy_requests_total", { service: "", route: "unrouted", code: "4xx" }) ?? 0;
      return ok >= 11 && unrouted >= 1 ? all : null;
    },
    { timeoutMs: 20_000 },
  );
  const web = { service: "web", route: "web.localhost", code: "2xx" };
  const count = seriesValue(seen, "engine_proxy_requests_total", web) as number;
  expect(seriesValue(seen, "engine_proxy_request_duration_seconds_count", web)).toBe(count);
  expect(seriesValue(seen, "engine_proxy_request_duration_seconds_bucket", { ...web, le: "+Inf" })).toBe(count);
  expect(seriesValue(seen, "engine_proxy_request_duration_seconds_sum", web)).toBeGreaterThan(0);
  expect(seriesValue(seen, "engine_proxy_request_bytes_total", web)).toBeGreaterThan(count * 30);
  expect(seriesValue(seen, "engine_proxy_response_bytes_total", web)).toBeGreaterThan(count * 50);
  expect(await promtoolCheck(await (await engine.call("GET", "/metrics")).text())).toEqual({ code: 0, output: "" });
});

test("counts do not go down when a proxy process is killed and respawned", async () => {
  const web = { service: "web", route: "web.localhost", code: "2xx" };
  const status = (await engine.json<{ respawn: { pids: number[]; count: number } }>("GET", "/api/proxy/status")).body;
  // Let every process report what it has, then kill one.
  const reported = await eventually(
    async () => {
      const value = seriesValue(await series(), "engine_proxy_requests_total", web) ?? 0;
      await Bun.sleep(100);
      return value;
    },
    { timeoutMs: 20_000 },
  );
  process.kill(status.respawn.pids[0] as number, "SIGKILL");
  await eventually(async () => {
    const now = (await engine.json<{ respawn: { count: number; processes: number } }>("GET", "/api/proxy/status")).body.respawn;
    return now.count > status.respawn.count && now.processes === 2;
  });
  expect(seriesValue(await series(), "engine_proxy_requests_total", web)).toBeGreaterThanOrEqual(reported);
});
