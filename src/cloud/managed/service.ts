import { AppError } from "../../lib/errors";
import type { Logger } from "../../lib/logger";
import type { Account, AccountStore } from "../accounts";
import type { AuditLog } from "../audit";
import type { ManagedConfig } from "../config";
import type { Database, Sql } from "../db";
import type { NodeStore } from "../nodes";
import { compareVersions } from "./providers/local";
import type { BoxProvider } from "./providers/provider";
import { type Allocation, type Invoice, ManagedStore } from "./store";
import {
  type AllocationView,
  allocationView,
  type BackupsView,
  backupsView,
  MANAGED_RULES,
  type PurchaseView,
  purchaseView,
  type UpdateView,
  updateView,
  type WakeView,
  wakeView,
} from "./views";

/** ManagedContext is what the hosted-machine module is built from (the composition root passes it). */
export interface ManagedContext {
  db: Database;
  accounts: AccountStore;
  nodes: NodeStore;
  audit: AuditLog;
  /** provider runs the boxes; null when the console offers no hosted machines (`ENGINE_CLOUD_BOX_PROVIDER=off`). */
  provider: BoxProvider | null;
  config: ManagedConfig;
  /** clock is the time the rules read (trial expiry, idle sleep, update spacing, the start budget): tests move it. */
  clock: () => number;
  /** publicUrl is where the console is reached (fixed once its port is bound). */
  publicUrl: () => string;
  log: Logger;
}

/** Answer is a route's outcome: its status and its view. */
export interface Answer<T> {
  status: number;
  body: T;
}

/**
 * ManagedService is the one coordinator of hosted machines: every route and every operator
 * command goes through it, and it owns the rules. Changes happen in one transaction that
 * first locks the account's row, so two requests of one account queue and each reads what
 * the other wrote; the provisioner performs what they record (`onChange` wakes it).
 */
export class ManagedService {
  readonly store: ManagedStore;
  /** onChange is called after a route records work for the provisioner (the in-process one is kicked). */
  onChange: () => void = () => {};

  constructor(readonly ctx: ManagedContext) {
    this.store = new ManagedStore(ctx.db);
  }

  get provider(): BoxProvider {
    if (!this.ctx.provider) throw new AppError("managed_not_offered", "this console offers no hosted machines");
    return this.ctx.provider;
  }

  /** offeredVersion is the engine release new boxes get and updates go to: the provider's newest. */
  offeredVersion(): string {
    return this.provider.releases().at(-1) as string;
  }

