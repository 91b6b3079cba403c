import { randomId } from "../../lib/crypto";
import { AppError } from "../../lib/errors";
import { type Database, isUniqueViolation, num, type Sql } from "../db";

/** Standing is an account's good standing: only `active` accounts may mint keys or approve devices. */
export type Standing = "active" | "suspended" | "closed";
export const STANDINGS: readonly Standing[] = ["active", "suspended", "closed"];

/** Account is the owner of nodes, keys and (later) one hosted allocation. */
export interface Account {
  id: string;
  email: string;
  name: string;
  standing: Standing;
  /** remoteLink is the entitlement the assistant (MCP) flows check. */
  remoteLink: boolean;
  paid: boolean;
  nodeLimit: number;
  trialsLeft: number;
  createdAt: number;
}

/** AccountChanges are what an operator may set with `engine-cloud accounts set`. */
export interface AccountChanges {
  name?: string;
  standing?: Standing;
  remoteLink?: boolean;
  paid?: boolean;
  nodeLimit?: number;
  trialsLeft?: number;
}

/** DEFAULT_NODE_LIMIT is a new account's node limit (decision: five machines, raised by an operator). */
export const DEFAULT_NODE_LIMIT = 5;

/** accountFromRow reads an `accounts` row (or a join that keeps its column names) into an Account. */
export function accountFromRow(row: Record<string, unknown>): Account {
  return {
    id: row.id as string,
    email: row.email as string,
    name: row.name as string,
    standing: row.standing as Standing,
    remoteLink: num(row.remote_link) === 1,
    paid: num(row.paid) === 1,
    nodeLimit: num(row.node_limit),
    trialsLeft: num(row.trials_left),
    createdAt: num(row.created_at),
  };
}

function normalizeEmail(email: string): string {
  const trimmed = email.trim().toLowerCase();
  if (!/^[^\s@]{1,64}@[^\s@]{1,255}$/.test(trimmed))
    throw new AppError("invalid_request", `not an email address: ${JSON.stringify(email)}`);
  return trimmed;
}

/**
 * assertStanding is the account standing assertion the contract puts before minting a key
 * or approving a device: a suspended or closed account is refused with 403.
 */
export function assertStanding(account: Account): void {
  if (account.standing !== "active") {
    throw new AppError("account_suspended", `the account is ${account.standing}; it may not mint keys or enroll machines`);
  }
}

/**
 * lockAccount takes the account's row lock inside the caller's transaction, so concurrent
 * changes to one account (enrollments against its node limit, key mints against their cap,
 * hosted-machine purchases) queue behind it: the row is touched with an UPDATE, which
 * PostgreSQL holds to the end of the transaction and which SQLite's BEGIN IMMEDIATE already
 * covers with its write lock (`SELECT … FOR UPDATE` is not portable: src/cloud/db). It answers
 * the account as locked; a missing account is `account_not_found`. Every module that needs the
 * lock calls this, so only this module writes SQL against `accounts`.
 */
export async function lockAccount(tx: Sql, id: string): Promise<Account> {
  const [row] = await tx`UPDATE accounts SET updated_at = updated_at WHERE id = ${id} RETURNING *`;
  if (!row) throw new AppError("account_not_found", "the account is gone");
  return accountFromRow(row);
}

/** AccountStore reads and writes accounts. */
export class AccountStore {
  constructor(private readonly db: Database) {}

  async byId(id: string, tx?: Sql): Promise<Account | null> {
    const [row] = await (tx ?? this.db.sql)`SELECT * FROM accounts WHERE id = ${id}`;
    return row ? accountFromRow(row) : null;
  }

  async byEmail(email: string): Promise<Account | null> {
    const [row] = await this.db.sql`SELECT * FROM accounts WHERE email = ${normalizeEmail(email)}`;
    return row ? accountFromRow(row) : null;
  }

  async list(): Promise<Account[]> {
    return (await this.db.sql`SELECT * FROM accounts ORDER BY created_at`).map(accountFromRow);
  }

