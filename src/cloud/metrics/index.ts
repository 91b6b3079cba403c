/**
 * Package metrics is the console's GET /metrics (docs/decisions.md 330, 337): requests by
 * route and status, rate-limit refusals, device-flow outcomes, and gauges read from the
 * database at the scrape (sessions, linked nodes, nodes online). Counters are this process's
 * own; several replicas each expose theirs.
 */
import { constantTimeEqual } from "../../lib/crypto";
import { pathOf } from "../../lib/http";
import { MetricsText, metricsResponse } from "../../lib/prometheus";
import type { Database } from "../db";

/** NODE_ONLINE_MS is how recent a node's last contact must be for it to count as online. */
export const NODE_ONLINE_MS = 5 * 60_000;

/** DEVICE_ROUTES say which device-flow outcome an answer of each route means. */
const DEVICE_START = "POST /api/link/device";
const DEVICE_POLL = "POST /api/link/device/poll";
const DEVICE_APPROVE = "POST /api/nodes/device-approvals/approve";
const DEVICE_DENY = "POST /api/nodes/device-approvals/deny";

/** POLL_ERRORS name the outcome of each RFC 8628 error a poll answers with. */
const POLL_ERRORS: Record<string, string> = {
  slow_down: "polled_slow_down",
  access_denied: "polled_denied",
  expired_token: "polled_expired",
};

interface CompiledRoute {
  method: string;
  path: string;
  pattern: RegExp;
}

function compile(routes: readonly { method: string; path: string }[]): CompiledRoute[] {
  return (
    routes
      .filter((route) => route.method !== "HEAD" && route.method !== "OPTIONS" && route.path !== "/metrics")
      .map((route) => ({
        method: route.method,
        path: route.path,
        params: (route.path.match(/\/:/g) ?? []).length + (route.path.includes("*") ? 10 : 0),
        pattern: new RegExp(
          `^${route.path
            .split("/")
            .map((segment) => (segment.startsWith(":") ? "[^/]+" : segment === "*" ? ".*" : segment.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")))
            .join("/")}/?$`,
        ),
      }))
      // A static path wins over a parameter in the same place, as the router's does.
      .sort((a, b) => a.params - b.params)
      .map(({ method, path, pattern }) => ({ method, path, pattern }))
  );
}

function isLoopback(address: string | undefined): boolean {
  if (!address) return false;
  return address === "::1" || address.startsWith("127.") || address.startsWith("::ffff:127.");
}

/**
 * ConsoleMetrics counts what the console answered and renders the Prometheus answer. The
 * composition root hands it every request and response (`observe`) and every rate-limit
 * refusal (`rateLimited`), and routes GET /metrics to `handle`.
 */
export class ConsoleMetrics {
  private routes: CompiledRoute[] = [];
  private readonly requests = new Map<string, { route: string; method: string; code: string; count: number }>();
  private readonly refusals = new Map<string, number>();
  private readonly deviceFlow = new Map<string, number>();

  /**
   * `online` counts the nodes whose tunnel is open in this process (the relay's registry); the
   * database's last contact stands in where there is none (a worker role serves no tunnels).
   */
  constructor(private readonly o: { db: Database; token: string | undefined; online?: () => number }) {}

  /** learn takes the app's routes, so requests are counted by route pattern, never by raw path. */
  learn(routes: readonly { method: string; path: string }[]): void {
    this.routes = compile(routes);
  }

  /** rateLimited counts one refusal by the limit that refused it. */
  rateLimited(limit: string): void {
    this.refusals.set(limit, (this.refusals.get(limit) ?? 0) + 1);
  }

  private routeOf(method: string, path: string): string {
    for (const route of this.routes) if (route.method === method && route.pattern.test(path)) return route.path;
    return "unmatched";
  }

  private outcome(name: string): void {
    this.deviceFlow.set(name, (this.deviceFlow.get(name) ?? 0) + 1);
  }

