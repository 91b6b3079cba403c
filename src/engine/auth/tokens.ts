import type { Database } from "bun:sqlite";
import type { Token, TokenCreate } from "../../contract/engine";
import { type Clock, iso } from "../../lib/clock";
import { constantTimeEqual, digestSecret, generateToken, randomId } from "../../lib/crypto";
import { AppError } from "../../lib/errors";
import { InputError } from "../../lib/validation";
import type { Principal } from "./principal";

interface TokenRow {
  id: string;
  name: string;
  role: Token["role"];
  digest: string;
  created_at: string;
  max_gpus: number | null;
  max_concurrent_jobs: number | null;
  last_used_at: string | null;
  revoked_at: string | null;
  expires_at: string | null;
  scope_services: string;
  origin: string;
}

/**
 * PresentedToken is a presented token's row as the check needs it: the principal it makes (one
 * object, frozen, shared by every request with that token) and its expiry as a number.
 */
interface PresentedToken {
  row: TokenRow;
  principal: Principal;
  expiresMs: number | null;
}

/** BEARER matches an Authorization header: RFC 6750 §2.1, token68-ish printable characters. */
const BEARER = /^Bearer[ ]+([\x21-\x7e]{1,512})[ ]*$/i;

/**
 * TokenStore holds access tokens. Secrets are stored only as SHA-256 digests; a presented
 * secret is found by its digest and then compared in constant time. `last_used_at` is
 * coalesced in memory and written at most once per flush interval, so a request storm
 * does not become a write storm.
 */
export class TokenStore {
  readonly #db: Database;
  readonly #clock: Clock;
  /** #pendingLastUsed holds, per token id, when it was last presented (ms since the epoch) and not yet written. */
  readonly #pendingLastUsed = new Map<string, number>();
  /**
   * #byDigest caches rows of presented tokens, with the principal each makes. Every write to
   * `tokens` goes through this store and clears it, so a revocation takes effect on the next request.
   */
  readonly #byDigest = new Map<string, PresentedToken>();
  #flushTimer: ReturnType<typeof setInterval> | undefined;

  constructor(db: Database, clock: Clock) {
    this.#db = db;
    this.#clock = clock;
  }

