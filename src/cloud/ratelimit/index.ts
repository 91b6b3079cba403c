import { AppError } from "../../lib/errors";
import { clientNetwork } from "../../lib/forwarded";
import { type Database, num } from "../db";

/** Limit is one token bucket: `burst` requests at once, refilled at `perMinute` a minute (a fraction for slower ones). */
export interface Limit {
  name: string;
  burst: number;
  perMinute: number;
  /** byAddress says the key is a client address: an IPv6 one is counted by its /64 (see clientNetwork). */
  byAddress?: true;
}

/**
 * LIMITS are the console's budgets, charged first on every route the contract lists (docs/
 * decisions.md repeats them). Each route charges its source address and, where it has one,
 * the code, key, credential or session it presents, so one address cannot grind one code and
 * one code cannot be ground from many addresses. RFC 8628's own 5 s cadence is enforced apart
 * from these (the poll's `slow_down`).
 */
export const LIMITS = {
  claimBySource: { name: "claim.source", burst: 10, perMinute: 10, byAddress: true },
  claimByCode: { name: "claim.code", burst: 5, perMinute: 5 },
  deviceBySource: { name: "device.source", burst: 10, perMinute: 10, byAddress: true },
  pollBySource: { name: "poll.source", burst: 60, perMinute: 120, byAddress: true },
  pollByDevice: { name: "poll.device", burst: 20, perMinute: 30 },
  lookupBySession: { name: "lookup.session", burst: 20, perMinute: 20 },
  lookupBySource: { name: "lookup.source", burst: 30, perMinute: 30, byAddress: true },
  decideBySession: { name: "approval.session", burst: 20, perMinute: 20 },
  // An account and an address each get 10 decisions at once, then one every 6 minutes (docs/decisions.md 160).
  decideByAccount: { name: "approval.account", burst: 10, perMinute: 1 / 6 },
  decideBySource: { name: "approval.source", burst: 20, perMinute: 1 / 3, byAddress: true },
  authorizeBySession: { name: "authorize.session", burst: 60, perMinute: 60 },
  authorizeBySource: { name: "authorize.source", burst: 120, perMinute: 120, byAddress: true },
  // The assistants' OAuth endpoints outside /api (docs/decisions.md 231): each writes a row or
  // fetches a metadata document, so each source is bounded.
  oauthAuthorizeBySource: { name: "oauth.authorize.source", burst: 60, perMinute: 60, byAddress: true },
  oauthTokenBySource: { name: "oauth.token.source", burst: 120, perMinute: 120, byAddress: true },
  oauthRegisterBySource: { name: "oauth.register.source", burst: 20, perMinute: 10, byAddress: true },
  preauthBySource: { name: "preauth.source", burst: 20, perMinute: 20, byAddress: true },
  preauthByKey: { name: "preauth.key", burst: 20, perMinute: 20 },
  loginBySource: { name: "login.source", burst: 30, perMinute: 30, byAddress: true },
} as const satisfies Record<string, Limit>;

/** Decision is one charge's outcome: allowed, or refused with how long until a token returns. */
export interface Decision {
  allowed: boolean;
  retryAfterS: number;
}

/** BucketStore keeps the buckets: in this process's memory, or in the database for several replicas. */
export interface BucketStore {
  take(key: string, limit: Limit, now: number): Promise<Decision>;
}

/**
 * refill adds the tokens earned since the bucket was last charged. Concurrent requests can
 * read the clock out of order (a charge stamped later commits first), so elapsed time is
 * never negative: a bucket never loses tokens to a clock that seems to run backwards.
 */
function refill(tokens: number, updatedAt: number, limit: Limit, now: number): number {
  return Math.min(limit.burst, tokens + (Math.max(0, now - updatedAt) / 60_000) * limit.perMinute);
}

function decide(tokens: number, limit: Limit): Decision {
  if (tokens >= 1) return { allowed: true, retryAfterS: 0 };
  return { allowed: false, retryAfterS: Math.max(1, Math.ceil(((1 - tokens) * 60) / limit.perMinute)) };
}

