import type { Database, SQLQueryBindings } from "bun:sqlite";
import { open } from "node:fs/promises";
import { AppError } from "../../lib/errors";
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

/** withRestartDefaults and withForensicsDefaults complete what an older row holds with the fields it lacks. */
const withRestartDefaults = (parsed: RestartState): RestartState => ({ ...EMPTY_RESTART_STATE, ...parsed });
const withForensicsDefaults = (parsed: Forensics): Forensics => ({ ...EMPTY_FORENSICS, ...parsed });

function parseService(raw: Raw<ServiceRow>): ServiceRow {
  return {
    ...(raw as unknown as ServiceRow),
    owner: JSON.parse(raw.owner as string),
    restart_state: withRestartDefaults(JSON.parse(raw.restart_state as string)),
    forensics: withForensicsDefaults(JSON.parse(raw.forensics as string)),
    run_as: raw.run_as ? JSON.parse(raw.run_as as string) : null,
  };
}

/**
 * STORED remembers the JSON each value the caches hold was read from or written as (such a value
 * is deep-frozen: it cannot have changed since). A row written back with it unchanged, as a
 * status change writes its owner, restart state and forensics, has it neither serialized nor
 * parsed again.
 */
const STORED = new WeakMap<object, string>();

/** toJson is `value` as the store holds it: its JSON, remembered where the caches hold it. */
function toJson(value: object): string {
  return STORED.get(value) ?? JSON.stringify(value);
}

/** revived is `text` as a cached value: `previous` where the store held it as that text already, else parsed, completed and frozen. */
function revived<T extends object>(text: string, previous: T | null | undefined, complete: (parsed: T) => T = (parsed) => parsed): T {
  if (previous && STORED.get(previous) === text) return previous;
  const value = deepFreeze(complete(JSON.parse(text)));
  STORED.set(value, text);
  return value;
}