  /** start begins the periodic flush of coalesced `last_used_at` values. */
  start(flushMs: number): void {
    this.#flushTimer = setInterval(() => {
      try {
        this.flushLastUsed();
      } catch {
        // A full disk: the times stay pending and go out with a later flush (issue 13); a
        // timer that throws would end the daemon.
      }
    }, flushMs);
    this.#flushTimer.unref?.();
  }

  /** stop writes what is pending. It is safe to call more than once, and after a failed start. */
  stop(): void {
    if (this.#flushTimer) clearInterval(this.#flushTimer);
    this.#flushTimer = undefined;
    this.flushLastUsed();
  }

  flushLastUsed(): void {
    if (this.#pendingLastUsed.size === 0) return;
    const pending = [...this.#pendingLastUsed];
    this.#pendingLastUsed.clear();
    const update = this.#db.query("UPDATE tokens SET last_used_at = ? WHERE id = ? AND (last_used_at IS NULL OR last_used_at < ?)");
    try {
      this.#db.transaction(() => {
        for (const [id, at] of pending) {
          const stamp = iso(new Date(at));
          update.run(stamp, id, stamp);
        }
      })();
    } catch (error) {
      // Not stored: keep them for the next flush, unless a newer use came in meanwhile.
      for (const [id, at] of pending) if (!this.#pendingLastUsed.has(id)) this.#pendingLastUsed.set(id, at);
      throw error;
    }
  }

  list(): Token[] {
    return this.#db
      .query<TokenRow, []>("SELECT * FROM tokens ORDER BY created_at, id")
      .all()
      .map((row) => this.#toRecord(row));
  }

  get(id: string): Token {
    const row = this.#db.query<TokenRow, [string]>("SELECT * FROM tokens WHERE id = ?").get(id);
    if (!row) throw new AppError("token_not_found", `no token with id ${JSON.stringify(id)}`);
    return this.#toRecord(row);
  }

  /** create stores a new token and returns its record and its secret; the secret is not kept. */
  create(input: TokenCreate, origin = "api", secret = generateToken()): { record: Token; secret: string } {
    const now = this.#clock.now();
    if (input.expires_at != null && Date.parse(input.expires_at) <= now.getTime()) {
      throw new InputError([
        { loc: ["body", "expires_at"], msg: "expires_at must be in the future", type: "value_error", input: input.expires_at },
      ]);
    }
    const id = randomId("tok");
    const role = input.role ?? "readonly";
    try {
      this.#db
        .query(
          `INSERT INTO tokens (id, name, role, digest, created_at, max_gpus, max_concurrent_jobs, expires_at, scope_services, origin)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
        )
        .run(
          id,
          input.name,
          role,
          digestSecret(secret),
          iso(now),
          input.max_gpus ?? null,
          input.max_concurrent_jobs ?? null,
          input.expires_at == null ? null : iso(new Date(input.expires_at)),
          JSON.stringify(input.scope_services ?? []),
          origin,
        );
    } catch (error) {
      if (String((error as Error).message).includes("tokens.name")) {
        throw new AppError("token_name_taken", `an active token is already named ${JSON.stringify(input.name)}`);
      }
      throw error;
    }
    return { record: this.get(id), secret };
  }

  /**
   * revoke marks a token revoked. It refuses to revoke the last usable admin token, so an
   * engine is never left without an administrator reachable over HTTP.
   */
  revoke(id: string): Token {
    const record = this.get(id);
    if (record.revoked) return record;
    const revoke = this.#db.transaction(() => {
      if (record.role === "admin" && this.#activeAdminCount() <= 1) {
        throw new AppError("last_admin_token", "this is the last active admin token: create another admin token first");
      }
      this.#db.query("UPDATE tokens SET revoked_at = ? WHERE id = ?").run(iso(this.#clock.now()), id);
    });
    revoke.immediate();
    this.#byDigest.clear();
    this.#pendingLastUsed.delete(id);
    return this.get(id);
  }

  /** activeAdminCount counts admin tokens that are neither revoked nor expired. */
  #activeAdminCount(): number {
    const row = this.#db
      .query<{ n: number }, [string]>(
        "SELECT count(*) AS n FROM tokens WHERE role = 'admin' AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ?)",
      )
      .get(iso(this.#clock.now()));
    return row?.n ?? 0;
  }

  hasActiveAdmin(): boolean {
    return this.#activeAdminCount() > 0;
  }

  /** hasDigestOf tells whether a token with this secret exists, revoked or not. */
  hasDigestOf(secret: string): boolean {
    return this.#db.query("SELECT 1 FROM tokens WHERE digest = ?").get(digestSecret(secret)) !== null;
  }

  /**
   * authenticate resolves an Authorization header to a principal, or throws a 401-class
   * error: missing, malformed, unknown, revoked or expired.
   */
  authenticate(header: string | null): Principal {
    if (header === null || header === "") {
      throw new AppError("unauthenticated", "this route needs a bearer token: send `Authorization: Bearer <token>`");
    }
    const match = BEARER.exec(header);
    if (!match?.[1]) throw new AppError("invalid_token", "the Authorization header is not a well-formed bearer token");
    const digest = digestSecret(match[1]);
    let presented = this.#byDigest.get(digest) ?? null;
    if (!presented) {
      const row = this.#db.query<TokenRow, [string]>("SELECT * FROM tokens WHERE digest = ?").get(digest);
      if (row) {
        presented = { row, principal: principalOf(row), expiresMs: row.expires_at === null ? null : Date.parse(row.expires_at) };
        if (this.#byDigest.size >= 10_000) this.#byDigest.clear();
        this.#byDigest.set(digest, presented);
      }
    }
    if (!presented || !constantTimeEqual(presented.row.digest, digest))
      throw new AppError("invalid_token", "the bearer token is not valid");
    const { row, principal, expiresMs } = presented;
    if (row.revoked_at !== null) throw new AppError("token_revoked", "the bearer token has been revoked");
    const now = this.#clock.now().getTime();
    if (expiresMs !== null && expiresMs <= now) throw new AppError("token_expired", "the bearer token has expired");
    this.#pendingLastUsed.set(row.id, now);
    return principal;
  }

  #pendingIso(id: string): string | null {
    const at = this.#pendingLastUsed.get(id);
    return at === undefined ? null : iso(new Date(at));
  }

  #toRecord(row: TokenRow): Token {
    return {
      id: row.id,
      name: row.name,
      role: row.role,
      created_at: row.created_at,
      max_gpus: row.max_gpus,
      max_concurrent_jobs: row.max_concurrent_jobs,
      last_used_at: maxIso(row.last_used_at, this.#pendingIso(row.id)),
      revoked: row.revoked_at !== null,
      expires_at: row.expires_at,
      scope_services: JSON.parse(row.scope_services) as string[],
    };
  }
}

/** principalOf is the principal a token's row makes, frozen: every request with the token shares it. */
function principalOf(row: TokenRow): Principal {
  return Object.freeze({
    kind: "token",
    tokenId: row.id,
    name: row.name,
    role: row.role,
    maxGpus: row.max_gpus,
    maxConcurrentJobs: row.max_concurrent_jobs,
    scopeServices: Object.freeze(JSON.parse(row.scope_services) as string[]) as string[],
  });
}

function maxIso(a: string | null, b: string | null): string | null {
  if (a === null) return b;
  if (b === null) return a;
  return a > b ? a : b;
}
