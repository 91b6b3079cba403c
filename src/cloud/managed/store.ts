import { randomId } from "../../lib/crypto";
import { type Database, num, optionalNum, type Sql } from "../db";

/** AllocationKind: a paid box, or a one-hour trial. */
export type AllocationKind = "trial" | "paid";
/**
 * AllocationStatus is the allocation's life: `provisioning` until its box first answers,
 * `ready`, `failed` (with or without a sandbox at the provider), `deleting` while the provider
 * still owes the delete, and `deleted`.
 */
export type AllocationStatus = "provisioning" | "ready" | "failed" | "deleting" | "deleted";
export const ALLOCATION_STATUSES: readonly AllocationStatus[] = ["provisioning", "ready", "failed", "deleting", "deleted"];
/** BoxPower is the box's engine as the provisioner last left it (a ready box only). */
export type BoxPower = "none" | "starting" | "running" | "stopping" | "asleep" | "updating";
export const BOX_POWERS: readonly BoxPower[] = ["none", "starting", "running", "stopping", "asleep", "updating"];
/** UpdateState is an update's progress; null when none was ever asked for. */
export type UpdateState = "pending" | "running" | "failed" | "done";
export const UPDATE_STATES: readonly UpdateState[] = ["pending", "running", "failed", "done"];

/** Allocation is one row of `managed_allocations`. */
export interface Allocation {
  id: string;
  accountId: string;
  kind: AllocationKind;
  status: AllocationStatus;
  power: BoxPower;
  sandboxId: string | null;
  nodeId: string | null;
  boxVersion: string;
  templateVersion: string;
  restoreFrom: string | null;
  sleepAfterMs: number;
  expiresAt: number | null;
  readyAt: number | null;
  lastActivityAt: number | null;
  startStartedAt: number | null;
  startWindowAt: number | null;
  startsInWindow: number;
  updateState: UpdateState | null;
  updateTarget: string | null;
  updateFrom: string | null;
  updateRequestedAt: number | null;
  updateError: string | null;
  backingUpSince: number | null;
  finalBackupTried: boolean;
  operation: string | null;
  operationStartedAt: number | null;
  attempts: number;
  error: string | null;
  leaseOwner: string | null;
  leaseUntil: number | null;
  nextCheckAt: number;
  deleteRequestedAt: number | null;
  deletedAt: number | null;
  createdAt: number;
  updatedAt: number;
}

/** Backup is one row of `managed_backups`. */
export interface Backup {
  id: string;
  allocationId: string;
  accountId: string;
  kind: "nightly" | "final";
  state: "running" | "done" | "failed";
  sizeBytes: number;
  startedAt: number;
  takenAt: number | null;
  expiresAt: number | null;
  forgottenAt: number | null;
  error: string | null;
}

export function allocationFromRow(row: Record<string, unknown>): Allocation {
  return {
    id: row.id as string,
    accountId: row.account_id as string,
    kind: row.kind as AllocationKind,
    status: row.status as AllocationStatus,
    power: row.power as BoxPower,
    sandboxId: (row.sandbox_id as string | null) ?? null,
    nodeId: (row.node_id as string | null) ?? null,
    boxVersion: row.box_version as string,
    templateVersion: row.template_version as string,
    restoreFrom: (row.restore_from as string | null) ?? null,
    sleepAfterMs: num(row.sleep_after_ms),
    expiresAt: optionalNum(row.expires_at),
    readyAt: optionalNum(row.ready_at),
    lastActivityAt: optionalNum(row.last_activity_at),
    startStartedAt: optionalNum(row.start_started_at),
    startWindowAt: optionalNum(row.start_window_at),
    startsInWindow: num(row.starts_in_window),
    updateState: (row.update_state as UpdateState | null) ?? null,
    updateTarget: (row.update_target as string | null) ?? null,
    updateFrom: (row.update_from as string | null) ?? null,
    updateRequestedAt: optionalNum(row.update_requested_at),
    updateError: (row.update_error as string | null) ?? null,
    backingUpSince: optionalNum(row.backing_up_since),
    finalBackupTried: num(row.final_backup_tried) === 1,
    operation: (row.operation as string | null) ?? null,
    operationStartedAt: optionalNum(row.operation_started_at),
    attempts: num(row.attempts),
    error: (row.error as string | null) ?? null,
    leaseOwner: (row.lease_owner as string | null) ?? null,
    leaseUntil: optionalNum(row.lease_until),
    nextCheckAt: num(row.next_check_at),
    deleteRequestedAt: optionalNum(row.delete_requested_at),
    deletedAt: optionalNum(row.deleted_at),
    createdAt: num(row.created_at),
    updatedAt: num(row.updated_at),
  };
}

