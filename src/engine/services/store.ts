import type { Database } from "bun:sqlite";
import type { LastDump } from "../databases";
import type { ExitRecord, RunHandle } from "../supervisor";
import type { RecordedUser } from "../users";
import type { LogCause } from "./diagnose";
import { EMPTY_RESTART_STATE, type RestartState } from "./restart-policy";
import type { ServiceSpec } from "./spec";

/** Forensics is what the engine learned from the latest runs that ended badly. */
export interface Forensics {
  last_exit_code: number | null;
  last_signal: string | null;
  oom_killed: boolean;
  gpu_oom: boolean;
  priv_denied: boolean;
  exec_error: string | null;
  last_crash_at: string | null;
  /** error is the cause in a class and words; key_line is the run's output line that says it (absent in older records). */
  error: { class: string; message: string; key_line?: string | null } | null;
  /** log_cause is what the last crashed run's output said: its key line and the facts behind its class. */
  log_cause: LogCause | null;
}

export const EMPTY_FORENSICS: Forensics = {
  last_exit_code: null,
  last_signal: null,
  oom_killed: false,
  gpu_oom: false,
  priv_denied: false,
  exec_error: null,
  last_crash_at: null,
  error: null,
  log_cause: null,
};

/** Owner is the token a service was deployed with and its caps at that moment. */
export interface Owner {
  token_id: string | null;
  name: string;
  max_gpus: number | null;
  max_concurrent_jobs: number | null;
}

export interface ServiceRow {
  id: string;
  name: string;
  kind: ServiceSpec["kind"];
  version: number;
  desired_state: string;
  status: string;
  status_message: string | null;
  owner: Owner;
  priority: number;
  submitted_at: string;
  created_at: string;
  updated_at: string;
  restart_state: RestartState;
  forensics: Forensics;
  current_run_id: string | null;
  /** run_as is the OS user the latest launch ran the workload as; null when the engine did not switch users. */
  run_as: RecordedUser | null;
}

export interface VersionRow {
  service_id: string;
  version: number;
  spec: ServiceSpec;
  sealed_secrets: string | null;
  created_at: string;
  build_result: string | null;
  build_reason: string | null;
  build_commit: string | null;
  build_dir: string | null;
}

export interface GpuHold {
  device_uuids: string[];
  visible_ids: string[];
  whole: boolean;
  memory_mb: number;
}

export interface RunRow {
  id: string;
  service_id: string;
  version: number;
  run_dir: string;
  shim_pid: number | null;
  shim_start: number | null;
  pid: number | null;
  pid_start: number | null;
  cgroup_dir: string | null;
  gpus: GpuHold | null;
  env_keys: string[];
  started_at: string;
  ended_at: string | null;
  /** exit also says, for a run ended on purpose, how it was asked to stop and whether SIGKILL had to follow. */
  exit: (ExitRecord & { gpu_oom: boolean; priv_denied: boolean; forced_kill?: boolean; stop_method?: string | null }) | null;
  end_reason: string | null;
}

type Raw<T> = { [K in keyof T]: unknown };

function parseService(raw: Raw<ServiceRow>): ServiceRow {
  return {
    ...(raw as unknown as ServiceRow),
    owner: JSON.parse(raw.owner as string),
    restart_state: { ...EMPTY_RESTART_STATE, ...JSON.parse(raw.restart_state as string) },
    forensics: { ...EMPTY_FORENSICS, ...JSON.parse(raw.forensics as string) },
    run_as: raw.run_as ? JSON.parse(raw.run_as as string) : null,
  };
}

function parseRun(raw: Raw<RunRow>): RunRow {
  return {
    ...(raw as unknown as RunRow),
    gpus: JSON.parse(raw.gpus as string),
    env_keys: JSON.parse(raw.env_keys as string),
    exit: raw.exit ? JSON.parse(raw.exit as string) : null,
  };
}

