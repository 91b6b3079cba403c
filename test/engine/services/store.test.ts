import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { existsSync, rmSync } from "node:fs";
import { join } from "node:path";
import { EMPTY_RESTART_STATE } from "../../../src/engine/services/restart-policy";
import { EMPTY_FORENSICS, RUNS_KEPT, type ServiceRow, ServiceStore, type VersionRow } from "../../../src/engine/services/store";
import type { Database } from "../../../src/engine/store";
import { openStore } from "../../../src/engine/store";
import { tempDir } from "../../helpers";
import { runRow } from "./rows";

let dir: string;
let db: Database;
let store: ServiceStore;
beforeEach(() => {
  dir = tempDir();
  db = openStore(join(dir, "engine.db"));
  store = new ServiceStore(db);
});
afterEach(() => {
  db.close();
  rmSync(dir, { recursive: true, force: true });
});

function row(name: string, status: string, desired = "running", createdAt = "2026-11-27T00:00:00.000Z"): ServiceRow {
  return {
    id: `svc_${name}`,
    name,
    kind: "batch",
    version: 1,
    desired_state: desired,
    status,
    status_message: null,
    owner: { token_id: null, name: "admin", max_gpus: null, max_concurrent_jobs: null },
    priority: 0,
    submitted_at: createdAt,
    created_at: createdAt,
    updated_at: createdAt,
    restart_state: EMPTY_RESTART_STATE,
    forensics: EMPTY_FORENSICS,
    current_run_id: null,
    run_as: null,
  };
}

/** versionRow is version `number` of a service with `spec`, as a deploy records it. */
function versionRow(serviceId: string, spec: Record<string, unknown>, number = 1): VersionRow {
  return {
    service_id: serviceId,
    version: number,
    spec: spec as unknown as VersionRow["spec"],
    sealed_secrets: null,
    created_at: "2026-11-27T00:00:00.000Z",
    build_result: null,
    build_reason: null,
    build_commit: null,
    build_dir: null,
  };
}

describe("ServiceStore.listPendingServices", () => {
  test("answers the services meant to run and waiting to be launched, oldest first, and nothing else", () => {
    store.insertService(row("b-late", "pending", "running", "2026-11-27T00:00:02.000Z"));
    store.insertService(row("a-early", "pending", "running", "2026-11-27T00:00:01.000Z"));
    store.insertService(row("c-same", "pending", "running", "2026-11-27T00:00:01.000Z"));
    for (const status of ["scheduled", "running", "restarting", "retrying", "building", "completed", "failed", "stopped", "cancelled"]) {
      store.insertService(row(`other-${status}`, status));
    }
    store.insertService(row("pending-but-stopped", "pending", "stopped"));
    expect(store.listPendingServices().map((service) => service.name)).toEqual(["a-early", "c-same", "b-late"]);
    // The row comes back whole, as getService reads it.
    expect(store.listPendingServices()[0]).toEqual(store.getService("svc_a-early") as ServiceRow);

    store.updateService({ ...row("a-early", "scheduled", "running", "2026-11-27T00:00:01.000Z") });
    store.updateService({ ...row("other-restarting", "pending") });
    expect(store.listPendingServices().map((service) => service.name)).toEqual(["other-restarting", "c-same", "b-late"]);
  });
});

describe("ServiceStore.openRuns", () => {
  const run = (service: string, id: string, pid: number | null, endedAt: string | null) =>
    store.insertRun(runRow(service, id, { shim_pid: pid === null ? null : pid - 1, pid, ended_at: endedAt }));

  test("names the services whose current run has not ended, in the list's order, with their ids, the run and its pid", () => {
    store.insertService({ ...row("b-live", "running", "running", "2026-11-27T00:00:02.000Z"), current_run_id: "run_b2" });
    store.insertService({ ...row("a-live", "running", "running", "2026-11-27T00:00:01.000Z"), current_run_id: "run_a" });
    store.insertService({ ...row("ended", "completed"), current_run_id: "run_e" });
    store.insertService({ ...row("starting", "scheduled", "running", "2026-11-27T00:00:03.000Z"), current_run_id: "run_s" });
    store.insertService(row("never-ran", "pending"));
    run("b-live", "run_b1", 101, "2026-11-27T00:00:06.000Z"); // an earlier run of b, ended
    run("b-live", "run_b2", 102, null);
    run("a-live", "run_a", 201, null);
    run("ended", "run_e", 301, "2026-11-27T00:00:06.000Z");
    run("starting", "run_s", null, null); // recorded, its processes not yet
    expect(store.openRuns()).toEqual([
      { id: "svc_a-live", name: "a-live", run_id: "run_a", pid: 201 },
      { id: "svc_b-live", name: "b-live", run_id: "run_b2", pid: 102 },
      { id: "svc_starting", name: "starting", run_id: "run_s", pid: null },
    ]);
  });
});

