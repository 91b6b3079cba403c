import { Elysia, t } from "elysia";
import {
  AssistantGrantIdParams,
  AssistantGrantsView,
  AuthorizeContextQuery,
  AuthorizeContextView,
  AuthorizeDecisionRequest,
  AuthorizeDecisionView,
  ConnectorQuery,
  ConnectorView,
} from "../../contract/cloud";
import { isAppError } from "../../lib/errors";
import { readBoundedText } from "../../lib/http";
import { requireSession, type SignedInCaller } from "../auth/guard";
import { type CloudDeps, errorResponses } from "../context";
import { LIMITS } from "../ratelimit";
import { messagePageResponse, pageResponse } from "../ui";
import { AuthorizationServer, OAuthError } from "./authorization";
import { ASSISTANT_NAMES } from "./clients";
import { ClientDirectory } from "./directory";
import { ASSISTANT_SCOPES } from "./grant";

/** AssistantRoutesOptions let tests move the clock and answer DNS for metadata document hosts. */
export interface AssistantRoutesOptions {
  clock?: () => number;
  resolve?: (hostname: string) => Promise<string[]>;
}

/** OAUTH_BODY_MAX_BYTES bounds a token, revocation or registration body. */
const OAUTH_BODY_MAX_BYTES = 16 * 1024;

/**
 * CORS_HEADERS let an assistant that runs in a browser (an MCP inspector) read the metadata and
 * call the token, revocation and registration endpoints. Nothing there uses a cookie, so any
 * origin may, without credentials.
 */
const CORS_HEADERS = {
  "access-control-allow-origin": "*",
  "access-control-allow-methods": "GET, POST, OPTIONS",
  "access-control-allow-headers": "authorization, content-type, mcp-protocol-version",
  "access-control-max-age": "600",
};

/** oauthJson answers an OAuth endpoint: JSON, never cached (RFC 6749 §5.1), readable cross-origin. */
function oauthJson(body: unknown, status = 200, extra: Record<string, string> = {}): Response {
  return new Response(body === null ? null : JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json", "cache-control": "no-store", pragma: "no-cache", ...CORS_HEADERS, ...extra },
  });
}

/** oauthFailure answers an OAuthError in RFC 6749 §5.2's shape (401 with a Basic challenge), a rate limit as 429. */
function oauthFailure(error: unknown): Response {
  if (error instanceof OAuthError) {
    const extra: Record<string, string> = error.status === 401 ? { "www-authenticate": `Basic realm="engine-cloud"` } : {};
    return oauthJson({ error: error.error, error_description: error.message }, error.status, extra);
  }
  if (isAppError(error) && error.code === "rate_limited") {
    const retry = String(error.details?.retry_after_s ?? 60);
    return oauthJson({ error: "temporarily_unavailable", error_description: error.message }, 429, { "retry-after": retry });
  }
  throw error;
}

/** readForm reads an `application/x-www-form-urlencoded` body (RFC 6749 §3.2), bounded. */
async function readForm(request: Request): Promise<URLSearchParams> {
  const type = (request.headers.get("content-type") ?? "").toLowerCase();
  if (!type.startsWith("application/x-www-form-urlencoded")) {
    throw new OAuthError("invalid_request", "the body must be application/x-www-form-urlencoded");
  }
  const text = await readBoundedText(request, OAUTH_BODY_MAX_BYTES);
  if (text === null) throw new OAuthError("invalid_request", `the body is larger than ${OAUTH_BODY_MAX_BYTES} bytes`);
  return new URLSearchParams(text);
}

/**
 * assistantRoutes serves the console's authorization server for assistants (src/cloud/oauth):
 *
 * - outside /api, the OAuth endpoints an MCP client discovers: RFC 8414 metadata, the
 *   authorization endpoint (which also serves the consent page for a pending `rid`), token,
 *   revocation and dynamic registration. They answer in OAuth's own shapes (RFC 6749 §5.2),
 *   not the API's envelope, and are not in the OpenAPI document (docs/decisions.md 220);
 * - under /api, the contract's three routes (authorize context and decision, connector) and
 *   the account's list of grants and their revocation.
 */
