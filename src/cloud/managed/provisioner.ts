import { hostname } from "node:os";
import { randomId } from "../../lib/crypto";
import { AppError, isAppError } from "../../lib/errors";
import type { AuditEntry } from "../audit";
import type { ManagedService } from "./service";
import type { Allocation } from "./store";
import { MANAGED_RULES } from "./views";

/** ProvisionerOptions tune the provisioner; the defaults suit a console, tests shorten them. */
export interface ProvisionerOptions {
  /** intervalMs is how often it looks for due allocations when nothing wakes it sooner. */
  intervalMs?: number;
  /** leaseMs is how long a claimed allocation stays this provisioner's without renewal (renewed every third of it). */
  leaseMs?: number;
  /** operationTimeoutMs bounds one provider call; a call past it is a hung operation, retried later. */
  operationTimeoutMs?: number;
  /** recheckMs is how often a ready box is looked at (idle, backups, a box lost or crashed). */
  recheckMs?: number;
  /** maxAttempts failed tries of one step make the allocation (or its update) `failed`. */
  maxAttempts?: number;
  /** concurrency is how many allocations it works on at once. */
  concurrency?: number;
  /** owner names this provisioner in leases (host and pid by default). */
  owner?: string;
}

const DEFAULTS = {
  intervalMs: 1000,
  leaseMs: 30_000,
  operationTimeoutMs: 120_000,
  recheckMs: 5000,
  maxAttempts: 5,
  concurrency: 4,
} as const;

/** backoff is the wait before the n-th retry of a failed step: 1 s, 2 s, 4 s … up to a minute. */
function backoff(attempts: number): number {
  return Math.min(60_000, 1000 * 2 ** Math.max(0, attempts - 1));
}

/**
 * Provisioner makes the provider's boxes match what the allocations want (Daytona's desired
 * vs actual state), one allocation at a time under a lease:
 *
 * - it claims due allocations with a lease (PostgreSQL: `FOR UPDATE SKIP LOCKED`, so several
 *   provisioners can run and never act on one allocation at once; SQLite: one provisioner,
 *   which drops stale leases at start), renews the lease while it works, and gives it back
 *   with the time the allocation is next due;
 * - every provider call is idempotent and bounded by a deadline: a call past it is a hung
 *   operation, recorded and retried with backoff; a provisioner killed mid-operation leaves a
 *   lease that expires and an `operation` column, and whoever claims the row next repeats
 *   the step, which finishes it without a second box (the provider finds its boxes by the
 *   process table);
 * - it expires trials after their hour, retries owed deletes until the provider says done
 *   (after one attempt at a final backup, kept as a tombstone), starts woken boxes, runs
 *   updates as stop → update → start, puts idle boxes to sleep, notices boxes that crashed
 *   (started again) or were lost (the allocation fails and loses its sandbox, so the next
 *   POST replaces it), and backs boxes up once a day with retention.
 */
export class Provisioner {
  readonly owner: string;
  /** worked counts the allocations this provisioner has claimed (tests compare provisioners by it). */
  worked = 0;
  readonly #service: ManagedService;
  readonly #options: Required<Omit<ProvisionerOptions, "owner">>;
  #timer: ReturnType<typeof setTimeout> | null = null;
  #heartbeat: ReturnType<typeof setInterval> | null = null;
  #running: Promise<void> | null = null;
  #again = false;
  #stopped = true;
  /** #work is the allocations in hand, each with its work. */
  readonly #work = new Map<string, Promise<void>>();

  constructor(service: ManagedService, options: ProvisionerOptions = {}) {
    this.#service = service;
    this.owner = options.owner ?? `${hostname()}:${process.pid}:${randomId("prov").slice(5, 13)}`;
    this.#options = { ...DEFAULTS, ...Object.fromEntries(Object.entries(options).filter(([, v]) => v !== undefined)) } as Required<
      Omit<ProvisionerOptions, "owner">
    >;
  }