function backupFromRow(row: Record<string, unknown>): Backup {
  return {
    id: row.id as string,
    allocationId: row.allocation_id as string,
    accountId: row.account_id as string,
    kind: row.kind as Backup["kind"],
    state: row.state as Backup["state"],
    sizeBytes: num(row.size_bytes),
    startedAt: num(row.started_at),
    takenAt: optionalNum(row.taken_at),
    expiresAt: optionalNum(row.expires_at),
    forgottenAt: optionalNum(row.forgotten_at),
    error: (row.error as string | null) ?? null,
  };
}

/** NewAllocation is what creating an allocation writes. */
export interface NewAllocation {
  accountId: string;
  kind: AllocationKind;
  nodeId: string | null;
  boxVersion: string;
  templateVersion: string;
  sleepAfterMs: number;
  expiresAt: number | null;
  restoreFrom?: string | null;
  now: number;
}

/**
 * ManagedStore owns the managed tables' SQL: allocations, backups, purchase requests,
 * invoices, seats and places. The rest of the module calls it, never the tables.
 */
export class ManagedStore {
  constructor(readonly db: Database) {}

  /** current is the account's current allocation (provisioning, ready, deleting, or failed with a sandbox), or null. */
  async current(accountId: string, tx?: Sql): Promise<Allocation | null> {
    const [row] = await (tx ?? this.db.sql)`SELECT * FROM managed_allocations WHERE account_id = ${accountId}
      AND (status IN ('provisioning', 'ready', 'deleting') OR (status = 'failed' AND sandbox_id IS NOT NULL))
      ORDER BY created_at DESC LIMIT 1`;
    return row ? allocationFromRow(row) : null;
  }

  /** newest is the account's newest allocation whatever its status, deleted ones included. */
  async newest(accountId: string, tx?: Sql): Promise<Allocation | null> {
    const [row] = await (tx ?? this.db.sql)`SELECT * FROM managed_allocations WHERE account_id = ${accountId}
      ORDER BY created_at DESC, id DESC LIMIT 1`;
    return row ? allocationFromRow(row) : null;
  }

  async byId(id: string, tx?: Sql): Promise<Allocation | null> {
    const [row] = await (tx ?? this.db.sql)`SELECT * FROM managed_allocations WHERE id = ${id}`;
    return row ? allocationFromRow(row) : null;
  }

  /** insert creates an allocation in `provisioning`, due for the provisioner at once. */
  async insert(tx: Sql, fields: NewAllocation): Promise<Allocation> {
    const id = randomId("box");
    // created_at is strictly after the account's previous allocation, so "newest" never ties.
    const [previous] = await tx`SELECT MAX(created_at) AS newest FROM managed_allocations WHERE account_id = ${fields.accountId}`;
    const newest = optionalNum(previous?.newest);
    const createdAt = newest !== null && newest >= fields.now ? newest + 1 : fields.now;
    await tx`INSERT INTO managed_allocations (id, account_id, kind, status, power, node_id, box_version, template_version,
        restore_from, sleep_after_ms, expires_at, next_check_at, created_at, updated_at)
      VALUES (${id}, ${fields.accountId}, ${fields.kind}, 'provisioning', 'none', ${fields.nodeId}, ${fields.boxVersion},
        ${fields.templateVersion}, ${fields.restoreFrom ?? null}, ${fields.sleepAfterMs}, ${fields.expiresAt}, ${fields.now},
        ${createdAt}, ${fields.now})`;
    return (await this.byId(id, tx)) as Allocation;
  }