  /** add creates an account; an email already taken is `conflict`. */
  async add(email: string, changes: AccountChanges = {}): Promise<Account> {
    const now = Date.now();
    const id = randomId("acct");
    const address = normalizeEmail(email);
    // The unique email decides, so two concurrent adds of one address give one account and one conflict.
    try {
      await this.db.sql`INSERT INTO accounts (id, email, name, node_limit, created_at, updated_at)
        VALUES (${id}, ${address}, ${changes.name ?? ""}, ${DEFAULT_NODE_LIMIT}, ${now}, ${now})`;
    } catch (error) {
      if (isUniqueViolation(error)) throw new AppError("conflict", `an account for ${address} exists`);
      throw error;
    }
    return this.set(id, changes);
  }

  /** set changes the given fields; unknown accounts are `account_not_found`. */
  async set(id: string, changes: AccountChanges): Promise<Account> {
    const current = await this.byId(id);
    if (!current) throw new AppError("account_not_found", `no account ${id}`);
    const next = { ...current, ...Object.fromEntries(Object.entries(changes).filter(([, v]) => v !== undefined)) } as Account;
    if (!STANDINGS.includes(next.standing)) throw new AppError("invalid_request", `standing must be one of ${STANDINGS.join(", ")}`);
    if (!Number.isInteger(next.nodeLimit) || next.nodeLimit < 0) throw new AppError("invalid_request", "node limit must be an integer ≥ 0");
    if (!Number.isInteger(next.trialsLeft) || next.trialsLeft < 0) throw new AppError("invalid_request", "trials must be an integer ≥ 0");
    await this.db.sql`UPDATE accounts SET name = ${next.name}, standing = ${next.standing}, remote_link = ${next.remoteLink ? 1 : 0},
      paid = ${next.paid ? 1 : 0}, node_limit = ${next.nodeLimit}, trials_left = ${next.trialsLeft}, updated_at = ${Date.now()}
      WHERE id = ${id}`;
    return next;
  }

  /** lock takes the account's row lock inside the caller's transaction: see lockAccount. */
  lock(tx: Sql, id: string): Promise<Account> {
    return lockAccount(tx, id);
  }

  /** spendTrial takes one hosted-machine trial inside the caller's transaction; false when none is left. */
  async spendTrial(tx: Sql, id: string): Promise<boolean> {
    const rows = await tx`UPDATE accounts SET trials_left = trials_left - 1, updated_at = ${Date.now()}
      WHERE id = ${id} AND trials_left > 0 RETURNING id`;
    return rows.length > 0;
  }

  /**
   * fromIdentity returns the account of an identity-provider subject, creating it on first
   * sign-in, or adopting an operator-made account with the same verified email.
   */
  async fromIdentity(identity: {
    issuer: string;
    subject: string;
    email: string;
    emailVerified: boolean;
    name?: string;
  }): Promise<Account> {
    const [known] = await this.db.sql`SELECT * FROM accounts WHERE idp_issuer = ${identity.issuer} AND idp_subject = ${identity.subject}`;
    if (known) return accountFromRow(known);
    const email = normalizeEmail(identity.email);
    const now = Date.now();
    return this.db.transaction(async (tx) => {
      const [byEmail] = await tx`SELECT * FROM accounts WHERE email = ${email}`;
      if (byEmail) {
        // Adopt only on a verified email and an account no other identity holds (no takeover by a claimed address).
        if (!identity.emailVerified || byEmail.idp_subject) {
          throw new AppError("login_failed", "this email belongs to another sign-in identity");
        }
        await tx`UPDATE accounts SET idp_issuer = ${identity.issuer}, idp_subject = ${identity.subject}, updated_at = ${now} WHERE id = ${byEmail.id}`;
        return accountFromRow(byEmail);
      }
      const id = randomId("acct");
      await tx`INSERT INTO accounts (id, email, name, node_limit, idp_issuer, idp_subject, created_at, updated_at)
        VALUES (${id}, ${email}, ${identity.name ?? ""}, ${DEFAULT_NODE_LIMIT}, ${identity.issuer}, ${identity.subject}, ${now}, ${now})`;
      const [row] = await tx`SELECT * FROM accounts WHERE id = ${id}`;
      return accountFromRow(row);
    });
  }
}
