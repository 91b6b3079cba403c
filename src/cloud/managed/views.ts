import type { Static } from "@sinclair/typebox";
import type {
  ManagedAllocationView,
  ManagedBackupsView,
  ManagedPurchaseView,
  ManagedUpdateView,
  ManagedWakeView,
} from "../../contract/cloud";
import type { Allocation, Backup, Invoice } from "./store";

export type PurchaseView = Static<typeof ManagedPurchaseView>;
export type AllocationView = Static<typeof ManagedAllocationView>;
export type WakeView = Static<typeof ManagedWakeView>;
export type UpdateView = Static<typeof ManagedUpdateView>;
export type BackupsView = Static<typeof ManagedBackupsView>;

const iso = (ms: number | null): string | null => (ms === null ? null : new Date(ms).toISOString());

/**
 * MANAGED_RULES are the numbers of the hosted-machine rules: the contract's (a trial lives
 * one hour, updates are 3 minutes apart, a start over two minutes refuses a wake) and ours
 * (docs/decisions.md 300–329: the start budget, the backup cadence and what counts healthy).
 */
export const MANAGED_RULES = {
  trialLifetimeMs: 3_600_000,
  updateSpacingMs: 180_000,
  startStuckMs: 120_000,
  /** startBudget starts are accepted per startWindowMs; a wake past them is 429. */
  startBudget: 6,
  startWindowMs: 3_600_000,
  /** backupEveryMs: a box is backed up once a day ("nightly"), a failed backup retried after backupRetryMs. */
  backupEveryMs: 86_400_000,
  backupRetryMs: 3_600_000,
  /** backupHealthyMs: a newest successful backup older than this (a day and two hours) is not healthy. */
  backupHealthyMs: 26 * 3_600_000,
} as const;

/** boxUrl is where a box's engine API is reached through the console. */
export function boxUrl(publicUrl: string, allocation: Allocation): string | null {
  return allocation.status === "ready" ? `${publicUrl}/boxes/${allocation.id}/` : null;
}

/** billingActive is derived, never stored: a paid box bills while it starts or runs, not once it stops, sleeps or is deleted. */
export function billingActive(allocation: Allocation): boolean {
  return allocation.kind === "paid" && allocation.status === "ready" && ["starting", "running", "updating"].includes(allocation.power);
}

export function allocationView(allocation: Allocation, publicUrl: string): AllocationView {
  return {
    id: allocation.id,
    kind: allocation.kind,
    status: allocation.status,
    power: allocation.power,
    sandbox_id: allocation.sandboxId,
    node_id: allocation.nodeId,
    url: boxUrl(publicUrl, allocation),
    box_version: allocation.boxVersion,
    template_version: allocation.templateVersion,
    sleep_after_s: Math.round(allocation.sleepAfterMs / 1000),
    expires_at: iso(allocation.expiresAt),
    created_at: iso(allocation.createdAt) as string,
    ready_at: iso(allocation.readyAt),
    last_activity_at: iso(allocation.lastActivityAt),
    delete_requested_at: iso(allocation.deleteRequestedAt),
    deleted_at: iso(allocation.deletedAt),
    billing_active: billingActive(allocation),
    update: { state: allocation.updateState ?? "idle", target_version: allocation.updateTarget, error: allocation.updateError },
    error: allocation.error,
  };
}

export function wakeView(allocation: Allocation, publicUrl: string): WakeView {
  return {
    allocation_id: allocation.id,
    power: allocation.power,
    start_started_at: iso(allocation.startStartedAt),
    url: boxUrl(publicUrl, allocation),
  };
}

export function updateView(allocation: Allocation, offered: string): UpdateView {
  return {
    allocation_id: allocation.id,
    current_version: allocation.boxVersion,
    offered_version: offered,
    state: allocation.updateState ?? "idle",
    target_version: allocation.updateTarget,
    requested_at: iso(allocation.updateRequestedAt),
    next_allowed_at: iso(allocation.updateRequestedAt === null ? null : allocation.updateRequestedAt + MANAGED_RULES.updateSpacingMs),
    error: allocation.updateError,
  };
}

export function purchaseView(fields: {
  paid: boolean;
  seatSince: number | null;
  request: { requestedAt: number } | null;
  invoice: Invoice | null;
  placeFree: boolean;
}): PurchaseView {
  const { invoice } = fields;
  const state = fields.paid ? "paid" : invoice?.state === "open" ? "invoiced" : fields.request ? "requested" : "none";
  return {
    state,
    requested_at: iso(fields.request?.requestedAt ?? null),
    invoice: invoice
      ? { id: invoice.id, state: invoice.state, amount: invoice.amount, created_at: iso(invoice.createdAt) as string }
      : null,
    seat_since: iso(fields.seatSince),
    launch_place_free: fields.placeFree,
  };
}

/**
 * backupsView shows an allocation's backups, newest first. Healthy means the newest finished
 * attempt succeeded less than a day and two hours ago, or the box is younger than that and no
 * attempt failed; a deleted box is healthy while a tombstone is kept.
 */
export function backupsView(allocation: Allocation, backups: Backup[], now: number, retentionMs: number): BackupsView {
  const done = backups.filter((backup) => backup.state === "done");
  const finished = backups.filter((backup) => backup.state !== "running");
  const lastBackupAt = done[0]?.takenAt ?? null;
  let healthy: boolean;
  if (allocation.status === "deleted" || allocation.status === "deleting") healthy = done.length > 0;
  else if (finished[0]?.state === "failed") healthy = false;
  else if (lastBackupAt !== null) healthy = now - lastBackupAt < MANAGED_RULES.backupHealthyMs;
  else healthy = now - (allocation.readyAt ?? allocation.createdAt) < MANAGED_RULES.backupHealthyMs;
  return {
    allocation_id: allocation.id,
    allocation_status: allocation.status,
    healthy,
    last_backup_at: iso(lastBackupAt),
    retention_days: Math.round(retentionMs / 86_400_000),
    backups: backups.map((backup) => ({
      id: backup.id,
      kind: backup.kind,
      state: backup.state,
      size_bytes: backup.sizeBytes,
      started_at: iso(backup.startedAt) as string,
      taken_at: iso(backup.takenAt),
      expires_at: iso(backup.expiresAt),
      tombstone: allocation.status === "deleted" && backup.state === "done",
      error: backup.error,
    })),
  };
}