/** RUNS_KEPT is how many ended runs of a service the store keeps for forensics. */
export const RUNS_KEPT = 20;

/**
 * ServiceStore is the persistent record of services, their versions and their runs. It is
 * the truth a restarted daemon reconciles from; the manager keeps no state it cannot rebuild.
 */
export class ServiceStore {
  /**
   * versions caches version rows, which never change but for their build fields (updateBuild
   * drops the entry) and go with their service: a job's launch, exit and API answers read its
   * version a dozen times, each a query and a JSON parse of its spec. Entries are frozen, so a
   * caller cannot change what the next one reads, and made only outside a transaction (one
   * rolled back would leave a row that is not there). The daemon that owns the store is its one
   * writer; a successor forgets what it read before it took over.
   */
  private readonly versions = new Map<string, Map<number, VersionRow>>();

  constructor(private readonly db: Database) {}

  /** forget drops the cached rows: what this process read before it owned the store may have changed since. */
  forget(): void {
    this.versions.clear();
  }

  transaction<T>(fn: () => T): T {
    return this.db.transaction(fn)();
  }

  listServices(): ServiceRow[] {
    return this.db.query<Raw<ServiceRow>, []>("SELECT * FROM services ORDER BY created_at, name").all().map(parseService);
  }

  /** listUnsettledServices are those not stopped, failed, completed or cancelled: the scheduler's working set. */
  listUnsettledServices(): ServiceRow[] {
    return this.db
      .query<Raw<ServiceRow>, []>(
        "SELECT * FROM services WHERE status NOT IN ('stopped', 'failed', 'completed', 'cancelled') ORDER BY created_at, name",
      )
      .all()
      .map(parseService);
  }

  /**
   * listPendingServices are those meant to run and waiting to be launched, in submission order
   * (created_at, name): what a placement pass starts from. Only their rows are read and parsed,
   * however many services are live or launching beside them (issue 16: a pass used to parse
   * every unsettled row, quadratic under a flood of batch jobs).
   */
  listPendingServices(): ServiceRow[] {
    return this.db
      .query<Raw<ServiceRow>, []>("SELECT * FROM services WHERE status = 'pending' AND desired_state = 'running' ORDER BY created_at, name")
      .all()
      .map(parseService);
  }

  getService(id: string): ServiceRow | null {
    const raw = this.db.query<Raw<ServiceRow>, [string]>("SELECT * FROM services WHERE id = ?").get(id);
    return raw ? parseService(raw) : null;
  }

  findService(ident: string): ServiceRow | null {
    const raw = this.db.query<Raw<ServiceRow>, [string, string]>("SELECT * FROM services WHERE name = ? OR id = ?").get(ident, ident);
    return raw ? parseService(raw) : null;
  }

  insertService(row: ServiceRow): void {
    this.db
      .query(
        `INSERT INTO services (id, name, kind, version, desired_state, status, status_message, owner, priority, submitted_at,
           created_at, updated_at, restart_state, forensics, current_run_id, run_as)
         VALUES ($id, $name, $kind, $version, $desired_state, $status, $status_message, $owner, $priority, $submitted_at,
           $created_at, $updated_at, $restart_state, $forensics, $current_run_id, $run_as)`,
      )
      .run(serviceParams(row));
  }

  updateService(row: ServiceRow): void {
    this.db
      .query(
        `UPDATE services SET kind = $kind, version = $version, desired_state = $desired_state, status = $status,
           status_message = $status_message, owner = $owner, priority = $priority, submitted_at = $submitted_at,
           updated_at = $updated_at, restart_state = $restart_state, forensics = $forensics, current_run_id = $current_run_id,
           run_as = $run_as
         WHERE id = $id`,
      )
      .run(serviceParams(row));
  }

  deleteService(id: string): void {
    this.db.query("DELETE FROM services WHERE id = ?").run(id);
    this.versions.delete(id);
  }