export function assistantRoutes(deps: CloudDeps, options: AssistantRoutesOptions = {}) {
  const clock = options.clock ?? Date.now;
  const clients = new ClientDirectory(deps.db, { allowLoopback: deps.config.cimdAllowLoopback, clock, resolve: options.resolve });
  const server = new AuthorizationServer({ ...deps, clients, clock });
  const issuer = () => deps.site.publicUrl;

  /** chargeConsent charges the contract's limits of context and decision, first: the session, then its source. */
  const chargeConsent = (caller: SignedInCaller, request: Request) =>
    deps.limiter.charge([LIMITS.authorizeBySession, caller.session.id], [LIMITS.authorizeBySource, deps.sourceOf(request)]);

  const metadata = () => ({
    issuer: issuer(),
    authorization_endpoint: `${issuer()}/oauth/authorize`,
    token_endpoint: `${issuer()}/oauth/token`,
    registration_endpoint: `${issuer()}/oauth/register`,
    revocation_endpoint: `${issuer()}/oauth/revoke`,
    scopes_supported: [...ASSISTANT_SCOPES],
    response_types_supported: ["code"],
    response_modes_supported: ["query"],
    grant_types_supported: ["authorization_code", "refresh_token"],
    token_endpoint_auth_methods_supported: ["none"],
    revocation_endpoint_auth_methods_supported: ["none"],
    code_challenge_methods_supported: ["S256"],
    client_id_metadata_document_supported: true,
    authorization_response_iss_parameter_supported: true,
    service_documentation: `${issuer()}/assistants`,
  });

  const preflight = () => new Response(null, { status: 204, headers: CORS_HEADERS });

  const outside = new Elysia({ detail: { hide: true } })
    .get("/.well-known/oauth-authorization-server", () => oauthJson(metadata(), 200, { "cache-control": "public, max-age=300" }))
    .options("/.well-known/oauth-authorization-server", preflight)
    .get("/oauth/authorize", async ({ request }) => {
      const query = new URL(request.url).searchParams;
      // Only the pending request's rid: the consent page, which reads its context with the session.
      if (!query.has("client_id") && !query.has("response_type")) return pageResponse("/oauth/authorize");
      try {
        await deps.limiter.charge([LIMITS.oauthAuthorizeBySource, deps.sourceOf(request)]);
      } catch (error) {
        if (isAppError(error) && error.code === "rate_limited") {
          return messagePageResponse("Too many authorization requests", [error.message, "Try again from the assistant shortly."], 429);
        }
        throw error;
      }
      const answer = await server.begin(query);
      if (answer.kind === "redirect") {
        return new Response(null, { status: 302, headers: { location: answer.location, "cache-control": "no-store" } });
      }
      return messagePageResponse(
        "This assistant's request cannot be accepted",
        [
          `${answer.description} (${answer.error}).`,
          "Nothing was sent back to the assistant, because the console cannot be sure where its answer would go. Check the assistant's connector settings and start again.",
        ],
        answer.status,
      );
    })
    .post("/oauth/token", async ({ request }) => {
      try {
        await deps.limiter.charge([LIMITS.oauthTokenBySource, deps.sourceOf(request)]);
        const form = await readForm(request);
        return oauthJson(await server.token(form, request.headers.get("authorization"), deps.sourceOf(request)));
      } catch (error) {
        return oauthFailure(error);
      }
    })
    .options("/oauth/token", preflight)
    .post("/oauth/revoke", async ({ request }) => {
      try {
        await deps.limiter.charge([LIMITS.oauthTokenBySource, deps.sourceOf(request)]);
        const form = await readForm(request);
        await server.revoke(form, request.headers.get("authorization"), deps.sourceOf(request));
        return oauthJson(null, 200);
      } catch (error) {
        return oauthFailure(error);
      }
    })
    .options("/oauth/revoke", preflight)
    .post("/oauth/register", async ({ request }) => {
      try {
        await deps.limiter.charge([LIMITS.oauthRegisterBySource, deps.sourceOf(request)]);
        const type = (request.headers.get("content-type") ?? "").toLowerCase();
        if (!type.startsWith("application/json")) throw new OAuthError("invalid_client_metadata", "the body must be application/json");
        const text = await readBoundedText(request, OAUTH_BODY_MAX_BYTES);
        if (text === null) throw new OAuthError("invalid_client_metadata", `the body is larger than ${OAUTH_BODY_MAX_BYTES} bytes`);
        let body: unknown;
        try {
          body = JSON.parse(text);
        } catch {
          throw new OAuthError("invalid_client_metadata", "the body is not JSON");
        }
        return oauthJson(await server.register(body), 201);
      } catch (error) {
        return oauthFailure(error);
      }
    })
    .options("/oauth/register", preflight);

  const api = new Elysia({ tags: ["assistants"] })
    .get(
      "/api/oauth/authorize/context",
      async ({ request, query }) => {
        const caller = await requireSession(deps, request);
        await chargeConsent(caller, request);
        return server.context(caller.account, query.rid);
      },
      {
        query: AuthorizeContextQuery,
        response: { 200: AuthorizeContextView, ...errorResponses(401, 403, 404, 409, 422, 429) },
        detail: {
          summary: "What the consent page shows for a pending assistant authorization; reads, never consumes",
          description:
            "403 `entitlement_required` without the remote-link entitlement; 404 for an unknown or expired rid; 409 `already_consumed` once decided.",
          security: [{ session: [] }],
        },
      },
    )
    .post(
      "/api/oauth/authorize/decision",
      async ({ request, body }) => {
        const caller = await requireSession(deps, request);
        await chargeConsent(caller, request);
        return server.decide(caller.account, body, deps.sourceOf(request));
      },
      {
        body: AuthorizeDecisionRequest,
        response: { 200: AuthorizeDecisionView, ...errorResponses(400, 401, 403, 404, 409, 422, 429) },
        detail: {
          summary: "Approve or deny a pending assistant authorization; consumes it once",
          description:
            "Answers where the browser goes: the assistant's redirect URI with a single-use `code`, `state` and `iss`, or with " +
            "`error=access_denied`. 400 `invalid_request` for an access the assistant did not ask for or a machine not the " +
            "account's (nothing consumed); 409 `already_consumed` for a decided rid.",
          security: [{ session: [] }],
        },
      },
    )
    .get(
      "/api/oauth/connector",
      async ({ request, query }) => {
        const { account } = await requireSession(deps, request);
        const assistant = query.client_id ?? null;
        // Not rate limited (contract rule 9). The entitlement and the machines are read together.
        const [fresh, nodes] = await Promise.all([deps.accounts.byId(account.id), deps.nodes.list(account.id)]);
        if (!fresh?.remoteLink) {
          return {
            assistant,
            mcp_url: null,
            client_id: null,
            nodes: [],
            refusal: {
              code: "entitlement_required",
              message: "this account does not have the remote-link entitlement that assistant access needs",
            },
          };
        }
        return {
          assistant,
          mcp_url: server.mcpUrl,
          // The pre-registered clients are a snapshot held in memory: no row is read.
          client_id: assistant === null ? null : (clients.byAssistant.get(assistant)?.id ?? null),
          nodes: nodes.map((node) => ({ id: node.id, slug: node.slug, hostname: node.hostname })),
          refusal: null,
        };
      },
      {
        query: ConnectorQuery,
        response: { 200: ConnectorView, ...errorResponses(401, 422) },
        detail: {
          summary: "What to give an assistant: the console's MCP URL and the registered client id",
          description: `\`client_id\` names one of ${ASSISTANT_NAMES.join(", ")}. Without the remote-link entitlement the answer is a 200 carrying the refusal (\`entitlement_required\`) and no values.`,
          security: [{ session: [] }],
        },
      },
    )
    .get(
      "/api/oauth/grants",
      async ({ request }) => {
        const { account } = await requireSession(deps, request);
        return { grants: await server.grants(account.id) };
      },
      {
        response: { 200: AssistantGrantsView, ...errorResponses(401) },
        detail: {
          summary: "The account's authorized assistants, newest first, revoked ones included (never a token)",
          security: [{ session: [] }],
        },
      },
    )
    .delete(
      "/api/oauth/grants/:grant_id",
      async ({ request, params, set }) => {
        const { account } = await requireSession(deps, request);
        await server.revokeGrant(account.id, params.grant_id, deps.sourceOf(request));
        set.status = 204;
      },
      {
        params: AssistantGrantIdParams,
        response: { 204: t.Void({ description: "Revoked, or nothing to revoke" }), ...errorResponses(401, 422) },
        detail: {
          summary: "Revoke an authorized assistant: every token it holds stops working at once (204 in every case)",
          security: [{ session: [] }],
        },
      },
    );

  return new Elysia().use(outside).use(api);
}