describe("ServiceStore's cached rows", () => {
  const newRun = (service: string, id: string) =>
    runRow(service, id, { gpus: { device_uuids: ["GPU-0"], visible_ids: ["0"], whole: true, memory_mb: 0 }, env_keys: ["A"] });
  /** fresh reads what the file holds, through a second store that has cached nothing. */
  const fresh = () => new ServiceStore(db);

  test("a read answers what the store holds after each write, frozen, and the caller's objects stay its own", () => {
    const mine = row("a", "pending");
    store.insertService(mine);
    const read = store.getService("svc_a") as ServiceRow;
    expect(Object.isFrozen(read) && Object.isFrozen(read.owner) && Object.isFrozen(read.restart_state)).toBe(true);
    expect(Object.isFrozen(mine) || Object.isFrozen(mine.owner)).toBe(false);
    expect(store.findService("a")).toBe(read);
    store.updateService({ ...read, status: "running", run_as: { name: "eng-a", uid: 5001, gid: 5001 } });
    expect(store.getService("svc_a")).toEqual(fresh().getService("svc_a") as ServiceRow);
    expect(store.findService("a")?.status).toBe("running");

    const run = newRun("a", "run_1");
    store.insertRun(run);
    expect(Object.isFrozen(run.gpus)).toBe(false);
    store.recordRunProcesses("run_1", {
      runId: "run_1",
      runDir: "/runs/run_1",
      shimPid: 10,
      shimStart: 11,
      pid: 12,
      pidStart: 13,
      cgroupDir: null,
    });
    const exit = {
      exitCode: 0,
      signal: null,
      endedAt: "2026-11-27T00:00:06.000Z",
      execError: null,
      execStage: null,
      execMessage: null,
      oomKilled: false,
      lost: false,
      gpu_oom: false,
      priv_denied: false,
    };
    store.endRun("run_1", "2026-11-27T00:00:06.000Z", exit, "exited");
    expect(store.getRun("run_1")).toEqual(fresh().getRun("run_1") as NonNullable<ReturnType<ServiceStore["getRun"]>>);
    expect(store.getRun("run_1")?.pid).toBe(12);

    store.deleteService("svc_a");
    expect(store.getService("svc_a")).toBeNull();
    expect(store.findService("a")).toBeNull();
    expect(store.getRun("run_1")).toBeNull(); // it went with its service
  });

  test("a transaction that throws leaves no row it wrote in the cache", () => {
    store.insertService(row("a", "pending"));
    store.insertService(row("b", "pending"));
    store.insertRun(newRun("a", "run_1"));
    store.getService("svc_a"); // cached
    expect(() =>
      store.transaction(() => {
        store.updateService({ ...(store.getService("svc_a") as ServiceRow), status: "scheduled" });
        store.insertService(row("c", "pending"));
        store.endRun("run_1", "2026-11-27T00:00:06.000Z", null, "exited");
        throw new Error("refused");
      }),
    ).toThrow("refused");
    expect(store.getService("svc_a")?.status).toBe("pending");
    expect(store.findService("c")).toBeNull();
    expect(store.getRun("run_1")?.ended_at).toBeNull();

    // A savepoint rolled back inside a transaction that commits: the outer writes stay, the inner ones do not.
    store.transaction(() => {
      store.updateService({ ...(store.getService("svc_b") as ServiceRow), status: "scheduled" });
      try {
        store.transaction(() => {
          store.updateService({ ...(store.getService("svc_a") as ServiceRow), status: "running" });
          throw new Error("inner");
        });
      } catch {}
    });
    expect(store.getService("svc_a")?.status).toBe("pending");
    expect(store.getService("svc_b")?.status).toBe("scheduled");
  });

  test("a version reads back as written, frozen, and neither a version nor a name a rolled-back transaction wrote is found", () => {
    const version = (serviceId: string, spec: Record<string, unknown>) => versionRow(serviceId, spec);
    expect(store.findService("a")).toBeNull(); // looked up before it exists
    const spec = { command: ["true"], env: { A: "1" } };
    store.transaction(() => {
      store.insertService(row("a", "pending"));
      store.insertVersion(version("svc_a", spec));
    });
    expect(store.findService("a")?.id).toBe("svc_a");
    const read = store.getVersion("svc_a", 1) as VersionRow;
    expect(read).toEqual(fresh().getVersion("svc_a", 1) as VersionRow);
    expect(Object.isFrozen(read.spec) && Object.isFrozen((read.spec as unknown as typeof spec).env)).toBe(true);
    expect(Object.isFrozen(spec)).toBe(false);

    expect(store.findService("b")).toBeNull();
    expect(() =>
      store.transaction(() => {
        store.insertService(row("b", "pending"));
        store.insertVersion(version("svc_b", spec));
        expect(store.findService("b")?.id).toBe("svc_b");
        throw new Error("refused");
      }),
    ).toThrow("refused");
    expect(store.findService("b")).toBeNull();
    expect(store.getVersion("svc_b", 1)).toBeNull();
    // Made by another store on the same file (a predecessor, say): found once this one forgets.
    fresh().insertService(row("b", "pending"));
    store.forget();
    expect(store.findService("b")?.id).toBe("svc_b");
  });

  test("a row written back keeps the values it did not change, and writes every one it did", () => {
    store.insertService(row("a", "pending"));
    const before = store.getService("svc_a") as ServiceRow;
    store.updateService({ ...before, status: "running" }); // a status change: the same values otherwise
    const after = store.getService("svc_a") as ServiceRow;
    expect(after.owner).toBe(before.owner);
    expect(after.restart_state).toBe(before.restart_state);
    // Changed values, one of them frozen by the caller: each is written, and read back as written.
    const restart_state = Object.freeze({ ...after.restart_state, restarts: ["2026-11-27T00:00:05.000Z"] });
    const forensics = { ...after.forensics, log_cause: { key_line: "boom", facts: [] } } as unknown as ServiceRow["forensics"];
    store.updateService({ ...after, restart_state, forensics, run_as: { name: "eng-a", uid: 5001, gid: 5001 } });
    const written = fresh().getService("svc_a") as ServiceRow;
    expect(written.restart_state.restarts).toEqual(["2026-11-27T00:00:05.000Z"]);
    expect(written.forensics).toEqual(forensics);
    expect(store.getService("svc_a")).toEqual(written);
    expect(store.getService("svc_a")?.owner).toBe(before.owner);
  });

  test("writeSoon commits the writes of one turn of the event loop in one transaction, and says whether it committed", async () => {
    store.insertService(row("a", "pending"));
    store.insertService(row("b", "pending"));
    const mark = (id: string, status: string) => () => store.updateService({ ...(store.getService(id) as ServiceRow), status });
    const both = Promise.all([store.writeSoon(mark("svc_a", "scheduled")), store.writeSoon(mark("svc_b", "scheduled"))]);
    expect(store.getService("svc_a")?.status).toBe("pending"); // not before the next turn
    await both;
    expect(fresh().getService("svc_a")?.status).toBe("scheduled");
    expect(fresh().getService("svc_b")?.status).toBe("scheduled");

    // One write that throws takes the others of its turn with it: they shared the transaction.
    const first = store.writeSoon(mark("svc_a", "running"));
    const second = store.writeSoon(() => {
      throw new Error("refused");
    });
    expect(
      await first.then(
        () => "committed",
        (error: Error) => error.message,
      ),
    ).toBe("refused");
    expect(
      await second.then(
        () => "committed",
        (error: Error) => error.message,
      ),
    ).toBe("refused");
    expect(store.getService("svc_a")?.status).toBe("scheduled");
    expect(fresh().getService("svc_a")?.status).toBe("scheduled");
  });

  test("writeApart shares the turn's commit, sees the writes before it, and keeps its own outcome", async () => {
    // Three deploys of one turn: the second sees the first's row and refuses its name; the third commits.
    const insertUnlessTaken = (name: string) => () => {
      if (store.findService(name)) throw new Error(`${name} is taken`);
      store.insertService(row(name, "pending"));
      return `svc_${name}`;
    };
    const first = store.writeApart(insertUnlessTaken("a"));
    const second = store.writeApart(() => {
      store.insertService(row("b", "pending")); // rolled back with its savepoint
      return insertUnlessTaken("a")();
    });
    const shared = store.writeSoon(() => store.insertService(row("c", "pending")));
    const third = store.writeApart(insertUnlessTaken("d"));
    expect(store.findService("a")).toBeNull(); // not before the next turn
    const outcome = (promise: Promise<unknown>) =>
      promise.then(
        (value) => value,
        (error: Error) => error.message,
      );
    expect(await Promise.all([outcome(first), outcome(second), outcome(shared), outcome(third)])).toEqual([
      "svc_a",
      "a is taken",
      undefined,
      "svc_d",
    ]);
    for (const name of ["a", "c", "d"]) expect(fresh().findService(name)?.id).toBe(`svc_${name}`);
    expect(fresh().findService("b")).toBeNull();
    expect(store.findService("b")).toBeNull();

    // A shared write that throws rolls the whole turn back: every write of it rejects, none committed.
    const apart = store.writeApart(insertUnlessTaken("e"));
    const refused = store.writeSoon(() => {
      throw new Error("refused");
    });
    expect(await outcome(apart)).toBe("refused");
    expect(await outcome(refused)).toBe("refused");
    expect(fresh().findService("e")).toBeNull();
    expect(store.findService("e")).toBeNull();
  });

  test("a daemon that ran many jobs keeps a bounded number of them in memory, and still reads every one", () => {
    const count = 4200;
    store.transaction(() => {
      for (let i = 0; i < count; i++) store.insertService(row(`job-${i}`, "completed"));
    });
    expect(store.getService("svc_job-0")?.name).toBe("job-0");
    expect(store.findService(`job-${count - 1}`)?.id).toBe(`svc_job-${count - 1}`);
    const cached = (store as unknown as { rows: Map<string, ServiceRow>; names: Map<string, string> }).rows;
    const names = (store as unknown as { names: Map<string, string> }).names;
    expect(cached.size).toBeLessThanOrEqual(4096);
    expect(names.size).toBe(cached.size);
  });
});