  get #ctx() {
    return this.#service.ctx;
  }

  /** start begins the loop. On SQLite it first drops every lease: there, one process is the only provisioner. */
  async start(): Promise<void> {
    if (!this.#stopped) return;
    this.#stopped = false;
    if (this.#ctx.db.dialect === "sqlite") {
      const dropped = await this.#service.store.releaseAll(this.#ctx.clock());
      if (dropped > 0) this.#ctx.log.info({ leases: dropped }, "provisioner took over the leases a stopped provisioner left");
    }
    this.#heartbeat = setInterval(() => void this.#renew(), Math.max(100, Math.floor(this.#options.leaseMs / 3)));
    this.#heartbeat.unref?.();
    this.kick();
  }

  /** stop ends the loop and waits for the work in hand (its leases are given back as each finishes). */
  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
    await this.#running;
    await Promise.all(this.#work.values());
    if (this.#heartbeat) clearInterval(this.#heartbeat);
    this.#heartbeat = null;
  }

  /** kick runs a pass now (a route recorded work, or a step finished), or right after the pass under way. */
  kick(): void {
    if (this.#stopped) return;
    if (this.#running) {
      this.#again = true;
      return;
    }
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
    this.#running = this.#loop().finally(() => {
      this.#running = null;
      if (this.#stopped) return;
      if (this.#again) {
        this.#again = false;
        this.kick();
        return;
      }
      this.#timer = setTimeout(() => this.kick(), this.#options.intervalMs);
      this.#timer.unref?.();
    });
  }

  /**
   * #loop claims what is due, up to the free slots, and starts working on it without waiting:
   * a slow or hung box never holds the others up. Each finished allocation kicks the next pass.
   */
  async #loop(): Promise<void> {
    try {
      const free = this.#options.concurrency - this.#work.size;
      if (free > 0) {
        for (const allocation of await this.#claim(free)) {
          this.worked += 1;
          const work = this.#work1(allocation).finally(() => {
            this.#work.delete(allocation.id);
            this.kick();
          });
          this.#work.set(allocation.id, work);
        }
      }
      await this.#forgetExpiredBackups();
    } catch (error) {
      this.#ctx.log.warn({ err: (error as Error).message }, "provisioner pass failed; retrying next round");
    }
  }

  async #renew(): Promise<void> {
    try {
      await this.#service.store.renew(this.owner, [...this.#work.keys()], Date.now() + this.#options.leaseMs);
    } catch (error) {
      this.#ctx.log.warn({ err: (error as Error).message }, "provisioner could not renew its leases");
    }
  }

  #claim(limit: number) {
    return this.#service.store.claim(
      this.owner,
      this.#ctx.clock(),
      Date.now(),
      Date.now() + this.#options.leaseMs,
      limit,
      this.#options.leaseMs,
    );
  }

  /** #work1 reconciles one claimed allocation and gives its lease back with the time it is next due. */
  async #work1(allocation: Allocation): Promise<void> {
    let next = this.#ctx.clock() + this.#options.recheckMs;
    try {
      next = await this.reconcile(allocation);
    } catch (error) {
      this.#ctx.log.warn({ allocation: allocation.id, err: (error as Error).message }, "reconcile failed");
    } finally {
      await this.#service.store.release(this.owner, allocation.id, next).catch(() => undefined);
    }
  }

  /**
   * tick claims the due allocations and reconciles each, waiting for all of them (tests drive
   * provisioners with it; the loop does not wait). It answers how many it worked on.
   */
  async tick(): Promise<number> {
    const claimed = await this.#claim(this.#options.concurrency);
    this.worked += claimed.length;
    await Promise.all(
      claimed.map((allocation) => {
        const work = this.#work1(allocation).finally(() => this.#work.delete(allocation.id));
        this.#work.set(allocation.id, work);
        return work;
      }),
    );
    return claimed.length;
  }

  /**
   * #call runs one provider call under the operation deadline, recording the operation on the
   * row first, so a provisioner that dies mid-call leaves a trace for the next one.
   */
  async #call<T>(allocation: Allocation, operation: string, fn: () => Promise<T>): Promise<T> {
    await this.#service.store.patch(allocation.id, { operation, operation_started_at: this.#ctx.clock() });
    return this.#deadline(operation, fn);
  }

  /** #deadline bounds one provider call: past operationTimeoutMs it is a hung operation (`operation_hung`). */
  async #deadline<T>(operation: string, fn: () => Promise<T>): Promise<T> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const hung = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new AppError("operation_hung", `${operation} did not answer within ${this.#options.operationTimeoutMs} ms`)),
        this.#options.operationTimeoutMs,
      );
    });
    try {
      return await Promise.race([fn(), hung]);
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * #transition changes an allocation by compare-and-set and writes its audit row in the same
   * transaction, so a state change and its record are never seen apart. It answers the row
   * after the change, or null when the row was changed first by someone else (nothing written).
   */
  async #transition(
    allocation: Allocation,
    set: Parameters<ManagedService["store"]["patch"]>[1],
    where: Parameters<ManagedService["store"]["patch"]>[2],
    entry: Omit<AuditEntry, "accountId" | "subject">,
  ): Promise<Allocation | null> {
    return this.#ctx.db.transaction(async (tx) => {
      const changed = await this.#service.store.patch(allocation.id, set, where, tx);
      if (changed) await this.#ctx.audit.write({ accountId: allocation.accountId, subject: allocation.id, ...entry }, tx);
      return changed;
    });
  }

  #message(error: unknown): string {
    return isAppError(error) ? `${error.code}: ${error.message}` : (error as Error).message;
  }

  /** reconcile does the next step one allocation needs and answers when it is next due. */
  async reconcile(claimed: Allocation): Promise<number> {
    const now = this.#ctx.clock();
    let allocation = claimed;
    if (allocation.operation) {
      this.#ctx.log.info({ allocation: allocation.id, operation: allocation.operation }, "resuming an operation a provisioner left");
    }
    // A backup still marked running when the row is claimed was left by a provisioner that stopped.
    if (allocation.backingUpSince !== null) {
      await this.#service.store.failRunningBackups(allocation.id, "interrupted: the provisioner stopped while it ran");
      allocation = (await this.#service.store.patch(allocation.id, { backing_up_since: null })) ?? allocation;
    }
    if (
      allocation.kind === "trial" &&
      allocation.expiresAt !== null &&
      allocation.expiresAt <= now &&
      ["provisioning", "ready", "failed"].includes(allocation.status)
    ) {
      const expired = await this.#ctx.db.transaction((tx) => this.#service.beginDelete(tx, allocation, "expired", "provisioner"));
      if (expired) allocation = expired;
    }
    switch (allocation.status) {
      case "provisioning":
        return this.#provision(allocation);
      case "deleting":
        return this.#delete(allocation);
      case "ready":
        return this.#ready(allocation);
      default:
        // failed: nothing to do but wait for its trial hour or a delete.
        return allocation.expiresAt !== null ? Math.min(allocation.expiresAt, now + 60_000) : now + 60_000;
    }
  }

  async #provision(allocation: Allocation): Promise<number> {
    const provider = this.#service.provider;
    const spec = { version: allocation.boxVersion, templateVersion: allocation.templateVersion };
    try {
      await this.#call(allocation, "create", async () => {
        if (allocation.restoreFrom) {
          const backup = await this.#service.store.backupById(allocation.restoreFrom);
          if (!backup) throw new AppError("not_found", `backup ${allocation.restoreFrom} is gone`);
          const source = await this.#service.store.byId(backup.allocationId);
          await provider.restore(source?.sandboxId ?? backup.allocationId, backup.id, allocation.id, spec);
        } else await provider.create(allocation.id, spec);
      });
      await this.#service.store.patch(allocation.id, { sandbox_id: allocation.id });
      await this.#call(allocation, "start", () => provider.start(allocation.id));
      const now = this.#ctx.clock();
      const ready = await this.#transition(
        allocation,
        {
          status: "ready",
          power: "running",
          ready_at: now,
          last_activity_at: now,
          operation: null,
          operation_started_at: null,
          attempts: 0,
          error: null,
        },
        { status: "provisioning" },
        { action: "managed.ready" },
      );
      if (ready) this.#ctx.log.info({ allocation: allocation.id }, "hosted box ready");
      return now;
    } catch (error) {
      return this.#stepFailed(allocation, "provision", error);
    }
  }

  /** #stepFailed records a failed step; past maxAttempts a box being made fails (losing its sandbox if the provider has none). */
  async #stepFailed(allocation: Allocation, step: string, error: unknown): Promise<number> {
    const attempts = allocation.attempts + 1;
    const message = `${step}: ${this.#message(error)}`;
    this.#ctx.log.warn({ allocation: allocation.id, attempts, err: message }, "hosted box step failed");
    const now = this.#ctx.clock();
    if (allocation.status === "provisioning" && attempts >= this.#options.maxAttempts) {
      const present = await this.#present(allocation.id);
      await this.#transition(
        allocation,
        { status: "failed", power: "none", attempts, error: message, operation: null, sandbox_id: present ? allocation.id : null },
        { status: "provisioning" },
        { action: "managed.failed", details: { error: message.slice(0, 300), sandbox: present } },
      );
      return now + 60_000;
    }
    await this.#service.store.patch(allocation.id, { attempts, error: message, operation: null });
    return now + backoff(attempts);
  }

  /** #present asks whether the provider has the box; an unanswered question counts as present. */
  async #present(id: string): Promise<boolean> {
    try {
      return (await this.#deadline("status", () => this.#service.provider.status(id))).state !== "absent";
    } catch {
      return true;
    }
  }

  async #delete(allocation: Allocation): Promise<number> {
    const provider = this.#service.provider;
    const sandbox = allocation.sandboxId;
    if (sandbox && !allocation.finalBackupTried) {
      // One try at a last backup, kept as a tombstone; a failure never holds the delete up.
      await this.#service.store.patch(allocation.id, { final_backup_tried: 1 });
      if (await this.#present(sandbox)) await this.#backup({ ...allocation, finalBackupTried: true }, "final");
    }
    try {
      const result = sandbox ? await this.#call(allocation, "destroy", () => provider.destroy(sandbox)) : "done";
      if (result === "done") {
        await this.#service.store.patch(allocation.id, { operation: null, attempts: 0 });
        const done = await this.#service.finishDelete(allocation);
        if (done) this.#ctx.log.info({ allocation: allocation.id }, "hosted box deleted");
        return this.#ctx.clock() + 60_000;
      }
      const attempts = allocation.attempts + 1;
      await this.#service.store.patch(allocation.id, {
        attempts,
        error: "destroy: the provider still holds part of the box",
        operation: null,
      });
      return this.#ctx.clock() + backoff(attempts);
    } catch (error) {
      // An owed delete is retried until the provider says done: it never fails for good.
      const attempts = allocation.attempts + 1;
      const message = `destroy: ${this.#message(error)}`;
      this.#ctx.log.warn({ allocation: allocation.id, attempts, err: message }, "hosted box delete failed; retrying");
      await this.#service.store.patch(allocation.id, { attempts, error: message, operation: null });
      return this.#ctx.clock() + backoff(attempts);
    }
  }

  async #ready(allocation: Allocation): Promise<number> {
    const provider = this.#service.provider;
    const id = allocation.sandboxId ?? allocation.id;
    if (allocation.updateState === "pending" || allocation.updateState === "running") return this.#update(allocation);
    if (allocation.power === "starting") {
      try {
        await this.#call(allocation, "start", () => provider.start(id));
        const now = this.#ctx.clock();
        await this.#transition(
          allocation,
          { power: "running", start_started_at: null, last_activity_at: now, operation: null, attempts: 0, error: null },
          { power: "starting", status: "ready" },
          { action: "managed.woke" },
        );
        return now + this.#options.recheckMs;
      } catch (error) {
        return this.#stepFailed(allocation, "start", error);
      }
    }
    let status: Awaited<ReturnType<typeof provider.status>>;
    try {
      status = await this.#call(allocation, "status", () => provider.status(id));
    } catch (error) {
      return this.#stepFailed(allocation, "status", error);
    }
    await this.#service.store.patch(allocation.id, { operation: null });
    const now = this.#ctx.clock();
    if (status.state === "absent") {
      const lost = await this.#ctx.db.transaction(async (tx) => {
        const changed = await this.#service.store.patch(
          allocation.id,
          { status: "failed", power: "none", sandbox_id: null, error: "the box is gone at the provider" },
          { status: "ready" },
          tx,
        );
        if (!changed) return null;
        if (allocation.nodeId) await this.#ctx.nodes.unlink(tx, allocation.nodeId);
        await this.#ctx.audit.write({ accountId: allocation.accountId, action: "managed.lost", subject: allocation.id }, tx);
        return changed;
      });
      if (lost) {
        this.#ctx.log.warn({ allocation: allocation.id }, "hosted box lost at the provider");
      }
      return now + 60_000;
    }
    if (status.version && status.version !== allocation.boxVersion) {
      await this.#service.store.patch(allocation.id, { box_version: status.version });
    }
    if (allocation.power === "running" && status.state === "stopped") {
      // Crashed (or stopped behind our back): a box that should run is started again.
      this.#ctx.log.warn({ allocation: allocation.id }, "hosted box found stopped; starting it again");
      try {
        await this.#call(allocation, "start", () => provider.start(id));
        await this.#service.store.patch(allocation.id, { operation: null, attempts: 0, error: null });
        return now + this.#options.recheckMs;
      } catch (error) {
        return this.#stepFailed(allocation, "restart", error);
      }
    }
    if (allocation.power === "running" && allocation.sleepAfterMs > 0) {
      const lastActive = Math.max(allocation.lastActivityAt ?? 0, allocation.readyAt ?? 0);
      if (now - lastActive >= allocation.sleepAfterMs) return this.#sleep(allocation, true);
    }
    if (allocation.power === "stopping") return this.#sleep(allocation, false);
    if ((allocation.power === "running" || allocation.power === "asleep") && (await this.#backupDue(allocation, now))) {
      await this.#backup(allocation, "nightly");
    }
    let next = now + this.#options.recheckMs;
    if (allocation.expiresAt !== null) next = Math.min(next, allocation.expiresAt);
    return next;
  }

  /**
   * #sleep stops an idle box. When `idle` decided it, the box goes to `stopping` only if no
   * request came since the row was read (compare-and-set on its last activity).
   */
  async #sleep(allocation: Allocation, idle: boolean): Promise<number> {
    const id = allocation.sandboxId ?? allocation.id;
    const stopping = await this.#service.store.patch(
      allocation.id,
      { power: "stopping" },
      idle
        ? { power: "running", status: "ready", last_activity_at: allocation.lastActivityAt }
        : { power: ["running", "stopping"], status: "ready" },
    );
    if (!stopping) return this.#ctx.clock();
    try {
      await this.#call(allocation, "stop", () => this.#service.provider.stop(id));
      const asleep = await this.#transition(
        allocation,
        { power: "asleep", operation: null, attempts: 0, error: null },
        { power: "stopping" },
        { action: "managed.slept" },
      );
      if (asleep) this.#ctx.log.info({ allocation: allocation.id }, "hosted box asleep");
      return this.#ctx.clock() + this.#options.recheckMs;
    } catch (error) {
      return this.#stepFailed(stopping, "sleep", error);
    }
  }

  /**
   * #update runs stop → update → start. Each step is idempotent, so a retry (or a provisioner
   * taking over) repeats the sequence safely. After maxAttempts the update is `failed` and
   * the box is left as the provider has it; it is never moved back to an older release.
   */
  async #update(allocation: Allocation): Promise<number> {
    const provider = this.#service.provider;
    const id = allocation.sandboxId ?? allocation.id;
    const target = allocation.updateTarget as string;
    const running = await this.#service.store.patch(
      allocation.id,
      { update_state: "running", power: "updating" },
      { update_state: ["pending", "running"], status: "ready" },
    );
    if (!running) return this.#ctx.clock();
    try {
      await this.#call(allocation, "stop", () => provider.stop(id));
      await this.#call(allocation, "update", () => provider.update(id, target));
      await this.#call(allocation, "start", () => provider.start(id));
      const now = this.#ctx.clock();
      await this.#transition(
        allocation,
        { update_state: "done", box_version: target, power: "running", last_activity_at: now, operation: null, attempts: 0, error: null },
        { update_state: "running" },
        { action: "managed.updated", details: { from: allocation.updateFrom, to: target } },
      );
      return now + this.#options.recheckMs;
    } catch (error) {
      const attempts = allocation.attempts + 1;
      const message = this.#message(error);
      const now = this.#ctx.clock();
      if (attempts < this.#options.maxAttempts) {
        await this.#service.store.patch(allocation.id, { attempts, error: `update: ${message}`, operation: null });
        return now + backoff(attempts);
      }
      let state: Awaited<ReturnType<typeof provider.status>> | null = null;
      try {
        state = await provider.status(id);
      } catch {
        // unknown: shown as asleep, the next look finds out
      }
      await this.#transition(
        allocation,
        {
          update_state: "failed",
          update_error: message,
          power: state?.state === "running" ? "running" : "asleep",
          box_version: state?.version ?? allocation.boxVersion,
          attempts: 0,
          operation: null,
        },
        { update_state: "running" },
        { action: "managed.update_failed", details: { to: target, error: message.slice(0, 300) } },
      );
      return now + this.#options.recheckMs;
    }
  }

  async #backupDue(allocation: Allocation, now: number): Promise<boolean> {
    const backups = await this.#service.store.backups(allocation.id);
    const lastFailed = backups.find((backup) => backup.state === "failed");
    if (lastFailed && now - lastFailed.startedAt < MANAGED_RULES.backupRetryMs && backups[0]?.state === "failed") return false;
    const lastGood = backups.find((backup) => backup.state === "done");
    const since = lastGood?.startedAt ?? allocation.readyAt ?? allocation.createdAt;
    return now - since >= MANAGED_RULES.backupEveryMs;
  }

  /** #backup takes one backup; while it runs the allocation is `backing_up` (an update is refused). */
  async #backup(allocation: Allocation, kind: "nightly" | "final"): Promise<void> {
    const id = allocation.sandboxId ?? allocation.id;
    const now = this.#ctx.clock();
    await this.#service.store.patch(allocation.id, { backing_up_since: now });
    const backup = await this.#service.store.insertBackup(allocation, kind, now);
    try {
      const info = await this.#call(allocation, "backup", () => this.#service.provider.backup(id, backup.id));
      const takenAt = this.#ctx.clock();
      // The backup's end and its audit row in one transaction: one is never seen without the other.
      await this.#ctx.db.transaction(async (tx) => {
        await this.#service.store.finishBackup(
          backup.id,
          { state: "done", sizeBytes: info.sizeBytes, takenAt, expiresAt: takenAt + this.#ctx.config.backupRetentionMs },
          tx,
        );
        await this.#ctx.audit.write(
          {
            accountId: allocation.accountId,
            action: "managed.backed_up",
            subject: allocation.id,
            details: { backup_id: backup.id, kind, size_bytes: info.sizeBytes },
          },
          tx,
        );
      });
    } catch (error) {
      const message = this.#message(error);
      await this.#ctx.db.transaction(async (tx) => {
        await this.#service.store.finishBackup(
          backup.id,
          { state: "failed", error: message, expiresAt: now + this.#ctx.config.backupRetentionMs },
          tx,
        );
        await this.#ctx.audit.write(
          {
            accountId: allocation.accountId,
            action: "managed.backup_failed",
            subject: allocation.id,
            details: { backup_id: backup.id, kind, error: message.slice(0, 300) },
          },
          tx,
        );
      });
    } finally {
      await this.#service.store.patch(allocation.id, { backing_up_since: null, operation: null });
    }
  }

  /** #forgetExpiredBackups removes backups past their retention (and the tombstones of deleted boxes past theirs). */
  async #forgetExpiredBackups(): Promise<void> {
    const now = this.#ctx.clock();
    for (const backup of await this.#service.store.dueToForget(now)) {
      const allocation = await this.#service.store.byId(backup.allocationId);
      // A live box keeps its newest finished backup past its retention (a box that cannot be backed up still has one).
      if (allocation && allocation.status !== "deleted") {
        const [newest] = (await this.#service.store.backups(allocation.id)).filter((b) => b.state === "done");
        if (newest?.id === backup.id) continue;
      }
      try {
        if (backup.state === "done") await this.#service.provider.forgetBackup(allocation?.sandboxId ?? backup.allocationId, backup.id);
        await this.#service.store.forgetBackup(backup.id, now);
      } catch (error) {
        this.#ctx.log.warn({ backup: backup.id, err: (error as Error).message }, "could not remove an expired backup");
      }
    }
  }
}
