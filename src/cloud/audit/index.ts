import { randomId } from "../../lib/crypto";
import type { Database, Sql } from "../db";

/** AuditAction names the state changes the console records. */
export type AuditAction =
  | "device_link.requested"
  | "device_link.approved"
  | "device_link.denied"
  | "link_code.minted"
  | "link_code.claimed"
  | "preauth_key.minted"
  | "preauth_key.revoked"
  | "preauth_key.enrolled"
  | "session.logout_all"
  | "managed.purchase_requested"
  | "managed.allocated"
  | "managed.ready"
  | "managed.failed"
  | "managed.lost"
  | "managed.deleted"
  | "managed.expired"
  | "managed.destroyed"
  | "managed.wake_requested"
  | "managed.woke"
  | "managed.slept"
  | "managed.update_requested"
  | "managed.updated"
  | "managed.update_failed"
  | "managed.backed_up"
  | "managed.backup_failed"
  | "managed.invoice_opened"
  | "managed.invoice_paid"
  | "managed.invoice_voided"
  | "managed.seat_granted"
  | "managed.seat_released"
  | "managed.places_set"
  | "assistant.authorized"
  | "assistant.denied"
  | "assistant.revoked";

/** AuditEntry is one row to write. `details` must never hold a secret's plaintext: ids, counts and labels only. */
export interface AuditEntry {
  accountId: string | null;
  action: AuditAction;
  subject?: string;
  source?: string;
  details?: Record<string, string | number | boolean | null>;
}

/** AuditLog writes audit rows, inside the caller's transaction when one is given, so a rolled-back change leaves no row. */
export class AuditLog {
  constructor(private readonly db: Database) {}

  async write(entry: AuditEntry, tx?: Sql): Promise<void> {
    await (tx ?? this.db.sql)`INSERT INTO audit (id, account_id, action, subject, source, details, created_at)
      VALUES (${randomId("aud")}, ${entry.accountId}, ${entry.action}, ${entry.subject ?? ""}, ${entry.source ?? ""},
        ${JSON.stringify(entry.details ?? {})}, ${Date.now()})`;
  }

  /** list returns an account's rows, newest first (for operators and tests). */
  async list(accountId: string | null, limit = 100): Promise<Record<string, unknown>[]> {
    return accountId === null
      ? await this.db.sql`SELECT * FROM audit ORDER BY created_at DESC LIMIT ${limit}`
      : await this.db.sql`SELECT * FROM audit WHERE account_id = ${accountId} ORDER BY created_at DESC LIMIT ${limit}`;
  }
}
