import { Database as Sqlite } from "bun:sqlite";
import { afterEach, beforeEach, describe, expect, type Mock, spyOn, test } from "bun:test";
import { rmSync } from "node:fs";
import { join } from "node:path";
import pino from "pino";
import { RETRY_SOON_MS } from "../../../src/engine/scheduler/runner";
import { ExitSettler } from "../../../src/engine/scheduler/settle";
import { type RunRow, ServiceStore } from "../../../src/engine/services/store";
import type { Database } from "../../../src/engine/store";
import { openStore } from "../../../src/engine/store";
import type { ExitRecord, RunHandle } from "../../../src/engine/supervisor";
import { eventually, tempDir } from "../../helpers";
import { runRow, serviceRow } from "../services/rows";

/** LogLine is one line the settler logged, as pino wrote it. */
interface LogLine {
  level: number;
  msg: string;
  run?: string | null;
  disk_full?: boolean;
}

const ERROR = 50;
const INFO = 30;
const REFUSED = "cannot record a service's exit yet: retrying";
const RECOVERED = "recorded the exits that were waiting for the disk";

let dir: string;
let db: Database;
/** reader is a second connection to the database: it sees what the store committed, and nothing else. */
let reader: Sqlite;
let store: ServiceStore;
let lines: LogLine[];
/** events are what the settler asked of the test's recordExit and what followed, in order. */
let events: string[];
/** committedDuringRecord are, for each recordExit call, the runs the reader saw ended then: the exits committed before it. */
let committedDuringRecord: string[][];
/** refusals says how many more times the store refuses to record a run's exit. */
let refusals: Map<string, number>;
let handedOver: boolean;
let settler: ExitSettler;
let timers: Mock<typeof setTimeout> | null;

beforeEach(() => {
  dir = tempDir();
  db = openStore(join(dir, "engine.db"));
  reader = new Sqlite(join(dir, "engine.db"), { readonly: true });
  store = new ServiceStore(db);
  lines = [];
  events = [];
  committedDuringRecord = [];
  refusals = new Map();
  handedOver = false;
  timers = null;
  const log = pino({ level: "debug" }, { write: (line: string) => void lines.push(JSON.parse(line)) });
  settler = new ExitSettler({ store, log, recordExit, handedOver: () => handedOver });
  for (const name of ["app", "web", "db"]) store.insertService(serviceRow(name, { kind: "batch", status: "running" }));
});

afterEach(() => {
  settler.stop();
  timers?.mockRestore();
  reader.close();
  db.close();
  rmSync(dir, { recursive: true, force: true });
});

/**
 * recordExit stands for ServiceRunner.recordExit: it ends the run in a savepoint of the settle's
 * transaction (recording the processes a quick exit left unrecorded) and answers what follows
 * the commit. A refused one writes first and then throws SQLITE_FULL, as a store does when the
 * disk fills up in the middle of a write.
 */
function recordExit(_serviceId: string, run: RunRow, exit: ExitRecord, processes: RunHandle | null): () => void {
  events.push(`record ${run.id}`);
  committedDuringRecord.push(endedOnDisk());
  store.transaction(() => {
    if (run.shim_pid === null && processes) store.recordRunProcesses(run.id, processes);
    store.endRun(run.id, exit.endedAt, { ...exit, gpu_oom: false, priv_denied: false }, "exited");
    const left = refusals.get(run.id) ?? 0;
    if (left > 0) {
      refusals.set(run.id, left - 1);
      throw Object.assign(new Error("database or disk is full"), { code: "SQLITE_FULL" });
    }
  });
  return () => {
    const committed = endedOnDisk().includes(run.id);
    events.push(`follow ${run.id}${committed ? "" : " (not committed)"}`);
  };
}

/** endedOnDisk are the runs whose end is committed, as another connection reads them. */
function endedOnDisk(): string[] {
  return reader
    .query<{ id: string }, []>("SELECT id FROM runs WHERE ended_at IS NOT NULL ORDER BY id")
    .all()
    .map((row) => row.id);
}

