import { Elysia } from "elysia";
import {
  AUTHED,
  DomainAdd,
  DomainAdded,
  DomainParams,
  DomainRemovalResult,
  errorResponses,
  ServiceIdentParams,
} from "../../contract/engine";
import { assertServiceInScope, type RequestContext } from "../auth";
import type { ServiceDirectory } from "../services";
import type { ProxyController } from "./controller";

/** DomainRouteDeps are what the domain routes need: the proxy that routes and certifies names, and the services for scope checks. */
export interface DomainRouteDeps {
  proxy: Pick<ProxyController, "addDomain" | "removeDomain">;
  services: Pick<ServiceDirectory, "serviceName">;
}

/**
 * domainRoutes serves a service's domains: adding one routes it (and optionally only a path
 * prefix) to the service with a certificate, removing one stops routing it. A scoped token
 * touches only the domains of services in its scope.
 */
export function domainRoutes(deps: DomainRouteDeps, ctx: RequestContext) {
  return new Elysia({ name: "domains" })
    .post(
      // Named :ident because the router shares the tree with POST /api/services/:ident/:action;
      // the static `domains` segment wins over the action parameter.
      "/api/services/:ident/domains",
      async ({ params, body, request, set }) => {
        assertServiceInScope(ctx.principalOf(request), deps.services.serviceName(params.ident));
        const added = await deps.proxy.addDomain(params.ident, body.domain, body.path_prefix);
        set.status = 201;
        return added;
      },
      {
        params: ServiceIdentParams,
        body: DomainAdd,
        response: { 201: DomainAdded, ...errorResponses(...AUTHED, 404, 409, 422) },
        detail: {
          tags: ["services"],
          summary:
            "Route a domain (and optionally only a path prefix) to a service: a local-CA certificate for .local, .localhost and private names, ACME for public ones",
        },
      },
    )
    .delete(
      "/api/services/:name/domains/:domain",
      ({ params, request }) => {
        assertServiceInScope(ctx.principalOf(request), params.name);
        return deps.proxy.removeDomain(params.name, params.domain.toLowerCase());
      },
      {
        params: DomainParams,
        response: { 200: DomainRemovalResult, ...errorResponses(...AUTHED, 404, 422) },
        detail: { tags: ["services"], summary: "Remove a domain from a service" },
      },
    );
}
