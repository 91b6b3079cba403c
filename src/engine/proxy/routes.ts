import { Elysia } from "elysia";
import { AUTHED, errorResponses, ProxyStatus } from "../../contract/engine";
import type { ProxyController } from "./controller";

/** ProxyRouteDeps are what the proxy's own route needs: its status. */
export interface ProxyRouteDeps {
  proxy: Pick<ProxyController, "status">;
}

/** proxyRoutes serves the reverse proxy's status: listeners, routes, certificates and name publication. */
export function proxyRoutes(deps: ProxyRouteDeps) {
  return new Elysia({ name: "proxy" }).get("/api/proxy/status", () => deps.proxy.status(), {
    response: { 200: ProxyStatus, ...errorResponses(...AUTHED) },
    detail: { tags: ["proxy"], summary: "Reverse proxy status" },
  });
}
