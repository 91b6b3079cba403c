import { Elysia, t } from "elysia";
import { ErrorBody, ValidationErrorBody } from "../../contract/engine";
import { AppError } from "../../lib/errors";
import { cookieValue } from "../../lib/http";
import { uiAssets } from "./assets";
import { CSRF_HEADER, clearedSessionCookie, SESSION_COOKIE, sameOrigin, sessionCookie, UiSessions } from "./sessions";

/** cookieOf returns the request's session cookie, or throws 401 when it has none. */
function cookieOf(request: Request): string {
  const cookie = cookieValue(request.headers.get("cookie"), SESSION_COOKIE);
  if (cookie === null) throw new AppError("unauthenticated", "no web session: sign in");
  return cookie;
}

/**
 * CONTENT_SECURITY_POLICY allows the UI's own script, styles and API calls and nothing else:
 * no inline script, no third-party origin, no framing.
 */
const CONTENT_SECURITY_POLICY =
  "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

const PAGE_HEADERS = {
  "content-security-policy": CONTENT_SECURITY_POLICY,
  "x-content-type-options": "nosniff",
  "x-frame-options": "DENY",
  // The login link carries its code in the query: never leak it in a Referer.
  "referrer-policy": "no-referrer",
  "cache-control": "no-cache",
};

/** UiRouteDeps are what the UI's routes need from the API. */
export interface UiRouteDeps {
  sessions: UiSessions;
  log: { info(fields: Record<string, unknown>, message: string): void };
  /** baseUrl is where browsers reach the engine, for the login link's full address. */
  baseUrl?: () => string | undefined;
}

const SessionInfo = t.Object({
  role: t.String(),
  name: t.String(),
  csrf: t.String({ description: "Send it back in X-Engine-CSRF on every state-changing request" }),
  expires_at: t.String(),
});

/**
 * uiRoutes serves the web UI (the page shell, its bundled script and stylesheet) and its
 * sessions: sign-in with a token, the one-time login link of `engine ui`, the session's
 * CSRF token for the page, and sign-out.
 */
export function uiRoutes(deps: UiRouteDeps) {
  const asset = async (kind: "html" | "js" | "css") => {
    const assets = await uiAssets();
    const type = { html: "text/html; charset=utf-8", js: "text/javascript; charset=utf-8", css: "text/css; charset=utf-8" }[kind];
    return new Response(assets[kind], { headers: { ...PAGE_HEADERS, "content-type": type } });
  };
  const info = (session: { role: string; name: string; csrf: string; expiresAt: number }) => ({
    role: session.role,
    name: session.name,
    csrf: session.csrf,
    expires_at: new Date(session.expiresAt).toISOString(),
  });
  return new Elysia({ name: "ui" })
    .get("/", () => asset("html"), { detail: { hide: true } })
    .get("/ui/app.js", () => asset("js"), { detail: { hide: true } })
    .get("/ui/app.css", () => asset("css"), { detail: { hide: true } })
    .get(
      "/ui/login",
      ({ query, request }) => {
        const secure = request.url.startsWith("https:");
        try {
          const { cookie } = deps.sessions.redeemLoginCode(query.code ?? "");
          deps.log.info({}, "web UI session opened with a login link");
          // 303 to / takes the spent code out of the address bar and the history.
          return new Response(null, {
            status: 303,
            headers: { ...PAGE_HEADERS, location: "/", "set-cookie": sessionCookie(cookie, secure) },
          });
        } catch (error) {
          const message = error instanceof AppError ? error.message : "this login link cannot be used";
          return new Response(loginFailurePage(message), {
            status: 401,
            headers: { ...PAGE_HEADERS, "content-type": "text/html; charset=utf-8" },
          });
        }
      },
      { query: t.Object({ code: t.Optional(t.String({ maxLength: 512, writeOnly: true })) }), detail: { hide: true } },
    )
    .post(
      "/ui/session",
      ({ body, request, set }) => {
        if (!sameOrigin(request)) throw new AppError("forbidden", "sign-in must come from the engine's own page");
        const opened = deps.sessions.signInWithToken(body.token);
        deps.log.info({ role: opened.role }, "web UI session opened with a token");
        const session = deps.sessions.resolve(opened.cookie);
        set.status = 201;
        set.headers["set-cookie"] = sessionCookie(opened.cookie, request.url.startsWith("https:"));
        set.headers["cache-control"] = "no-store";
        return info({ role: session.principal.role, name: session.principal.name, csrf: session.csrf, expiresAt: session.expiresAt });
      },
      {
        body: t.Object({ token: t.String({ minLength: 1, maxLength: 512, writeOnly: true }) }, { additionalProperties: false }),
        response: { 201: SessionInfo, 401: ErrorBody, 403: ErrorBody, 422: ValidationErrorBody },
        detail: { tags: ["ui"], summary: "Open a web UI session with an access token (sets an HttpOnly cookie)", security: [] },
      },
    )
    .get(
      "/ui/session",
      ({ request, set }) => {
        const session = deps.sessions.resolve(cookieOf(request));
        set.headers["cache-control"] = "no-store";
        return info({ role: session.principal.role, name: session.principal.name, csrf: session.csrf, expiresAt: session.expiresAt });
      },
      {
        response: { 200: SessionInfo },
        detail: { tags: ["ui"], summary: "The current web session and its CSRF token (cookie)", security: [] },
      },
    )
    .delete(
      "/ui/session",
      ({ request, set }) => {
        const cookie = cookieOf(request);
        const session = deps.sessions.resolve(cookie);
        if (!sameOrigin(request) || !UiSessions.csrfMatches(session, request.headers.get(CSRF_HEADER))) {
          throw new AppError("forbidden", "signing out needs the session's CSRF token in X-Engine-CSRF, from the engine's own page");
        }
        deps.sessions.end(cookie);
        set.headers["set-cookie"] = clearedSessionCookie();
        return { signed_out: true };
      },
      {
        response: { 200: t.Object({ signed_out: t.Boolean() }) },
        detail: { tags: ["ui"], summary: "Sign the web session out (cookie + CSRF)", security: [] },
      },
    )
    .post(
      "/api/ui/login-links",
      ({ set }) => {
        const { code, expiresAt } = deps.sessions.mintLoginCode();
        set.status = 201;
        set.headers["cache-control"] = "no-store";
        const path = `/ui/login?code=${encodeURIComponent(code)}`;
        const base = deps.baseUrl?.();
        return { code, path, url: base ? `${base}${path}` : null, expires_at: new Date(expiresAt).toISOString() };
      },
      {
        response: {
          201: t.Object({ code: t.String(), path: t.String(), url: t.Union([t.String(), t.Null()]), expires_at: t.String() }),
          401: ErrorBody,
          403: ErrorBody,
        },
        detail: { tags: ["ui"], summary: "Mint a one-time web UI login link (admin; `engine ui` prints it)" },
      },
    );
}

function loginFailurePage(message: string): string {
  const escaped = message.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>engine: sign-in failed</title><link rel="stylesheet" href="/ui/app.css"></head><body><main id="main"><h1>Sign-in failed</h1><p>${escaped}</p><p><a href="/">Sign in with a token</a></p></main></body></html>`;
}
