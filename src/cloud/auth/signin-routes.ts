import { Elysia } from "elysia";
import { CallbackQuery, LoginQuery, LoginStart, ProviderConfigView, SignedIn, SocialQuery } from "../../contract/cloud";
import { AppError, isAppError } from "../../lib/errors";
import { cookieValue } from "../../lib/http";
import { type CloudDeps, errorResponses } from "../context";
import { LIMITS } from "../ratelimit";
import { bindingCookieName, type CallbackKind, clearedBindingCookie, type LoginKind, RelyingParty } from "./oidc";
import { normalizeReturnTo } from "./return-to";
import { sessionCookie } from "./sessions";

/** CALLBACK_PATHS are where the IdP sends the browser back: one per start, so a state cannot cross over. */
const CALLBACK_PATHS = { login: "/api/auth/callback", social: "/api/auth/social/callback" } as const;

/**
 * isNavigation says whether a request is a browser's top-level navigation (the IdP's redirect
 * back) rather than an API client's call: Fetch Metadata's `Sec-Fetch-Mode: navigate`, or, from
 * a browser that predates it, an Accept that asks for HTML first.
 */
function isNavigation(request: Request): boolean {
  const mode = request.headers.get("sec-fetch-mode");
  if (mode !== null) return mode === "navigate";
  return (request.headers.get("accept") ?? "").startsWith("text/html");
}

/** seeOther answers a navigation with a 303 to a path on this console, keeping any Set-Cookie the handler chose. */
function seeOther(location: string, set: { headers: Record<string, unknown> }): Response {
  const headers = new Headers({ location, "cache-control": "no-store" });
  const cookies = set.headers["set-cookie"];
  for (const cookie of Array.isArray(cookies) ? cookies : cookies ? [cookies] : []) headers.append("set-cookie", String(cookie));
  return new Response(null, { status: 303, headers });
}

/** NAVIGATION_NOTE documents the callbacks' answer to a browser, beside their JSON answer to an API client. */
const NAVIGATION_NOTE =
  "An API client gets 200 `SignedIn` or 401. A browser's top-level navigation (Sec-Fetch-Mode: navigate) gets 303 to the " +
  "sign-in's return_to with the session cookie set, or 303 to /signin?error=<code> on any failure (with started_at=<origin> " +
  "when the browser came back on another host than the one the sign-in started at).";

/** SIGNIN_PAGE is the console page a failed browser sign-in lands on, with the error code in its query. */
const SIGNIN_PAGE = "/signin";

const notConfigured = () => new AppError("provider_not_configured", "sign-in is not configured on this console (no OpenID provider)");

/**
 * signinRoutes is sign-in through the console's OpenID provider: the two starts (login and
 * social) that answer where to send the browser, the two callbacks that redeem the code and
 * mint the console's own session, and the browser-safe provider configuration.
 *
 * Without an OpenID provider configured the starts and provider-config answer 404
 * `provider_not_configured` and the callbacks 401 `login_failed`. With one, the module adds
 * `identity_provider` to /api/ready and starts discovery at once (a failure is retried on use).
 */
