import { type Static, Type as t } from "@sinclair/typebox";
import type { Clock } from "../../lib/clock";
import { iso } from "../../lib/clock";
import { randomId } from "../../lib/crypto";
import type { ToolApi } from "./context";

/**
 * Operation is a handle on work that can outlast one tool call (MCP clients give up on a call
 * after a minute or so; a build or a restore can take far longer): the tool that starts it
 * answers at once with the handle, and `get_operation` reports on it until it is done.
 */
export const Operation = t.Object({
  id: t.String({ description: "The handle to pass to get_operation" }),
  kind: t.Union([t.Literal("build"), t.Literal("restore")]),
  service: t.String(),
  state: t.Union([t.Literal("running"), t.Literal("succeeded"), t.Literal("failed")]),
  started_at: t.String({ format: "date-time" }),
  finished_at: t.Union([t.String({ format: "date-time" }), t.Null()]),
  result: t.Union([t.Record(t.String(), t.Unknown()), t.Null()], { description: "What the work produced, once it succeeded" }),
  error: t.Union([
    t.Object({ status: t.Union([t.Integer(), t.Null()]), code: t.String(), message: t.String() }, { additionalProperties: true }),
    t.Null(),
  ]),
  poll_after_s: t.Integer({ description: "Ask again after this many seconds while the state is running" }),
});
export type Operation = Static<typeof Operation>;

/** OperationOutcome is what a poll of the work found. */
export type OperationOutcome =
  | { state: "running" }
  | { state: "succeeded"; result: Record<string, unknown> }
  | { state: "failed"; error: { status: number | null; code: string; message: string } };

/**
 * OperationProbe reports on work that is not held in this process (a build runs in the
 * daemon): it is asked on every poll, through the poller's own ToolApi, so it reads with the
 * credentials of the call that asks, never with ones kept from the call that started it.
 */
export type OperationProbe = (api: ToolApi) => Promise<OperationOutcome>;

interface Entry {
  owner: string;
  record: Operation;
  /** probe asks the daemon again; absent for work this process holds (its promise settles the record). */
  probe?: OperationProbe;
  /** done settles when work this process holds has settled the record. */
  done?: Promise<void>;
  touched: number;
}

/** OPERATION_TTL_MS is how long a finished operation can still be read. */
const OPERATION_TTL_MS = 60 * 60_000;
/** MAX_OPERATIONS bounds the book; the oldest finished ones go first. */
const MAX_OPERATIONS = 1000;

/**
 * OperationBook holds the operations of one MCP server: the daemon's (every `/mcp` caller,
 * each seeing only its own, keyed by token) or one `engine mcp` process's. Operations live in
 * memory: a daemon restart forgets them, and the service's own record still tells the outcome.
 */
export class OperationBook {
  readonly #entries = new Map<string, Entry>();
  readonly #clock: Clock;

  constructor(clock: Clock) {
    this.#clock = clock;
  }

  /** track records work this process holds: `work` settles the operation. */
  track(
    owner: string,
    kind: Operation["kind"],
    service: string,
    work: Promise<Record<string, unknown>>,
    toFailure: (error: unknown) => OperationOutcome & { state: "failed" },
  ): Operation {
    const entry = this.#add(owner, kind, service);
    entry.done = work.then(
      (result) => this.#settle(entry, { state: "succeeded", result }),
      (error) => this.#settle(entry, toFailure(error)),
    );
    return entry.record;
  }

  /** watch records work the daemon holds: `probe` is asked on each poll. */
  watch(owner: string, kind: Operation["kind"], service: string, probe: OperationProbe): Operation {
    const entry = this.#add(owner, kind, service);
    entry.probe = probe;
    return entry.record;
  }

  /**
   * get answers the operation `id` if `owner` started it, asking its probe first when it is
   * still running; null otherwise (another caller's handle reads as unknown).
   */
  async get(owner: string, id: string, api: ToolApi): Promise<Operation | null> {
    const entry = this.#entries.get(id);
    if (!entry || entry.owner !== owner) return null;
    entry.touched = this.#clock.now().getTime();
    if (entry.record.state === "running" && entry.probe) this.#settle(entry, await entry.probe(api));
    return { ...entry.record };
  }

  /**
   * settled waits until work this process holds is done or `ms` have passed, and answers the
   * operation's record then (a probed operation is answered as it is now).
   */
  async settled(owner: string, id: string, ms: number, api: ToolApi): Promise<Operation | null> {
    const done = this.#entries.get(id)?.done;
    if (done && ms > 0) {
      let timer: ReturnType<typeof setTimeout> | undefined;
      await Promise.race([done, new Promise<void>((resolve) => (timer = setTimeout(resolve, ms)))]);
      clearTimeout(timer);
    }
    return this.get(owner, id, api);
  }

  #add(owner: string, kind: Operation["kind"], service: string): Entry {
    this.#prune();
    const now = this.#clock.now();
    const entry: Entry = {
      owner,
      touched: now.getTime(),
      record: {
        id: randomId("op"),
        kind,
        service,
        state: "running",
        started_at: iso(now),
        finished_at: null,
        result: null,
        error: null,
        poll_after_s: kind === "build" ? 10 : 5,
      },
    };
    this.#entries.set(entry.record.id, entry);
    return entry;
  }

  #settle(entry: Entry, outcome: OperationOutcome): void {
    if (outcome.state === "running" || entry.record.state !== "running") return;
    entry.record = {
      ...entry.record,
      state: outcome.state,
      finished_at: iso(this.#clock.now()),
      result: outcome.state === "succeeded" ? outcome.result : null,
      error: outcome.state === "failed" ? outcome.error : null,
      poll_after_s: 0,
    };
    entry.probe = undefined;
  }

  /** #prune drops finished operations nobody read for OPERATION_TTL_MS, then the oldest finished past MAX_OPERATIONS. */
  #prune(): void {
    const now = this.#clock.now().getTime();
    for (const [id, entry] of this.#entries) {
      if (entry.record.state !== "running" && now - entry.touched > OPERATION_TTL_MS) this.#entries.delete(id);
    }
    if (this.#entries.size < MAX_OPERATIONS) return;
    for (const [id, entry] of this.#entries) {
      if (this.#entries.size < MAX_OPERATIONS) break;
      if (entry.record.state !== "running") this.#entries.delete(id);
    }
    // Running ones past the bound too: a probe can ask again, a held promise keeps its work.
    for (const [id] of this.#entries) {
      if (this.#entries.size < MAX_OPERATIONS) break;
      this.#entries.delete(id);
    }
  }
}
