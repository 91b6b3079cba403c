import { Elysia } from "elysia";
import { AUTHED, errorResponses, MetricsHistory, MetricsHistoryQuery } from "../../contract/engine";
import { metricsResponse } from "../../lib/prometheus";
import { assertServiceInScope, type RequestContext } from "../auth";
import type { EngineMetrics, MetricsServices } from "./index";

/** MetricsRouteDeps are what the metrics routes need: the metrics themselves and the services, to name the one a history is asked for. */
export interface MetricsRouteDeps {
  services: Pick<MetricsServices, "get">;
  /** metrics answers GET /metrics and the history; unset: both answer empty. */
  metrics?: Pick<EngineMetrics, "render" | "history">;
}

/**
 * metricsRoutes serves the machine's numbers: GET /metrics in the Prometheus text format,
 * outside /api and outside the contract (docs/decisions.md 330), and the in-process history
 * the web UI draws, GET /api/metrics/history (decision 331). Both need a token of any role;
 * a scoped token sees its services only.
 */
export function metricsRoutes(deps: MetricsRouteDeps, ctx: RequestContext) {
  return new Elysia({ name: "metrics" })
    .get("/metrics", ({ request }) => metricsResponse(deps.metrics?.render(ctx.principalOf(request)) ?? ""), {
      detail: { hide: true },
    })
    .get(
      "/api/metrics/history",
      ({ query, request }) => {
        const principal = ctx.principalOf(request);
        let service = null;
        if (query.service !== undefined) {
          service = deps.services.get(query.service);
          assertServiceInScope(principal, service.name);
        }
        const since = query.since === undefined ? undefined : Number(query.since);
        return (
          deps.metrics?.history(principal, since, service) ?? {
            interval_s: 5,
            window_s: 3600,
            now: Date.now() / 1000,
            times: [],
            gpus: [],
            services: [],
          }
        );
      },
      {
        query: MetricsHistoryQuery,
        response: { 200: MetricsHistory, ...errorResponses(...AUTHED, 404, 422) },
        detail: {
          tags: ["metrics"],
          summary:
            "The last hour at 5-s resolution, in memory: per-GPU utilization and memory, per-service CPU, resident memory and GPU memory (columnar: one value per `times` entry, null where not measured)",
        },
      },
    );
}
