import { Elysia } from "elysia";
import { CLOUD_INTERFACE_VERSION, ErrorEnvelope, HealthView, LinkMetadataView, ReadyView } from "../../contract/cloud";
import { AppError } from "../../lib/errors";
import { apiBasics, BodySchemas, pathOf, RequestIds } from "../../lib/http";
import { openapiDocument } from "../../lib/openapi";
import { assertNotCrossSite } from "../auth/csrf";
import { sessionRoutes } from "../auth/session-routes";
import { type CloudDeps, type CloudRoutes, STATUS_BY_CODE } from "../context";
import { LIMITS, type Limit } from "../ratelimit";

/** DISK_FULL_RETRY_AFTER_S is the Retry-After of a write refused for lack of disk space: room comes back when an operator makes it. */
const DISK_FULL_RETRY_AFTER_S = 30;

/** CLOUD_TAGS describe the groups of the console's operations in its OpenAPI document. */
const CLOUD_TAGS = [
  { name: "meta", description: "Liveness and readiness" },
  { name: "auth", description: "Sign-in and sessions" },
  { name: "link", description: "Linking an engine to this console" },
  { name: "preauth-keys", description: "Keys that link an engine without a browser" },
  { name: "device approvals", description: "Approving or denying an engine's device-flow request" },
  { name: "nodes", description: "The account's linked engines" },
  { name: "assistants", description: "Authorizing assistants (MCP clients) to reach the account's machines" },
  { name: "hosted machines", description: "The account's one hosted machine: purchase, allocation, wake, update, backups, delete" },
];

/**
 * readiness runs the role's dependency checks concurrently, each bounded to 3 s, and answers
 * each by name with `ready` true only when all pass.
 */
async function readiness(deps: CloudDeps): Promise<Record<string, boolean | number | string>> {
  const names = Object.keys(deps.readyChecks);
  const bounded = async (check: () => Promise<boolean>) => {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(false), 3000);
    });
    // The timer is cleared once the check answers, so a ready probe leaves nothing pending.
    return Promise.race([check().catch(() => false), late]).finally(() => clearTimeout(timer));
  };
  const results = await Promise.all(names.map((name) => bounded(deps.readyChecks[name] as () => Promise<boolean>)));
  const answer: Record<string, boolean | number | string> = {
    ready: results.every(Boolean),
    role: deps.config.role,
    dialect: deps.db.dialect,
  };
  names.forEach((name, i) => {
    answer[name] = results[i] as boolean;
  });
  // Reported beside `ready`, not folded into it: a full database is not cured by sending
  // traffic elsewhere (replicas share it), and this process still serves reads and a clear
  // 503 for writes (docs/decisions.md 163).
  answer.database_writable = answer.database === false ? false : await bounded(() => deps.db.writable());
  return answer;
}

/**
 * REFUSED_BODY_LIMITS are the per-source limits a body refused before it is parsed (too large,
 * too deep, not JSON) is charged against: the contract charges these routes' limits first, so
 * a body the console will not even read still costs its sender what a readable one would. The
 * per-code buckets need the parsed body and are not charged.
 */
const REFUSED_BODY_LIMITS: Record<string, Limit> = {
  "/api/link/claim": LIMITS.claimBySource,
  "/api/link/device": LIMITS.deviceBySource,
  "/api/link/device/poll": LIMITS.pollBySource,
  "/api/link/preauth": LIMITS.preauthBySource,
  "/api/nodes/device-approvals/lookup": LIMITS.lookupBySource,
  "/api/nodes/device-approvals/approve": LIMITS.decideBySource,
  "/api/nodes/device-approvals/deny": LIMITS.decideBySource,
  "/api/oauth/authorize/decision": LIMITS.authorizeBySource,
};

/**
 * buildCloudApp assembles the console's API: the shared request plumbing, the OpenAPI
 * document, the routes every role serves (health, ready, the two 501 boundaries, link
 * metadata, sessions) and the modules' route plugins.
 */