/** MemoryBuckets keeps buckets in a bounded map: one process, no database statement at all. */
export class MemoryBuckets implements BucketStore {
  readonly #buckets = new Map<string, { tokens: number; updatedAt: number }>();

  constructor(private readonly maxKeys = 100_000) {}

  async take(key: string, limit: Limit, now: number): Promise<Decision> {
    const bucket = this.#buckets.get(key);
    const tokens = bucket ? refill(bucket.tokens, bucket.updatedAt, limit, now) : limit.burst;
    const decision = decide(tokens, limit);
    if (bucket) this.#buckets.delete(key);
    else if (this.#buckets.size >= this.maxKeys) {
      // Forget the least recently charged key; a forgotten bucket starts full, which errs toward serving.
      const oldest = this.#buckets.keys().next().value;
      if (oldest !== undefined) this.#buckets.delete(oldest);
    }
    this.#buckets.set(key, { tokens: decision.allowed ? tokens - 1 : tokens, updatedAt: Math.max(now, bucket?.updatedAt ?? now) });
    return decision;
  }
}

/**
 * DatabaseBuckets keeps buckets in `rate_buckets`, so replicas behind one database share them.
 * A charge the database cannot store for lack of disk space is charged in this process's
 * memory instead: the request is still limited, and a read behind the limit (lookup) still
 * works on a full disk rather than failing at its rate limit.
 */
export class DatabaseBuckets implements BucketStore {
  readonly #fallback = new MemoryBuckets();

  constructor(private readonly db: Database) {}

  async take(key: string, limit: Limit, now: number): Promise<Decision> {
    try {
      return await this.#takeStored(key, limit, now);
    } catch (error) {
      if (!this.db.isDiskFull(error)) throw error;
      return this.#fallback.take(key, limit, now);
    }
  }

  #takeStored(key: string, limit: Limit, now: number): Promise<Decision> {
    return this.db.transaction(async (tx) => {
      await tx`INSERT INTO rate_buckets (key, tokens, updated_at) VALUES (${key}, ${limit.burst}, ${now}) ON CONFLICT (key) DO NOTHING`;
      // Touching the row first takes its lock on PostgreSQL, so concurrent charges queue here.
      const [row] = await tx`UPDATE rate_buckets SET key = key WHERE key = ${key} RETURNING tokens, updated_at`;
      const tokens = refill(Number(row.tokens), num(row.updated_at), limit, now);
      const decision = decide(tokens, limit);
      // Keep the later stamp, so a charge with an older clock reading cannot earn the same tokens twice.
      const stamp = Math.max(now, num(row.updated_at));
      await tx`UPDATE rate_buckets SET tokens = ${decision.allowed ? tokens - 1 : tokens}, updated_at = ${stamp} WHERE key = ${key}`;
      return decision;
    });
  }
}

/** RateLimiter charges buckets and throws `rate_limited` (429, with Retry-After) when one is empty. */
export class RateLimiter {
  constructor(
    private readonly store: BucketStore,
    private readonly clock: () => number = Date.now,
    /** onRefused is told the name of each limit that refused a request (the console's /metrics). */
    private readonly onRefused: (limit: string) => void = () => undefined,
  ) {}

  /** charge takes one token from each named bucket, in order, and refuses at the first empty one. */
  async charge(...charges: [Limit, string][]): Promise<void> {
    for (const [limit, key] of charges) {
      const decision = await this.store.take(`${limit.name}:${limit.byAddress ? clientNetwork(key) : key}`, limit, this.clock());
      if (!decision.allowed) {
        this.onRefused(limit.name);
        throw new AppError("rate_limited", `too many requests (${limit.name}); retry in ${decision.retryAfterS} s`, {
          retry_after_s: decision.retryAfterS,
        });
      }
    }
  }
}
