import { AppError } from "../../lib/errors";
import { cookieValue } from "../../lib/http";
import { SESSION_COOKIE } from "./sessions";

/** CSRF_HEADER is the header the console's pages send on every state-changing call. */
export const CSRF_HEADER = "x-engine-csrf";

/** SAFE_METHODS change nothing, so they need no CSRF check. */
const SAFE_METHODS = new Set(["GET", "HEAD", "OPTIONS"]);

/**
 * NO_SESSION_ROUTES never act as a session, so a session cookie riding along cannot be
 * abused through them: the machine routes authenticate by what is in the body, and logout
 * answers 204 in every case (the contract lists no other status for it; a cross-site post
 * carries no SameSite=Lax cookie anyway).
 */
const NO_SESSION_ROUTES = new Set([
  "/api/auth/logout",
  "/api/link/claim",
  "/api/link/device",
  "/api/link/device/poll",
  "/api/link/preauth",
]);

/**
 * assertNotCrossSite refuses a state-changing /api request that a browser could have been
 * tricked into sending with the console's session cookie. It applies only when the cookie is
 * what would authenticate the call (a session cookie and no `Authorization` header), so
 * bearer-token callers and the routes that never use a session (NO_SESSION_ROUTES) are
 * unaffected. Such a request must
 *
 * 1. carry `X-Engine-CSRF: 1`: a cross-site form cannot set a header, and a cross-site
 *    `fetch` with one needs a CORS preflight the console never grants; and
 * 2. if it names an `Origin`, name the console's own public origin (OWASP's "verifying origin
 *    with standard headers", as defence in depth beside SameSite=Lax).
 *
 * Either failure is `csrf_rejected` (403).
 */
export function assertNotCrossSite(request: Request, publicOrigin: string): void {
  if (SAFE_METHODS.has(request.method)) return;
  if (request.headers.has("authorization")) return;
  if (!cookieValue(request.headers.get("cookie"), SESSION_COOKIE)) return;
  const path = new URL(request.url).pathname;
  // /boxes/ is the hosted machines' proxy (src/cloud/managed/proxy): a session acts there too.
  if (!(path.startsWith("/api/") || path.startsWith("/boxes/")) || NO_SESSION_ROUTES.has(path)) return;
  if (request.headers.get(CSRF_HEADER) !== "1") {
    throw new AppError("csrf_rejected", `a state-changing call with the session cookie must send ${CSRF_HEADER}: 1`);
  }
  const origin = request.headers.get("origin");
  if (origin !== null && origin !== publicOrigin) {
    throw new AppError("csrf_rejected", "the request comes from another site", { origin: origin.slice(0, 200) });
  }
}