  #assertOffered(): void {
    if (!this.ctx.provider) throw new AppError("managed_not_offered", "this console offers no hosted machines");
  }

  #assertNotClosed(account: Account): void {
    if (account.standing === "closed") throw new AppError("account_suspended", "the account is closed");
  }

  #assertActive(account: Account): void {
    if (account.standing !== "active") throw new AppError("account_suspended", `the account is ${account.standing}`);
  }

  /** isPaid: an account pays for a hosted machine when it holds a seat, or when an operator marked it paid. */
  async isPaid(account: Account, tx?: Sql): Promise<boolean> {
    return account.paid || (await this.store.heldSeat(account.id, tx)) !== null;
  }

  // ---- purchase

  async #purchase(account: Account, tx?: Sql): Promise<PurchaseView> {
    const seat = await this.store.heldSeat(account.id, tx);
    const request = await this.store.openRequest(account.id, tx);
    const [invoice] = await this.store.invoices(account.id, tx);
    return purchaseView({
      paid: seat !== null || account.paid,
      seatSince: seat?.grantedAt ?? null,
      request,
      invoice: invoice ?? null,
      placeFree: await this.#launchPlaceFree(tx),
    });
  }

  async #launchPlaceFree(tx?: Sql): Promise<boolean> {
    const used = await this.store.launchPlacesUsed(tx);
    return used.seats + used.openInvoices < (await this.store.places("launch", tx));
  }

  /** purchaseState answers GET /api/managed/purchase: derived, `none` until the account asks. */
  async purchaseState(account: Account): Promise<PurchaseView> {
    this.#assertOffered();
    return this.#purchase(account);
  }

  /**
   * requestPurchase records that the account asks to buy a hosted machine (201), once: a
   * repeat, or an account that already holds a seat or an invoice, answers 200 and writes
   * nothing. It needs an active account and a free launch place (seats held plus open
   * invoices below the operator's places), else 409 `no_launch_place`.
   */
  async requestPurchase(account: Account, source: string): Promise<Answer<PurchaseView>> {
    this.#assertOffered();
    this.#assertActive(account);
    return this.ctx.db.transaction(async (tx) => {
      const locked = await this.ctx.accounts.lock(tx, account.id);
      this.#assertActive(locked);
      const current = await this.#purchase(locked, tx);
      if (current.state !== "none") return { status: 200, body: current };
      if (!current.launch_place_free) {
        throw new AppError("no_launch_place", "no launch place is free (seats held plus open invoices fill them); try again later");
      }
      await this.store.insertRequest(tx, account.id, this.ctx.clock());
      await this.ctx.audit.write({ accountId: account.id, action: "managed.purchase_requested", source }, tx);
      return { status: 201, body: await this.#purchase(locked, tx) };
    });
  }

  // ---- allocation

  /** allocation answers GET /api/managed/allocation: the account's newest allocation, a deleted one included. */
  async allocation(account: Account): Promise<AllocationView> {
    this.#assertOffered();
    this.#assertNotClosed(account);
    const newest = await this.store.newest(account.id);
    if (!newest) throw new AppError("allocation_not_found", "the account has no hosted machine");
    return allocationView(newest, this.ctx.publicUrl());
  }

  /**
   * allocate gives the account its hosted machine: the current one if it has one (200, no
   * write), else a new allocation (201) that the provisioner makes. A paid account gets a
   * full box; any other gets a one-hour trial when it has a trial left (else 403
   * `trial_quota_used`) and a trial place is free (else 409 `trial_boxes_busy`, worth
   * retrying). A `failed` allocation with no sandbox is not current: it is replaced. The box
   * is linked as a node of the account at once.
   */
  async allocate(account: Account, source: string): Promise<Answer<AllocationView>> {
    this.#assertOffered();
    this.#assertActive(account);
    const version = this.offeredVersion();
    const answer = await this.ctx.db.transaction(async (tx) => {
      const locked = await this.ctx.accounts.lock(tx, account.id);
      this.#assertActive(locked);
      const current = await this.store.current(account.id, tx);
      if (current) return { status: 200, body: current };
      const now = this.ctx.clock();
      const paid = await this.isPaid(locked, tx);
      if (!paid) {
        if (locked.trialsLeft <= 0) throw new AppError("trial_quota_used", "the account has used its hosted-machine trials");
        const trials = await this.store.countCurrentTrials(tx);
        if (trials >= (await this.store.places("trial", tx))) {
          throw new AppError("trial_boxes_busy", "every trial place is taken right now; try again in a few minutes");
        }
        if (!(await this.ctx.accounts.spendTrial(tx, account.id))) {
          throw new AppError("trial_quota_used", "the account has used its hosted-machine trials");
        }
      }
      const allocation = await this.store.insert(tx, {
        accountId: account.id,
        kind: paid ? "paid" : "trial",
        nodeId: null,
        boxVersion: version,
        templateVersion: this.ctx.config.templateVersion,
        sleepAfterMs: this.ctx.config.sleepAfterMs,
        expiresAt: paid ? null : now + MANAGED_RULES.trialLifetimeMs,
        now,
      });
      const node = await this.ctx.nodes.enrollHosted(tx, account.id, allocation.id);
      const linked = (await this.store.patch(allocation.id, { node_id: node.id }, {}, tx)) as Allocation;
      await this.ctx.audit.write(
        {
          accountId: account.id,
          action: "managed.allocated",
          subject: allocation.id,
          source,
          details: { kind: linked.kind, box_version: version, node_id: node.id, expires_at: linked.expiresAt },
        },
        tx,
      );
      return { status: 201, body: linked };
    });
    if (answer.status === 201) this.onChange();
    return { status: answer.status, body: allocationView(answer.body, this.ctx.publicUrl()) };
  }

  /**
   * restoreBackup gives a backup's account a new box made from that backup (an operator's
   * `engine-cloud boxes restore`): the account must pay and have no current allocation. The
   * provisioner restores the backup's data and engine state into the new box and starts it,
   * so it runs the services the backed-up box had.
   */
  async restoreBackup(backupId: string): Promise<Allocation> {
    this.#assertOffered();
    const backup = await this.store.backupById(backupId);
    if (backup?.state !== "done" || backup.forgottenAt !== null) {
      throw new AppError("not_found", `no finished backup ${backupId} is kept`);
    }
    const version = this.offeredVersion();
    const allocation = await this.ctx.db.transaction(async (tx) => {
      const account = await this.ctx.accounts.lock(tx, backup.accountId);
      if (!(await this.isPaid(account, tx))) throw new AppError("forbidden", `${account.email} does not pay for a hosted machine`);
      if (await this.store.current(account.id, tx)) {
        throw new AppError("conflict", `${account.email} has a hosted machine; delete it before restoring into a new one`);
      }
      const created = await this.store.insert(tx, {
        accountId: account.id,
        kind: "paid",
        nodeId: null,
        boxVersion: version,
        templateVersion: this.ctx.config.templateVersion,
        sleepAfterMs: this.ctx.config.sleepAfterMs,
        expiresAt: null,
        restoreFrom: backup.id,
        now: this.ctx.clock(),
      });
      const node = await this.ctx.nodes.enrollHosted(tx, account.id, created.id);
      const linked = (await this.store.patch(created.id, { node_id: node.id }, {}, tx)) as Allocation;
      await this.ctx.audit.write(
        {
          accountId: account.id,
          action: "managed.allocated",
          subject: created.id,
          source: "operator",
          details: { kind: "paid", box_version: version, node_id: node.id, restored_from: backup.id },
        },
        tx,
      );
      return linked;
    });
    this.onChange();
    return allocation;
  }

  /**
   * beginDelete moves an allocation to `deleting` inside the caller's transaction: billing
   * stops, the node is unlinked at once (no undo), and one audit row is written. An
   * allocation already deleting or deleted is left as it is and nothing is written (false).
   */
  async beginDelete(tx: Sql, allocation: Allocation, cause: "deleted" | "expired", source: string): Promise<Allocation | null> {
    const now = this.ctx.clock();
    const changed = await this.store.patch(
      allocation.id,
      {
        status: "deleting",
        delete_requested_at: now,
        next_check_at: now,
        update_state: allocation.updateState === "pending" ? null : allocation.updateState,
      },
      { status: ["provisioning", "ready", "failed"] },
      tx,
    );
    if (!changed) return null;
    if (allocation.nodeId) await this.ctx.nodes.unlink(tx, allocation.nodeId);
    await this.ctx.audit.write(
      {
        accountId: allocation.accountId,
        action: cause === "expired" ? "managed.expired" : "managed.deleted",
        subject: allocation.id,
        source,
        details: { kind: allocation.kind, was: allocation.status, node_id: allocation.nodeId },
      },
      tx,
    );
    return changed;
  }

  /**
   * finishDelete marks an allocation `deleted` once the provider holds nothing of it; its
   * kept backups become tombstones that expire after the retention.
   */
  async finishDelete(allocation: Allocation): Promise<Allocation | null> {
    const now = this.ctx.clock();
    return this.ctx.db.transaction(async (tx) => {
      const done = await this.store.patch(
        allocation.id,
        { status: "deleted", power: "none", deleted_at: now, error: null },
        { status: "deleting" },
        tx,
      );
      if (!done) return null;
      await this.store.expireBackups(allocation.id, now + this.ctx.config.backupRetentionMs, tx);
      await this.ctx.audit.write({ accountId: allocation.accountId, action: "managed.destroyed", subject: allocation.id }, tx);
      return done;
    });
  }

  /**
   * delete ends the account's hosted machine, with no payment or standing check, so a lapsed
   * or suspended owner can stop the cost. It answers 200 `deleted` when nothing is left at the
   * provider (at once when no box was ever made), and 202 `deleting` while the provider still
   * owes the delete, which the provisioner retries until the provider says done. Only the
   * first delete writes the audit row; a repeat changes nothing.
   */
  async delete(account: Account, source: string): Promise<Answer<AllocationView>> {
    this.#assertOffered();
    let allocation = await this.store.newest(account.id);
    if (!allocation) throw new AppError("allocation_not_found", "the account has no hosted machine");
    if (allocation.status !== "deleted" && allocation.status !== "deleting") {
      const target = allocation;
      allocation = (await this.ctx.db.transaction(async (tx) => {
        await this.ctx.accounts.lock(tx, account.id);
        const fresh = (await this.store.byId(target.id, tx)) as Allocation;
        return (await this.beginDelete(tx, fresh, "deleted", source)) ?? (await this.store.byId(target.id, tx));
      })) as Allocation;
    }
    if (allocation.status === "deleting") {
      // Nothing to delete at the provider: no box was made, or it is gone already.
      const owed = allocation.sandboxId !== null && (await this.#presentAtProvider(allocation.sandboxId));
      if (!owed) allocation = (await this.finishDelete(allocation)) ?? ((await this.store.byId(allocation.id)) as Allocation);
      else this.onChange();
    }
    return { status: allocation.status === "deleted" ? 200 : 202, body: allocationView(allocation, this.ctx.publicUrl()) };
  }

  /** #presentAtProvider asks the provider whether a box exists; an unanswered question counts as present (the delete stays owed). */
  async #presentAtProvider(sandboxId: string): Promise<boolean> {
    try {
      return (await this.provider.status(sandboxId)).state !== "absent";
    } catch {
      return true;
    }
  }

  // ---- wake

  /**
   * wake starts a sleeping box (202 `starting`), whatever its sleep setting. A repeat while it
   * starts answers the same (no write), unless that start has run over two minutes (429
   * `start_stuck`); a box that is not asleep answers 200 unchanged. No ready box is 404, an
   * inactive account 403, and a spent start budget 429 `start_budget_spent`.
   */
  async wake(account: Account, source: string): Promise<Answer<WakeView>> {
    this.#assertOffered();
    this.#assertActive(account);
    const answer = await this.ctx.db.transaction(async (tx) => {
      await this.ctx.accounts.lock(tx, account.id);
      const allocation = await this.store.current(account.id, tx);
      if (allocation?.status !== "ready") throw new AppError("no_ready_box", "the account has no ready hosted machine to wake");
      const now = this.ctx.clock();
      if (allocation.power === "starting") {
        const since = allocation.startStartedAt ?? now;
        if (now - since > MANAGED_RULES.startStuckMs) {
          throw new AppError("start_stuck", "the box's start has run for over two minutes; it is being looked at, try again later", {
            retry_after_s: 60,
          });
        }
        return { status: 202, body: allocation };
      }
      if (allocation.power !== "asleep" && allocation.power !== "stopping") return { status: 200, body: allocation };
      const windowOpen = allocation.startWindowAt !== null && now - allocation.startWindowAt < MANAGED_RULES.startWindowMs;
      const starts = windowOpen ? allocation.startsInWindow : 0;
      if (starts >= MANAGED_RULES.startBudget) {
        const retry = Math.ceil(((allocation.startWindowAt as number) + MANAGED_RULES.startWindowMs - now) / 1000);
        throw new AppError("start_budget_spent", `the box has been started ${starts} times this hour; try again later`, {
          retry_after_s: Math.max(1, retry),
        });
      }
      const woken = (await this.store.patch(
        allocation.id,
        {
          power: "starting",
          start_started_at: now,
          start_window_at: windowOpen ? allocation.startWindowAt : now,
          starts_in_window: starts + 1,
          next_check_at: now,
          attempts: 0,
        },
        {},
        tx,
      )) as Allocation;
      await this.ctx.audit.write({ accountId: account.id, action: "managed.wake_requested", subject: allocation.id, source }, tx);
      return { status: 202, body: woken };
    });
    if (answer.status === 202) this.onChange();
    return { status: answer.status, body: wakeView(answer.body, this.ctx.publicUrl()) };
  }

  // ---- update

  /** updateState answers GET /api/managed/allocation/update. */
  async updateState(account: Account): Promise<UpdateView> {
    this.#assertOffered();
    const allocation = await this.store.current(account.id);
    if (!allocation) throw new AppError("allocation_not_found", "the account has no hosted machine");
    return updateView(allocation, this.offeredVersion());
  }

  /**
   * requestUpdate records an update of the box to `version` (202); the provisioner runs stop →
   * update → start. In order: a repeat for the update already pending or running answers 202
   * and writes nothing (another version is 409 `box_busy`); never a downgrade (409
   * `downgrade_refused`); 409 `up_to_date`; only the offered version (409
   * `version_not_offered`); 3 minutes between accepted updates (429 `update_too_soon`); and
   * the box must be up and idle: 409 `box_offline` (asleep, failed or deleting), `box_busy`
   * (starting, stopping, being made) or `backup_running`.
   */
  async requestUpdate(account: Account, version: string, source: string): Promise<Answer<UpdateView>> {
    this.#assertOffered();
    this.#assertActive(account);
    const offered = this.offeredVersion();
    const answer = await this.ctx.db.transaction(async (tx) => {
      await this.ctx.accounts.lock(tx, account.id);
      const allocation = await this.store.current(account.id, tx);
      if (!allocation) throw new AppError("allocation_not_found", "the account has no hosted machine");
      if (allocation.updateState === "pending" || allocation.updateState === "running") {
        if (allocation.updateTarget === version) return { status: 202, body: allocation };
        throw new AppError("box_busy", `an update to ${allocation.updateTarget} is in progress`);
      }
      if (compareVersions(version, allocation.boxVersion) < 0) {
        throw new AppError("downgrade_refused", `the box runs ${allocation.boxVersion}; it is never moved back to ${version}`);
      }
      if (version === allocation.boxVersion) throw new AppError("up_to_date", `the box runs ${version} already`);
      if (version !== offered) throw new AppError("version_not_offered", `the version offered is ${offered}, not ${version}`);
      const now = this.ctx.clock();
      if (allocation.updateRequestedAt !== null && now - allocation.updateRequestedAt < MANAGED_RULES.updateSpacingMs) {
        const retry = Math.ceil((allocation.updateRequestedAt + MANAGED_RULES.updateSpacingMs - now) / 1000);
        throw new AppError("update_too_soon", "updates are at least 3 minutes apart", { retry_after_s: Math.max(1, retry) });
      }
      if (allocation.status !== "ready" || allocation.power === "asleep" || allocation.power === "none") {
        throw new AppError("box_offline", "the box is not running: wake it first");
      }
      if (allocation.power !== "running") throw new AppError("box_busy", `the box is ${allocation.power}; try again when it runs`);
      if (allocation.backingUpSince !== null)
        throw new AppError("backup_running", "the box is being backed up; try again in a few minutes");
      const accepted = (await this.store.patch(
        allocation.id,
        {
          update_state: "pending",
          update_target: version,
          update_from: allocation.boxVersion,
          update_requested_at: now,
          update_error: null,
          next_check_at: now,
          attempts: 0,
        },
        { power: "running" },
        tx,
      )) as Allocation;
      await this.ctx.audit.write(
        {
          accountId: account.id,
          action: "managed.update_requested",
          subject: allocation.id,
          source,
          details: { from: allocation.boxVersion, to: version },
        },
        tx,
      );
      return { status: 202, body: accepted };
    });
    if (answer.body.updateState === "pending") this.onChange();
    return { status: answer.status, body: updateView(answer.body, offered) };
  }

  // ---- backups

  /** backups answers GET /api/managed/allocation/backups: the newest allocation's backups, tombstones included. */
  async backups(account: Account): Promise<BackupsView> {
    this.#assertOffered();
    this.#assertNotClosed(account);
    const allocation = await this.store.newest(account.id);
    if (!allocation) throw new AppError("allocation_not_found", "the account has no hosted machine");
    return backupsView(allocation, await this.store.backups(allocation.id), this.ctx.clock(), this.ctx.config.backupRetentionMs);
  }

  // ---- the proxy

  /**
   * boxFor answers the caller's box that `/boxes/<id>/…` names, ready and running, or throws:
   * 404 when it is not the caller's (or not there), 409 `box_not_running` when it sleeps or
   * is busy (a request never wakes a box: only POST wake does).
   */
  async boxFor(account: Account, allocationId: string): Promise<Allocation> {
    this.#assertOffered();
    this.#assertActive(account);
    const allocation = await this.store.byId(allocationId);
    if (!allocation || allocation.accountId !== account.id || allocation.status !== "ready") {
      throw new AppError("not_found", "no hosted machine of this account has this id");
    }
    if (allocation.power !== "running") {
      throw new AppError("box_not_running", `the box is ${allocation.power}; wake it with POST /api/managed/allocation/wake`);
    }
    return allocation;
  }

  // ---- operators (engine-cloud seats, invoices, trials, places)

  async #accountByEmail(email: string): Promise<Account> {
    const account = await this.ctx.accounts.byEmail(email);
    if (!account) throw new AppError("account_not_found", `no account for ${email}`);
    return account;
  }

  /** grantSeat gives an account a seat (a paid hosted machine); a second seat is `conflict`. */
  async grantSeat(email: string, invoiceId: string | null = null): Promise<void> {
    const account = await this.#accountByEmail(email);
    await this.ctx.db.transaction(async (tx) => {
      await this.ctx.accounts.lock(tx, account.id);
      if (await this.store.heldSeat(account.id, tx)) throw new AppError("conflict", `${email} holds a seat already`);
      await this.store.insertSeat(tx, account.id, invoiceId, this.ctx.clock());
      await this.ctx.audit.write({ accountId: account.id, action: "managed.seat_granted", details: { invoice_id: invoiceId } }, tx);
    });
  }

  /** releaseSeat ends an account's seat and closes its purchase request; its box is not touched (delete it to stop it). */
  async releaseSeat(email: string): Promise<boolean> {
    const account = await this.#accountByEmail(email);
    return this.ctx.db.transaction(async (tx) => {
      await this.ctx.accounts.lock(tx, account.id);
      const released = await this.store.releaseSeat(tx, account.id, this.ctx.clock());
      await this.store.closeRequests(tx, account.id, this.ctx.clock());
      if (released) await this.ctx.audit.write({ accountId: account.id, action: "managed.seat_released" }, tx);
      return released;
    });
  }

  /** openInvoice invoices an account by hand; it takes a launch place, so one must be free (`no_launch_place`). */
  async openInvoice(email: string, amount: string, note: string): Promise<Invoice> {
    const account = await this.#accountByEmail(email);
    const id = await this.ctx.db.transaction(async (tx) => {
      await this.ctx.accounts.lock(tx, account.id);
      if (await this.store.heldSeat(account.id, tx)) throw new AppError("conflict", `${email} holds a seat already`);
      if (!(await this.#launchPlaceFree(tx)))
        throw new AppError("no_launch_place", "no launch place is free: raise them with `engine-cloud places`");
      const now = this.ctx.clock();
      if (!(await this.store.openRequest(account.id, tx))) await this.store.insertRequest(tx, account.id, now);
      const invoiceId = await this.store.insertInvoice(tx, account.id, amount, note, now);
      await this.ctx.audit.write({ accountId: account.id, action: "managed.invoice_opened", subject: invoiceId, details: { amount } }, tx);
      return invoiceId;
    });
    return (await this.store.invoiceById(id)) as Invoice;
  }

  /** payInvoice marks an open invoice paid and grants its account a seat; void marks it void (its place is free again). */
  async decideInvoice(id: string, state: "paid" | "void"): Promise<Invoice> {
    await this.ctx.db.transaction(async (tx) => {
      const decided = await this.store.decideInvoice(tx, id, state, this.ctx.clock());
      if (!decided) throw new AppError("invoice_not_found", `no open invoice ${id}`);
      await this.ctx.accounts.lock(tx, decided.accountId);
      if (state === "paid" && !(await this.store.heldSeat(decided.accountId, tx))) {
        await this.store.insertSeat(tx, decided.accountId, id, this.ctx.clock());
      }
      await this.ctx.audit.write(
        { accountId: decided.accountId, action: state === "paid" ? "managed.invoice_paid" : "managed.invoice_voided", subject: id },
        tx,
      );
    });
    return (await this.store.invoiceById(id)) as Invoice;
  }

  /** setPlaces sets how many launch places (purchases) or trial places (trial boxes at once) there are. */
  async setPlaces(kind: "launch" | "trial", places: number): Promise<void> {
    if (!Number.isInteger(places) || places < 0 || places > 100_000) throw new AppError("invalid_request", "places must be a whole number");
    await this.store.setPlaces(kind, places, this.ctx.clock());
    await this.ctx.audit.write({ accountId: null, action: "managed.places_set", subject: kind, details: { places } });
  }

  /** placesSummary is what `engine-cloud places` and `trials` show. */
  async placesSummary(): Promise<{
    launch: { places: number; seats: number; open_invoices: number; free: number };
    trial: { places: number; running: number; free: number };
  }> {
    const used = await this.store.launchPlacesUsed();
    const launch = await this.store.places("launch");
    const trial = await this.store.places("trial");
    const running = await this.store.countCurrentTrials();
    return {
      launch: {
        places: launch,
        seats: used.seats,
        open_invoices: used.openInvoices,
        free: Math.max(0, launch - used.seats - used.openInvoices),
      },
      trial: { places: trial, running, free: Math.max(0, trial - running) },
    };
  }
}
