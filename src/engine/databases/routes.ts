import type { Static } from "@sinclair/typebox";
import { Elysia } from "elysia";
import {
  AUTHED,
  DatabaseNameParams,
  errorResponses,
  RestoreRequest,
  RestoreResult,
  RevealedConnection,
  ServiceIdentParams,
} from "../../contract/engine";
import { assertServiceInScope, type Principal, type RequestContext } from "../auth";

/**
 * DatabaseRouteDeps are what the database routes need from the services' coordinator, which
 * owns the database services' records and runs their restores.
 */
export interface DatabaseRouteDeps {
  services: {
    /** serviceName resolves a name or id to the service's name, for scope checks. */
    serviceName(ident: string): string;
    revealConnection(ident: string, principal: Principal): RevealedConnection;
    restoreDatabase(name: string, dump: string, timeoutS: number): Promise<Static<typeof RestoreResult>>;
  };
}

/** databaseRoutes serves a managed database's connection details and the restore of a dump into it. */
export function databaseRoutes(deps: DatabaseRouteDeps, ctx: RequestContext) {
  return new Elysia({ name: "databases" })
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
