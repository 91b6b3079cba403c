import { Elysia } from "elysia";
import { AppError, diskFullError } from "../../lib/errors";
import { apiBasics, BodySchemas, cookieValue, pathOf, RequestIds } from "../../lib/http";
import { openapiDocument } from "../../lib/openapi";
import { type Access, LOCAL_PRINCIPAL, type Principal, type RequestContext, ROUTE_ACCESS, roleMay, tokenRoutes } from "../auth";
import { databaseRoutes } from "../databases";
import { gpuRoutes } from "../gpu";
import { linkRoutes } from "../link";
import { metricsRoutes } from "../metrics";
import { domainRoutes, proxyRoutes } from "../proxy";
import { serviceRoutes } from "../services";
import { templateRoutes } from "../templates";
import { CSRF_HEADER, SESSION_COOKIE, sameOrigin, UiSessions, uiRoutes } from "../ui";
import type { ApiDeps } from "./deps";
import { docsPage } from "./docs-page";
import { STATUS_BY_CODE } from "./errors";
import { daemonRoutes } from "./routes";

export type { ApiDeps, DaemonControl, UpgradeAccepted } from "./deps";

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

/** ENGINE_TAGS describe the groups of the engine's operations in its OpenAPI document. */
const ENGINE_TAGS = [
  { name: "tokens", description: "Access tokens: roles, caps and scopes" },
  { name: "app-templates", description: "Built-in templates a service can be deployed from" },
  { name: "proxy", description: "The reverse proxy" },
  { name: "services", description: "Services: deploy, control, logs, diagnosis and domains" },
  { name: "databases", description: "Database services" },
  { name: "gpus", description: "The GPU inventory" },
  {
    name: "metrics",
    description: "The last hour of GPU and service usage, in memory (GET /metrics, outside this contract, has the Prometheus form)",
  },
  { name: "daemon", description: "The daemon itself: health, restart and this document" },
  { name: "link", description: "The link to a cloud console" },
  { name: "ui", description: "The web UI's sessions" },
];

export interface Api {
  app: ReturnType<typeof buildApp>;
  /** markLocal flags a request as arriving over the unix socket, which counts as admin. */
  markLocal(request: Request): void;
  /**
   * actAs makes an in-process request run as `principal` (a relayed assistant, the link): it
   * meets the same role check, scope and caps as a bearer token with those rights. Only code in
   * the daemon calls it; no listener does, so no client can choose its principal.
   */
  actAs(request: Request, principal: Principal): void;
}

function buildApp(
  deps: ApiDeps,
  ctx: RequestContext,
  hooks: { onRequest: (request: Request) => void; requestIds: RequestIds; sessions: UiSessions; bodySchemas: BodySchemas },
) {
  return (
    new Elysia()
      .onRequest(({ request }) => hooks.onRequest(request))
      .use(
        apiBasics({
          log: deps.log,
          requestIds: hooks.requestIds,
          statusByCode: STATUS_BY_CODE,
          bodySchemas: hooks.bodySchemas,
          // The engine's routes may answer 413 (decision 141); its callers are the CLI and the UI.
          oversizeStatus: 413,
          // A write refused for lack of space is the typed `disk_full` (507), wherever it was thrown.
          translateError: diskFullError,
          headersFor: (status) => (status === 401 ? { "www-authenticate": `Bearer error="invalid_token"` } : undefined),
        }),
      )
      .use(
        openapiDocument({
          specPath: "/api/openapi.json",
          info: {
            title: "engine — local engine API",
            version: deps.version,
            description: "The local engine API: tokens, app templates, proxy, services, databases, daemon and the link.",
          },
          // The default address stands in until the engine has listened and knows its own.
          servers: () => [{ url: deps.baseUrl?.() ?? "http://127.0.0.1:9321", description: "This engine" }],
          tags: ENGINE_TAGS,
          securitySchemes: { bearer: { type: "http", scheme: "bearer" } },
          security: [{ bearer: [] }],
          // The document's own route is not generated from a route declaration; the spec lists it.
          paths: {
            "/api/openapi.json": {
              get: {
                tags: ["daemon"],
                operationId: "getApiOpenapiJson",
                summary: "The installed contract (OpenAPI 3.1); no credential",
                security: [],
                responses: {
                  "200": { description: "The OpenAPI document", content: { "application/json": { schema: { type: "object" } } } },
                },
              },
            },
          },
        }),
      )
      .get("/api/docs", () => new Response(docsPage(deps.version), { headers: { "content-type": "text/html; charset=utf-8" } }), {
        detail: { hide: true },
      })
      // Each resource's routes live beside their module (docs/decisions.md 400). The order they
      // are mounted in is the order of the OpenAPI document's paths.
      .use(tokenRoutes(deps, ctx))
      .use(templateRoutes(deps))
      .use(proxyRoutes(deps))
      .use(serviceRoutes(deps, ctx))
      .use(domainRoutes(deps, ctx))
      .use(databaseRoutes(deps, ctx))
      .use(gpuRoutes(deps))
      .use(daemonRoutes(deps))
      .use(linkRoutes(deps))
      .use(metricsRoutes(deps, ctx))
      .use(uiRoutes({ sessions: hooks.sessions, log: deps.log, baseUrl: deps.baseUrl }))
  );
}