describe("a successor's prepared rows (decision 533)", () => {
  const version = versionRow;

  test("writeCount counts every statement that changes a service, a version or a run, and no read", () => {
    const counts: Record<string, number> = {};
    let last = store.writeCount;
    const step = (name: string, write: () => void) => {
      write();
      counts[name] = store.writeCount - last;
      last = store.writeCount;
    };
    step("insertService", () => store.insertService(row("a", "pending")));
    step("insertVersion", () => store.insertVersion(version("svc_a", { command: ["true"] })));
    step("updateBuild", () =>
      store.updateBuild("svc_a", 1, { build_result: "succeeded", build_reason: null, build_commit: null, build_dir: null }),
    );
    step("insertRun", () => store.insertRun(runRow("a", "run_1")));
    step("recordRunProcesses", () =>
      store.recordRunProcesses("run_1", {
        runId: "run_1",
        runDir: "/runs/run_1",
        shimPid: 1,
        shimStart: 1,
        pid: 2,
        pidStart: 2,
        cgroupDir: null,
      }),
    );
    step("endRun", () => store.endRun("run_1", "2026-11-27T00:01:00.000Z", null, "exit"));
    step("updateService", () => store.updateService({ ...(store.getService("svc_a") as ServiceRow), status: "completed" }));
    step("setLastDump", () => store.setLastDump("svc_a", { engine: "postgres" } as never, "2026-11-27T00:01:00.000Z"));
    step("reads", () => {
      store.getService("svc_a");
      store.findService("a");
      store.getRun("run_1");
      store.getVersion("svc_a", 1);
      store.listServices();
      store.reload();
      store.preparedServices();
    });
    step("deleteService", () => store.deleteService("svc_a"));
    expect(counts).toEqual({
      insertService: 1,
      insertVersion: 1,
      updateBuild: 1,
      insertRun: 1,
      recordRunProcesses: 1,
      endRun: 1,
      updateService: 1,
      setLastDump: 1,
      reads: 0,
      deleteService: 1,
    });
  });

  test("reload reads the live services with their open runs and versions; preparedServices answers them again until a forget, an insert or a delete", () => {
    store.insertService({ ...row("a", "running"), current_run_id: "run_a" });
    store.insertVersion(version("svc_a", { command: ["sleep", "1"] }));
    store.insertRun(runRow("a", "run_a"));
    store.insertService(row("b", "pending", "running", "2026-11-27T00:00:01.000Z"));
    store.insertVersion(version("svc_b", { command: ["true"] }));
    // A job that completed, its run ended: a start has nothing to do with it.
    store.insertService({ ...row("done", "completed", "completed", "2026-11-26T00:00:00.000Z"), current_run_id: "run_done" });
    store.insertRun(runRow("done", "run_done", { ended_at: "2026-11-26T00:01:00.000Z" }));
    // A stopped service whose run has not ended yet is adopted all the same.
    store.insertService({ ...row("held", "stopped", "stopped", "2026-11-27T00:00:02.000Z"), current_run_id: "run_held" });
    store.insertRun(runRow("held", "run_held"));
    expect(store.listLive().map((service) => service.name)).toEqual(["a", "b", "held"]);
    // Another process's store (a successor) prepares: it reads them while this one still owns the file.
    const successor = new ServiceStore(db);
    expect(successor.reload().map((service) => service.name)).toEqual(["a", "b", "held"]);
    // What the owner writes after that is not in the successor's rows until it reads again:
    // the services, and the open runs and their versions, came with the one read.
    store.updateService({ ...(store.getService("svc_a") as ServiceRow), status: "stopped" });
    store.endRun("run_a", "2026-11-27T00:02:00.000Z", null, "stopped");
    store.updateService({ ...(store.getService("svc_held") as ServiceRow), current_run_id: null });
    expect(successor.preparedServices().map((service) => [service.name, service.status])).toEqual([
      ["a", "running"],
      ["b", "pending"],
      ["held", "stopped"],
    ]);
    expect(successor.getRun("run_a")?.ended_at).toBeNull();
    expect(successor.getVersion("svc_a", 1)?.spec).toEqual({ command: ["sleep", "1"] } as never);
    // A forget (its predecessor wrote since the switch) reads them as the store holds them.
    successor.forget();
    expect(successor.preparedServices().map((service) => [service.name, service.status])).toEqual([
      ["a", "stopped"],
      ["b", "pending"],
    ]);
    expect(successor.getRun("run_a")?.ended_at).toBe("2026-11-27T00:02:00.000Z");
    // Its own insert or delete ends the prepared list; its own update goes to the rows.
    successor.reload();
    successor.updateService({ ...(successor.getService("svc_b") as ServiceRow), status: "running" });
    expect(successor.preparedServices().map((service) => service.status)).toEqual(["stopped", "running"]);
    successor.insertService(row("c", "pending", "running", "2026-11-27T00:00:02.000Z"));
    expect(successor.preparedServices().map((service) => service.name)).toEqual(["a", "b", "c"]);
    successor.reload();
    successor.deleteService("svc_a");
    expect(successor.preparedServices().map((service) => service.name)).toEqual(["b", "c"]);
  });
});

