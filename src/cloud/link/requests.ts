import { type Database, num, type Sql } from "../db";
import type { Reported } from "../nodes";

/** DeviceState is a device request's stored state; `expired` is derived from `expires_at`, never stored. */
export type DeviceState = "pending" | "approved" | "denied" | "consumed";

/** DeviceRequest is one row of `device_requests`: a machine's RFC 8628 request and where its decision stands. */
export interface DeviceRequest {
  id: string;
  deviceCodeDigest: string;
  userCodeDigest: string;
  reported: Reported;
  /** source is the address the request came from (bounded to 64 characters when stored). */
  source: string;
  state: DeviceState;
  attemptsLeft: number;
  intervalS: number;
  createdAt: number;
  expiresAt: number;
}

/** NewDeviceRequest is what `insert` stores: a pending request with its budget and expiry. */
export type NewDeviceRequest = Omit<DeviceRequest, "state">;

function requestFromRow(row: Record<string, unknown>): DeviceRequest {
  return {
    id: row.id as string,
    deviceCodeDigest: row.device_code_digest as string,
    userCodeDigest: row.user_code_digest as string,
    reported: { hostname: row.hostname as string, os: row.os as string, version: row.version as string },
    source: row.source as string,
    state: row.state as DeviceState,
    attemptsLeft: num(row.attempts_left),
    intervalS: num(row.interval_s),
    createdAt: num(row.created_at),
    expiresAt: num(row.expires_at),
  };
}

/**
 * DeviceRequests owns the `device_requests` table: the machine's side (src/cloud/link/device.ts)
 * inserts, reads and consumes rows, the console's side (src/cloud/approvals) spends attempts and
 * decides, and the worker sweeps; none of them writes its SQL. Every state change is one
 * compare-and-set that answers whether it won, so callers keep deciding what a lost race means.
 * The methods that take `tx` run inside the caller's transaction.
 */
export class DeviceRequests {
  constructor(private readonly db: Database) {}

  /** insert stores a pending request inside the caller's transaction; a user code digest already taken is a unique violation. */
  async insert(tx: Sql, request: NewDeviceRequest): Promise<void> {
    const { reported } = request;
    await tx`INSERT INTO device_requests (id, device_code_digest, user_code_digest, hostname, os, version, source, state,
        attempts_left, interval_s, created_at, expires_at)
      VALUES (${request.id}, ${request.deviceCodeDigest}, ${request.userCodeDigest}, ${reported.hostname}, ${reported.os},
        ${reported.version}, ${request.source.slice(0, 64)}, 'pending', ${request.attemptsLeft}, ${request.intervalS},
        ${request.createdAt}, ${request.expiresAt})`;
  }

  /** byId reads a request by its row id (the first part of a device code), in one statement. */
  async byId(id: string): Promise<DeviceRequest | null> {
    const [row] = await this.db.sql`SELECT * FROM device_requests WHERE id = ${id}`;
    return row ? requestFromRow(row) : null;
  }

  /** byUserCode reads a request by its user code's keyed digest, in one statement. */
  async byUserCode(digest: string): Promise<DeviceRequest | null> {
    const [row] = await this.db.sql`SELECT * FROM device_requests WHERE user_code_digest = ${digest}`;
    return row ? requestFromRow(row) : null;
  }

  /**
   * spendAttempt takes one decision from a pending, unexpired request's budget by
   * compare-and-set, autocommitted (it never goes below zero, however many decide at once), and
   * returns the row's id, or null when nothing was spent.
   */
  async spendAttempt(userCodeDigest: string, now: number): Promise<string | null> {
    const [spent] = await this.db.sql`UPDATE device_requests SET attempts_left = attempts_left - 1
      WHERE user_code_digest = ${userCodeDigest} AND state = 'pending' AND expires_at > ${now} AND attempts_left > 0 RETURNING id`;
    return spent ? (spent.id as string) : null;
  }

  /** reportedOf reads what the machine reported, inside the caller's transaction; null for a row gone. */
  async reportedOf(tx: Sql, id: string): Promise<Reported | null> {
    const [row] = await tx`SELECT hostname, os, version FROM device_requests WHERE id = ${id}`;
    return row ? { hostname: row.hostname as string, os: row.os as string, version: row.version as string } : null;
  }

  /** approve moves a pending, unexpired request to approved by compare-and-set, naming the account and the node; false when it lost. */
  async approve(tx: Sql, id: string, decision: { accountId: string; nodeId: string; now: number }): Promise<boolean> {
    const { accountId, nodeId, now } = decision;
    const won = await tx`UPDATE device_requests SET state = 'approved', account_id = ${accountId}, node_id = ${nodeId},
        decided_at = ${now}
      WHERE id = ${id} AND state = 'pending' AND expires_at > ${now} RETURNING id`;
    return won.length > 0;
  }

  /** deny moves a pending, unexpired request to denied by compare-and-set, naming the account; false when it lost. */
  async deny(tx: Sql, id: string, decision: { accountId: string; now: number }): Promise<boolean> {
    const { accountId, now } = decision;
    const won = await tx`UPDATE device_requests SET state = 'denied', account_id = ${accountId}, decided_at = ${now}
      WHERE id = ${id} AND state = 'pending' AND expires_at > ${now} RETURNING id`;
    return won.length > 0;
  }

  /** consume moves an approved, unexpired request to consumed by compare-and-set and returns its node's id; null when it lost. */
  async consume(tx: Sql, id: string, now: number): Promise<string | null> {
    const [taken] = await tx`UPDATE device_requests SET state = 'consumed', consumed_at = ${now}
      WHERE id = ${id} AND state = 'approved' AND expires_at > ${now} RETURNING node_id`;
    return taken ? (taken.node_id as string) : null;
  }

  /** sweep deletes the requests that expired before `before` and answers how many. */
  async sweep(before: number): Promise<number> {
    return (await this.db.sql`DELETE FROM device_requests WHERE expires_at < ${before} RETURNING id`).length;
  }
}
