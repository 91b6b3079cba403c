import type { Role } from "../../contract/engine";
import { constantTimeEqual, digestSecret, generateToken } from "../../lib/crypto";
import { AppError } from "../../lib/errors";
import type { Principal, TokenStore } from "../auth";

/** SESSION_COOKIE names the web UI's session cookie; it differs from the console's `engine_session`, since cookies are shared across the ports of one host. */
export const SESSION_COOKIE = "engine_ui_session";
/** CSRF_HEADER is the header a cookie-authenticated state change must carry. */
export const CSRF_HEADER = "x-engine-csrf";
/** SESSION_TTL_MS bounds a web session: twelve hours, then sign in again. */
export const SESSION_TTL_MS = 12 * 60 * 60 * 1000;
/** LOGIN_CODE_TTL_MS bounds a one-time login link printed by `engine ui`. */
export const LOGIN_CODE_TTL_MS = 5 * 60 * 1000;
/** MAX_SESSIONS keeps a flood of sign-ins from growing memory without bound. */
const MAX_SESSIONS = 10_000;

interface SessionEntry {
  /** tokenId is the token the session came from; null for a login link (admin). */
  tokenId: string | null;
  role: Role;
  csrf: string;
  expiresAt: number;
}

/** UiSession is what a valid cookie resolves to. */
export interface UiSession {
  principal: Principal;
  csrf: string;
  expiresAt: number;
}

/**
 * UiSessions holds the web UI's sessions and one-time login codes. Only SHA-256 digests of
 * the cookie and of the codes are kept, in memory: a daemon restart signs every browser out,
 * as Jupyter's do. A session made from a token follows that token, so revoking or expiring
 * the token ends the session on its next request.
 */
export class UiSessions {
  readonly #tokens: TokenStore;
  readonly #now: () => number;
  readonly #sessions = new Map<string, SessionEntry>();
  readonly #codes = new Map<string, number>();

  constructor(tokens: TokenStore, now: () => number = Date.now) {
    this.#tokens = tokens;
    this.#now = now;
  }

  /** mintLoginCode makes a single-use code, valid for LOGIN_CODE_TTL_MS, that opens an admin session. */
  mintLoginCode(): { code: string; expiresAt: number } {
    this.#sweep();
    const code = generateToken();
    const expiresAt = this.#now() + LOGIN_CODE_TTL_MS;
    this.#codes.set(digestSecret(code), expiresAt);
    return { code, expiresAt };
  }

  /** redeemLoginCode spends a login code and returns a new admin session's cookie value. */
  redeemLoginCode(code: string): { cookie: string; csrf: string } {
    const digest = digestSecret(code);
    const expiresAt = this.#codes.get(digest);
    // Spent on first sight, valid or not: a code works exactly once.
    this.#codes.delete(digest);
    if (expiresAt === undefined || expiresAt <= this.#now()) {
      throw new AppError("invalid_token", "this login link is unknown, used or expired: run `engine ui` for a new one");
    }
    return this.#open(null, "admin");
  }

  /** signInWithToken checks a bearer secret and opens a session with its token's role. */
  signInWithToken(secret: string): { cookie: string; csrf: string; role: Role } {
    const principal = this.#tokens.authenticate(`Bearer ${secret}`);
    return { ...this.#open(principal.tokenId, principal.role), role: principal.role };
  }

  /** resolve returns the session a cookie value names, or throws a 401-class error. */
  resolve(cookie: string): UiSession {
    const entry = this.#sessions.get(digestSecret(cookie));
    if (!entry || entry.expiresAt <= this.#now()) {
      throw new AppError("unauthenticated", "the web session has ended: sign in again");
    }
    return { principal: this.#principalOf(entry), csrf: entry.csrf, expiresAt: entry.expiresAt };
  }

  /** end forgets a session (sign-out). */
  end(cookie: string): void {
    this.#sessions.delete(digestSecret(cookie));
  }

  /** csrfMatches compares a presented CSRF header with the session's in constant time. */
  static csrfMatches(session: UiSession, presented: string | null): boolean {
    return presented !== null && presented.length > 0 && constantTimeEqual(session.csrf, presented);
  }

  #open(tokenId: string | null, role: Role): { cookie: string; csrf: string } {
    this.#sweep();
    if (this.#sessions.size >= MAX_SESSIONS) {
      // Drop the oldest session (Map keeps insertion order).
      const oldest = this.#sessions.keys().next().value;
      if (oldest !== undefined) this.#sessions.delete(oldest);
    }
    const cookie = generateToken();
    const csrf = generateToken();
    this.#sessions.set(digestSecret(cookie), { tokenId, role, csrf, expiresAt: this.#now() + SESSION_TTL_MS });
    return { cookie, csrf };
  }

  #principalOf(entry: SessionEntry): Principal {
    if (entry.tokenId === null) {
      return {
        kind: "local",
        tokenId: null,
        name: "web UI login link",
        role: entry.role,
        maxGpus: null,
        maxConcurrentJobs: null,
        scopeServices: [],
      };
    }
    let token: ReturnType<TokenStore["get"]>;
    try {
      token = this.#tokens.get(entry.tokenId);
    } catch {
      throw new AppError("invalid_token", "the token behind this web session no longer exists");
    }
    if (token.revoked) throw new AppError("token_revoked", "the token behind this web session has been revoked");
    if (token.expires_at !== null && Date.parse(token.expires_at) <= this.#now()) {
      throw new AppError("token_expired", "the token behind this web session has expired");
    }
    return {
      kind: "token",
      tokenId: token.id,
      name: token.name,
      role: token.role,
      maxGpus: token.max_gpus,
      maxConcurrentJobs: token.max_concurrent_jobs,
      scopeServices: token.scope_services,
    };
  }

  #sweep(): void {
    const now = this.#now();
    for (const [digest, expiresAt] of this.#codes) if (expiresAt <= now) this.#codes.delete(digest);
    for (const [digest, entry] of this.#sessions) if (entry.expiresAt <= now) this.#sessions.delete(digest);
  }
}

/** sessionCookie is the Set-Cookie value for a new session: HttpOnly, SameSite=Strict, whole site. */
export function sessionCookie(value: string, secure: boolean): string {
  return `${SESSION_COOKIE}=${value}; Path=/; HttpOnly; SameSite=Strict; Max-Age=${SESSION_TTL_MS / 1000}${secure ? "; Secure" : ""}`;
}

/** clearedSessionCookie removes the session cookie. */
export function clearedSessionCookie(): string {
  return `${SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0`;
}

/**
 * sameOrigin tells whether a state-changing request comes from the engine's own pages:
 * Sec-Fetch-Site, when the browser sends it, must be `same-origin`; Origin, when present, must
 * name the host the request was sent to. A browser sends at least one of them on every
 * cross-site POST or DELETE, so a request with neither is not a browser's cross-site request.
 */
export function sameOrigin(request: Request): boolean {
  const site = request.headers.get("sec-fetch-site");
  if (site !== null && site !== "same-origin") return false;
  const origin = request.headers.get("origin");
  if (origin === null) return site === "same-origin" || site === null;
  const host = request.headers.get("host");
  if (!host) return false;
  return origin === `http://${host}` || origin === `https://${host}`;
}
