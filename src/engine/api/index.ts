import { openapi } from "@elysiajs/openapi";
import { Elysia, ValidationError } from "elysia";
import { randomId } from "../../lib/crypto";
import { AppError, isAppError } from "../../lib/errors";
import { InputError, type SchemaIssue, toValidationDetail } from "../../lib/validation";
import { type Access, LOCAL_PRINCIPAL, type Principal, ROUTE_ACCESS, roleMay } from "../auth";
import { daemonRoutes } from "./daemon";
import type { ApiDeps, RequestContext } from "./deps";
import { docsPage } from "./docs-page";
import { errorResponse, STATUS_BY_CODE, validationResponse } from "./errors";
import { serviceRoutes } from "./services";
import { templateRoutes } from "./templates";
import { tokenRoutes } from "./tokens";
import { workloadRoutes } from "./workloads";

export type { ApiDeps, DaemonControl } from "./deps";

interface CompiledRoute {
  method: string;
  pattern: RegExp;
  key: string;
  access: Access;
}

/** compileRouteAccess turns ROUTE_ACCESS keys into matchers used before the body is parsed. */
function compileRouteAccess(): CompiledRoute[] {
  return Object.entries(ROUTE_ACCESS).map(([key, access]) => {
    const [method = "", path = ""] = key.split(" ");
    const source = path
      .split("/")
      .map((segment) => (segment.startsWith(":") ? "[^/]+" : segment.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")))
      .join("/");
    return { method, pattern: new RegExp(`^${source}/?$`), key, access };
  });
}

/** pathOf returns a URL's path without its query, without the cost of a URL object. */
function pathOf(url: string): string {
  const start = url.indexOf("/", url.indexOf("//") + 2);
  if (start === -1) return "/";
  const query = url.indexOf("?", start);
  return url.slice(start, query === -1 ? undefined : query);
}

/** jsonInvalid is the 422 entry for a body that is not JSON at all. */
function jsonInvalid(ctx: Record<string, unknown>) {
  return { loc: ["body"], msg: "JSON decode error: the body is not valid JSON", type: "json_invalid", input: null, ctx };
}

/** PART_NAMES maps Elysia's validation targets to the `loc` roots of the 422 body. */
const PART_NAMES: Record<string, string> = { body: "body", params: "path", query: "query", headers: "header", cookie: "cookie" };

export interface Api {
  app: ReturnType<typeof buildApp>;
  /** markLocal flags a request as arriving over the unix socket, which counts as admin. */
  markLocal(request: Request): void;
}

function buildApp(
  deps: ApiDeps,
  ctx: RequestContext,
  hooks: { onRequest: (request: Request) => void; requestId: (request: Request) => string },
) {
  // Elysia wraps whatever a parser throws into a bare PARSE error; the real reason waits here.
  const parseFailures = new WeakMap<Request, InputError>();
  const refuseBody = (request: Request, failure: InputError): never => {
    parseFailures.set(request, failure);
    throw failure;
  };
  return new Elysia()
    .onRequest(({ request }) => hooks.onRequest(request))
    .onParse({ as: "global" }, async ({ request, contentType }) => {
      if (!contentType?.startsWith("application/json")) return;
      const text = await request.text();
      let value: unknown;
      try {
        value = JSON.parse(text);
      } catch (error) {
        refuseBody(request, new InputError([jsonInvalid({ error: (error as Error).message })]));
      }
      // Every body of this API is a JSON object; say so before field checks run on a coerced value.
      if (value === null || typeof value !== "object" || Array.isArray(value)) {
        refuseBody(request, new InputError([{ loc: ["body"], msg: "Input should be a valid object", type: "dict_type", input: value }]));
      }
      return value;
    })
    .onAfterHandle({ as: "global" }, ({ request, set }) => {
      set.headers["x-request-id"] = hooks.requestId(request);
    })
    .onError({ as: "global" }, ({ code, error, request }) => {
      const requestId = hooks.requestId(request);
      if (error instanceof ValidationError) {
        if (error.type === "response") {
          deps.log.error({ request_id: requestId, path: pathOf(request.url), issues: error.all }, "response failed its schema");
          return errorResponse(500, "internal", "internal error", requestId);
        }
        const part = PART_NAMES[error.type] ?? error.type;
        const issues = error.all as unknown as SchemaIssue[];
        return validationResponse(toValidationDetail(part, issues), requestId);
      }
      if (error instanceof InputError) return validationResponse(error.detail, requestId);
      if (code === "PARSE") {
        const failure = parseFailures.get(request);
        if (failure) return validationResponse(failure.detail, requestId);
        return validationResponse([jsonInvalid({})], requestId);
      }
      if (code === "NOT_FOUND") return errorResponse(404, "not_found", "no such route", requestId);
      if (isAppError(error)) {
        const status = STATUS_BY_CODE[error.code] ?? 500;
        const headers = status === 401 ? { "www-authenticate": `Bearer error="invalid_token"` } : undefined;
        if (status >= 500) deps.log.error({ request_id: requestId, code: error.code, err: error.message }, "request failed");
        return errorResponse(status, error.code, error.message, requestId, headers);
      }
      // Anything else is a bug: log it once with the request id, and tell the client only the id.
      deps.log.error({ request_id: requestId, err: error, path: pathOf(request.url) }, "unhandled error");
      return errorResponse(500, "internal", "internal error; the engine log has the details under this request id", requestId);
    })
    .use(
      openapi({
        path: "/api/docs",
        specPath: "/api/openapi.json",
        provider: null,
        documentation: {
          info: {
            title: "engine — local engine API",
            version: deps.version,
            description: "The local engine API: tokens, app templates, proxy, services, databases, daemon and the link.",
          },
          components: { securitySchemes: { bearer: { type: "http", scheme: "bearer" } } },
          // The plugin serves the contract but does not list its own route; the spec does.
          paths: {
            "/api/openapi.json": {
              get: {
                tags: ["daemon"],
                summary: "The installed contract (OpenAPI 3.1); no credential",
                security: [],
                responses: {
                  "200": { description: "The OpenAPI document", content: { "application/json": { schema: { type: "object" } } } },
                },
              },
            },
          },
          security: [{ bearer: [] }],
        },
      }),
    )
    .get("/api/docs", () => new Response(docsPage(deps.version), { headers: { "content-type": "text/html; charset=utf-8" } }), {
      detail: { hide: true },
    })
    .use(tokenRoutes(deps, ctx))
    .use(templateRoutes(deps))
    .use(serviceRoutes(deps, ctx))
    .use(workloadRoutes(deps, ctx))
    .use(daemonRoutes(deps));
}

/**
 * createApi builds the engine's HTTP API. Authentication and the role check run when the
 * request arrives, before its body is parsed, from the ROUTE_ACCESS matrix; a route missing
 * from the matrix stops the engine from starting.
 */
export function createApi(deps: ApiDeps): Api {
  const routes = compileRouteAccess();
  const local = new WeakSet<Request>();
  const principals = new WeakMap<Request, Principal>();
  const requestIds = new WeakMap<Request, string>();
  // Request ids are a random per-process prefix and a counter: unique across restarts, and cheap.
  const bootPrefix = randomId("req").slice(4, 12);
  let requestCounter = 0;

  const requestId = (request: Request): string => {
    let id = requestIds.get(request);
    if (!id) {
      const given = request.headers.get("x-request-id");
      id = given && /^[A-Za-z0-9._-]{1,64}$/.test(given) ? given : `req_${bootPrefix}${(++requestCounter).toString(36)}`;
      requestIds.set(request, id);
    }
    return id;
  };

  const onRequest = (request: Request) => {
    requestId(request);
    const path = pathOf(request.url);
    const method = request.method === "HEAD" ? "GET" : request.method;
    const route = routes.find((r) => r.method === method && r.pattern.test(path));
    if (!route || route.access === "public") return;
    const principal = local.has(request) ? LOCAL_PRINCIPAL : deps.tokens.authenticate(request.headers.get("authorization"));
    if (!roleMay(principal.role, route.access)) {
      throw new AppError("forbidden", `a ${principal.role} token may not call ${route.key}`);
    }
    principals.set(request, principal);
  };

  const ctx: RequestContext = {
    principalOf(request) {
      const principal = principals.get(request);
      if (!principal) throw new AppError("unauthenticated", "no credential was checked for this request");
      return principal;
    },
  };

  const app = buildApp(deps, ctx, { onRequest, requestId });
  const declared = new Set(app.routes.filter((r) => r.method !== "HEAD" && r.method !== "OPTIONS").map((r) => `${r.method} ${r.path}`));
  const missing = [...declared].filter((key) => !(key in ROUTE_ACCESS));
  const stale = Object.keys(ROUTE_ACCESS).filter((key) => !declared.has(key));
  if (missing.length > 0 || stale.length > 0) {
    throw new Error(`route access matrix is out of date: missing ${missing.join(", ") || "none"}; stale ${stale.join(", ") || "none"}`);
  }
  return { app, markLocal: (request) => local.add(request) };
}
