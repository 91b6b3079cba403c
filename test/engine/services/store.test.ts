import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { EMPTY_RESTART_STATE } from "../../../src/engine/services/restart-policy";
import { EMPTY_FORENSICS, type ServiceRow, ServiceStore } from "../../../src/engine/services/store";
import type { Database } from "../../../src/engine/store";
import { openStore } from "../../../src/engine/store";
import { tempDir } from "../../helpers";

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
    store.insertRun({
      id,
      service_id: `svc_${service}`,
      version: 1,
      run_dir: `/runs/${id}`,
      shim_pid: pid === null ? null : pid - 1,
      shim_start: null,
      pid,
      pid_start: null,
      cgroup_dir: null,
      gpus: null,
      env_keys: [],
      started_at: "2026-11-27T00:00:05.000Z",
      ended_at: endedAt,
      exit: null,
      end_reason: null,
    });

  test("names the services whose current run has not ended, in the list's order, with the run and its pid", () => {
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
      { name: "a-live", run_id: "run_a", pid: 201 },
      { name: "b-live", run_id: "run_b2", pid: 102 },
      { name: "starting", run_id: "run_s", pid: null },
    ]);
  });
});