  /** countCurrentTrials counts trial boxes that hold a trial place (not yet deleted). */
  async countCurrentTrials(tx?: Sql): Promise<number> {
    const [row] = await (tx ?? this.db.sql)`SELECT COUNT(*) AS n FROM managed_allocations WHERE kind = 'trial'
      AND (status IN ('provisioning', 'ready', 'deleting') OR (status = 'failed' AND sandbox_id IS NOT NULL))`;
    return num(row?.n ?? 0);
  }

  /** listCurrent lists every current allocation (operators), or those of one kind. */
  async listCurrent(kind?: AllocationKind): Promise<Allocation[]> {
    const rows = kind
      ? await this.db.sql`SELECT * FROM managed_allocations WHERE kind = ${kind} AND status <> 'deleted' ORDER BY created_at`
      : await this.db.sql`SELECT * FROM managed_allocations WHERE status <> 'deleted' ORDER BY created_at`;
    return rows.map(allocationFromRow);
  }

  /**
   * patch sets columns of an allocation. `where` adds compare-and-set conditions (column =
   * value, null meaning IS NULL); it answers the row after the change, or null when the
   * conditions no longer held (someone else changed the row first).
   */
  async patch(
    id: string,
    set: Partial<Record<string, string | number | null>>,
    where: Partial<Record<string, string | number | null | readonly string[]>> = {},
    tx?: Sql,
  ): Promise<Allocation | null> {
    const sql = tx ?? this.db.sql;
    const columns = Object.entries(set).filter(([, v]) => v !== undefined);
    for (const column of [...columns.map(([c]) => c), ...Object.keys(where)]) {
      if (!/^[a-z_]+$/.test(column)) throw new Error(`not a column: ${column}`);
    }
    // Placeholders are numbered in the order they appear: SQLite numbers `$n` by appearance.
    const values: unknown[] = [];
    const mark = (value: unknown) => {
      values.push(value);
      return `$${values.length}`;
    };
    const assignments = [`updated_at = ${mark(Date.now())}`, ...columns.map(([column, value]) => `${column} = ${mark(value)}`)];
    const conditions = [`id = ${mark(id)}`];
    for (const [column, value] of Object.entries(where)) {
      if (value === undefined) continue;
      if (value === null) conditions.push(`${column} IS NULL`);
      else if (Array.isArray(value)) conditions.push(`${column} IN (${value.map(mark).join(", ")})`);
      else conditions.push(`${column} = ${mark(value)}`);
    }
    const [row] = await sql.unsafe(
      `UPDATE managed_allocations SET ${assignments.join(", ")} WHERE ${conditions.join(" AND ")} RETURNING *`,
      values,
    );
    return row ? allocationFromRow(row) : null;
  }

  /**
   * claim takes the lease of up to `limit` allocations that are due, for `owner` until
   * `leaseUntil`. On PostgreSQL the rows are picked `FOR UPDATE SKIP LOCKED`, so provisioners
   * running side by side never pick the same row and never wait on each other (Coder's job
   * acquisition); the lease condition is repeated outside the subquery so a row taken between
   * the pick and the update is skipped. On SQLite one statement is atomic already.
   */
  async claim(owner: string, now: number, realNow: number, leaseUntil: number, limit: number, holdMs: number): Promise<Allocation[]> {
    // While held, a row is not due; a route that wants it looked at sets next_check_at to now,
    // and release keeps the earlier of that and the provisioner's own next time.
    const hold = now + holdMs;
    const rows =
      this.db.dialect === "postgres"
        ? await this.db.sql`UPDATE managed_allocations SET lease_owner = ${owner}, lease_until = ${leaseUntil}, next_check_at = ${hold}
            WHERE id IN (SELECT id FROM managed_allocations WHERE status IN ('provisioning', 'ready', 'deleting', 'failed') AND next_check_at <= ${now}
                AND (lease_until IS NULL OR lease_until < ${realNow})
                ORDER BY next_check_at LIMIT ${limit} FOR UPDATE SKIP LOCKED)
              AND (lease_until IS NULL OR lease_until < ${realNow})
            RETURNING *`
        : await this.db.sql`UPDATE managed_allocations SET lease_owner = ${owner}, lease_until = ${leaseUntil}, next_check_at = ${hold}
            WHERE id IN (SELECT id FROM managed_allocations WHERE status IN ('provisioning', 'ready', 'deleting', 'failed') AND next_check_at <= ${now}
                AND (lease_until IS NULL OR lease_until < ${realNow})
                ORDER BY next_check_at LIMIT ${limit})
            RETURNING *`;
    return rows.map(allocationFromRow);
  }

