import { randomBytes, randomUUID } from "node:crypto";
import { digestSecret } from "../../lib/crypto";
import { AppError } from "../../lib/errors";
import { type Account, type AccountStore, assertStanding } from "../accounts";
import type { AuditLog } from "../audit";
import { type Database, num, optionalNum } from "../db";
import { cleanText, type Enrollment, type NodeStore, type Reported } from "../nodes";

/** PREAUTH_KEY_PREFIX marks pre-authorized link keys for secret scanners and humans. */
export const PREAUTH_KEY_PREFIX = "epk_";
/** PREAUTH_KEY_LENGTH is a key's length: the prefix and 256 random bits in base64url (43 characters). */
export const PREAUTH_KEY_LENGTH = PREAUTH_KEY_PREFIX.length + 43;
const KEY_SHAPE = /^epk_[A-Za-z0-9_-]{43}$/;

/**
 * PREAUTH_KEY_BOUNDS are a key's defaults and the per-account cap (docs/decisions.md 59, 60).
 * The ranges (60 s to 90 days, 1 to 1000 uses) are in the contract's schema, which answers 422
 * beyond them; the defaults follow Tailscale and Headscale: a key lives a day and enrolls one
 * machine unless asked otherwise.
 */
export const PREAUTH_KEY_BOUNDS = {
  defaultLifetimeS: 86_400,
  defaultMaxUses: 1,
  descriptionMax: 200,
  /** maxActivePerAccount bounds the keys that can still enroll (not revoked, not expired, uses left); a 101st mint is 409. */
  maxActivePerAccount: 100,
} as const;

/** PreauthKey is a key's metadata as its owner sees it: never the key or its digest. */
export interface PreauthKey {
  id: string;
  accountId: string;
  description: string;
  maxUses: number;
  uses: number;
  createdAt: number;
  expiresAt: number;
  revokedAt: number | null;
}

/** MintedKey is a new key: its id, the plaintext (shown once, here only), its expiry and fan-out. */
export interface MintedKey {
  id: string;
  key: string;
  expiresAt: number;
  maxUses: number;
}

/** MintOptions are what the owner may choose at mint; absent values take the defaults. */
export interface MintOptions {
  expiresInS?: number;
  maxUses?: number;
  description?: string;
  source?: string;
}

/** isWellFormedKey says whether a string has a key's shape: the prefix and exactly 43 base64url characters. */
export function isWellFormedKey(key: string): boolean {
  return key.length === PREAUTH_KEY_LENGTH && KEY_SHAPE.test(key);
}

/** cleanDescription strips control and bidi-override characters and bounds the text, so a list shows what was meant. */
export function cleanDescription(raw: string | undefined): string {
  return cleanText(raw ?? "", PREAUTH_KEY_BOUNDS.descriptionMax);
}

/**
 * assertAccountOpen refuses a closed account (403). A suspended account may still list and
 * revoke its keys, since both only reduce what it can do; a closed one manages nothing.
 */
export function assertAccountOpen(account: Account): void {
  if (account.standing === "closed") throw new AppError("account_suspended", "the account is closed");
}

function rowToKey(row: Record<string, unknown>): PreauthKey {
  return {
    id: row.id as string,
    accountId: row.account_id as string,
    description: row.description as string,
    maxUses: num(row.max_uses),
    uses: num(row.uses),
    createdAt: num(row.created_at),
    expiresAt: num(row.expires_at),
    revokedAt: optionalNum(row.revoked_at),
  };
}

/**
 * PreauthKeyStore mints, lists, revokes and spends pre-authorized link keys, after Tailscale's
 * auth keys and Headscale's preauth keys. The plaintext is 256 random bits shown once at mint;
 * only its SHA-256 is stored. A use is counted when a node enrolls and is never given back,
 * not even when that node is deleted (headscale#158: a single-use key stays spent).
 */
export class PreauthKeyStore {
  constructor(
    private readonly db: Database,
    private readonly accounts: AccountStore,
    private readonly nodes: NodeStore,
    private readonly audit: AuditLog,
  ) {}