  /** observe counts one answered request; a device-flow poll's error answer is read for its RFC 8628 code. */
  async observe(request: Request, response: Response): Promise<void> {
    const method = request.method;
    const route = this.routeOf(method === "HEAD" ? "GET" : method, pathOf(request.url));
    const code = String(response.status);
    const key = `${route}\n${method}\n${code}`;
    const held = this.requests.get(key);
    if (held) held.count += 1;
    else this.requests.set(key, { route, method, code, count: 1 });
    const ok = response.status >= 200 && response.status < 300;
    const which = `${method} ${route}`;
    if (which === DEVICE_START && ok) this.outcome("started");
    else if (which === DEVICE_APPROVE && ok) this.outcome("approved");
    else if (which === DEVICE_DENY && ok) this.outcome("denied");
    else if (which === DEVICE_POLL) {
      if (response.status === 202) this.outcome("polled_pending");
      else if (response.status === 200) this.outcome("collected");
      else {
        const body = (await response
          .clone()
          .json()
          .catch(() => null)) as { error?: { code?: string } } | null;
        const error = body?.error?.code ?? "";
        this.outcome(POLL_ERRORS[error] ?? "polled_refused");
      }
    }
  }

  /**
   * handle answers GET /metrics: with a metrics token configured, to its bearer only; without
   * one, to a direct loopback peer that sends no forwarding header (decision 330). Others get
   * 404, so the route is not advertised.
   */
  async handle(request: Request, peer: string | undefined): Promise<Response> {
    const notFound = () =>
      new Response(JSON.stringify({ error: { code: "not_found", message: "no such route", request_id: "" } }), {
        status: 404,
        headers: { "content-type": "application/json" },
      });
    if (this.o.token !== undefined) {
      const presented = /^Bearer (\S+)$/i.exec(request.headers.get("authorization") ?? "")?.[1] ?? "";
      if (!constantTimeEqual(presented, this.o.token)) return notFound();
    } else if (!isLoopback(peer) || request.headers.has("forwarded") || request.headers.has("x-forwarded-for")) {
      return notFound();
    }
    return metricsResponse(await this.render());
  }

  /** render writes the Prometheus answer, with the database gauges read now. */
  async render(now = Date.now()): Promise<string> {
    const db = this.o.db;
    const count = async (rows: Promise<unknown[]>) => Number(((await rows)[0] as { n: number | string | bigint }).n);
    const [sessions, nodes, online] = await Promise.all([
      count(db.sql`SELECT COUNT(*) AS n FROM sessions WHERE expires_at > ${now} AND absolute_expires_at > ${now}`),
      count(db.sql`SELECT COUNT(*) AS n FROM nodes WHERE credential_digest IS NOT NULL`),
      count(
        db.sql`SELECT COUNT(*) AS n FROM nodes WHERE credential_digest IS NOT NULL AND last_seen_at IS NOT NULL AND last_seen_at > ${now - NODE_ONLINE_MS}`,
      ),
    ]);
    const text = new MetricsText();
    text.counter(
      "engine_cloud_http_requests_total",
      "Requests the console answered, by route pattern, method and status.",
      [...this.requests.values()].map((item) => ({
        labels: { route: item.route, method: item.method, code: item.code },
        value: item.count,
      })),
    );
    text.counter(
      "engine_cloud_rate_limited_total",
      "Requests refused with 429, by the limit that refused them.",
      [...this.refusals.entries()].map(([limit, value]) => ({ labels: { limit }, value })),
    );
    text.counter(
      "engine_cloud_device_flow_total",
      "Device-flow (RFC 8628) events: started, approved, denied, polled_pending, polled_slow_down, polled_denied, polled_expired, polled_refused, collected.",
      [...this.deviceFlow.entries()].map(([outcome, value]) => ({ labels: { outcome }, value })),
    );
    text.gauge("engine_cloud_sessions_active", "Browser sessions that have not expired.", [{ labels: {}, value: sessions }]);
    text.gauge("engine_cloud_nodes", "Linked nodes (engines holding a node credential).", [{ labels: {}, value: nodes }]);
    text.gauge("engine_cloud_nodes_online", "Linked nodes whose engine's tunnel to this console is open now.", [
      { labels: {}, value: this.o.online ? this.o.online() : online },
    ]);
    return text.toString();
  }
}
