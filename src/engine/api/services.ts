import { Elysia } from "elysia";
import {
  DatabaseNameParams,
  Diagnosis,
  DomainAdd,
  DomainAdded,
  DomainParams,
  DomainRemovalResult,
  ProxyStatus,
  RestoreRequest,
  RestoreResult,
  RevealedConnection,
  ServiceIdentParams,
} from "../../contract/engine";
import { assertServiceInScope } from "../auth";
import type { ApiDeps, RequestContext } from "./deps";
import { AUTHED, errorResponses } from "./responses";

/** serviceRoutes serves diagnosis, domains, a database's connection details, database restore and the proxy's status. */
export function serviceRoutes(deps: ApiDeps, ctx: RequestContext) {
  return new Elysia({ name: "services" })
    .get("/api/proxy/status", () => deps.proxy.status(), {
      response: { 200: ProxyStatus, ...errorResponses(...AUTHED) },
      detail: { tags: ["proxy"], summary: "Reverse proxy status" },
    })
    .get(
      "/api/services/:ident/diagnose",
      ({ params, request }) => {
        assertServiceInScope(ctx.principalOf(request), deps.services.serviceName(params.ident));
        return deps.services.diagnose(params.ident);
      },
      {
        params: ServiceIdentParams,
        response: { 200: Diagnosis, ...errorResponses(...AUTHED, 404, 422) },
        detail: { tags: ["services"], summary: "Diagnose a service: status, forensics, restarts, health, bindings, build, logs" },
      },
    )
    .get(
      "/api/services/:ident/connection",
      ({ params, request }) => deps.services.revealConnection(params.ident, ctx.principalOf(request)),
      {
        params: ServiceIdentParams,
        response: { 200: RevealedConnection, ...errorResponses(...AUTHED, 404, 409, 422) },
        detail: {
          tags: ["databases"],
          summary:
            "Admin only: a managed database's connection details in full, password included (GET /api/services/{ident} shows them masked). The reveal is logged, the details never are; 409 not_a_database for other services",
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
    )
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
    .post(
      "/api/databases/:name/restore",
      ({ params, body, request }) => {
        assertServiceInScope(ctx.principalOf(request), params.name);
        return deps.services.restoreDatabase(params.name, body.dump, body.timeout_s);
      },
      {
        params: DatabaseNameParams,
        body: RestoreRequest,
        response: { 200: RestoreResult, ...errorResponses(...AUTHED, 404, 409, 422, 500, 501, 504) },
        detail: {
          tags: ["databases"],
          summary:
            "Restore a dump into a database service: 409 not a database, wrong engine for the dump, not running, or a restore already under way; 422 an unreadable, unrecognised or failing dump (the database is left as it was); 500 database_tools_missing; 504 past timeout_s (the database is left as it was)",
        },
      },
    );
}