/** CommittedRun is what the reader sees of a run: its end and the workload's pid. */
type CommittedRun = { ended_at: string | null; pid: number | null; exit: string | null };

/** runOnDisk is a run's row as committed. */
function runOnDisk(id: string): CommittedRun | null {
  return reader.query<CommittedRun, [string]>("SELECT ended_at, pid, exit FROM runs WHERE id = ?").get(id);
}

/** startRun records a run of `service` as a launch does, before the shim reported its processes. */
function startRun(service: string, id: string, fields: Partial<RunRow> = {}): RunRow {
  const run = runRow(service, id, fields);
  store.insertRun(run);
  return run;
}

function handleOf(runId: string, pid = 4242): RunHandle {
  return { runId, runDir: join(dir, "runs", runId), shimPid: pid - 1, shimStart: 1, pid, pidStart: 2, cgroupDir: null };
}

function exited(exitCode = 0): ExitRecord {
  return {
    exitCode,
    signal: null,
    endedAt: "2026-11-27T00:01:00.000Z",
    execError: null,
    execStage: null,
    execMessage: null,
    oomKilled: false,
    lost: false,
  };
}

const logged = (msg: string) => lines.filter((line) => line.msg === msg);

/** watchTimers spies on setTimeout and answers a count of the retry timers armed since. */
function watchTimers(): () => number {
  timers = spyOn(globalThis, "setTimeout");
  return () => timers!.mock.calls.filter(([, delay]) => delay === RETRY_SOON_MS).length;
}