export function signinRoutes(deps: CloudDeps) {
  const party = deps.config.oidc ? new RelyingParty(deps.config.oidc, deps.db, deps.secrets, deps.log) : null;
  if (party) {
    deps.readyChecks.identity_provider = () => party.reachable();
    party.configuration().catch(() => {
      // Logged by configuration(); the next sign-in discovers again.
    });
  }

  const start = async (request: Request, set: { headers: Record<string, unknown> }, kind: LoginKind, returnTo: string, hint?: string) => {
    await chargeSignInStart(deps, request);
    if (!party) throw notConfigured();
    // Only the providers the operator listed: the page shows no other button, and the broker may not know another.
    if (kind.provider && !party.oidc.socialProviders.includes(kind.provider)) {
      throw new AppError(
        "social_provider_not_configured",
        `sign-in with ${kind.provider} is not offered by this console (ENGINE_CLOUD_OIDC_SOCIAL_PROVIDERS)`,
      );
    }
    const callback = kind.provider ? CALLBACK_PATHS.social : CALLBACK_PATHS.login;
    const started = await party.begin(kind, {
      redirectUri: `${deps.site.publicUrl}${callback}`,
      returnTo: normalizeReturnTo(returnTo),
      loginHint: hint || undefined,
      startedAt: new URL(request.url).origin,
    });
    set.headers["set-cookie"] = started.bindingCookie;
    set.headers["cache-control"] = "no-store";
    return { url: started.url, expires_in: started.expiresInS };
  };

  const finish = async (request: Request, set: { headers: Record<string, unknown> }, callback: CallbackKind) => {
    if (!party) throw new AppError("login_failed", "sign-in is not configured on this console");
    const given = new URL(request.url);
    // Redeem against the public callback URL the authorization request named, with the query the browser brought.
    const callbackUrl = new URL(`${deps.site.publicUrl}${CALLBACK_PATHS[callback]}`);
    callbackUrl.search = given.search;
    const cookies = request.headers.get("cookie");
    const readBinding = (state: string) => {
      try {
        return cookieValue(cookies, bindingCookieName(state));
      } catch {
        return null; // malformed percent-encoding: no usable cookie
      }
    };
    const identity = await party.finish(callback, callbackUrl, { readBinding, cameBackAt: given.origin, publicUrl: deps.site.publicUrl });
    const account = await deps.accounts.fromIdentity(identity);
    const { token, session } = await deps.sessions.mint(account.id, "browser", {
      userAgent: request.headers.get("user-agent") ?? "",
      source: deps.sourceOf(request),
    });
    deps.log.info({ account_id: account.id, session_id: session.id, provider: identity.provider }, "signed in");
    // The cookie lives to the absolute end; the idle end is enforced by the server on each use.
    set.headers["set-cookie"] = [
      sessionCookie(token, session.absoluteExpiresAt - Date.now()),
      clearedBindingCookie(callbackUrl.searchParams.get("state") as string),
    ];
    set.headers["cache-control"] = "no-store";
    return { return_to: identity.returnTo, account_id: account.id, expires_at: new Date(session.expiresAt).toISOString() };
  };

  /**
   * callbackRoute answers an API client with the JSON `SignedIn` (the contract), and a
   * browser's navigation back from the IdP with a 303 to the sign-in's `return_to` (the
   * session cookie set), or to the sign-in page naming the error, so a person never lands on
   * JSON. Validation (422) happens before either.
   */
  // Typed as the JSON answer: a Response (the navigation's 303) passes through Elysia unchanged.
  type SignedInAnswer = Awaited<ReturnType<typeof finish>>;
  const callbackRoute = async (
    request: Request,
    set: { headers: Record<string, unknown> },
    callback: CallbackKind,
  ): Promise<SignedInAnswer> => {
    if (!isNavigation(request)) return finish(request, set, callback);
    try {
      const signedIn = await finish(request, set, callback);
      return seeOther(signedIn.return_to, set) as unknown as SignedInAnswer;
    } catch (error) {
      const code = error instanceof AppError ? error.code : "internal";
      if (!(error instanceof AppError)) deps.log.error({ err: (error as Error).message }, "sign-in callback failed");
      const page = new URLSearchParams({ error: code });
      // The page explains a host mismatch from this origin and the public URL it knows itself.
      const startedAt = error instanceof AppError ? error.details?.started_at : undefined;
      if (typeof startedAt === "string") page.set("started_at", startedAt);
      return seeOther(`${SIGNIN_PAGE}?${page}`, { headers: {} }) as unknown as SignedInAnswer;
    }
  };

  const startResponses = { 200: LoginStart, ...errorResponses(400, 404, 422, 503) };
  const callbackResponses = { 200: SignedIn, ...errorResponses(401, 422, 503) };
  return new Elysia({ tags: ["auth"] })
    .get("/api/auth/login", ({ request, set, query }) => start(request, set, { provider: null }, query.return_to ?? "/", query.identity), {
      query: LoginQuery,
      response: startResponses,
      detail: { summary: "Start a sign-in: where to send the browser (sets the browser-binding cookie)" },
    })
    .get("/api/auth/social", ({ request, set, query }) => start(request, set, { provider: query.provider }, query.return_to ?? "/"), {
      query: SocialQuery,
      response: startResponses,
      detail: { summary: "Start a social sign-in with one of the two providers (sets the browser-binding cookie)" },
    })
    .get("/api/auth/callback", ({ request, set }) => callbackRoute(request, set, "login"), {
      query: CallbackQuery,
      response: callbackResponses,
      detail: {
        summary: "The IdP's redirect back: redeem the code and sign in (sets the session cookie)",
        description: NAVIGATION_NOTE,
      },
    })
    .get("/api/auth/social/callback", ({ request, set }) => callbackRoute(request, set, "social"), {
      query: CallbackQuery,
      response: callbackResponses,
      detail: { summary: "The IdP's redirect back from a social sign-in", description: NAVIGATION_NOTE },
    })
    .get(
      "/api/auth/provider-config",
      () => {
        if (!party) throw notConfigured();
        return { publishable_key: party.oidc.publishableKey, project_url: party.oidc.issuer, client_id: party.oidc.clientId };
      },
      {
        response: { 200: ProviderConfigView, ...errorResponses(404) },
        detail: { summary: "The three browser-safe values of the identity provider; never the client secret" },
      },
    );
}

/**
 * chargeSignInStart charges a sign-in start to its source's bucket (each start writes a login
 * attempt). The contract lists 400 ("refused request on login, social") and no 429 on these
 * two routes, so an empty bucket is a 400 `sign_in_rate_limited`, still with Retry-After.
 */
async function chargeSignInStart(deps: CloudDeps, request: Request): Promise<void> {
  try {
    await deps.limiter.charge([LIMITS.loginBySource, deps.sourceOf(request)]);
  } catch (error) {
    if (isAppError(error) && error.code === "rate_limited") {
      throw new AppError("sign_in_rate_limited", error.message, error.details);
    }
    throw error;
  }
}