/** cachedService is a row as the cache keeps it, from what the store holds: the values of `previous`, its cached row, that did not change are kept. */
function cachedService(raw: Raw<ServiceRow>, previous?: ServiceRow): ServiceRow {
  return {
    ...(raw as unknown as ServiceRow),
    owner: revived(raw.owner as string, previous?.owner),
    restart_state: revived(raw.restart_state as string, previous?.restart_state, withRestartDefaults),
    forensics: revived(raw.forensics as string, previous?.forensics, withForensicsDefaults),
    run_as: raw.run_as ? revived(raw.run_as as string, previous?.run_as) : null,
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

/** LiveWorkload is a service a process runs for now, and that process's pid. */
export interface LiveWorkload {
  id: string;
  name: string;
  pid: number;
}

/** SoonWrite is one write queued for the next group commit (ServiceStore.writeSoon, writeApart). */
interface SoonWrite {
  write: () => unknown;
  /** apart: the write's own outcome, for a write in a savepoint of its own; null: it shares the transaction's. */
  apart: { value: unknown; failed: boolean; error: unknown } | null;
}

/** LIVE_STATUSES are those in which a service holds (or is about to hold) a running process. */
export const LIVE_STATUSES: ReadonlySet<string> = new Set(["scheduled", "running", "degraded", "paused"]);
/** ENDED_STATUSES hold no process and will not start one by themselves: a service settled until someone acts on it. */
export const ENDED_STATUSES: ReadonlySet<string> = new Set(["completed", "failed", "cancelled", "stopped"]);

/**
 * ServiceStore is the persistent record of services, their versions and their runs. It is
 * the truth a restarted daemon reconciles from; the manager keeps no state it cannot rebuild.
 */
export class ServiceStore {
  /**
   * versions caches version rows by service, written through like the service rows below: they
   * never change but for their build fields (updateBuild drops the entry) and go with their
   * service. A job's launch, exit and API answers read its version a dozen times, each a query
   * and a JSON parse of its spec. Entries are frozen, so a caller cannot change what the next
   * one reads. The daemon that owns the store is its one writer; a successor forgets what it
   * read before it took over.
   */
  private readonly versions = new Map<string, Map<number, VersionRow>>();
  /**
   * rows caches service rows by id, written through: a job's way from its deploy to its exit
   * read its row a dozen times (each launch step, each status change, each API read), each a
   * query and four JSON parses. Entries are frozen like the versions'. A write updates the
   * entry once its statement ran; a transaction that throws (rolled back, or its commit refused)
   * drops them all, since what it wrote is not in the store. `names` maps a name to its id.
   */
  private readonly rows = new Map<string, ServiceRow>();
  private readonly names = new Map<string, string>();
  /**
   * absent are names and ids a lookup found no service for: a deploy of a new name looked it up
   * twice, each a query that found nothing. An insert takes its name and id out; it is bounded
   * like the caches, and dropped with them.
   */
  private readonly absent = new Set<string>();
  /** runs caches run rows by id the same way: a launch, its exit and the API's reads of the service read its current run. */
  private readonly runs = new Map<string, RunRow>();
  /**
   * runCounts are how many runs a service has in the store, where this process knows it (it
   * made the service, or counted once): an exit prunes a service's old runs, and a query for
   * them at each exit of a batch job, which has one, found none. Never fewer than are there.
   */
  private readonly runCounts = new Map<string, number>();
  /**
   * soon are the writes asked for in this turn of the event loop, to be committed together
   * (writeSoon, writeApart): `apart` is set on a write that runs in a savepoint of its own and
   * keeps its own outcome (its value, or what it threw).
   */
  private soon: { writes: SoonWrite[]; committed: PromiseWithResolvers<void> } | null = null;
  /** syncing is the WAL's sync under way (syncSoon), and syncAgain the one asked for meanwhile. */
  private syncing: Promise<void> | null = null;
  private syncAgain: PromiseWithResolvers<void> | null = null;
  /** handedOver is true once the store is the next daemon's (handOver). */
  private handedOver = false;
  /** transact runs a function in a transaction (a savepoint when one is open): one wrapper, not one made per call. */
  private readonly transact: (fn: () => unknown) => unknown;
  /**
   * writeCount counts the statements this process ran that change a service, a version or a run
   * (each counted before it runs: one rolled back counts too). A predecessor says it at the
   * switch and at the release: where the two are equal, it changed none of them in between, and
   * its successor keeps the rows it read while it prepared (decision 533).
   */
  private writes = 0;
  /**
   * prepared are the services reload() read, in the list's order: the rows a successor's
   * adoption goes through, while the store keeps them (an insert or a delete, or a forget, drops
   * the list; an update goes to the rows themselves).
   */
  private prepared: string[] | null = null;

  constructor(private readonly db: Database) {
    this.transact = db.transaction((fn: () => unknown) => fn());
  }

  /** forget drops the cached rows: what this process read before it owned the store may have changed since. */
  forget(): void {
    this.dropRows();
  }

  /** writeCount is how many statements this process ran that change a service, a version or a run (decision 533). */
  get writeCount(): number {
    return this.writes;
  }

  /** write runs a statement that changes the store, counted in writeCount first: every write of this store goes through it. */
  private write(sql: string, ...params: SQLQueryBindings[]): void {
    this.writes++;
    this.db.query<unknown, SQLQueryBindings[]>(sql).run(...params);
  }

  /**
   * listLive are the services a daemon's start goes through, in the list's order (created_at,
   * name): those meant to run, and those whose current run has not ended (a run of a service
   * stopped or paused is adopted too). A data dir that ran 100,000 batch jobs keeps their rows,
   * which a start has nothing to do with.
   */
  listLive(): ServiceRow[] {
    return this.db.query<Raw<ServiceRow>, []>(LIVE_SERVICES).all().map(parseService);
  }

  /**
   * reload drops the cached rows and reads the live services (listLive), with their current
   * runs that have not ended and those runs' versions, three queries in all, into the caches;
   * it answers them, which preparedServices answers again while the store keeps them. A
   * successor reads them while it prepares, so that its adoption, in the hand-over's window
   * where new requests wait, reads nothing again where its predecessor wrote none of them since.
   */
  reload(): ServiceRow[] {
    this.dropRows();
    const services = this.db
      .query<Raw<ServiceRow>, []>(LIVE_SERVICES)
      .all()
      .map((raw) => this.cache(cachedService(raw)));
    const runs = this.db.query<Raw<RunRow>, []>(
      "SELECT r.* FROM services s JOIN runs r ON r.id = s.current_run_id WHERE r.ended_at IS NULL",
    );
    for (const raw of runs.all()) this.cacheRun(parseRun(raw));
    const versions = this.db.query<Raw<VersionRow>, []>(
      `SELECT v.* FROM services s JOIN runs r ON r.id = s.current_run_id
         JOIN service_versions v ON v.service_id = s.id AND v.version = s.version WHERE r.ended_at IS NULL`,
    );
    for (const raw of versions.all()) this.cacheVersion({ ...(raw as unknown as VersionRow), spec: JSON.parse(raw.spec as string) });
    this.prepared = services.map((service) => service.id);
    return services;
  }

  /**
   * preparedServices are the services reload() read, as the store holds them now, where it has
   * kept them since (no forget, insert or delete); else the live services, read now (listLive).
   */
  preparedServices(): ServiceRow[] {
    if (!this.prepared) return this.listLive();
    const services: ServiceRow[] = [];
    for (const id of this.prepared) {
      const service = this.getService(id);
      if (service) services.push(service);
    }
    return services;
  }

  private dropRows(): void {
    this.prepared = null;
    this.versions.clear();
    this.absent.clear();
    this.rows.clear();
    this.names.clear();
    this.runs.clear();
    this.runCounts.clear();
  }

  transaction<T>(fn: () => T): T {
    try {
      return this.transact(fn) as T;
    } catch (error) {
      this.dropRows(); // what the transaction wrote is not in the store
      throw error;
    }
  }

  /**
   * syncSoon puts what the store committed so far on disk, off the event loop: an fdatasync of
   * the WAL on a thread of the pool, where the store's commits otherwise reach the disk at the
   * next checkpoint (synchronous=NORMAL: a power loss may take the last of them). A checkpoint
   * syncs what it copies into the database first, so a WAL restarted since takes nothing with
   * it. Calls made while one runs share the next. The runs' exits ask for it, which is what
   * lets the launcher leave the exit records it told the daemon of unsynced: one sync for a
   * batch of exits instead of one for each (docs/decisions.md 524). It resolves once synced,
   * or once the sync failed (the next checkpoint's then).
   */
  syncSoon(): Promise<void> {
    if (this.syncing) {
      this.syncAgain ??= Promise.withResolvers<void>();
      return this.syncAgain.promise;
    }
    const path = `${this.db.filename}-wal`;
    this.syncing = (async () => {
      try {
        const handle = await open(path, "r");
        try {
          await handle.datasync();
        } finally {
          await handle.close();
        }
      } catch {
        // no WAL (an in-memory store), or the disk refused: the next checkpoint syncs
      }
    })().finally(() => {
      this.syncing = null;
      const again = this.syncAgain;
      this.syncAgain = null;
      if (again) void this.syncSoon().then(again.resolve);
    });
    return this.syncing;
  }

  /**
   * writeSoon runs `write` on the next turn of the event loop, in one transaction with every
   * write asked for in this one, and resolves once that transaction committed (rejects when it
   * did not, a full disk say): the launches of one placement pass record their users in one
   * commit, where each took a commit of its own. `write` reads the rows it changes itself, as
   * they are then.
   */
  writeSoon(write: () => void): Promise<void> {
    return this.queueSoon({ write, apart: null });
  }

  /**
   * writeApart runs `write` in the same commit as writeSoon's writes of this turn, in a
   * savepoint of its own: what it throws rolls back its own writes alone, and rejects its own
   * promise alone (the others of the turn commit). It resolves with what `write` returned once
   * the commit is made, and every write of the turn rejects when the commit is refused. The
   * deploys of one turn (16 POSTs read at once) share one commit this way, each checked, as it
   * runs, against the services as the writes before it in that commit left them.
   */
  async writeApart<T>(write: () => T): Promise<T> {
    const apart: NonNullable<SoonWrite["apart"]> = { value: undefined, failed: false, error: undefined };
    await this.queueSoon({ write, apart });
    if (apart.failed) throw apart.error;
    return apart.value as T;
  }

  private queueSoon(queued: SoonWrite): Promise<void> {
    if (this.handedOver) return Promise.reject(new Error("the store is the next daemon's: it takes no more writes from this one"));
    if (!this.soon) {
      const soon = { writes: [] as SoonWrite[], committed: Promise.withResolvers<void>() };
      this.soon = soon;
      setImmediate(() => this.commitSoon(soon));
    }
    this.soon.writes.push(queued);
    return this.soon.committed.promise;
  }

  private commitSoon(soon: NonNullable<ServiceStore["soon"]>): void {
    if (this.soon === soon) this.soon = null;
    if (soon.writes.length === 0) return; // committed already, at a hand-over
    const writes = soon.writes.splice(0);
    try {
      this.transaction(() => {
        for (const { write, apart } of writes) {
          if (!apart) {
            write();
            continue;
          }
          try {
            apart.value = this.transaction(write); // a savepoint: the transaction is open
          } catch (error) {
            apart.failed = true;
            apart.error = error;
          }
        }
      });
      soon.committed.resolve();
    } catch (error) {
      soon.committed.reject(error);
    }
  }

  /**
   * handOver commits what writeSoon holds at once, and refuses its writes from then on: the
   * next daemon takes the store over once this one has stopped, and a write of this one's
   * after that would change rows under it.
   */
  handOver(): void {
    if (this.soon) this.commitSoon(this.soon);
    this.handedOver = true;
  }

  /** cache keeps `row` as the store now holds it (frozen: what a caller gets, the next one reads too). */
  private cache(row: ServiceRow): ServiceRow {
    deepFreeze(row);
    if (!this.rows.has(row.id)) evictOldest(this.rows, (evicted) => this.names.delete(evicted.name));
    this.rows.set(row.id, row);
    this.names.set(row.name, row.id);
    return row;
  }

  private cacheRun(row: RunRow): RunRow {
    deepFreeze(row);
    if (!this.runs.has(row.id)) evictOldest(this.runs);
    this.runs.set(row.id, row);
    return row;
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
    const cached = this.rows.get(id);
    if (cached) return cached;
    const raw = this.db.query<Raw<ServiceRow>, [string]>("SELECT * FROM services WHERE id = ?").get(id);
    return raw ? this.cache(cachedService(raw)) : null;
  }

  findService(ident: string): ServiceRow | null {
    const byName = this.names.get(ident);
    const cached = this.rows.get(byName ?? ident);
    if (cached) return cached;
    if (this.absent.has(ident)) return null;
    const raw = this.db.query<Raw<ServiceRow>, [string, string]>("SELECT * FROM services WHERE name = ? OR id = ?").get(ident, ident);
    if (raw) return this.cache(cachedService(raw));
    if (this.absent.size >= CACHED_ROWS) this.absent.clear();
    this.absent.add(ident);
    return null;
  }

  insertService(row: ServiceRow): void {
    this.prepared = null;
    const params = serviceParams(row);
    this.write(
      `INSERT INTO services (id, name, kind, version, desired_state, status, status_message, owner, priority, submitted_at,
           created_at, updated_at, restart_state, forensics, current_run_id, run_as)
         VALUES ($id, $name, $kind, $version, $desired_state, $status, $status_message, $owner, $priority, $submitted_at,
           $created_at, $updated_at, $restart_state, $forensics, $current_run_id, $run_as)`,
      params,
    );
    this.absent.delete(row.id);
    this.absent.delete(row.name);
    this.cache(cachedService(params));
    this.runCounts.set(row.id, 0);
  }

  updateService(row: ServiceRow): void {
    const params = serviceParams(row);
    this.write(
      `UPDATE services SET kind = $kind, version = $version, desired_state = $desired_state, status = $status,
           status_message = $status_message, owner = $owner, priority = $priority, submitted_at = $submitted_at,
           updated_at = $updated_at, restart_state = $restart_state, forensics = $forensics, current_run_id = $current_run_id,
           run_as = $run_as
         WHERE id = $id`,
      params,
    );
    // What the store holds, parsed back: the caller's objects stay its own. The name never
    // changes; a row that is not there was not written.
    const previous = this.rows.get(row.id);
    if (previous) this.cache(cachedService(params, previous));
  }

  deleteService(id: string): void {
    this.prepared = null;
    this.write("DELETE FROM services WHERE id = ?", id);
    this.versions.delete(id);
    const cached = this.rows.get(id);
    if (cached) this.names.delete(cached.name);
    this.rows.delete(id);
    // Its runs went with it (ON DELETE CASCADE).
    for (const [runId, run] of this.runs) if (run.service_id === id) this.runs.delete(runId);
    this.runCounts.delete(id);
  }

  insertVersion(row: VersionRow): void {
    const spec = JSON.stringify(row.spec);
    this.write(
      `INSERT INTO service_versions (service_id, version, spec, sealed_secrets, created_at, build_result, build_reason, build_commit, build_dir)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      row.service_id,
      row.version,
      spec,
      row.sealed_secrets,
      row.created_at,
      row.build_result,
      row.build_reason,
      row.build_commit,
      row.build_dir,
    );
    // The spec as read back from the store: a copy, not the caller's object.
    this.cacheVersion({ ...row, spec: JSON.parse(spec) });
  }

  updateBuild(
    serviceId: string,
    version: number,
    build: Pick<VersionRow, "build_result" | "build_reason" | "build_commit" | "build_dir">,
  ): void {
    this.write(
      "UPDATE service_versions SET build_result = ?, build_reason = ?, build_commit = ?, build_dir = ? WHERE service_id = ? AND version = ?",
      build.build_result,
      build.build_reason,
      build.build_commit,
      build.build_dir,
      serviceId,
      version,
    );
    this.versions.get(serviceId)?.delete(version);
  }

  getVersion(serviceId: string, version: number): VersionRow | null {
    const cached = this.versions.get(serviceId)?.get(version);
    if (cached) return cached;
    const raw = this.db
      .query<Raw<VersionRow>, [string, number]>("SELECT * FROM service_versions WHERE service_id = ? AND version = ?")
      .get(serviceId, version);
    if (!raw) return null;
    return this.cacheVersion({ ...(raw as unknown as VersionRow), spec: JSON.parse(raw.spec as string) });
  }

  /** currentVersion is the version a service runs (or will run): its row's `version`, which always exists. */
  currentVersion(service: ServiceRow): VersionRow {
    const version = this.getVersion(service.id, service.version);
    if (!version) throw new AppError("internal", `service ${service.name} has no version ${service.version}`);
    return version;
  }

  private cacheVersion(row: VersionRow): VersionRow {
    deepFreeze(row);
    let rows = this.versions.get(row.service_id);
    if (!rows) {
      evictOldest(this.versions);
      rows = new Map<number, VersionRow>();
      this.versions.set(row.service_id, rows);
    }
    rows.set(row.version, row);
    return row;
  }

  latestVersion(serviceId: string): VersionRow | null {
    const raw = this.db
      .query<Raw<VersionRow>, [string]>("SELECT * FROM service_versions WHERE service_id = ? ORDER BY version DESC LIMIT 1")
      .get(serviceId);
    return raw ? { ...(raw as unknown as VersionRow), spec: JSON.parse(raw.spec as string) } : null;
  }

  insertRun(row: RunRow): void {
    const raw: Raw<RunRow> = {
      ...row,
      gpus: JSON.stringify(row.gpus),
      env_keys: JSON.stringify(row.env_keys),
      exit: row.exit ? JSON.stringify(row.exit) : null,
    };
    this.write(
      `INSERT INTO runs (id, service_id, version, run_dir, shim_pid, shim_start, pid, pid_start, cgroup_dir, gpus, env_keys, started_at, ended_at, exit, end_reason)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      row.id,
      row.service_id,
      row.version,
      row.run_dir,
      row.shim_pid,
      row.shim_start,
      row.pid,
      row.pid_start,
      row.cgroup_dir,
      raw.gpus as string,
      raw.env_keys as string,
      row.started_at,
      row.ended_at,
      raw.exit as string | null,
      row.end_reason,
    );
    // What the store holds, parsed back: the caller's objects stay its own (the cache freezes its entries).
    this.cacheRun(parseRun(raw));
    const count = this.runCounts.get(row.service_id);
    if (count !== undefined) this.runCounts.set(row.service_id, count + 1);
  }

  /** recordRunProcesses writes the shim's and the workload's pids and start times once the shim reported them. */
  recordRunProcesses(id: string, handle: RunHandle): void {
    this.write(
      "UPDATE runs SET shim_pid = ?, shim_start = ?, pid = ?, pid_start = ?, cgroup_dir = ? WHERE id = ?",
      handle.shimPid,
      handle.shimStart,
      handle.pid,
      handle.pidStart,
      handle.cgroupDir,
      id,
    );
    const cached = this.runs.get(id);
    if (cached) {
      this.cacheRun({
        ...cached,
        shim_pid: handle.shimPid,
        shim_start: handle.shimStart,
        pid: handle.pid,
        pid_start: handle.pidStart,
        cgroup_dir: handle.cgroupDir,
      });
    }
  }

  endRun(id: string, endedAt: string, exit: RunRow["exit"], endReason: string): void {
    const serialized = JSON.stringify(exit);
    this.write("UPDATE runs SET ended_at = ?, exit = ?, end_reason = ? WHERE id = ?", endedAt, serialized, endReason, id);
    const cached = this.runs.get(id);
    // The exit as read back from the store: a copy, not the caller's object.
    if (cached) this.cacheRun({ ...cached, ended_at: endedAt, exit: JSON.parse(serialized), end_reason: endReason });
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
   * name): their ids, names, run ids and workload pids, in one query and without parsing a row.
   */
  openRuns(): { id: string; name: string; run_id: string; pid: number | null }[] {
    return this.db
      .query<{ id: string; name: string; run_id: string; pid: number | null }, []>(
        `SELECT s.id AS id, s.name AS name, r.id AS run_id, r.pid AS pid FROM services s JOIN runs r ON r.id = s.current_run_id
         WHERE r.ended_at IS NULL ORDER BY s.created_at, s.name`,
      )
      .all();
  }

  getRun(id: string): RunRow | null {
    const cached = this.runs.get(id);
    if (cached) return cached;
    const raw = this.db.query<Raw<RunRow>, [string]>("SELECT * FROM runs WHERE id = ?").get(id);
    return raw ? this.cacheRun(parseRun(raw)) : null;
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
    this.write(
      `INSERT INTO database_dumps (service_id, record, updated_at) VALUES (?, ?, ?)
         ON CONFLICT (service_id) DO UPDATE SET record = excluded.record, updated_at = excluded.updated_at`,
      serviceId,
      JSON.stringify(record),
      updatedAt,
    );
  }

  /** pruneRuns keeps the newest RUNS_KEPT runs of a service and returns the run dirs it dropped. */
  pruneRuns(serviceId: string): string[] {
    let count = this.runCounts.get(serviceId);
    if (count === undefined) {
      count = this.db.query<{ n: number }, [string]>("SELECT COUNT(*) AS n FROM runs WHERE service_id = ?").get(serviceId)?.n ?? 0;
      this.runCounts.set(serviceId, count);
    }
    if (count <= RUNS_KEPT) return [];
    const old = this.db
      .query<{ id: string; run_dir: string }, [string, number]>(
        "SELECT id, run_dir FROM runs WHERE service_id = ? AND ended_at IS NOT NULL ORDER BY started_at DESC, rowid DESC LIMIT -1 OFFSET ?",
      )
      .all(serviceId, RUNS_KEPT);
    for (const run of old) {
      this.write("DELETE FROM runs WHERE id = ?", run.id);
      this.runs.delete(run.id);
    }
    this.runCounts.set(serviceId, count - old.length);
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
    owner: toJson(row.owner),
    priority: row.priority,
    submitted_at: row.submitted_at,
    created_at: row.created_at,
    updated_at: row.updated_at,
    restart_state: toJson(row.restart_state),
    forensics: toJson(row.forensics),
    current_run_id: row.current_run_id,
    run_as: row.run_as ? toJson(row.run_as) : null,
  };
}

/** LIVE_SERVICES selects the services a start goes through (ServiceStore.listLive). */
const LIVE_SERVICES = `SELECT s.* FROM services s LEFT JOIN runs r ON r.id = s.current_run_id
  WHERE s.desired_state = 'running' OR (r.id IS NOT NULL AND r.ended_at IS NULL) ORDER BY s.created_at, s.name`;

/**
 * CACHED_ROWS bounds each cache of rows: a daemon that ran 100,000 jobs keeps their rows in its
 * store, not in its memory. The entries the scheduler works on are the newest; past the bound
 * the oldest one made goes.
 */
const CACHED_ROWS = 4096;

function evictOldest<T>(cache: Map<string, T>, evicted?: (row: T) => void): void {
  if (cache.size < CACHED_ROWS) return;
  const oldest = cache.keys().next();
  if (oldest.done) return;
  const row = cache.get(oldest.value);
  cache.delete(oldest.value);
  if (row !== undefined) evicted?.(row);
}

/** deepFreeze freezes an object and everything it holds (a parsed JSON value: no cycles). */
function deepFreeze<T>(value: T): T {
  if (value !== null && typeof value === "object" && !Object.isFrozen(value)) {
    for (const inner of Object.values(value)) deepFreeze(inner);
    Object.freeze(value);
  }
  return value;
}
