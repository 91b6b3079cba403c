import { AppError } from "../../lib/errors";
import { type Account, type AccountStore, assertStanding } from "../accounts";
import type { AuditLog } from "../audit";
import type { Database } from "../db";
import { DeviceRequests, formatUserCode, normalizeUserCode, type UserCodeDigester } from "../link";
import type { NodeStore } from "../nodes";

export interface ApprovalDeps {
  db: Database;
  accounts: AccountStore;
  nodes: NodeStore;
  audit: AuditLog;
  userCodes: UserCodeDigester;
  clock: () => number;
}

/** ApprovalView is a pending device request as the approver sees it (`DeviceApprovalView`). */
export interface ApprovalView {
  user_code: string;
  state: "pending";
  reported: { hostname: string; os: string; version: string; verified: false };
  source_address: string;
  requested_at: string;
  expires_at: string;
  attempts_left: number;
}

/** ApprovalGrant is an approval's answer (`DeviceApprovalGrant`): the node the machine will become. */
export interface ApprovalGrant {
  approved: true;
  node_id: string;
  slug: string;
  adopted: boolean;
}

const iso = (ms: number) => new Date(ms).toISOString();
const notFound = () => new AppError("device_request_not_found", "no pending device request has this code; check it, or start again");

/**
 * DeviceApprovals is the console's side of the device link: a signed-in person types the
 * user code the machine shows, reads what the machine reported, and approves or denies it.
 *
 * The user code is the guessable secret of the flow (~34.6 bits), so it is only ever looked
 * up by its keyed digest, each code has a budget of decisions (approve and deny spend it;
 * lookup does not), and the routes charge per-session, per-account and per-source limits first.
 */
export class DeviceApprovals {
  readonly #requests: DeviceRequests;

  constructor(private readonly deps: ApprovalDeps) {
    this.#requests = new DeviceRequests(deps.db);
  }

  /**
   * lookup shows a pending request — reported strings labelled unverified, the address it came
   * from, its times and the attempts left — and spends nothing. A malformed, unknown, decided
   * or expired code is `device_request_not_found`.
   */
  async lookup(userCode: string): Promise<ApprovalView> {
    const code = normalizeUserCode(userCode);
    if (!code) throw notFound();
    const row = await this.#requests.byUserCode(this.deps.userCodes.digest(code));
    if (row?.state !== "pending" || row.expiresAt <= this.deps.clock()) throw notFound();
    return {
      user_code: formatUserCode(code),
      state: "pending",
      reported: { ...row.reported, verified: false },
      source_address: row.source,
      requested_at: iso(row.createdAt),
      expires_at: iso(row.expiresAt),
      attempts_left: row.attemptsLeft,
    };
  }

  /**
   * approve enrolls the requesting machine under the account. First one attempt of the
   * code's budget is spent, in a statement of its own: it stays spent whatever happens next,
   * so a refused approval (suspended account, node limit) cannot be retried for free. Then
   * one transaction asserts the account's standing, enrolls the node (the node limit; create,
   * or adopt by slug) and moves the row pending → approved by compare-and-set, naming the
   * account and the node. Losing that compare-and-set to a concurrent decision rolls the
   * enrollment back and answers `conflict`, so a code approved many times at once makes one
   * node. The machine's next poll collects the identity (src/cloud/link).
   */
  async approve(account: Account, userCode: string, source: string): Promise<ApprovalGrant> {
    const { id, now } = await this.#spendAttempt(userCode);
    return this.deps.db.transaction(async (tx) => {
      const current = await this.deps.accounts.byId(account.id, tx);
      if (!current) throw new AppError("account_not_found", "the account is gone");
      assertStanding(current);
      const reported = await this.#requests.reportedOf(tx, id);
      if (!reported) throw notFound();
      const enrollment = await this.deps.nodes.enroll(tx, account.id, reported, "device");
      const won = await this.#requests.approve(tx, id, { accountId: account.id, nodeId: enrollment.node.id, now });
      if (!won) throw new AppError("conflict", "this device request was decided meanwhile");
      await this.deps.audit.write(
        {
          accountId: account.id,
          action: "device_link.approved",
          subject: id,
          source,
          details: { node_id: enrollment.node.id, slug: enrollment.node.slug, adopted: enrollment.adopted },
        },
        tx,
      );
      return { approved: true as const, node_id: enrollment.node.id, slug: enrollment.node.slug, adopted: enrollment.adopted };
    });
  }

  /**
   * deny refuses a pending request: it spends one attempt like approve, then moves the row
   * pending → denied by compare-and-set; the machine's next poll answers `access_denied`.
   * Denying grants nothing, so it needs no standing.
   */
  async deny(account: Account, userCode: string, source: string): Promise<{ denied: true }> {
    const { id, now } = await this.#spendAttempt(userCode);
    return this.deps.db.transaction(async (tx) => {
      const won = await this.#requests.deny(tx, id, { accountId: account.id, now });
      if (!won) throw new AppError("conflict", "this device request was decided meanwhile");
      await this.deps.audit.write({ accountId: account.id, action: "device_link.denied", subject: id, source }, tx);
      return { denied: true as const };
    });
  }

  /**
   * spendAttempt takes one decision from a pending, unexpired code's budget by compare-and-set
   * (it never goes below zero, however many decide at once) and autocommits it. When nothing
   * is spent it says why: unknown or expired `device_request_not_found`, already decided
   * `conflict`, budget gone `user_code_attempts_exhausted`.
   */
  async #spendAttempt(userCode: string): Promise<{ id: string; now: number }> {
    const code = normalizeUserCode(userCode);
    if (!code) throw notFound();
    const digest = this.deps.userCodes.digest(code);
    const now = this.deps.clock();
    const spent = await this.#requests.spendAttempt(digest, now);
    if (spent !== null) return { id: spent, now };
    const row = await this.#requests.byUserCode(digest);
    if (!row) throw notFound();
    if (row.state !== "pending") throw new AppError("conflict", "this device request has already been decided");
    if (row.expiresAt <= now) throw notFound();
    throw new AppError("user_code_attempts_exhausted", "this code has used up its attempts; start linking again on the machine");
  }
}
