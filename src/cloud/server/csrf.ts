import { AppError } from "../../lib/errors";
import { SESSION_COOKIE } from "../auth/sessions";

/** CSRF_HEADER is the header the console's pages send on every state-changing call. */
export const CSRF_HEADER = "x-engine-csrf";

/** SAFE_METHODS change nothing, so they need no CSRF check. */
const SAFE_METHODS = new Set(["GET", "HEAD", "OPTIONS"]);

/**
 * assertNotCrossSite refuses a state-changing /api request that a browser could have been
 * tricked into sending with the console's session cookie. It applies only when the cookie is
 * what would authenticate the call (a session cookie and no `Authorization` header), so
 * bearer-token callers and unauthenticated machine routes are unaffected. Such a request must
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
  const cookies = request.headers.get("cookie");
  if (!cookies || !new RegExp(`(?:^|;\\s*)${SESSION_COOKIE}=`).test(cookies)) return;
  if (!new URL(request.url).pathname.startsWith("/api/")) return;
  if (request.headers.get(CSRF_HEADER) !== "1") {
    throw new AppError("csrf_rejected", `a state-changing call with the session cookie must send ${CSRF_HEADER}: 1`);
  }
  const origin = request.headers.get("origin");
  if (origin !== null && origin !== publicOrigin) {
    throw new AppError("csrf_rejected", "the request comes from another site", { origin: origin.slice(0, 200) });
  }
}
