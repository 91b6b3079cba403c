import { randomBytes } from "node:crypto";
import { digestSecret, randomId } from "../../lib/crypto";
import { AppError } from "../../lib/errors";
import { InputError } from "../../lib/validation";
import { type Account, type AccountStore, assertStanding } from "../accounts";
import type { AuditLog } from "../audit";
import { type Database, num } from "../db";
import { type ClaimAnswer, claimAnswer, cleanReported, type NodeStore, type Reported } from "../nodes";

/** LINK_CODE_PREFIX marks link codes for secret scanners and people (the contract's `NL-`). */
export const LINK_CODE_PREFIX = "NL-";
/** LINK_CODE_BYTES is the code's randomness: 160 bits, written as 32 base32 characters. */
const LINK_CODE_BYTES = 20;
/** DEFAULT_LINK_CODE_LIFETIME_S is a link code's life when the minting request names none: ten minutes. */
export const DEFAULT_LINK_CODE_LIFETIME_S = 600;

const BASE32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/** base32 writes bytes in RFC 4648 base32 without padding: upper-case and unambiguous to read aloud or retype. */
function base32(bytes: Uint8Array): string {
  let out = "";
  let value = 0;
  let bits = 0;
  for (const byte of bytes) {
    value = ((value << 8) | byte) & 0xfff;
    bits += 8;
    while (bits >= 5) {
      out += BASE32[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
  }
  if (bits > 0) out += BASE32[(value << (5 - bits)) & 31];
  return out;
}

/**
 * normalizeLinkCode trims what was pasted and upper-cases it (base32 is case-insensitive).
 * It does not judge the shape: the route charges its limits on the normalised code first.
 */
export function normalizeLinkCode(presented: string): string {
  return presented.trim().toUpperCase();
}

/** linkCodeDigest is how a link code is stored and how its rate-limit bucket is named: never the plaintext. */
export function linkCodeDigest(presented: string): string {
  return digestSecret(normalizeLinkCode(presented));
}

export interface LinkCodeDeps {
  db: Database;
  accounts: AccountStore;
  nodes: NodeStore;
  audit: AuditLog;
  site: { publicUrl: string; hostedBaseDomain: string };
  clock: () => number;
}

/**
 * LinkCodes mints and claims link codes: a signed-in user mints one in the console, pastes it
 * into `engine link`, and the machine exchanges it once for its node identity. Only the
 * code's SHA-256 is stored (160 random bits need no slow hash).
 */
/** sweepLinkCodes deletes the link codes that expired before `before` and answers how many. */
export async function sweepLinkCodes(db: Database, before: number): Promise<number> {
  return (await db.sql`DELETE FROM link_codes WHERE expires_at < ${before} RETURNING id`).length;
}

export class LinkCodes {
  constructor(private readonly deps: LinkCodeDeps) {}

  /**
   * mint makes a code for an account in good standing, valid for `lifetimeS` seconds, and
   * returns its plaintext: the only time it exists outside the caller's hands.
   */
  async mint(account: Account, lifetimeS: number, source: string): Promise<{ code: string; expiresAt: number }> {
    assertStanding(account);
    const code = LINK_CODE_PREFIX + base32(randomBytes(LINK_CODE_BYTES));
    const id = randomId("lnk");
    const now = this.deps.clock();
    const expiresAt = now + lifetimeS * 1000;
    await this.deps.db.transaction(async (tx) => {
      await tx`INSERT INTO link_codes (id, digest, account_id, created_at, expires_at)
        VALUES (${id}, ${digestSecret(code)}, ${account.id}, ${now}, ${expiresAt})`;
      await this.deps.audit.write(
        { accountId: account.id, action: "link_code.minted", subject: id, source, details: { lifetime_s: lifetimeS } },
        tx,
      );
    });
    return { code, expiresAt };
  }

  /**
   * claim releases the node identity a code stands for, at most once: in one transaction the
   * code is consumed by compare-and-set (only an unused, unexpired code matches), the
   * account's standing is asserted, and the node is enrolled (created, or adopted by slug).
   * If anything after the consume fails (the node limit, a suspended account) the whole
   * transaction rolls back and the code stays usable. Unknown is `link_code_not_found`,
   * used `link_code_used`, expired `link_code_expired`; a code without the `NL-` prefix is
   * unknown too (404: the contract lists no 400 on claim), and a hostname that is empty once
   * cleaned is a 422 on `hostname`.
   */
  async claim(presented: string, reported: Reported, source: string): Promise<ClaimAnswer> {
    const code = normalizeLinkCode(presented);
    if (!code.startsWith(LINK_CODE_PREFIX))
      throw new AppError("link_code_not_found", `no such link code: a link code starts with ${LINK_CODE_PREFIX}`);
    const clean = cleanReported(reported);
    if (!clean.hostname) {
      throw new InputError([
        {
          loc: ["body", "hostname"],
          msg: "the reported hostname is empty once control characters are removed",
          type: "string_too_short",
          input: null,
        },
      ]);
    }
    const digest = digestSecret(code);
    const now = this.deps.clock();
    return this.deps.db.transaction(async (tx) => {
      const [taken] = await tx`UPDATE link_codes SET consumed_at = ${now}
        WHERE digest = ${digest} AND consumed_at IS NULL AND expires_at > ${now} RETURNING id, account_id`;
      if (!taken) {
        const [row] = await tx`SELECT consumed_at, expires_at FROM link_codes WHERE digest = ${digest}`;
        if (!row) throw new AppError("link_code_not_found", "no such link code; mint a new one in the console");
        if (row.consumed_at !== null) throw new AppError("link_code_used", "this link code has been used; mint a new one");
        throw new AppError("link_code_expired", `this link code expired at ${new Date(num(row.expires_at)).toISOString()}`);
      }
      const accountId = taken.account_id as string;
      const account = await this.deps.accounts.byId(accountId, tx);
      if (!account) throw new AppError("account_not_found", "the account that minted this code is gone");
      assertStanding(account);
      const enrollment = await this.deps.nodes.enroll(tx, accountId, clean, "link_code");
      await tx`UPDATE link_codes SET node_id = ${enrollment.node.id} WHERE id = ${taken.id}`;
      await this.deps.audit.write(
        {
          accountId,
          action: "link_code.claimed",
          subject: taken.id as string,
          source,
          details: { node_id: enrollment.node.id, slug: enrollment.node.slug, adopted: enrollment.adopted },
        },
        tx,
      );
      return claimAnswer(enrollment, this.deps.site);
    });
  }
}
