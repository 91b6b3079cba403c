import { randomBytes } from "node:crypto";
import { digestSecret, randomId } from "../../lib/crypto";
import { type Database, num, optionalNum, type PreparedRead, type Sql } from "../db";
import type { ClientKind } from "./clients";
import { ASSISTANT_SCOPES, type AssistantScope } from "./grant";

/**
 * The authorization server's rows: pending requests, grants (a consent and its one code) and
 * tokens. Only this file writes their SQL. Every secret — the request's `rid`, the code, the
 * access and refresh tokens — is kept as its SHA-256 digest: 256 random bits each, so a read
 * of the database yields nothing usable (the session store's pattern).
 */

/** SECRET_PREFIXES mark each kind of secret for secret scanners and humans. */
export const SECRET_PREFIXES = { code: "ecc_", access: "eca_", refresh: "ecr_" } as const;

/** newSecret returns a secret: an optional prefix and 256 random bits in base64url. */
export function newSecret(prefix = ""): string {
  return prefix + randomBytes(32).toString("base64url");
}

/** scopesFrom reads a space-separated scope column into the known scopes. */
export function scopesFrom(text: string): AssistantScope[] {
  const words = new Set(text.split(" "));
  return ASSISTANT_SCOPES.filter((scope) => words.has(scope));
}

/** PendingRequest is an authorization waiting for the person's decision. */
export interface PendingRequest {
  id: string;
  clientId: string;
  clientKind: ClientKind;
  clientLabel: string;
  clientName: string;
  redirectUri: string;
  state: string | null;
  codeChallenge: string;
  scopes: AssistantScope[];
  resource: string;
  createdAt: number;
  expiresAt: number;
  decidedAt: number | null;
}

/** Grant is one consent: who, which client, what it may do and where; its code; whether it was revoked. */
export interface Grant {
  id: string;
  accountId: string;
  clientId: string;
  clientLabel: string;
  redirectUri: string;
  scopes: AssistantScope[];
  nodeIds: string[] | null;
  resource: string;
  codeChallenge: string;
  codeExpiresAt: number;
  codeUsedAt: number | null;
  createdAt: number;
  lastUsedAt: number | null;
  revokedAt: number | null;
  revokedReason: string | null;
}

/** TokenKind tells access tokens from refresh tokens. */
export type TokenKind = "access" | "refresh";

/** TokenRecord is a token row (never the token). */
export interface TokenRecord {
  id: string;
  kind: TokenKind;
  grantId: string;
  clientId: string;
  scopes: AssistantScope[];
  resource: string;
  parentId: string | null;
  createdAt: number;
  expiresAt: number;
  usedAt: number | null;
  revokedAt: number | null;
}

function requestFromRow(row: Record<string, unknown>): PendingRequest {
  return {
    id: row.id as string,
    clientId: row.client_id as string,
    clientKind: row.client_kind as ClientKind,
    clientLabel: row.client_label as string,
    clientName: row.client_name as string,
    redirectUri: row.redirect_uri as string,
    state: (row.state as string | null) ?? null,
    codeChallenge: row.code_challenge as string,
    scopes: scopesFrom(row.scopes as string),
    resource: row.resource as string,
    createdAt: num(row.created_at),
    expiresAt: num(row.expires_at),
    decidedAt: optionalNum(row.decided_at),
  };
}

export function grantFromRow(row: Record<string, unknown>): Grant {
  return {
    id: row.id as string,
    accountId: row.account_id as string,
    clientId: row.client_id as string,
    clientLabel: row.client_label as string,
    redirectUri: row.redirect_uri as string,
    scopes: scopesFrom(row.scopes as string),
    nodeIds: row.node_ids === null || row.node_ids === undefined ? null : (JSON.parse(row.node_ids as string) as string[]),
    resource: row.resource as string,
    codeChallenge: row.code_challenge as string,
    codeExpiresAt: num(row.code_expires_at),
    codeUsedAt: optionalNum(row.code_used_at),
    createdAt: num(row.created_at),
    lastUsedAt: optionalNum(row.last_used_at),
    revokedAt: optionalNum(row.revoked_at),
    revokedReason: (row.revoked_reason as string | null) ?? null,
  };
}

function tokenFromRow(row: Record<string, unknown>): TokenRecord {
  return {
    id: row.id as string,
    kind: row.kind as TokenKind,
    grantId: row.grant_id as string,
    clientId: row.client_id as string,
    scopes: scopesFrom(row.scopes as string),
    resource: row.resource as string,
    parentId: (row.parent_id as string | null) ?? null,
    createdAt: num(row.created_at),
    expiresAt: num(row.expires_at),
    usedAt: optionalNum(row.used_at),
    revokedAt: optionalNum(row.revoked_at),
  };
}