export function buildCloudApp(deps: CloudDeps, modules: CloudRoutes[]) {
  const requestIds = new RequestIds();
  const bodySchemas = new BodySchemas();
  // The metadata is static: one body and one ETag for the life of the process.
  const metadata = JSON.stringify({ hosted_base_domain: deps.site.hostedBaseDomain });
  const metadataTag = `"${Bun.hash(metadata).toString(36)}"`;
  let app = new Elysia()
    .onRequest(({ request }) => {
      requestIds.of(request);
      // Before any route: a forged cookie-authenticated call never reaches a handler.
      assertNotCrossSite(request, new URL(deps.site.publicUrl).origin);
    })
    .use(
      apiBasics({
        log: deps.log,
        requestIds,
        statusByCode: STATUS_BY_CODE,
        bodySchemas,
        // The console's bodies are a few short strings: 64 KiB is far past any of them.
        bodyLimits: { maxBytes: 64 * 1024, maxDepth: 32 },
        // The contract lists no 400/413/415 on the console's routes: an oversized body is a 422.
        oversizeStatus: 422,
        beforeRefusal: async (request) => {
          const limit = request.method === "POST" ? REFUSED_BODY_LIMITS[pathOf(request.url)] : undefined;
          if (limit) await deps.limiter.charge([limit, deps.sourceOf(request)]);
        },
        headersFor: (status, error): Record<string, string> | undefined => {
          if (status === 401) return { "www-authenticate": `Bearer realm="engine-cloud"` };
          if (error.code === "disk_full") return { "retry-after": String(DISK_FULL_RETRY_AFTER_S) };
          const retry = error.details?.retry_after_s;
          return (status === 429 || error.code === "sign_in_rate_limited") && typeof retry === "number"
            ? { "retry-after": String(retry) }
            : undefined;
        },
        translateError: (error) =>
          deps.db.isDiskFull(error)
            ? new AppError("disk_full", "the console's database is out of disk space; nothing was stored: retry later")
            : undefined,
        fieldsFor: (error) => (error.code === "slow_down" ? { interval: error.details?.interval } : undefined),
      }),
    )
    .use(
      openapiDocument({
        specPath: "/api/openapi.json",
        info: {
          title: "engine-cloud — cloud console API",
          version: CLOUD_INTERFACE_VERSION,
          description:
            "The cloud console API: sign-in and sessions, the engine link, preauth keys, device approvals, nodes, assistants and hosted machines.",
        },
        servers: () => [{ url: deps.site.publicUrl, description: "This console" }],
        tags: CLOUD_TAGS,
        securitySchemes: { session: { type: "http", scheme: "bearer" } },
      }),
    )
    .get(
      "/api/health",
      () => ({
        status: "ok",
        version: deps.version,
        role: deps.config.role,
        uptime_s: String(Math.round((Date.now() - deps.startedAt) / 1000)),
      }),
      { response: { 200: HealthView }, detail: { tags: ["meta"], summary: "Process liveness; touches nothing external" } },
    )
    .get("/api/ready", () => readiness(deps), {
      response: { 200: ReadyView },
      detail: { tags: ["meta"], summary: "Whether this role's dependencies answer" },
    })
    .get(
      "/api/auth",
      () => {
        throw new AppError("not_supported", "GET /api/auth is a boundary, not a route: start with /api/auth/login");
      },
      { response: { 501: ErrorEnvelope }, detail: { tags: ["auth"], summary: "Boundary (501)" } },
    )
    .get(
      "/api/link",
      () => {
        throw new AppError("not_supported", "GET /api/link is a boundary, not a route: see /api/link/device");
      },
      { response: { 501: ErrorEnvelope }, detail: { tags: ["link"], summary: "Boundary (501)" } },
    )
    .get(
      "/api/link/metadata",
      ({ request }) => {
        const headers = { "content-type": "application/json", "cache-control": "public, max-age=300", etag: metadataTag };
        if (request.headers.get("if-none-match") === metadataTag) return new Response(null, { status: 304, headers });
        return new Response(metadata, { headers });
      },
      { response: { 200: LinkMetadataView }, detail: { tags: ["link"], summary: "The hosted base domain; static and cacheable" } },
    )
    .use(sessionRoutes(deps));
  for (const module of modules) app = app.use(module(deps)) as unknown as typeof app;
  bodySchemas.learn(app.routes);
  return app;
}