  /**
   * mint creates a key for an account in good standing (403 otherwise). It runs in one
   * transaction that first touches the account row, so concurrent mints of one account queue:
   * the active-key cap is then exact (409 `preauth_key_limit_reached`), and `created_at` is
   * made strictly greater than the account's newest key, so "newest first" never ties.
   */
  async mint(account: Account, options: MintOptions = {}): Promise<MintedKey> {
    assertStanding(account);
    const lifetimeS = options.expiresInS ?? PREAUTH_KEY_BOUNDS.defaultLifetimeS;
    const maxUses = options.maxUses ?? PREAUTH_KEY_BOUNDS.defaultMaxUses;
    const description = cleanDescription(options.description);
    const key = PREAUTH_KEY_PREFIX + randomBytes(32).toString("base64url");
    const id = randomUUID();
    return this.db.transaction(async (tx) => {
      const now = Date.now();
      await this.accounts.lock(tx, account.id);
      const [stats] = await tx`SELECT MAX(created_at) AS newest,
          SUM(CASE WHEN revoked_at IS NULL AND expires_at > ${now} AND uses < max_uses THEN 1 ELSE 0 END) AS active
        FROM preauth_keys WHERE account_id = ${account.id}`;
      if (num(stats?.active ?? 0) >= PREAUTH_KEY_BOUNDS.maxActivePerAccount) {
        throw new AppError(
          "preauth_key_limit_reached",
          `the account has ${PREAUTH_KEY_BOUNDS.maxActivePerAccount} keys that can still enroll; revoke one first`,
        );
      }
      const newest = optionalNum(stats?.newest);
      const createdAt = newest !== null && newest >= now ? newest + 1 : now;
      const expiresAt = createdAt + lifetimeS * 1000;
      await tx`INSERT INTO preauth_keys (id, account_id, digest, description, max_uses, uses, created_at, expires_at)
        VALUES (${id}, ${account.id}, ${digestSecret(key)}, ${description}, ${maxUses}, 0, ${createdAt}, ${expiresAt})`;
      await this.audit.write(
        {
          accountId: account.id,
          action: "preauth_key.minted",
          subject: id,
          source: options.source,
          details: { key_id: id, max_uses: maxUses, expires_at: new Date(expiresAt).toISOString() },
        },
        tx,
      );
      return { id, key, expiresAt, maxUses };
    });
  }

  /** list returns an account's keys, newest first, revoked and expired ones included. */
  async list(accountId: string): Promise<PreauthKey[]> {
    const rows = await this.db.sql`SELECT id, account_id, description, max_uses, uses, created_at, expires_at, revoked_at
      FROM preauth_keys WHERE account_id = ${accountId} ORDER BY created_at DESC, id DESC`;
    return rows.map(rowToKey);
  }

  /**
   * revoke marks the account's key revoked and says whether it changed anything. It is one
   * compare-and-set on (id, account, not yet revoked), so an unknown id, another account's key
   * and a key already revoked all change nothing and write no audit row. Nodes the key
   * enrolled are not touched. Ids are compared in lower case, as `randomUUID` writes them.
   */
  async revoke(accountId: string, rawKeyId: string, source?: string): Promise<boolean> {
    const keyId = rawKeyId.toLowerCase();
    return this.db.transaction(async (tx) => {
      const [row] = await tx`UPDATE preauth_keys SET revoked_at = ${Date.now()}
        WHERE id = ${keyId} AND account_id = ${accountId} AND revoked_at IS NULL RETURNING id, uses, max_uses`;
      if (!row) return false;
      await this.audit.write(
        {
          accountId,
          action: "preauth_key.revoked",
          subject: keyId,
          source,
          details: { key_id: keyId, uses: num(row.uses), max_uses: num(row.max_uses) },
        },
        tx,
      );
      return true;
    });
  }

  /**
   * enroll spends one use of a key and enrolls the reporting machine under the key's account,
   * in one transaction: a compare-and-set takes the use (so N concurrent enrollments of a key
   * with k uses left yield exactly k nodes), then the account's standing is asserted and the
   * node created or adopted. Any refusal after the spend (standing, node limit) rolls the spend
   * back with the transaction.
   *
   * A malformed key is `invalid_request` (400). An unknown, revoked or expired key is one
   * answer, `preauth_key_invalid` (404), so a revoked key cannot be told from an invented one;
   * a live key with no uses left is `preauth_key_exhausted` (409).
   */
  async enroll(key: string, reported: Reported, source?: string): Promise<{ keyId: string; enrollment: Enrollment }> {
    if (!isWellFormedKey(key)) throw new AppError("invalid_request", "not a pre-authorized link key");
    const digest = digestSecret(key);
    return this.db.transaction(async (tx) => {
      const now = Date.now();
      const [spent] = await tx`UPDATE preauth_keys SET uses = uses + 1
        WHERE digest = ${digest} AND revoked_at IS NULL AND expires_at > ${now} AND uses < max_uses
        RETURNING id, account_id, uses, max_uses`;
      if (!spent) {
        const [row] = await tx`SELECT revoked_at, expires_at, uses, max_uses FROM preauth_keys WHERE digest = ${digest}`;
        const live = row && row.revoked_at === null && num(row.expires_at) > now;
        if (live) throw new AppError("preauth_key_exhausted", "the key has no uses left");
        throw new AppError("preauth_key_invalid", "the key is not valid: unknown, revoked or expired");
      }
      const keyId = spent.id as string;
      const accountId = spent.account_id as string;
      const account = await this.accounts.byId(accountId, tx);
      if (!account) throw new AppError("preauth_key_invalid", "the key is not valid: unknown, revoked or expired");
      // A key outlives a change of standing: a suspended account's keys stop enrolling at once.
      assertStanding(account);
      const enrollment = await this.nodes.enroll(tx, accountId, reported, "preauth_key");
      await this.audit.write(
        {
          accountId,
          action: "preauth_key.enrolled",
          subject: keyId,
          source,
          details: {
            key_id: keyId,
            node_id: enrollment.node.id,
            adopted: enrollment.adopted,
            uses: num(spent.uses),
            max_uses: num(spent.max_uses),
          },
        },
        tx,
      );
      return { keyId, enrollment };
    });
  }
}
