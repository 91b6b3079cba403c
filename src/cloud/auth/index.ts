import type { CloudSweep } from "../context";
import { sweepLoginAttempts } from "./oidc";

/**
 * The auth module's public surface: the console's own sessions (store, guard, routes) and
 * sign-in through its OpenID provider (relying party, return_to guard, routes).
 */
export { assertNotCrossSite, CSRF_HEADER } from "./csrf";
export { requireSession, type SignedInCaller } from "./guard";
export {
  BINDING_COOKIE_PREFIX,
  type CallbackKind,
  LOGIN_ATTEMPT_TTL_MS,
  type LoginKind,
  RelyingParty,
  sweepLoginAttempts,
  type VerifiedIdentity,
} from "./oidc";
export { normalizeReturnTo } from "./return-to";
export { accountView, sessionRoutes } from "./session-routes";
export {
  clearedSessionCookie,
  SESSION_COOKIE,
  SESSION_PREFIX,
  type Session,
  type SessionKind,
  SessionStore,
  sessionCookie,
  sessionTokenOf,
} from "./sessions";
export { signinRoutes } from "./signin-routes";

/** sweepAuthRows is the auth module's sweep: sessions past their expiry and sign-ins that were never finished. */
export const sweepAuthRows: CloudSweep = async (deps, now) => ({
  sessions: await deps.sessions.sweep(),
  logins: await sweepLoginAttempts(deps.db, now),
});
