import { AppError } from "../../../lib/errors";
import type { BackupInfo, BoxEndpoint, BoxProvider, BoxSpec, BoxStatus, DestroyResult } from "./provider";

/** ProviderOperation names each call of the provider interface a fault can be put on. */
export type ProviderOperation = "create" | "start" | "stop" | "status" | "update" | "backup" | "restore" | "destroy";
export const PROVIDER_OPERATIONS: readonly ProviderOperation[] = [
  "create",
  "start",
  "stop",
  "status",
  "update",
  "backup",
  "restore",
  "destroy",
];

/**
 * Fault is what a scripted call does instead of (or before) the real one:
 * - `fail`: throws `provider_failed` without calling through;
 * - `hang`: never answers (the caller's deadline must end it);
 * - `slow`: waits `ms`, then calls through;
 * - `slow_after`: calls through, then waits `ms` before answering (the work is done, the answer late);
 * - `lose`: destroys the box behind the caller's back, then calls through (a box lost at the provider).
 * `times` bounds how many calls the fault applies to (default: every call until cleared).
 */
export interface Fault {
  kind: "fail" | "hang" | "slow" | "slow_after" | "lose";
  ms?: number;
  times?: number;
}

/** ScriptedCall is one call the wrapper saw, for tests to assert on order and overlap. */
export interface ScriptedCall {
  operation: ProviderOperation;
  id: string;
  at: number;
  /** overlapping is how many calls on the same box were in flight when this one began (0: none). */
  overlapping: number;
}

/**
 * ScriptedProvider wraps a real provider (the local one) and injects faults per operation, for
 * tests: fail, hang, slow, or lose the box. It also records every call and how many calls on
 * the same box overlapped, so a test can show two provisioners never act on one box at once.
 * Faults may be set in code or from JSON (`ENGINE_CLOUD_BOX_FAULTS`, e.g.
 * `{"start":[{"kind":"slow_after","ms":3000}]}`), for a test that runs the console as a process.
 */
export class ScriptedProvider implements BoxProvider {
  readonly name = "scripted";
  readonly calls: ScriptedCall[] = [];
  readonly #inner: BoxProvider;
  readonly #faults = new Map<ProviderOperation, Fault[]>();
  readonly #inFlight = new Map<string, number>();
  #offered: string[] | null = null;

  constructor(inner: BoxProvider, faults: Partial<Record<ProviderOperation, Fault[]>> = {}) {
    this.#inner = inner;
    for (const [operation, list] of Object.entries(faults)) this.#faults.set(operation as ProviderOperation, [...(list ?? [])]);
  }

  /** parseFaults reads the JSON form of a fault script, naming the first bad entry. */
  static parseFaults(raw: string): Partial<Record<ProviderOperation, Fault[]>> {
    let parsed: unknown;
    try {
      parsed = JSON.parse(raw);
    } catch {
      throw new AppError("config_invalid", "ENGINE_CLOUD_BOX_FAULTS is not JSON");
    }
    const out: Partial<Record<ProviderOperation, Fault[]>> = {};
    for (const [operation, list] of Object.entries(parsed as Record<string, unknown>)) {
      if (!PROVIDER_OPERATIONS.includes(operation as ProviderOperation) || !Array.isArray(list)) {
        throw new AppError("config_invalid", `ENGINE_CLOUD_BOX_FAULTS: ${operation} is not an operation with a list of faults`);
      }
      for (const fault of list as Fault[]) {
        if (!["fail", "hang", "slow", "slow_after", "lose"].includes(fault?.kind)) {
          throw new AppError("config_invalid", `ENGINE_CLOUD_BOX_FAULTS: ${operation} has a fault of unknown kind`);
        }
      }
      out[operation as ProviderOperation] = list as Fault[];
    }
    return out;
  }

  /** inject adds a fault to an operation; faults apply in the order added. */
  inject(operation: ProviderOperation, fault: Fault): void {
    this.#faults.set(operation, [...(this.#faults.get(operation) ?? []), fault]);
  }

  /** clear removes the faults of one operation, or of all. */
  clear(operation?: ProviderOperation): void {
    if (operation) this.#faults.delete(operation);
    else this.#faults.clear();
  }

  /** maxOverlap is the most calls ever in flight at once on one box, minus one (0: never two at once). */
  maxOverlap(operations?: ProviderOperation[]): number {
    return Math.max(0, ...this.calls.filter((c) => !operations || operations.includes(c.operation)).map((c) => c.overlapping));
  }

  #next(operation: ProviderOperation): Fault | undefined {
    const list = this.#faults.get(operation);
    const fault = list?.[0];
    if (!fault) return undefined;
    if (fault.times !== undefined) {
      fault.times -= 1;
      if (fault.times <= 0) list?.shift();
    }
    return fault;
  }

  async #call<T>(operation: ProviderOperation, id: string, real: () => Promise<T>): Promise<T> {
    // status is read-only and asked freely (the API asks it too): it is not counted as acting.
    const acting = operation !== "status";
    const overlapping = acting ? (this.#inFlight.get(id) ?? 0) : 0;
    this.calls.push({ operation, id, at: Date.now(), overlapping });
    if (acting) this.#inFlight.set(id, overlapping + 1);
    try {
      const fault = this.#next(operation);
      if (fault?.kind === "fail") throw new AppError("provider_failed", `scripted failure of ${operation} on ${id}`);
      if (fault?.kind === "hang") await new Promise(() => {});
      if (fault?.kind === "slow") await Bun.sleep(fault.ms ?? 1000);
      if (fault?.kind === "lose") await this.#inner.destroy(id);
      const result = await real();
      if (fault?.kind === "slow_after") await Bun.sleep(fault.ms ?? 1000);
      return result;
    } finally {
      if (acting) this.#inFlight.set(id, (this.#inFlight.get(id) ?? 1) - 1);
    }
  }

  /** offer narrows the releases the provider reports (a newer one "arrives" when the test offers it); null reports them all. */
  offer(versions: string[] | null): void {
    this.#offered = versions;
  }

  releases(): string[] {
    return this.#offered ?? this.#inner.releases();
  }
  create(id: string, spec: BoxSpec): Promise<void> {
    return this.#call("create", id, () => this.#inner.create(id, spec));
  }
  start(id: string): Promise<void> {
    return this.#call("start", id, () => this.#inner.start(id));
  }
  stop(id: string): Promise<void> {
    return this.#call("stop", id, () => this.#inner.stop(id));
  }
  status(id: string): Promise<BoxStatus> {
    return this.#call("status", id, () => this.#inner.status(id));
  }
  update(id: string, version: string): Promise<void> {
    return this.#call("update", id, () => this.#inner.update(id, version));
  }
  backup(id: string, backupId: string): Promise<BackupInfo> {
    return this.#call("backup", id, () => this.#inner.backup(id, backupId));
  }
  restore(sourceId: string, backupId: string, id: string, spec: BoxSpec): Promise<void> {
    return this.#call("restore", id, () => this.#inner.restore(sourceId, backupId, id, spec));
  }
  forgetBackup(sourceId: string, backupId: string): Promise<void> {
    return this.#inner.forgetBackup(sourceId, backupId);
  }
  destroy(id: string): Promise<DestroyResult> {
    return this.#call("destroy", id, () => this.#inner.destroy(id));
  }
  endpoint(id: string): BoxEndpoint {
    return this.#inner.endpoint(id);
  }
}