  /** renew extends the leases `owner` holds on these rows. */
  async renew(owner: string, ids: string[], leaseUntil: number): Promise<void> {
    if (ids.length === 0) return;
    await this.db
      .sql`UPDATE managed_allocations SET lease_until = ${leaseUntil} WHERE lease_owner = ${owner} AND id IN ${this.db.sql(ids)}`;
  }

  /** release gives a lease back and says when the row is next due. */
  async release(owner: string, id: string, nextCheckAt: number): Promise<void> {
    await this.db.sql`UPDATE managed_allocations SET lease_owner = NULL, lease_until = NULL,
      next_check_at = CASE WHEN next_check_at < ${nextCheckAt} THEN next_check_at ELSE ${nextCheckAt} END
      WHERE id = ${id} AND lease_owner = ${owner}`;
  }

  /**
   * releaseAll drops every lease and makes those rows due at once (SQLite at provisioner
   * start: one process is the only provisioner, so a lease left is a dead one's).
   */
  async releaseAll(now: number): Promise<number> {
    const rows = await this.db.sql`UPDATE managed_allocations SET lease_owner = NULL, lease_until = NULL, next_check_at = ${now}
      WHERE lease_owner IS NOT NULL RETURNING id`;
    return rows.length;
  }

  /** due asks for the row to be looked at now (after a route changed what is wanted). */
  async due(id: string, now: number, tx?: Sql): Promise<void> {
    await (tx ?? this.db.sql)`UPDATE managed_allocations SET next_check_at = ${now} WHERE id = ${id}`;
  }

  /** touch records a user's request to the box (idle sleep reads it). */
  async touch(id: string, now: number): Promise<void> {
    await this.db.sql`UPDATE managed_allocations SET last_activity_at = ${now} WHERE id = ${id}
      AND (last_activity_at IS NULL OR last_activity_at < ${now})`;
  }

  // ---- backups

  async insertBackup(allocation: Allocation, kind: Backup["kind"], now: number): Promise<Backup> {
    const id = randomId("bak");
    await this.db.sql`INSERT INTO managed_backups (id, allocation_id, account_id, kind, state, started_at)
      VALUES (${id}, ${allocation.id}, ${allocation.accountId}, ${kind}, 'running', ${now})`;
    return {
      id,
      allocationId: allocation.id,
      accountId: allocation.accountId,
      kind,
      state: "running",
      sizeBytes: 0,
      startedAt: now,
      takenAt: null,
      expiresAt: null,
      forgottenAt: null,
      error: null,
    };
  }

  async finishBackup(
    id: string,
    fields: { state: "done" | "failed"; sizeBytes?: number; takenAt?: number | null; expiresAt?: number | null; error?: string | null },
    tx?: Sql,
  ): Promise<void> {
    await (tx ?? this.db.sql)`UPDATE managed_backups SET state = ${fields.state}, size_bytes = ${fields.sizeBytes ?? 0},
      taken_at = ${fields.takenAt ?? null}, expires_at = ${fields.expiresAt ?? null}, error = ${fields.error ?? null} WHERE id = ${id}`;
  }