describe("ServiceStore.pruneRuns", () => {
  const ended = (service: string, id: string, at: number) =>
    store.insertRun(
      runRow(service, id, {
        started_at: new Date(Date.UTC(2026, 10, 27, 0, 0, at)).toISOString(),
        ended_at: new Date(Date.UTC(2026, 10, 27, 0, 0, at + 1)).toISOString(),
        end_reason: "exit",
      }),
    );
  const stored = (service: string) =>
    db
      .query<{ id: string }, [string]>("SELECT id FROM runs WHERE service_id = ? ORDER BY started_at")
      .all(`svc_${service}`)
      .map((r) => r.id);

  test("keeps the newest RUNS_KEPT ended runs, whether this store made the service or found it there", () => {
    store.insertService(row("made-here", "running"));
    for (let i = 0; i < RUNS_KEPT + 3; i++) {
      ended("made-here", `run_m${String(i).padStart(2, "0")}`, i);
      store.pruneRuns("svc_made-here");
    }
    expect(stored("made-here")).toHaveLength(RUNS_KEPT);
    expect(stored("made-here")[0]).toBe("run_m03");

    // A service a daemon before this one made, with more runs than are kept: counted once, pruned.
    store.insertService(row("found", "running"));
    for (let i = 0; i < RUNS_KEPT + 5; i++) ended("found", `run_f${String(i).padStart(2, "0")}`, i);
    const next = new ServiceStore(db);
    expect(next.pruneRuns("svc_found").sort()).toEqual([
      "/runs/run_f00",
      "/runs/run_f01",
      "/runs/run_f02",
      "/runs/run_f03",
      "/runs/run_f04",
    ]);
    expect(stored("found")).toHaveLength(RUNS_KEPT);
    expect(next.pruneRuns("svc_found")).toEqual([]);
  });
});

describe("ServiceStore.syncSoon", () => {
  test("the calls made while a sync of the WAL runs share one more, which starts after it; a call after that starts its own", async () => {
    store.transaction(() => store.insertService(row("synced", "pending")));
    expect(existsSync(join(dir, "engine.db-wal"))).toBe(true);
    const first = store.syncSoon();
    const second = store.syncSoon();
    const third = store.syncSoon();
    expect(third).toBe(second);
    expect(second).not.toBe(first);
    const order: string[] = [];
    await Promise.all([second.then(() => order.push("second")), first.then(() => order.push("first"))]);
    expect(order).toEqual(["first", "second"]);
    const fourth = store.syncSoon();
    expect(fourth).not.toBe(second);
    await fourth;
    // A store without a WAL file (in memory) has nothing to sync, and says so by resolving.
    const memory = openStore(":memory:");
    try {
      await new ServiceStore(memory).syncSoon();
    } finally {
      memory.close();
    }
  });
});
