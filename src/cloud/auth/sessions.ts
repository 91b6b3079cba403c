import { randomBytes } from "node:crypto";
import { digestSecret, randomId } from "../../lib/crypto";
import { AppError } from "../../lib/errors";
import { cookieValue } from "../../lib/http";
import { type Account, accountFromRow } from "../accounts";
import { type Database, num, type Sql } from "../db";

/** SESSION_PREFIX marks console session tokens for secret scanners and humans. */
export const SESSION_PREFIX = "ecs_";
/** SESSION_COOKIE is the browser cookie that carries the session token. */
export const SESSION_COOKIE = "engine_session";

/** SessionKind says how a session was made: a browser sign-in, or an operator's `sessions mint`. */
export type SessionKind = "browser" | "minted";

/** Session is a signed-in console session, as the API shows it (never the token). */
export interface Session {
  id: string;
  accountId: string;
  kind: SessionKind;
  createdAt: number;
  expiresAt: number;
  absoluteExpiresAt: number;
}

export interface SessionOptions {
  /** idleMs: a session unused this long ends; each use pushes the end out again (sliding renewal). */
  idleMs: number;
  /** absoluteMs: no session lives longer than this from sign-in, however it is used (ASVS 7.3.2). */
  absoluteMs: number;
}

/** RENEW_AFTER_FRACTION: a session's expiry is written back only when a tenth of its idle window has passed. */
const RENEW_AFTER_FRACTION = 0.1;

/**
 * SessionStore mints and checks the console's own sessions, following Lucia's pattern: the
 * token is 256 random bits shown once, and only its SHA-256 is stored, so a read of the
 * database yields no usable session.
 */
export class SessionStore {
  constructor(
    private readonly db: Database,
    private readonly options: SessionOptions,
  ) {}

  /** mint starts a session for an account and returns its token (shown once) and record. */
  async mint(
    accountId: string,
    kind: SessionKind,
    meta: { userAgent?: string; source?: string } = {},
  ): Promise<{ token: string; session: Session }> {
    const token = SESSION_PREFIX + randomBytes(32).toString("base64url");
    const now = Date.now();
    const session: Session = {
      id: randomId("ses"),
      accountId,
      kind,
      createdAt: now,
      expiresAt: Math.min(now + this.options.idleMs, now + this.options.absoluteMs),
      absoluteExpiresAt: now + this.options.absoluteMs,
    };
    await this.db
      .sql`INSERT INTO sessions (id, digest, account_id, kind, created_at, last_seen_at, expires_at, absolute_expires_at, user_agent, source)
      VALUES (${session.id}, ${digestSecret(token)}, ${accountId}, ${kind}, ${now}, ${now}, ${session.expiresAt}, ${session.absoluteExpiresAt},
        ${(meta.userAgent ?? "").slice(0, 256)}, ${(meta.source ?? "").slice(0, 64)})`;
    return { token, session };
  }

  /**
   * authenticate returns the session and account for a token, renewing the idle expiry when
   * enough of it has passed; an unknown, expired or malformed token is `invalid_session` (401).
   */
  async authenticate(token: string | undefined | null): Promise<{ session: Session; account: Account }> {
    if (!token) throw new AppError("unauthenticated", "sign in first: no session cookie or bearer token");
    if (!token.startsWith(SESSION_PREFIX) || token.length > 128) throw new AppError("invalid_session", "the session is not valid");
    // One read: the session and its account together (an account's sessions go with it, ON DELETE CASCADE).
    const [row] = await this.db.sql`SELECT accounts.*, sessions.id AS session_id, sessions.kind AS session_kind,
        sessions.created_at AS session_created_at, sessions.last_seen_at, sessions.expires_at, sessions.absolute_expires_at
      FROM sessions JOIN accounts ON accounts.id = sessions.account_id WHERE sessions.digest = ${digestSecret(token)}`;
    const now = Date.now();
    if (!row || num(row.expires_at) <= now) throw new AppError("invalid_session", "the session has ended; sign in again");
    const account = accountFromRow(row);
    const session: Session = {
      id: row.session_id as string,
      accountId: account.id,
      kind: row.session_kind as SessionKind,
      createdAt: num(row.session_created_at),
      expiresAt: num(row.expires_at),
      absoluteExpiresAt: num(row.absolute_expires_at),
    };
    if (now - num(row.last_seen_at) > this.options.idleMs * RENEW_AFTER_FRACTION) {
      const renewed = Math.min(now + this.options.idleMs, session.absoluteExpiresAt);
      try {
        await this.db.sql`UPDATE sessions SET last_seen_at = ${now}, expires_at = ${renewed} WHERE id = ${session.id}`;
        session.expiresAt = renewed;
      } catch (error) {
        // Renewal is a courtesy: on a full disk the session keeps its expiry and reads go on.
        if (!this.db.isDiskFull(error)) throw error;
      }
    }
    return { session, account };
  }

  /** end ends the session of a token, if there is one; it never fails (logout answers 204 always). */
  async end(token: string | undefined | null): Promise<boolean> {
    if (!token?.startsWith(SESSION_PREFIX) || token.length > 128) return false;
    const rows = await this.db.sql`DELETE FROM sessions WHERE digest = ${digestSecret(token)} RETURNING id`;
    return rows.length > 0;
  }

  /** endAll ends every session of an account, the caller's included, and says how many ended (inside `tx` when given). */
  async endAll(accountId: string, tx?: Sql): Promise<number> {
    const rows = await (tx ?? this.db.sql)`DELETE FROM sessions WHERE account_id = ${accountId} RETURNING id`;
    return rows.length;
  }

  /** sweep deletes sessions past their expiry (run by the worker role). */
  async sweep(): Promise<number> {
    const rows = await this.db.sql`DELETE FROM sessions WHERE expires_at <= ${Date.now()} RETURNING id`;
    return rows.length;
  }
}

/** sessionTokenOf reads the session token from `Authorization: Bearer` or the session cookie. */
export function sessionTokenOf(request: Request): string | null {
  const authorization = request.headers.get("authorization");
  if (authorization) {
    const match = /^Bearer\s+(\S+)$/i.exec(authorization);
    return match?.[1] ?? null;
  }
  return cookieValue(request.headers.get("cookie"), SESSION_COOKIE);
}

/**
 * sessionCookie is the Set-Cookie value for a session token: HttpOnly (no script reads it),
 * Secure, SameSite=Lax (sent on top-level navigation back from the IdP, not on cross-site
 * posts), Path=/, with Max-Age bounded by the session's expiry. `__Host-` is not used because
 * the console may run on plain http://localhost in development, where browsers refuse it.
 */
export function sessionCookie(token: string, maxAgeMs: number): string {
  return `${SESSION_COOKIE}=${token}; Path=/; HttpOnly; Secure; SameSite=Lax; Max-Age=${Math.max(0, Math.floor(maxAgeMs / 1000))}`;
}

/** clearedSessionCookie removes the session cookie from the browser. */
export function clearedSessionCookie(): string {
  return `${SESSION_COOKIE}=; Path=/; HttpOnly; Secure; SameSite=Lax; Max-Age=0`;
}