  /** failRunningBackups marks backups a dead provisioner left `running` as failed. */
  async failRunningBackups(allocationId: string, error: string): Promise<number> {
    const rows = await this.db.sql`UPDATE managed_backups SET state = 'failed', error = ${error}
      WHERE allocation_id = ${allocationId} AND state = 'running' RETURNING id`;
    return rows.length;
  }

  /** backups lists an allocation's backups, newest first, forgotten ones left out. */
  async backups(allocationId: string): Promise<Backup[]> {
    const rows = await this.db.sql`SELECT * FROM managed_backups WHERE allocation_id = ${allocationId} AND forgotten_at IS NULL
      ORDER BY started_at DESC, id DESC`;
    return rows.map(backupFromRow);
  }

  async backupById(id: string): Promise<Backup | null> {
    const [row] = await this.db.sql`SELECT * FROM managed_backups WHERE id = ${id}`;
    return row ? backupFromRow(row) : null;
  }

  /** expireBackups sets every kept backup of a deleted allocation to expire at `at` (its tombstones). */
  async expireBackups(allocationId: string, at: number, tx?: Sql): Promise<void> {
    await (tx ?? this.db.sql)`UPDATE managed_backups SET expires_at = ${at} WHERE allocation_id = ${allocationId} AND state = 'done'
      AND forgotten_at IS NULL`;
  }

  /** dueToForget lists finished or failed backups past their expiry. */
  async dueToForget(now: number, limit = 50): Promise<Backup[]> {
    const rows = await this.db.sql`SELECT * FROM managed_backups WHERE forgotten_at IS NULL AND state <> 'running'
      AND expires_at IS NOT NULL AND expires_at <= ${now} ORDER BY expires_at LIMIT ${limit}`;
    return rows.map(backupFromRow);
  }

  async forgetBackup(id: string, now: number): Promise<void> {
    await this.db.sql`UPDATE managed_backups SET forgotten_at = ${now} WHERE id = ${id}`;
  }

  // ---- purchase, invoices, seats, places

  async openRequest(accountId: string, tx?: Sql): Promise<{ id: string; requestedAt: number } | null> {
    const [row] = await (tx ?? this.db.sql)`SELECT id, requested_at FROM managed_purchase_requests
      WHERE account_id = ${accountId} AND closed_at IS NULL`;
    return row ? { id: row.id as string, requestedAt: num(row.requested_at) } : null;
  }

  async insertRequest(tx: Sql, accountId: string, now: number): Promise<void> {
    await tx`INSERT INTO managed_purchase_requests (id, account_id, requested_at) VALUES (${randomId("prq")}, ${accountId}, ${now})`;
  }

  async closeRequests(tx: Sql, accountId: string, now: number): Promise<void> {
    await tx`UPDATE managed_purchase_requests SET closed_at = ${now} WHERE account_id = ${accountId} AND closed_at IS NULL`;
  }

  async heldSeat(accountId: string, tx?: Sql): Promise<{ id: string; grantedAt: number } | null> {
    const [row] = await (tx ??
      this.db.sql)`SELECT id, granted_at FROM managed_seats WHERE account_id = ${accountId} AND released_at IS NULL`;
    return row ? { id: row.id as string, grantedAt: num(row.granted_at) } : null;
  }

  async insertSeat(tx: Sql, accountId: string, invoiceId: string | null, now: number): Promise<string> {
    const id = randomId("seat");
    await tx`INSERT INTO managed_seats (id, account_id, invoice_id, granted_at) VALUES (${id}, ${accountId}, ${invoiceId}, ${now})`;
    return id;
  }

  async releaseSeat(tx: Sql, accountId: string, now: number): Promise<boolean> {
    const rows =
      await tx`UPDATE managed_seats SET released_at = ${now} WHERE account_id = ${accountId} AND released_at IS NULL RETURNING id`;
    return rows.length > 0;
  }