  insertVersion(row: VersionRow): void {
    this.db
      .query(
        `INSERT INTO service_versions (service_id, version, spec, sealed_secrets, created_at, build_result, build_reason, build_commit, build_dir)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      )
      .run(
        row.service_id,
        row.version,
        JSON.stringify(row.spec),
        row.sealed_secrets,
        row.created_at,
        row.build_result,
        row.build_reason,
        row.build_commit,
        row.build_dir,
      );
  }

  updateBuild(
    serviceId: string,
    version: number,
    build: Pick<VersionRow, "build_result" | "build_reason" | "build_commit" | "build_dir">,
  ): void {
    this.db
      .query(
        "UPDATE service_versions SET build_result = ?, build_reason = ?, build_commit = ?, build_dir = ? WHERE service_id = ? AND version = ?",
      )
      .run(build.build_result, build.build_reason, build.build_commit, build.build_dir, serviceId, version);
    this.versions.get(serviceId)?.delete(version);
  }

  getVersion(serviceId: string, version: number): VersionRow | null {
    const cached = this.versions.get(serviceId)?.get(version);
    if (cached) return cached;
    const raw = this.db
      .query<Raw<VersionRow>, [string, number]>("SELECT * FROM service_versions WHERE service_id = ? AND version = ?")
      .get(serviceId, version);
    if (!raw) return null;
    const row: VersionRow = deepFreeze({ ...(raw as unknown as VersionRow), spec: JSON.parse(raw.spec as string) });
    if (!this.db.inTransaction) {
      const rows = this.versions.get(serviceId) ?? new Map<number, VersionRow>();
      rows.set(version, row);
      this.versions.set(serviceId, rows);
    }
    return row;
  }

  latestVersion(serviceId: string): VersionRow | null {
    const raw = this.db
      .query<Raw<VersionRow>, [string]>("SELECT * FROM service_versions WHERE service_id = ? ORDER BY version DESC LIMIT 1")
      .get(serviceId);
    return raw ? { ...(raw as unknown as VersionRow), spec: JSON.parse(raw.spec as string) } : null;
  }

  insertRun(row: RunRow): void {
    this.db
      .query(
        `INSERT INTO runs (id, service_id, version, run_dir, shim_pid, shim_start, pid, pid_start, cgroup_dir, gpus, env_keys, started_at, ended_at, exit, end_reason)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      )
      .run(
        row.id,
        row.service_id,
        row.version,
        row.run_dir,
        row.shim_pid,
        row.shim_start,
        row.pid,
        row.pid_start,
        row.cgroup_dir,
        JSON.stringify(row.gpus),
        JSON.stringify(row.env_keys),
        row.started_at,
        row.ended_at,
        row.exit ? JSON.stringify(row.exit) : null,
        row.end_reason,
      );
  }

  /** recordRunProcesses writes the shim's and the workload's pids and start times once the shim reported them. */
  recordRunProcesses(id: string, handle: RunHandle): void {
    this.db
      .query("UPDATE runs SET shim_pid = ?, shim_start = ?, pid = ?, pid_start = ?, cgroup_dir = ? WHERE id = ?")
      .run(handle.shimPid, handle.shimStart, handle.pid, handle.pidStart, handle.cgroupDir, id);
  }

  endRun(id: string, endedAt: string, exit: RunRow["exit"], endReason: string): void {
    this.db.query("UPDATE runs SET ended_at = ?, exit = ?, end_reason = ? WHERE id = ?").run(endedAt, JSON.stringify(exit), endReason, id);
  }

  /** currentRuns are the current runs of every service, by run id, in one query (a list of services reads them all). */
  currentRuns(): Map<string, RunRow> {
    const raws = this.db
      .query<Raw<RunRow>, []>("SELECT * FROM runs WHERE id IN (SELECT current_run_id FROM services WHERE current_run_id IS NOT NULL)")
      .all();
    return new Map(raws.map((raw) => [raw.id as string, parseRun(raw)]));
  }