describe("ExitSettler", () => {
  test("settles the exits told in one turn in one transaction, and what follows each only once all are committed", async () => {
    const runs: [service: string, runId: string][] = [
      ["app", "run_a"],
      ["web", "run_b"],
      ["db", "run_c"],
    ];
    for (const [service, id] of runs) {
      startRun(service, id);
      settler.told(handleOf(id), exited(3));
    }
    // Until this turn is over the exits are the settler's alone: known, not yet in the store.
    expect(events).toEqual([]);
    for (const id of ["run_a", "run_b", "run_c"]) expect(settler.pending(id)?.exitCode).toBe(3);
    expect(endedOnDisk()).toEqual([]);

    await Bun.sleep(0);
    expect(events).toEqual(["record run_a", "record run_b", "record run_c", "follow run_a", "follow run_b", "follow run_c"]);
    // No exit was committed while the others were recorded: one transaction took them all.
    expect(committedDuringRecord).toEqual([[], [], []]);
    expect(endedOnDisk()).toEqual(["run_a", "run_b", "run_c"]);
    for (const id of ["run_a", "run_b", "run_c"]) {
      expect(settler.pending(id)).toBeUndefined();
      // The run ended before the launch recorded its processes: the told handle's go with the exit.
      const row = runOnDisk(id)!;
      expect(row.pid).toBe(4242);
      expect(JSON.parse(row.exit!).exitCode).toBe(3);
    }
    expect(logged(REFUSED)).toEqual([]);
  });

  test("an exit told in a later turn is settled in a transaction of its own", async () => {
    startRun("app", "run_a");
    startRun("web", "run_b");
    settler.told(handleOf("run_a"), exited());
    await Bun.sleep(0);
    settler.told(handleOf("run_b"), exited());
    expect(settler.pending("run_b")).toBeDefined();
    await Bun.sleep(0);
    expect(events).toEqual(["record run_a", "follow run_a", "record run_b", "follow run_b"]);
    expect(committedDuringRecord).toEqual([[], ["run_a"]]);
  });

  test("drops the exit of a run already ended, or unknown to the store, without recording it", async () => {
    const endedAt = "2026-11-27T00:00:30.000Z";
    startRun("app", "run_old", { ended_at: endedAt, exit: { ...exited(9), gpu_oom: false, priv_denied: false }, end_reason: "stopped" });
    settler.told(handleOf("run_old"), exited(1));
    settler.told(handleOf("run_gone"), exited(1));
    expect(settler.pending("run_old")).toBeDefined();

    await Bun.sleep(0);
    expect(events).toEqual([]);
    expect(settler.pending("run_old")).toBeUndefined();
    expect(settler.pending("run_gone")).toBeUndefined();
    // The end on record stays the one the store had.
    const row = runOnDisk("run_old")!;
    expect(row.ended_at).toBe(endedAt);
    expect(JSON.parse(row.exit!).exitCode).toBe(9);
    expect(runOnDisk("run_gone")).toBeNull();
  });

  test("settles a second exit of a service right after the first's follow ran, in the same settle", () => {
    startRun("app", "run_1");
    startRun("app", "run_2");
    startRun("web", "run_w");
    settler.queue("run_1", exited(1));
    settler.queue("run_2", exited(2));
    settler.queue("run_w", exited(0));

    settler.settle();
    expect(events).toEqual(["record run_1", "record run_w", "follow run_1", "follow run_w", "record run_2", "follow run_2"]);
    // The second exit of app was recorded once the first's was committed, in a transaction of its own.
    expect(committedDuringRecord).toEqual([[], [], ["run_1", "run_w"]]);
    expect(endedOnDisk()).toEqual(["run_1", "run_2", "run_w"]);
    expect(JSON.parse(runOnDisk("run_2")!.exit!).exitCode).toBe(2);
    // A queued exit has no processes to record.
    expect(runOnDisk("run_1")!.pid).toBeNull();
    for (const id of ["run_1", "run_2", "run_w"]) expect(settler.pending(id)).toBeUndefined();
  });

  test("a follow-up that throws is logged, and the others' still run", async () => {
    const log = pino({ level: "debug" }, { write: (line: string) => void lines.push(JSON.parse(line)) });
    const throwing = new ExitSettler({
      store,
      log,
      recordExit: (serviceId, run, exit, processes) => {
        const follow = recordExit(serviceId, run, exit, processes);
        return run.id === "run_a"
          ? () => {
              follow();
              throw new Error("a waiter failed");
            }
          : follow;
      },
      handedOver: () => handedOver,
    });
    startRun("app", "run_a");
    startRun("web", "run_b");
    throwing.told(handleOf("run_a"), exited());
    throwing.told(handleOf("run_b"), exited());
    await Bun.sleep(0);
    expect(events).toEqual(["record run_a", "record run_b", "follow run_a", "follow run_b"]);
    const failed = logged("what follows a service's exit failed");
    expect(failed.map((line) => [line.level, line.run])).toEqual([[ERROR, "run_a"]]);
    for (const id of ["run_a", "run_b"]) expect(throwing.pending(id)).toBeUndefined();
    throwing.stop();
  });

  test("a refused exit stays pending and is logged once, the others are settled, and it is settled on a retry each second", async () => {
    startRun("app", "run_a");
    startRun("web", "run_b");
    startRun("db", "run_c");
    refusals.set("run_b", 2);
    const started = Date.now();
    for (const id of ["run_a", "run_b", "run_c"]) settler.told(handleOf(id), exited());

    await Bun.sleep(0);
    // The refusal ends the batch: run_a before it is committed, run_c after it waits.
    expect(events).toEqual(["record run_a", "record run_b", "follow run_a"]);
    expect(endedOnDisk()).toEqual(["run_a"]);
    expect(settler.pending("run_a")).toBeUndefined();
    expect(settler.pending("run_b")).toBeDefined();
    expect(settler.pending("run_c")).toBeDefined();
    // What run_b's savepoint wrote before the refusal was rolled back.
    expect(runOnDisk("run_b")!.ended_at).toBeNull();
    expect(logged(REFUSED)).toHaveLength(1);
    expect(logged(REFUSED)[0]).toMatchObject({ level: ERROR, run: "run_b", disk_full: true });

    // The first retry tries the refused exit last: run_c goes in, run_b is refused again.
    await eventually(() => settler.pending("run_c") === undefined, { timeoutMs: 5000 });
    expect(Date.now() - started).toBeGreaterThanOrEqual(RETRY_SOON_MS - 50);
    expect(events.slice(3)).toEqual(["record run_c", "record run_b", "follow run_c"]);
    expect(settler.pending("run_b")).toBeDefined();

    await eventually(() => settler.pending("run_b") === undefined, { timeoutMs: 5000 });
    expect(Date.now() - started).toBeGreaterThanOrEqual(2 * RETRY_SOON_MS - 100);
    expect(events.slice(6)).toEqual(["record run_b", "follow run_b"]);
    expect(endedOnDisk()).toEqual(["run_a", "run_b", "run_c"]);
    // One error line for the whole outage, one info line at its end.
    expect(logged(REFUSED)).toHaveLength(1);
    expect(logged(RECOVERED)).toHaveLength(1);
    expect(logged(RECOVERED)[0]!.level).toBe(INFO);
  });

  test("a refused exit goes last with its own service's later exits, which stay in their order", () => {
    startRun("app", "run_1");
    startRun("app", "run_2");
    startRun("web", "run_w");
    refusals.set("run_1", 1);
    settler.queue("run_1", exited(1));
    settler.queue("run_2", exited(2));
    settler.queue("run_w", exited(0));

    settler.settle();
    expect(events).toEqual(["record run_1"]);
    expect(endedOnDisk()).toEqual([]);

    // The retry (called here, not waited for): web's exit first, then app's two in the order they were told.
    settler.settle();
    expect(events.slice(1)).toEqual(["record run_w", "record run_1", "follow run_w", "follow run_1", "record run_2", "follow run_2"]);
    expect(endedOnDisk()).toEqual(["run_1", "run_2", "run_w"]);
    for (const id of ["run_1", "run_2", "run_w"]) expect(settler.pending(id)).toBeUndefined();
  });

  test("a refused exit arms no retry once the daemon handed over, and stays pending for a later settle", async () => {
    const retriesArmed = watchTimers();
    handedOver = true;
    startRun("app", "run_a");
    refusals.set("run_a", 1);
    settler.told(handleOf("run_a"), exited());

    await Bun.sleep(0);
    expect(events).toEqual(["record run_a"]);
    expect(retriesArmed()).toBe(0);
    expect(settler.pending("run_a")).toBeDefined();
    expect(logged(REFUSED)).toHaveLength(1);

    settler.settle();
    expect(events).toEqual(["record run_a", "record run_a", "follow run_a"]);
    expect(settler.pending("run_a")).toBeUndefined();
    expect(endedOnDisk()).toEqual(["run_a"]);
    expect(logged(RECOVERED)).toHaveLength(1);
  });

  test("a refused exit arms one retry at a time, and stop drops it", async () => {
    const retriesArmed = watchTimers();
    const clearTimers = spyOn(globalThis, "clearTimeout");
    try {
      startRun("app", "run_a");
      refusals.set("run_a", 5);
      settler.told(handleOf("run_a"), exited());
      await Bun.sleep(0);
      // A settle while the retry is armed arms no second one.
      settler.settle();
      expect(events).toEqual(["record run_a", "record run_a"]);
      expect(retriesArmed()).toBe(1);

      const retry = timers!.mock.results.find((_, index) => timers!.mock.calls[index]![1] === RETRY_SOON_MS)!.value;
      settler.stop();
      expect(clearTimers.mock.calls.map(([timer]) => timer as unknown)).toContain(retry);
      expect(settler.pending("run_a")).toBeDefined();
    } finally {
      clearTimers.mockRestore();
    }
  });
});