  async seats(): Promise<{ id: string; accountId: string; email: string; invoiceId: string | null; grantedAt: number }[]> {
    const rows = await this.db.sql`SELECT s.id, s.account_id, a.email, s.invoice_id, s.granted_at FROM managed_seats s
      JOIN accounts a ON a.id = s.account_id WHERE s.released_at IS NULL ORDER BY s.granted_at`;
    return rows.map((row: Record<string, unknown>) => ({
      id: row.id as string,
      accountId: row.account_id as string,
      email: row.email as string,
      invoiceId: (row.invoice_id as string | null) ?? null,
      grantedAt: num(row.granted_at),
    }));
  }

  async insertInvoice(tx: Sql, accountId: string, amount: string, note: string, now: number): Promise<string> {
    const id = randomId("inv");
    await tx`INSERT INTO managed_invoices (id, account_id, state, amount, note, created_at)
      VALUES (${id}, ${accountId}, 'open', ${amount}, ${note}, ${now})`;
    return id;
  }

  /** decideInvoice moves an open invoice to paid or void; null when it is not open (or unknown). */
  async decideInvoice(tx: Sql, id: string, state: "paid" | "void", now: number): Promise<{ accountId: string } | null> {
    const [row] = await tx`UPDATE managed_invoices SET state = ${state}, decided_at = ${now} WHERE id = ${id} AND state = 'open'
      RETURNING account_id`;
    return row ? { accountId: row.account_id as string } : null;
  }

  async invoices(accountId?: string, tx?: Sql): Promise<Invoice[]> {
    const sql = tx ?? this.db.sql;
    const rows = accountId
      ? await sql`SELECT i.*, a.email FROM managed_invoices i JOIN accounts a ON a.id = i.account_id
          WHERE i.account_id = ${accountId} ORDER BY i.created_at DESC, i.id DESC`
      : await sql`SELECT i.*, a.email FROM managed_invoices i JOIN accounts a ON a.id = i.account_id
          ORDER BY i.created_at DESC, i.id DESC`;
    return rows.map(invoiceFromRow);
  }

  async invoiceById(id: string): Promise<Invoice | null> {
    const [row] = await this.db.sql`SELECT i.*, a.email FROM managed_invoices i JOIN accounts a ON a.id = i.account_id WHERE i.id = ${id}`;
    return row ? invoiceFromRow(row) : null;
  }

  /** launchPlacesUsed counts seats held plus open invoices (the contract's launch places). */
  async launchPlacesUsed(tx?: Sql): Promise<{ seats: number; openInvoices: number }> {
    const sql = tx ?? this.db.sql;
    const [seats] = await sql`SELECT COUNT(*) AS n FROM managed_seats WHERE released_at IS NULL`;
    const [invoices] = await sql`SELECT COUNT(*) AS n FROM managed_invoices WHERE state = 'open'`;
    return { seats: num(seats?.n ?? 0), openInvoices: num(invoices?.n ?? 0) };
  }

  async places(kind: "launch" | "trial", tx?: Sql): Promise<number> {
    const [row] = await (tx ?? this.db.sql)`SELECT places FROM managed_places WHERE kind = ${kind}`;
    return row ? num(row.places) : 0;
  }

  async setPlaces(kind: "launch" | "trial", places: number, now: number): Promise<void> {
    await this.db.sql`INSERT INTO managed_places (kind, places, updated_at) VALUES (${kind}, ${places}, ${now})
      ON CONFLICT (kind) DO UPDATE SET places = excluded.places, updated_at = excluded.updated_at`;
  }
}

/** Invoice is one row of `managed_invoices`, with its account's email. */
export interface Invoice {
  id: string;
  accountId: string;
  email: string;
  state: "open" | "paid" | "void";
  amount: string;
  note: string;
  createdAt: number;
  decidedAt: number | null;
}

function invoiceFromRow(row: Record<string, unknown>): Invoice {
  return {
    id: row.id as string,
    accountId: row.account_id as string,
    email: row.email as string,
    state: row.state as Invoice["state"],
    amount: row.amount as string,
    note: row.note as string,
    createdAt: num(row.created_at),
    decidedAt: optionalNum(row.decided_at),
  };
}