  /**
   * openRuns are the services whose current run has not ended, in the list's order (created_at,
   * name): their names, run ids and workload pids, in one query and without parsing a row.
   */
  openRuns(): { name: string; run_id: string; pid: number | null }[] {
    return this.db
      .query<{ name: string; run_id: string; pid: number | null }, []>(
        `SELECT s.name AS name, r.id AS run_id, r.pid AS pid FROM services s JOIN runs r ON r.id = s.current_run_id
         WHERE r.ended_at IS NULL ORDER BY s.created_at, s.name`,
      )
      .all();
  }

  getRun(id: string): RunRow | null {
    const raw = this.db.query<Raw<RunRow>, [string]>("SELECT * FROM runs WHERE id = ?").get(id);
    return raw ? parseRun(raw) : null;
  }

  lastRuns(serviceId: string, limit: number): RunRow[] {
    return this.db
      .query<Raw<RunRow>, [string, number]>("SELECT * FROM runs WHERE service_id = ? ORDER BY started_at DESC, rowid DESC LIMIT ?")
      .all(serviceId, limit)
      .map(parseRun);
  }

  /** getLastDump returns the record of the last restore into a database service, or null. */
  getLastDump(serviceId: string): LastDump | null {
    const row = this.db.query<{ record: string }, [string]>("SELECT record FROM database_dumps WHERE service_id = ?").get(serviceId);
    return row ? (JSON.parse(row.record) as LastDump) : null;
  }

  /** setLastDump stores the record of a database service's latest restore, replacing the previous one. */
  setLastDump(serviceId: string, record: LastDump, updatedAt: string): void {
    this.db
      .query(
        `INSERT INTO database_dumps (service_id, record, updated_at) VALUES (?, ?, ?)
         ON CONFLICT (service_id) DO UPDATE SET record = excluded.record, updated_at = excluded.updated_at`,
      )
      .run(serviceId, JSON.stringify(record), updatedAt);
  }

  /** pruneRuns keeps the newest RUNS_KEPT runs of a service and returns the run dirs it dropped. */
  pruneRuns(serviceId: string): string[] {
    const old = this.db
      .query<{ id: string; run_dir: string }, [string, number]>(
        "SELECT id, run_dir FROM runs WHERE service_id = ? AND ended_at IS NOT NULL ORDER BY started_at DESC, rowid DESC LIMIT -1 OFFSET ?",
      )
      .all(serviceId, RUNS_KEPT);
    for (const run of old) this.db.query("DELETE FROM runs WHERE id = ?").run(run.id);
    return old.map((run) => run.run_dir);
  }
}

export function handleOf(run: RunRow): RunHandle {
  return {
    runId: run.id,
    runDir: run.run_dir,
    shimPid: run.shim_pid ?? -1,
    shimStart: run.shim_start ?? -1,
    pid: run.pid ?? -1,
    pidStart: run.pid_start ?? -1,
    cgroupDir: run.cgroup_dir,
  };
}

function serviceParams(row: ServiceRow) {
  return {
    id: row.id,
    name: row.name,
    kind: row.kind,
    version: row.version,
    desired_state: row.desired_state,
    status: row.status,
    status_message: row.status_message,
    owner: JSON.stringify(row.owner),
    priority: row.priority,
    submitted_at: row.submitted_at,
    created_at: row.created_at,
    updated_at: row.updated_at,
    restart_state: JSON.stringify(row.restart_state),
    forensics: JSON.stringify(row.forensics),
    current_run_id: row.current_run_id,
    run_as: row.run_as ? JSON.stringify(row.run_as) : null,
  };
}

/** deepFreeze freezes an object and everything it holds (a parsed JSON value: no cycles). */
function deepFreeze<T>(value: T): T {
  if (value !== null && typeof value === "object" && !Object.isFrozen(value)) {
    for (const inner of Object.values(value)) deepFreeze(inner);
    Object.freeze(value);
  }
  return value;
}