/** NewRequest is what /oauth/authorize stores for a request it accepted. */
export interface NewRequest {
  rid: string;
  clientId: string;
  clientKind: ClientKind;
  clientLabel: string;
  clientName: string;
  redirectUri: string;
  state: string | null;
  codeChallenge: string;
  scopes: AssistantScope[];
  resource: string;
  now: number;
  expiresAt: number;
}

/** NewGrant is a consent about to be written, with its code's digest. */
export interface NewGrant {
  accountId: string;
  clientId: string;
  clientLabel: string;
  redirectUri: string;
  scopes: AssistantScope[];
  nodeIds: string[] | null;
  resource: string;
  code: string;
  codeChallenge: string;
  codeExpiresAt: number;
  now: number;
}

/** NewToken is a token about to be written (the plaintext is digested here and never stored). */
export interface NewToken {
  token: string;
  kind: TokenKind;
  grantId: string;
  clientId: string;
  scopes: AssistantScope[];
  resource: string;
  parentId: string | null;
  now: number;
  expiresAt: number;
}

/** AssistantStore reads and writes the authorization server's rows. */
export class AssistantStore {
  /** #accessGrant is the verifier's one read, prepared at its first use. */
  #accessGrant: PreparedRead | undefined;

  constructor(private readonly db: Database) {}

  async createRequest(request: NewRequest): Promise<string> {
    const id = randomId("authz");
    await this.db.sql`INSERT INTO oauth_requests (id, rid_digest, client_id, client_kind, client_label, client_name, redirect_uri, state,
        code_challenge, scopes, resource, created_at, expires_at)
      VALUES (${id}, ${digestSecret(request.rid)}, ${request.clientId}, ${request.clientKind}, ${request.clientLabel}, ${request.clientName},
        ${request.redirectUri}, ${request.state}, ${request.codeChallenge}, ${request.scopes.join(" ")}, ${request.resource},
        ${request.now}, ${request.expiresAt})`;
    return id;
  }

  async requestByRid(rid: string): Promise<PendingRequest | null> {
    const [row] = await this.db.sql`SELECT * FROM oauth_requests WHERE rid_digest = ${digestSecret(rid)}`;
    return row ? requestFromRow(row) : null;
  }

  /**
   * decideRequest consumes a pending request inside `tx` with a compare-and-set: true for the
   * one caller that decided it, false when it was decided already or has expired meanwhile.
   */
  async decideRequest(tx: Sql, id: string, accountId: string, decision: "approved" | "denied", now: number): Promise<boolean> {
    const rows = await tx`UPDATE oauth_requests SET decided_at = ${now}, decision = ${decision}, account_id = ${accountId}
      WHERE id = ${id} AND decided_at IS NULL AND expires_at > ${now} RETURNING id`;
    return rows.length === 1;
  }

  async createGrant(tx: Sql, grant: NewGrant): Promise<string> {
    const id = randomId("grant");
    await tx`INSERT INTO oauth_grants (id, account_id, client_id, client_label, redirect_uri, scopes, node_ids, resource, code_digest,
        code_challenge, code_expires_at, created_at)
      VALUES (${id}, ${grant.accountId}, ${grant.clientId}, ${grant.clientLabel}, ${grant.redirectUri}, ${grant.scopes.join(" ")},
        ${grant.nodeIds === null ? null : JSON.stringify(grant.nodeIds)}, ${grant.resource}, ${digestSecret(grant.code)},
        ${grant.codeChallenge}, ${grant.codeExpiresAt}, ${grant.now})`;
    return id;
  }

  /**
   * useCode marks a code used inside `tx` and returns its grant: `fresh` for the one caller
   * that used it now, `replayed` when it had been used before, null when no grant has it.
   */
  async useCode(tx: Sql, code: string, now: number): Promise<{ grant: Grant; fresh: boolean } | null> {
    const digest = digestSecret(code);
    const [used] =
      await tx`UPDATE oauth_grants SET code_used_at = ${now} WHERE code_digest = ${digest} AND code_used_at IS NULL RETURNING *`;
    if (used) return { grant: grantFromRow(used), fresh: true };
    const [seen] = await tx`SELECT * FROM oauth_grants WHERE code_digest = ${digest}`;
    return seen ? { grant: grantFromRow(seen), fresh: false } : null;
  }

  async grant(id: string, tx?: Sql): Promise<Grant | null> {
    const [row] = await (tx ?? this.db.sql)`SELECT * FROM oauth_grants WHERE id = ${id}`;
    return row ? grantFromRow(row) : null;
  }

  /** grants lists an account's grants, newest first, revoked ones included. */
  async grants(accountId: string): Promise<Grant[]> {
    return (await this.db.sql`SELECT * FROM oauth_grants WHERE account_id = ${accountId} ORDER BY created_at DESC, id`).map(grantFromRow);
  }