/**
 * createApi builds the engine's HTTP API. Authentication and the role check run when the
 * request arrives, before its body is parsed, from the ROUTE_ACCESS matrix; a route missing
 * from the matrix stops the engine from starting.
 */
export function createApi(deps: ApiDeps): Api {
  const routes = compileRouteAccess();
  const local = new WeakSet<Request>();
  const actingAs = new WeakMap<Request, Principal>();
  const principals = new WeakMap<Request, Principal>();
  const sessions = new UiSessions(deps.tokens);
  const requestIds = new RequestIds();
  const bodySchemas = new BodySchemas();

  /**
   * authenticateCookie resolves the web UI's session cookie when no Authorization header is
   * sent. A state change made with a cookie must carry the session's CSRF token in
   * X-Engine-CSRF and come from the engine's own origin; bearer calls are unaffected.
   */
  const authenticateCookie = (request: Request, method: string, cookie: string): Principal => {
    const session = sessions.resolve(cookie);
    if (method !== "GET") {
      if (!sameOrigin(request)) throw new AppError("forbidden", "a cross-site request may not change anything");
      if (!UiSessions.csrfMatches(session, request.headers.get(CSRF_HEADER))) {
        throw new AppError("forbidden", "a web session's state change must carry its CSRF token in X-Engine-CSRF");
      }
    }
    return session.principal;
  };

  const onRequest = (request: Request) => {
    requestIds.of(request);
    const path = pathOf(request.url);
    const method = request.method === "HEAD" ? "GET" : request.method;
    const route = routes.find((r) => r.method === method && r.pattern.test(path));
    if (!route || route.access === "public") return;
    const authorization = request.headers.get("authorization");
    const injected = actingAs.get(request);
    const cookie =
      authorization === null && !local.has(request) && !injected ? cookieValue(request.headers.get("cookie"), SESSION_COOKIE) : null;
    const principal = local.has(request)
      ? LOCAL_PRINCIPAL
      : injected
        ? injected
        : cookie !== null
          ? authenticateCookie(request, method, cookie)
          : deps.tokens.authenticate(authorization);
    if (!roleMay(principal.role, route.access)) {
      const who = principal.kind === "assistant" ? `an assistant with ${principal.role} rights (its grant)` : `a ${principal.role} token`;
      throw new AppError("forbidden", `${who} may not call ${route.key}`);
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

  const app = buildApp(deps, ctx, { onRequest, requestIds, sessions, bodySchemas });
  bodySchemas.learn(app.routes);
  const declared = new Set(app.routes.filter((r) => r.method !== "HEAD" && r.method !== "OPTIONS").map((r) => `${r.method} ${r.path}`));
  const missing = [...declared].filter((key) => !(key in ROUTE_ACCESS));
  const stale = Object.keys(ROUTE_ACCESS).filter((key) => !declared.has(key));
  if (missing.length > 0 || stale.length > 0) {
    throw new Error(`route access matrix is out of date: missing ${missing.join(", ") || "none"}; stale ${stale.join(", ") || "none"}`);
  }
  return {
    app,
    markLocal: (request) => local.add(request),
    actAs: (request, principal) => actingAs.set(request, principal),
  };
}