  /**
   * revokeGrant revokes a grant and every token issued under it, inside `tx` when given; true
   * when this call revoked it (false: unknown, another account's when `accountId` is given,
   * or revoked already).
   */
  async revokeGrant(id: string, reason: string, now: number, options: { accountId?: string; tx?: Sql } = {}): Promise<boolean> {
    const run = async (tx: Sql) => {
      const rows = options.accountId
        ? await tx`UPDATE oauth_grants SET revoked_at = ${now}, revoked_reason = ${reason}
            WHERE id = ${id} AND account_id = ${options.accountId} AND revoked_at IS NULL RETURNING id`
        : await tx`UPDATE oauth_grants SET revoked_at = ${now}, revoked_reason = ${reason} WHERE id = ${id} AND revoked_at IS NULL RETURNING id`;
      if (rows.length === 0) return false;
      await tx`UPDATE oauth_tokens SET revoked_at = ${now} WHERE grant_id = ${id} AND revoked_at IS NULL`;
      return true;
    };
    return options.tx ? run(options.tx) : this.db.transaction(run);
  }

  /** touchGrant records the grant's last use (a token issued or refreshed). */
  async touchGrant(tx: Sql, id: string, now: number): Promise<void> {
    await tx`UPDATE oauth_grants SET last_used_at = ${now} WHERE id = ${id}`;
  }

  async insertToken(tx: Sql, token: NewToken): Promise<string> {
    const id = randomId(token.kind === "access" ? "at" : "rt");
    await tx`INSERT INTO oauth_tokens (id, digest, kind, grant_id, client_id, scopes, resource, parent_id, created_at, expires_at)
      VALUES (${id}, ${digestSecret(token.token)}, ${token.kind}, ${token.grantId}, ${token.clientId}, ${token.scopes.join(" ")},
        ${token.resource}, ${token.parentId}, ${token.now}, ${token.expiresAt})`;
    return id;
  }

  /** tokenBySecret returns the token row a presented token names, or null. */
  async tokenBySecret(token: string, tx?: Sql): Promise<TokenRecord | null> {
    const [row] = await (tx ?? this.db.sql)`SELECT * FROM oauth_tokens WHERE digest = ${digestSecret(token)}`;
    return row ? tokenFromRow(row) : null;
  }

  /** lockToken takes a token row's lock for the rest of `tx` (the portable idiom: update it first) and returns it fresh. */
  async lockToken(tx: Sql, id: string): Promise<TokenRecord | null> {
    const [row] = await tx`UPDATE oauth_tokens SET id = id WHERE id = ${id} RETURNING *`;
    return row ? tokenFromRow(row) : null;
  }

  async markUsed(tx: Sql, id: string, now: number): Promise<void> {
    await tx`UPDATE oauth_tokens SET used_at = ${now} WHERE id = ${id}`;
  }

  /** liveChildren are the unrevoked tokens rotated from a refresh token (its successor and that rotation's access token). */
  async liveChildren(tx: Sql, parentId: string): Promise<TokenRecord[]> {
    return (await tx`SELECT * FROM oauth_tokens WHERE parent_id = ${parentId} AND revoked_at IS NULL`).map(tokenFromRow);
  }

  async revokeTokens(tx: Sql, ids: string[], now: number): Promise<void> {
    for (const id of ids) await tx`UPDATE oauth_tokens SET revoked_at = ${now} WHERE id = ${id} AND revoked_at IS NULL`;
  }

  /**
   * accessGrant is the verifier's one read: an access token's row with its grant and the
   * grant's account (entitlement and standing), by the token's digest.
   */
  async accessGrant(token: string): Promise<Record<string, unknown> | null> {
    this.#accessGrant ??=
      this.db.prepareRead(`SELECT oauth_tokens.kind, oauth_tokens.resource, oauth_tokens.scopes, oauth_tokens.expires_at,
        oauth_tokens.revoked_at, oauth_tokens.client_id, oauth_tokens.grant_id, oauth_grants.account_id, oauth_grants.node_ids,
        oauth_grants.revoked_at AS grant_revoked_at, accounts.remote_link, accounts.standing
      FROM oauth_tokens JOIN oauth_grants ON oauth_grants.id = oauth_tokens.grant_id JOIN accounts ON accounts.id = oauth_grants.account_id
      WHERE oauth_tokens.digest = $1`);
    const [row] = await this.#accessGrant(digestSecret(token));
    return row ?? null;
  }

  /**
   * sweep deletes what can no longer be used, kept a day for support questions: requests
   * and tokens past their expiry, and grants revoked more than 30 days ago.
   */
  async sweep(now: number): Promise<{ requests: number; tokens: number; grants: number }> {
    const day = 86_400_000;
    const requests = await this.db.sql`DELETE FROM oauth_requests WHERE expires_at < ${now - day} RETURNING id`;
    const tokens = await this.db.sql`DELETE FROM oauth_tokens WHERE expires_at < ${now - day} RETURNING id`;
    const grants = await this.db.sql`DELETE FROM oauth_grants WHERE revoked_at < ${now - 30 * day} RETURNING id`;
    return { requests: requests.length, tokens: tokens.length, grants: grants.length };
  }
}
