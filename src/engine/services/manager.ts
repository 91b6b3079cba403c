import {
  appendFileSync,
  chmodSync,
  chownSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  rmdirSync,
  rmSync,
  statSync,
} from "node:fs";
import { chmod, chown, mkdir, stat } from "node:fs/promises";
import { basename, join } from "node:path";
import type {
  DatabaseConnection,
  Diagnosis,
  GpuInventoryRecord,
  LogLine,
  RevealedConnection,
  ServiceDeploy,
  ServicePatch,
  ServiceRecord,
  ServiceStatsRecord,
} from "../../contract/engine";
import { type Clock, iso } from "../../lib/clock";
import { randomId, type SecretBox } from "../../lib/crypto";
import { AppError, isDiskFull } from "../../lib/errors";
import type { Logger } from "../../lib/logger";
import { InputError } from "../../lib/validation";
import { assertServiceInScope, inScope, type Principal } from "../auth";
import { runBuild } from "../builds";
import {
  type DatabaseEngine,
  DatabaseEngines,
  type DatabaseInstance,
  freeTcpPort,
  type LastDump,
  RestoreCoordinator,
  type RestoreHost,
  type RestoreTarget,
  type RunAs,
  type ServerControl,
} from "../databases";
import { checkPossible, type GpuInventory, type GpuRequest } from "../gpu";
import type { VcsTokenStore } from "../link";
import {
  describeExit,
  type Holding,
  type PendingService,
  planLaunches,
  RETRY_SOON_MS,
  type RunnerHost,
  ServiceRunner,
  userEnv,
} from "../scheduler";
import { type ExitRecord, type ProcessStat, processTreeUsage, type RunHandle, readProcessStat, type Supervisor } from "../supervisor";
import type { TemplateCatalog } from "../templates";
import {
  canSwitchUsers,
  firstUnreachableBy,
  type RecordedUser,
  removeServiceUsersOf,
  ServiceUsers,
  serviceUserName,
  type WorkloadUser,
} from "../users";
import { buildDiagnosis, explainPortClash, findLogCause, KEY_SCAN_LINES, type LogCause, redactor } from "./diagnose";
import { assembleRunEnv, assertNoBindingCycle, type BoundService, bindingVariables, envPrefix } from "./env";
import type { ServiceChange, ServiceChangeListener, ServiceDirectory } from "./index";
import { followLog, type LogCursor, type LogRecord, linesSince, tailLog, tailRecords } from "./logs";
import { EMPTY_RESTART_STATE, restartsInWindow } from "./restart-policy";
import { applyPatch, deployOf, normalizeDeploy, type ServiceSpec } from "./spec";
import { EMPTY_FORENSICS, handleOf, type LiveWorkload, type RunRow, type ServiceRow, type ServiceStore, type VersionRow } from "./store";

/** DeployWrite is what a deploy wrote (ServiceManager.writeDeploy): a new service, a new version, or nothing. */
type DeployWrite =
  | { kind: "created"; row: ServiceRow }
  | { kind: "version"; id: string; version: number; wasLive: boolean; staysStopped: boolean }
  | { kind: "unchanged"; id: string };

/** LIVE_STATUSES are those in which a service holds (or is about to hold) a running process. */
const LIVE_STATUSES = new Set(["scheduled", "running", "degraded", "paused"]);
/** ENDED_STATUSES hold no process and will not start one by themselves. */
const ENDED_STATUSES = new Set(["completed", "failed", "cancelled", "stopped"]);
/** GPU_REFRESH_MS is how often the GPU inventory is asked again. */
const GPU_REFRESH_MS = 60_000;
/** GPU_FRESH_MS is how recent a refresh made before start (a successor's, while it prepared) may be to stand for start's own. */
const GPU_FRESH_MS = 10_000;
/** BUILDS_DIR is the folder of data/ that holds build checkouts; no service name starts with a dot. */
const BUILDS_DIR = ".builds";
/** DIAGNOSIS_LOG_LINES is how many of the latest log lines a Diagnosis carries. */
const DIAGNOSIS_LOG_LINES = 50;
const SETTLED_STATUSES = new Set(["stopped", "failed", "completed", "cancelled"]);

export interface ManagerOptions {
  store: ServiceStore;
  supervisor: Supervisor;
  gpus: GpuInventory;
  templates: TemplateCatalog;
  vcs: VcsTokenStore;
  secretBox: SecretBox;
  clock: Clock;
  log: Logger;
  dataDir: string;
  logMaxFiles: number;
  /** env is the daemon's environment, of which workloads inherit PATH, HOME, LANG and a few others. */
  env: Record<string, string | undefined>;
  /** databases are the database adapters (default: every adapter this engine has). */
  databases?: DatabaseEngines;
  /** trustedCas are PEM certificates trusted, besides the system's, for https:// dumps (the engine's local CA). */
  trustedCas?: () => string[];
  /** users makes and finds the OS users workloads run as (default: the host's, through useradd). */
  users?: ServiceUsers;
  /** switchUsers runs each workload as a user of its own; it defaults to whether the engine is root (only root can). */
  switchUsers?: boolean;
  /** onRestoreEnded is told of every restore that finished, for the metrics (docs/decisions.md 336). */
  onRestoreEnded?: (service: string, dump: LastDump) => void;
}

/**
 * ServiceManager is the one coordinator of services, in the manner of Headscale's state
 * package: deploys, versions and builds, control actions, deletes and reads all go through
 * it, and it writes every change to the store before acting on it so that a daemon that dies
 * at any point can reconcile on start. Running is the scheduler's (src/engine/scheduler): the
 * manager gathers a placement pass's inputs and applies planLaunches' plan, and each service's
 * ServiceRunner launches (through the prestart hooks), stops, watches health and settles exits
 * (scheduler/exit.ts). The manager gives the runners the engine's directories, users, secrets,
 * bound services and logs through one RunnerHost.
 */
export class ServiceManager implements ServiceDirectory {
  private readonly runners = new Map<string, ServiceRunner>();
  /**
   * warmedUsers are the workload identities warmAdoption rebuilt before a successor's switch,
   * keyed by the row they were rebuilt from: start() finds one only where it adopts that same
   * row (rows are frozen and replaced when changed), and rebuilds it otherwise.
   */
  private readonly warmedUsers = new WeakMap<ServiceRow, WorkloadUser | null>();
  private scheduleQueued = false;
  private draining = false;
  private stopped = false;
  /** unsettled holds exits reported by the supervisor that the store has not taken yet. */
  private readonly unsettled = new Map<string, ExitRecord>();
  /**
   * exitProcesses are the processes of reported exits, for the settle to record where its run
   * has none on record yet: a job that ends at once is settled before its launch records them,
   * which then took a commit of its own.
   */
  private readonly exitProcesses = new Map<string, RunHandle>();
  /** settleDue is true while a settle of the exits reported in this turn is queued. */
  private settleDue = false;
  private settleTimer: ReturnType<typeof setTimeout> | null = null;
  private settleFailing = false;
  private gpuTimer: ReturnType<typeof setInterval> | null = null;
  private readonly o: ManagerOptions;
  private readonly databases: DatabaseEngines;
  private readonly restores: RestoreCoordinator;
  private readonly users: ServiceUsers;
  private readonly switchUsers: boolean;

  private readonly host: RunnerHost;

  constructor(options: ManagerOptions) {
    this.o = options;
    this.host = this.makeHost();
    this.users = options.users ?? new ServiceUsers();
    this.switchUsers = options.switchUsers ?? canSwitchUsers();
    this.databases = options.databases ?? new DatabaseEngines();
    this.restores = new RestoreCoordinator({
      engines: this.databases,
      host: this.restoreHost(),
      clock: options.clock,
      log: options.log,
      scratchDir: join(options.dataDir, "tmp", "restores"),
      trustedCas: options.trustedCas,
    });
    options.supervisor.onExit((handle, exit) => this.onRunExit(handle, exit));
  }

  /** runner is a service's ServiceRunner, made on first use. */
  private runner(id: string): ServiceRunner {
    let runner = this.runners.get(id);
    if (!runner) {
      runner = new ServiceRunner(id, {
        store: this.o.store,
        supervisor: this.o.supervisor,
        log: this.o.log,
        clock: this.o.clock,
        host: this.host,
        changed: (serviceId, row) => this.changed(serviceId, row),
        schedule: () => this.schedule(),
        exited: (runId, exit) => {
          this.unsettled.set(runId, exit);
          this.settlePending();
        },
        handedOver: () => this.stopped,
      });
      this.runners.set(id, runner);
    }
    return runner;
  }

  /** host is what the runners and their launch hooks read of the engine: directories, users, secrets, bound services, logs. */
  private makeHost(): RunnerHost {
    return {
      baseEnv: this.o.env,
      serviceDataDir: (name) => this.serviceDataDir(name),
      serviceDir: (serviceId) => this.serviceDir(serviceId),
      ensureDir: (dir, mode) => this.ensureDirAsync(dir, mode),
      dataDirMode: (spec) => this.dataDirMode(spec),
      findService: (name) => this.o.store.findService(name),
      boundService: (service) => this.boundService(service),
      openSecrets: (version) => this.openSecrets(version),
      workloadUser: (serviceId) => this.workloadUser(serviceId),
      fileBindingGroups: (spec) => this.fileBindingGroups(spec),
      appendLog: (serviceId, line) => this.appendLog(serviceId, line),
      database: (service) => this.databaseOf(service),
      logFile: (serviceId) => this.logFile(serviceId),
      runOutput: (serviceId, run) =>
        linesSince(this.logFile(serviceId), KEY_SCAN_LINES, this.o.logMaxFiles, run.started_at.replace(/Z$/, "")),
      crashCause: (service, version, output) => this.logCauseOf(service, version, output),
    };
  }

  private now(): Date {
    return this.o.clock.now();
  }

  // ---------------------------------------------------------------- lifecycle

  /**
   * start reconciles the store with the host: runs whose shim is still the recorded process
   * are adopted as they are (no restart counted); runs that ended while no daemon watched
   * are settled with their recorded exit status; interrupted builds and backoffs resume.
   */
  async start(): Promise<void> {
    // A successor refreshed the inventory while it prepared (nvidia-smi takes 50-500 ms on a GPU
    // host: not in the hand-over's window, when requests wait); anyone else does it now.
    if (!this.o.gpus.refreshedWithin(GPU_FRESH_MS)) await this.o.gpus.refresh();
    // GPUs can fall off the bus or come back after a reset: look again now and then.
    this.gpuTimer = setInterval(() => {
      void this.o.gpus.refresh().then(() => this.schedule());
    }, GPU_REFRESH_MS);
    this.gpuTimer.unref?.();
    this.adoptAll();
    // Exits that ended while no daemon watched; on a full disk they wait for space, the
    // daemon starts anyway (a throw here was a crash loop under systemd).
    this.settlePending();
    this.schedule();
  }

  /**
   * adoptAll goes through the services meant to run or with a run not ended
   * (ServiceStore.listLive), as start() says, in one synchronous pass: a successor's rows as it
   * read them while it prepared, where its predecessor changed none of them since (decision
   * 533); else read now.
   */
  private adoptAll(): void {
    // What this pass read of each shim's process: a launcher holding thirty runs is read once.
    const seen = new Map<number, ProcessStat | null>();
    const adopted: { services: string[]; workload_pids: number[] } = { services: [], workload_pids: [] };
    for (const service of this.o.store.preparedServices()) {
      const run = service.current_run_id ? this.o.store.getRun(service.current_run_id) : null;
      if (run && run.ended_at === null) {
        // A run recorded before its shim reported: find the shim through the run directory.
        const handle = run.shim_pid === null ? this.o.supervisor.recover(run.id, run.run_dir) : handleOf(run);
        if (run.shim_pid === null) this.o.store.recordRunProcesses(run.id, handle);
        const found = this.o.supervisor.adopt(handle, seen);
        if (found.state === "running") {
          if (this.switchUsers && !service.run_as && this.serverUserOf(this.currentSpec(service).spec) === null) {
            // Started by an older engine, which ran Redis and SQLite services (and every service before decision 117) as root.
            this.o.log.warn(
              { service: service.name, user: serviceUserName(service.name) },
              "this service was started as root by an older engine: restart it to run it as its own user",
            );
          }
          const user = this.warmedUsers.has(service) ? (this.warmedUsers.get(service) ?? null) : this.recordedUser(service);
          this.runner(service.id).adopt(service, run, handle, user);
          adopted.services.push(service.name);
          adopted.workload_pids.push(handle.pid);
          continue;
        }
        this.o.log.info({ service: service.name, exit: found.exit }, "a service ended while the daemon was away");
        this.unsettled.set(run.id, found.exit);
        continue;
      }
      if (service.desired_state !== "running") continue;
      if (service.status === "building") {
        // The build was interrupted with the daemon: run it again.
        const latest = this.o.store.latestVersion(service.id);
        if (latest?.build_result === "running") void this.runVersionBuild(service.id, latest.version);
        else this.update(service.id, { status: "pending", status_message: "waiting to be scheduled" });
      } else if ((service.status === "restarting" || service.status === "retrying") && service.restart_state.next_retry_at) {
        this.runner(service.id).armRetry(Date.parse(service.restart_state.next_retry_at) - this.now().getTime());
      } else if (!SETTLED_STATUSES.has(service.status)) {
        this.update(service.id, { status: "pending", status_message: "waiting to be scheduled" });
      }
    }
    // One line for the pass, as the stop says which services it left running: a line per service
    // cost 15-80 µs each in the hand-over's window, where new requests wait (decision 535).
    const count = adopted.services.length;
    if (count > 0) this.o.log.info(adopted, count === 1 ? "adopted a running service" : `adopted ${count} running services`);
  }

  /**
   * warmAdoption works out, before a successor's switch, what adopting the running services
   * asks of the host: each workload user's identity, groups and home (/etc/group, NSS; the
   * first adoption spent 1.5-5.6 ms there while requests waited), and the runner each is
   * adopted into. It reads the live services, their open runs and those runs' versions
   * (ServiceStore.reload), which start() goes through again where the predecessor changed none
   * of them since, and reads again otherwise (decision 533); it changes nothing on the host or
   * in the store. An identity is used only for the row it was rebuilt from (decision 535).
   */
  warmAdoption(): void {
    for (const service of this.o.store.reload()) {
      if (!service.current_run_id) continue;
      this.runner(service.id);
      try {
        this.warmedUsers.set(service, this.recordedUser(service));
      } catch {
        // start() meets the same fault and reports it
      }
    }
  }

  /**
   * handOver stops everything this daemon does in-process (timers, probes, builds) and leaves
   * workloads running under their shims, for the next daemon to adopt.
   */
  handOver(): void {
    this.stopped = true;
    if (this.gpuTimer) clearInterval(this.gpuTimer);
    if (this.settleTimer) clearTimeout(this.settleTimer);
    for (const runner of this.runners.values()) runner.handOver();
  }

  /** accountsIdle resolves once no write of the account files (a new service user's) is in flight or due. */
  accountsIdle(): Promise<void> {
    return this.users.idle();
  }

  /** resumeAfterDrain takes deploys again after a restart that did not go through. */
  resumeAfterDrain(): void {
    this.draining = false;
    this.schedule(); // what queued meanwhile
  }

  /** drain refuses new deploys and waits, until the deadline, for batch jobs to finish. */
  async drain(deadline: number): Promise<void> {
    this.draining = true;
    while (Date.now() < deadline) {
      const launching = [...this.runners.values()].some((runner) => runner.launching);
      const busy = this.o.store
        .listUnsettledServices()
        .some(
          (service) =>
            service.kind === "batch" &&
            service.desired_state === "running" &&
            (LIVE_STATUSES.has(service.status) || service.status === "retrying"),
        );
      if (!busy && !launching) return;
      await Bun.sleep(50);
    }
  }

  // ---------------------------------------------------------------- reads

  private find(ident: string): ServiceRow {
    const service = this.o.store.findService(ident);
    if (!service) throw new AppError("service_not_found", `no service named or with id ${JSON.stringify(ident)}`);
    return service;
  }

  serviceName(ident: string): string {
    return this.find(ident).name;
  }

  list(principal?: Principal): ServiceRecord[] {
    // The current runs in one query, not one each: a list of 50 polled back to back spent most
    // of its time there.
    const runs = this.o.store.currentRuns();
    return this.o.store
      .listServices()
      .filter((service) => !principal || inScope(principal, service.name))
      .map((service) => this.record(service, runs));
  }

  get(ident: string): ServiceRecord {
    return this.record(this.find(ident));
  }

  /**
   * liveWorkloads are the services a process runs for now, those a list shows with a pid, and
   * that pid, without building their records: a hand-over names them in its log while the next
   * daemon waits for the release, and the metrics sample them every 5 s however many settled
   * jobs the store holds.
   */
  liveWorkloads(): LiveWorkload[] {
    return this.o.store
      .openRuns()
      .flatMap((run) => (run.pid !== null && !this.unsettled.has(run.run_id) ? [{ id: run.id, name: run.name, pid: run.pid }] : []));
  }

  private currentSpec(service: ServiceRow): VersionRow {
    const version = this.o.store.getVersion(service.id, service.version);
    if (!version) throw new AppError("internal", `service ${service.name} has no version ${service.version}`);
    return version;
  }

  /** record is a service's record for the API; `runs` are the current runs when the caller read them all at once. */
  record(service: ServiceRow, runs?: ReadonlyMap<string, RunRow>): ServiceRecord {
    const { spec } = this.currentSpec(service);
    const runner = this.runner(service.id);
    const runId = service.current_run_id;
    const run = runId ? (runs ? (runs.get(runId) ?? null) : this.o.store.getRun(runId)) : null;
    // An exit the store could not take yet (a full disk) is still an exit: no process is shown.
    const pendingExit = run ? this.unsettled.get(run.id) : undefined;
    const live = run !== null && run.ended_at === null && !pendingExit;
    return {
      id: service.id,
      name: service.name,
      kind: service.kind,
      status: service.status as ServiceRecord["status"],
      status_message: pendingExit ? `${describeExit(pendingExit)}; recorded once the disk has room` : service.status_message,
      desired_state: service.desired_state,
      version: service.version,
      pid: live ? run.pid : null,
      port: spec.port,
      command: spec.command,
      template_id: spec.template_id,
      cwd: spec.cwd,
      env: spec.env,
      secret_keys: spec.secret_keys,
      gpus: spec.gpus,
      gpu_memory_mb: spec.gpu_memory_mb,
      gpu_devices: live ? (runner.gpuHold?.visible_ids ?? run.gpus?.visible_ids ?? []) : [],
      memory_mb: spec.memory_mb,
      priority: spec.priority,
      restart: spec.restart,
      health: spec.health as Record<string, unknown> | null,
      build: spec.build as Record<string, unknown> | null,
      bindings: spec.bindings,
      restarts: restartsInWindow(spec.restart, service.restart_state, this.now().getTime()).length,
      user: this.userNameOf(service, spec),
      connection: this.maskedConnection(service, spec),
      created_at: service.created_at,
      updated_at: service.updated_at,
      started_at: live ? run.started_at : null,
    };
  }

  diagnose(ident: string): Diagnosis {
    const service = this.find(ident);
    const version = this.currentSpec(service);
    const runner = this.runner(service.id);
    return buildDiagnosis({
      service,
      version,
      latest: this.o.store.latestVersion(service.id) ?? version,
      runs: this.o.store.lastRuns(service.id, 1),
      // The monitor's own state is the latest; the runner's healthState is its last reported change.
      healthState: runner.healthNow(LIVE_STATUSES.has(service.status)),
      ...runner.diagnosisInputs(),
      logs: tailLog(this.logFile(service.id), DIAGNOSIS_LOG_LINES, this.o.logMaxFiles),
      nowMs: this.now().getTime(),
      lastDump: this.o.store.getLastDump(service.id),
      user: this.userNameOf(service, version.spec),
      cwd: version.build_dir ?? version.spec.cwd ?? this.serviceDataDir(service.name),
    });
  }

  /**
   * maskedConnection is a managed database's connection details with every secret shown as
   * `****`: it is built from the plain settings alone, so no secret is opened to make it.
   */
  private maskedConnection(service: ServiceRow, spec: ServiceSpec): DatabaseConnection | null {
    const engine = spec.database?.engine;
    if (!engine || !this.databases.available(engine)) return null;
    const masked = Object.fromEntries(spec.secret_keys.map((key) => [key, PASSWORD_MASK]));
    const { password: _password, ...details } = this.databases.get(engine).connection({
      serviceId: service.id,
      serviceName: service.name,
      dataDir: this.serviceDataDir(service.name),
      host: "127.0.0.1",
      port: spec.port,
      credentials: { ...spec.env, ...masked },
      env: {},
    });
    return { engine, ...details };
  }

  /**
   * revealConnection answers a managed database's connection details in full, password
   * included (the route is admin only). The reveal is written to the daemon's log and the
   * service's log, naming who asked; the details themselves never are.
   */
  revealConnection(ident: string, principal: Principal): RevealedConnection {
    const service = this.find(ident);
    const version = this.currentSpec(service);
    const engine = version.spec.database?.engine;
    if (!engine) {
      throw new AppError(
        "not_a_database",
        service.kind === "database"
          ? `${service.name} is a database that runs its own command: the engine manages no connection details for it`
          : `${service.name} is ${kindInWords(service.kind)}, not a database: it has no connection details`,
      );
    }
    const details = this.databases.get(engine).connection(this.databaseInstance(service.id, service.name, version));
    const who = principal.kind === "local" ? "the local socket" : `token ${principal.name} (${principal.tokenId})`;
    this.o.log.info({ service: service.name, by: principal.name, token_id: principal.tokenId }, "database connection details revealed");
    this.appendLog(service.id, `connection details (password included) revealed to ${who}`);
    return { engine, ...details };
  }

  /** restoreDatabase restores a dump into a database service; see RestoreCoordinator. */
  restoreDatabase(
    name: string,
    dump: string,
    timeoutS: number,
  ): Promise<{ service_name: string; dump: string; engine: string; duration_s: number }> {
    return this.restores.restore(name, dump, timeoutS);
  }

  // ---------------------------------------------------------------- databases

  /** databaseOf returns a managed database's adapter and instance; null for other services and engines without an adapter. */
  private databaseOf(service: ServiceRow): { adapter: DatabaseEngine; instance: DatabaseInstance } | null {
    const version = this.currentSpec(service);
    const engine = version.spec.database?.engine;
    if (!engine || !this.databases.available(engine)) return null;
    return { adapter: this.databases.get(engine), instance: this.databaseInstance(service.id, service.name, version) };
  }

  /** toolEnv is the environment database tools run with: the pass-through variables and the deploy's plain env, never secrets. */
  private toolEnv(spec: ServiceSpec): Record<string, string> {
    return assembleRunEnv({ base: this.o.env, engine: {}, bindings: {}, env: spec.env, secrets: {}, gpu: {} }).env;
  }

  private databaseInstance(serviceId: string, name: string, version: VersionRow): DatabaseInstance {
    return {
      serviceId,
      serviceName: name,
      dataDir: join(this.o.dataDir, "data", name),
      host: "127.0.0.1",
      port: version.spec.port,
      credentials: { ...version.spec.env, ...this.openSecrets(version) },
      env: this.toolEnv(version.spec),
      owner: this.databaseOwner(serviceId, version.spec),
    };
  }

  /** serverUserOf is the user a managed database's adapter runs its server as by itself (`postgres`, `mysql`); null for every other service. */
  private serverUserOf(spec: ServiceSpec): string | null {
    const engine = spec.database?.engine;
    return engine && this.databases.available(engine) ? this.databases.get(engine).serverUser : null;
  }

  /**
   * databaseOwner is the service's own user that a root engine runs a Redis or SQLite service
   * as, from its row (recorded at its first launch, see workloadUser); null when the engine
   * does not switch users, the adapter runs as its own user, or the service never ran.
   */
  private databaseOwner(serviceId: string, spec: ServiceSpec): RunAs | null {
    if (!this.switchUsers || this.serverUserOf(spec)) return null;
    const runAs = this.o.store.getService(serviceId)?.run_as;
    return runAs ? { user: runAs.name, uid: runAs.uid, gid: runAs.gid } : null;
  }

  /**
   * prepareDatabaseSpec completes a managed database's spec at deploy: the adapter must exist
   * and its tools be on the host; credentials are generated where the deploy (or, for a
   * redeploy, the previous version) gave none; a server gets a free port unless one is given.
   */
  private async prepareDatabaseSpec(spec: ServiceSpec, secrets: Record<string, string>, existing: ServiceRow | null): Promise<void> {
    const engine = spec.database?.engine;
    if (!engine) return;
    const adapter = this.databases.get(engine);
    const env = this.toolEnv(spec);
    const report = adapter.detectTools(env);
    if (report.missing.length > 0) {
      const packages = [...new Set(report.missing.map((m) => m.debianPackage))].join(" ");
      throw new AppError(
        "database_tools_missing",
        `${adapter.label} needs ${report.missing.map((m) => m.tool).join(", ")}, not found on this host: install the Debian package ${packages} (apt-get install ${packages})`,
        { missing: report.missing },
      );
    }
    const previous = existing ? this.o.store.latestVersion(existing.id) : null;
    const given = {
      ...(previous ? { ...previous.spec.env, ...this.openSecrets(previous) } : {}),
      ...spec.env,
      ...secrets,
    };
    const credentials = adapter.credentials(spec.name, given);
    Object.assign(secrets, credentials.secrets);
    spec.env = { ...spec.env, ...credentials.env };
    for (const key of Object.keys(secrets)) delete spec.env[key];
    spec.secret_keys = Object.keys(secrets).sort();
    if (!adapter.hasServer) spec.port = null;
    else if (spec.port === null) spec.port = previous?.spec.port ?? (await freeTcpPort());
    const instance: DatabaseInstance = {
      serviceId: existing?.id ?? "",
      serviceName: spec.name,
      dataDir: join(this.o.dataDir, "data", spec.name),
      host: "127.0.0.1",
      port: spec.port,
      credentials: { ...spec.env, ...secrets },
      env,
    };
    spec.command = adapter.startCommand(instance);
  }

  /** appendLog writes one line from the engine (stream `engine`) into a service's log, in the shim's format. */
  appendLog(serviceId: string, line: string): void {
    this.ensureServiceDir(serviceId);
    this.ensureDir(join(this.serviceDir(serviceId), "logs"));
    const ts = new Date().toISOString().replace("Z", "000000Z");
    try {
      appendFileSync(this.logFile(serviceId), `${ts} engine F ${line.replaceAll("\n", " ")}\n`);
    } catch (error) {
      this.o.log.warn({ err: (error as Error).message }, "could not write to a service's log");
    }
  }

  private restoreHost(): RestoreHost {
    return {
      target: (name: string): RestoreTarget => {
        const service = this.o.store.findService(name);
        if (!service) throw new AppError("database_not_found", `no database service named ${JSON.stringify(name)}`);
        const version = this.currentSpec(service);
        const engine = version.spec.database?.engine ?? null;
        return {
          serviceId: service.id,
          serviceName: service.name,
          kind: service.kind,
          engine,
          running: service.status === "running" || service.status === "degraded",
          status: service.status,
          instance: engine ? this.databaseInstance(service.id, service.name, version) : null,
        };
      },
      log: (serviceId, line) => this.appendLog(serviceId, line),
      recordDump: (serviceId: string, dump: LastDump) => {
        this.o.store.setLastDump(serviceId, dump, iso(this.now()));
        const name = dump.result === "running" ? undefined : this.o.store.getService(serviceId)?.name;
        if (name) this.o.onRestoreEnded?.(name, dump);
      },
      server: (serviceId: string): ServerControl => ({
        stop: async () => {
          await this.runner(serviceId).stop("restore");
          this.update(serviceId, { status: "stopped", status_message: "stopped for a restore" });
        },
        start: async () => {
          this.requeue(serviceId, {});
          const deadline = Date.now() + 120_000;
          for (;;) {
            const service = this.o.store.getService(serviceId);
            if (service?.status === "running") return;
            if (!service || service.status === "failed" || Date.now() > deadline) {
              throw new Error(`the database did not come back after the restore: ${service?.status_message ?? "deleted"}`);
            }
            await Bun.sleep(50);
          }
        },
      }),
    };
  }

  logs(ident: string, tail: number): LogLine[] {
    const service = this.find(ident);
    return tailLog(this.logFile(service.id), tail, this.o.logMaxFiles);
  }

  logRecords(ident: string, tail: number): { records: LogRecord[]; end: LogCursor } {
    const service = this.find(ident);
    return tailRecords(this.logFile(service.id), tail, this.o.logMaxFiles);
  }

  followLogs(ident: string, signal: AbortSignal, from: LogCursor): AsyncGenerator<LogRecord> {
    const service = this.find(ident);
    return followLog(this.logFile(service.id), signal, { from, maxFiles: this.o.logMaxFiles });
  }

  gpuInventory(): GpuInventoryRecord {
    const snapshot = this.o.gpus.snapshot();
    const holders = new Map<string, { service: string; whole: boolean; memory_mb: number }[]>();
    for (const service of this.o.store.listUnsettledServices()) {
      const hold = this.runners.get(service.id)?.gpuHold;
      if (!hold) continue;
      for (const uuid of hold.device_uuids) {
        const list = holders.get(uuid) ?? [];
        list.push({ service: service.name, whole: hold.whole, memory_mb: hold.memory_mb });
        holders.set(uuid, list);
      }
    }
    return {
      source: snapshot.source,
      refreshed_at: snapshot.refreshed_at,
      warnings: snapshot.warnings,
      devices: snapshot.devices.map((device) => {
        const held = holders.get(device.uuid) ?? [];
        return {
          index: device.index,
          uuid: device.uuid,
          name: device.name,
          source: device.source,
          memory_total_mb: device.memory_total_mb,
          memory_used_mb: device.memory_used_mb,
          utilization_pct: device.utilization_pct,
          mig_profile: device.mig_profile,
          visible_id: device.visible_id,
          reserved_mb: held.reduce((sum, holder) => sum + (holder.whole ? device.memory_total_mb : holder.memory_mb), 0),
          holders: held,
        };
      }),
    };
  }

  stats(principal?: Principal): ServiceStatsRecord {
    const live = this.liveWorkloads().filter((workload) => !principal || inScope(principal, workload.name));
    const usage = processTreeUsage(live.map((workload) => workload.pid));
    return {
      sampled_at: this.now().toISOString(),
      services: live.flatMap((record) => {
        const used = usage.get(record.pid);
        return used
          ? [{ name: record.name, pid: record.pid, processes: used.processes, cpu_seconds: used.cpuSeconds, rss_bytes: used.rssBytes }]
          : [];
      }),
    };
  }

  // ---------------------------------------------------------------- deploy

  /**
   * deploy creates a service, or a new version of an existing one. Everything is checked
   * before anything is written: the template, the command, the bindings graph, the GPU
   * request against the host and the token's caps and scope.
   */
  async deploy(body: ServiceDeploy, principal: Principal): Promise<{ record: ServiceRecord; created: boolean }> {
    this.assertTakesDeploys();
    assertServiceInScope(principal, body.name);
    this.assertMayAsk(body, principal);
    const { spec, secrets } = normalizeDeploy(body, this.o.templates);
    const { record, created } = await this.commit(spec, secrets, principal, { patch: false });
    return { record, created };
  }

  /**
   * patch makes a new version of a service from its latest one with some settings changed
   * (decision 180), through the same checks and versioning as a deploy: nothing is written
   * when one fails. A patch that changes nothing makes no version. A running service rolls
   * to the new version as on a redeploy; one stopped by request stays stopped and starts on
   * the new version next time.
   */
  async patch(ident: string, patch: ServicePatch, principal: Principal): Promise<{ record: ServiceRecord; changed: boolean }> {
    this.assertTakesDeploys();
    const service = this.find(ident);
    assertServiceInScope(principal, service.name);
    this.assertMayAsk(patch, principal);
    const latest = this.o.store.latestVersion(service.id) ?? this.currentSpec(service);
    const body = applyPatch(deployOf(latest.spec, this.openSecrets(latest)), patch);
    const { spec, secrets } = normalizeDeploy(body, this.o.templates);
    const { record, changed } = await this.commit(spec, secrets, principal, { patch: true });
    return { record, changed };
  }

  private assertTakesDeploys(): void {
    if (this.draining) throw new AppError("draining", "the daemon is restarting and takes no deploys now; retry in a few seconds");
  }

  /** assertMayAsk checks what a deploy or a patch asks beyond its own service: bound services' scope, the OS user. */
  private assertMayAsk(body: { bindings?: string[] | null; user?: string | null }, principal: Principal): void {
    // A binding hands the bound service's credentials to this one: it is a use of that service.
    for (const bound of body.bindings ?? []) assertServiceInScope(principal, bound);
    // Choosing the OS user (root included) is choosing the workload's privileges: an admin's call.
    if (body.user !== undefined && principal.role !== "admin") {
      throw new AppError("forbidden", "only an admin may choose the user a workload runs as (user)");
    }
  }

  /**
   * commit checks a normalized spec against the host, the other services and the token, then
   * writes it as a new service or a new version and acts on it (build, roll, schedule). The
   * checks against the other services and the write are one step (writeDeploy), taken in the
   * next group commit (the store's writeApart): the deploys of one turn of the event loop share
   * one commit, each checked, as it is written, against the services as the deploys before it
   * left them, and each refused on its own.
   */
  private async commit(
    spec: ServiceSpec,
    secrets: Record<string, string>,
    principal: Principal,
    mode: { patch: boolean },
  ): Promise<{ record: ServiceRecord; created: boolean; changed: boolean }> {
    if (spec.user) spec.user = this.checkChosenUser(spec.user);
    await this.prepareDatabaseSpec(spec, secrets, this.o.store.findService(spec.name));
    const written = await this.o.store.writeApart(() => this.writeDeploy(spec, secrets, principal, mode));
    if (written.kind === "unchanged") return { record: this.get(written.id), created: false, changed: false };
    if (written.kind === "created") {
      this.o.log.info({ service: spec.name, version: 1, kind: spec.kind }, "service deployed");
      this.changed(written.row.id, written.row);
      if (spec.build) void this.runVersionBuild(written.row.id, 1);
      else this.schedule();
      // Without a build, the row as written: nothing has run since (the placement pass runs
      // once this turn of the event loop is done); a build starts at once and may have written to it.
      return { record: spec.build ? this.get(written.row.id) : this.record(written.row), created: true, changed: true };
    }
    const { id, version, wasLive, staysStopped } = written;
    this.changed(id);
    this.o.log.info({ service: spec.name, version, patch: mode.patch }, mode.patch ? "service patched" : "service redeployed");
    if (spec.build) {
      // A build of a new version leaves the running version alone until it succeeds.
      if (!wasLive && !staysStopped) {
        this.update(id, { status: "building", status_message: `building version ${version}`, desired_state: "running" });
      }
      void this.runVersionBuild(id, version);
    } else if (!staysStopped) {
      await this.rollTo(id, version);
    }
    return { record: this.get(id), created: false, changed: true };
  }

  /**
   * writeDeploy checks a deploy against the other services (the bindings graph, the GPU
   * request, the token's cap, the port) and the daemon's state, then writes it: a new service
   * with its version 1, or a new version of the one of its name. It runs inside the store's
   * group commit and writes nothing when a check fails; a patch that changes nothing writes nothing.
   */
  private writeDeploy(spec: ServiceSpec, secrets: Record<string, string>, principal: Principal, mode: { patch: boolean }): DeployWrite {
    this.assertTakesDeploys(); // a drain may have begun since the request was read
    // A cycle through the new service needs one of its own bindings: none, no cycle to look for.
    if (spec.bindings.length > 0) {
      const graph = new Map<string, string[]>();
      for (const other of this.o.store.listServices()) graph.set(other.name, this.currentSpec(other).spec.bindings);
      assertNoBindingCycle(spec.name, spec.bindings, graph);
    }
    if (principal.maxGpus !== null && spec.gpus > principal.maxGpus) {
      throw new AppError("cap_exceeded", `this token may hold at most ${principal.maxGpus} GPUs; the deploy asks for ${spec.gpus}`);
    }
    const impossible = checkPossible(this.o.gpus.snapshot().devices, this.gpuRequest("new", spec, 0));
    if (impossible) throw new AppError("gpu_request_impossible", impossible);
    this.assertPortFree(spec);

    const now = iso(this.now());
    const existing = this.o.store.findService(spec.name);
    // Secrets are sealed with the service id and version as associated data, so a sealed
    // value copied to another row does not open.
    const seal = (id: string, version: number) =>
      Object.keys(secrets).length > 0 ? this.o.secretBox.seal(JSON.stringify(secrets), `${id}:${version}`) : null;
    const owner = {
      token_id: principal.tokenId,
      name: principal.name,
      max_gpus: principal.maxGpus,
      max_concurrent_jobs: principal.maxConcurrentJobs,
    };
    if (!existing) {
      const id = randomId("svc");
      const row: ServiceRow = {
        id,
        name: spec.name,
        kind: spec.kind,
        version: 1,
        desired_state: "running",
        status: spec.build ? "building" : "pending",
        status_message: spec.build ? "building version 1" : "waiting to be scheduled",
        owner,
        priority: spec.priority,
        submitted_at: now,
        created_at: now,
        updated_at: now,
        restart_state: EMPTY_RESTART_STATE,
        forensics: EMPTY_FORENSICS,
        current_run_id: null,
        run_as: null,
      };
      this.o.store.insertService(row);
      this.o.store.insertVersion(this.versionRow(id, 1, spec, seal(id, 1), now));
      return { kind: "created", row };
    }
    if (existing.kind !== spec.kind) {
      throw new InputError([
        {
          loc: ["body", "kind"],
          msg: `${spec.name} is a ${existing.kind}; delete it to redeploy it as a ${spec.kind}`,
          type: "value_error",
          input: spec.kind,
        },
      ]);
    }
    const latest = this.o.store.latestVersion(existing.id);
    if (mode.patch && latest && sameSpec(latest.spec, spec) && sameSecrets(this.openSecrets(latest), secrets)) {
      return { kind: "unchanged", id: existing.id };
    }
    const version = (latest?.version ?? existing.version) + 1;
    // A patch leaves a service stopped by request stopped: its next start runs the new version.
    const staysStopped = mode.patch && existing.desired_state === "stopped";
    this.o.store.insertVersion(this.versionRow(existing.id, version, spec, seal(existing.id, version), now));
    this.o.store.updateService({
      ...existing,
      owner,
      priority: spec.priority,
      updated_at: now,
      ...(staysStopped && !spec.build ? { version } : {}),
    });
    return { kind: "version", id: existing.id, version, wasLive: LIVE_STATUSES.has(existing.status), staysStopped };
  }

  /**
   * assertPortFree refuses a deploy whose declared port another service that is meant to run
   * already declares (409 `port_taken`, naming it), instead of accepting it and leaving it to
   * a crash loop on EADDRINUSE. A stopped or ended service holds nothing; one that is pending,
   * building or retrying is about to.
   */
  private assertPortFree(spec: ServiceSpec): void {
    if (spec.port === null) return;
    for (const other of this.o.store.listServices()) {
      if (other.name === spec.name || other.desired_state === "stopped" || ENDED_STATUSES.has(other.status)) continue;
      if (this.currentSpec(other).spec.port !== spec.port) continue;
      throw new AppError(
        "port_taken",
        `port ${spec.port} is declared by the service ${other.name} (${other.status}): choose another port, or stop ${other.name} first`,
        { holder: other.name, port: spec.port },
      );
    }
  }

  private versionRow(serviceId: string, version: number, spec: ServiceSpec, sealed: string | null, now: string): VersionRow {
    return {
      service_id: serviceId,
      version,
      spec,
      sealed_secrets: sealed,
      created_at: now,
      build_result: spec.build ? "running" : null,
      build_reason: null,
      build_commit: null,
      build_dir: null,
    };
  }

  /** rollTo ends the current run (if any, not counted as a restart) and schedules `version`. */
  private async rollTo(serviceId: string, version: number): Promise<void> {
    await this.runner(serviceId).stop("redeployed");
    if (!this.o.store.getService(serviceId)) return;
    this.requeue(serviceId, { version, restart_state: EMPTY_RESTART_STATE });
  }

  private async runVersionBuild(serviceId: string, version: number): Promise<void> {
    const row = this.o.store.getVersion(serviceId, version);
    const service = this.o.store.getService(serviceId);
    if (!row?.spec.build || !service) return;
    const runner = this.runner(serviceId);
    const controller = runner.beginBuild();
    const buildsDir = this.buildsDir(serviceId);
    const workDir = join(buildsDir, String(version));
    rmSync(workDir, { recursive: true, force: true });
    this.ensureServiceDir(serviceId);
    this.ensureDir(join(this.o.dataDir, "data"), this.switchUsers ? 0o711 : 0o700);
    this.ensureDir(join(this.o.dataDir, "data", BUILDS_DIR), this.switchUsers ? 0o711 : 0o700);
    this.ensureDir(buildsDir);
    const credential = this.o.vcs.credentialFor(row.spec.build.repo_url);
    const env = assembleRunEnv({ base: this.o.env, engine: {}, bindings: {}, env: row.spec.env, secrets: {}, gpu: {} }).env;
    let result: Awaited<ReturnType<typeof runBuild>>;
    try {
      // The build runs the repository's code: as the service's user, in a directory it owns.
      const user = await this.workloadUser(serviceId);
      if (user) chownSync(buildsDir, user.uid, user.gid);
      assertRepositoryReachable(row.spec.build.repo_url, user);
      for (const [key, value] of Object.entries(userEnv(user))) if (!(key in row.spec.env)) env[key] = value;
      result = await runBuild(row.spec.build, {
        workDir,
        logPath: join(this.serviceDir(serviceId), "build.log"),
        credential: credential ? { username: "x-access-token", password: credential.token } : null,
        env,
        inherited: this.o.env,
        signal: controller.signal,
        user,
      });
    } catch (error) {
      result = {
        ok: false,
        commit: null,
        dir: workDir,
        reason: `build could not start: ${(error as Error).message}`,
        duration_ms: 0,
        log_tail: [],
      };
    }
    runner.endBuild(controller);
    if (controller.signal.aborted || this.stopped) return;
    this.o.store.updateBuild(serviceId, version, {
      build_result: result.ok ? "succeeded" : "failed",
      build_reason: result.reason,
      build_commit: result.commit,
      build_dir: result.ok ? result.dir : null,
    });
    const current = this.o.store.getService(serviceId);
    if (!current) return;
    if (result.ok) {
      this.o.log.info({ service: current.name, version, commit: result.commit }, "build succeeded");
      if (current.desired_state === "running" || current.status === "building") await this.rollTo(serviceId, version);
      // Stopped by request (a patch): the built version is the one its next start runs.
      else if (current.desired_state === "stopped" && version > current.version) this.update(serviceId, { version });
      return;
    }
    this.o.log.warn({ service: current.name, version, reason: result.reason }, "build failed");
    if (LIVE_STATUSES.has(current.status)) return; // the previous version keeps running
    this.update(serviceId, {
      status: "failed",
      status_message: `build of version ${version} failed: ${result.reason}`,
      forensics: { ...current.forensics, error: { class: "build_failed", message: result.reason ?? "the build failed" } },
    });
  }

  // ---------------------------------------------------------------- control

  async control(ident: string, action: "start" | "stop" | "restart" | "pause" | "resume"): Promise<ServiceRecord> {
    const service = this.find(ident);
    const runner = this.runner(service.id);
    switch (action) {
      case "stop":
        this.update(service.id, { desired_state: "stopped" });
        runner.abortSetup(); // a database still initializing does not start
        // A launch under way finishes first, so its process is known and stopped, not left running.
        await runner.launched;
        await runner.stop("stopped");
        runner.cancelPending();
        this.update(service.id, { status: service.kind === "batch" ? "cancelled" : "stopped", status_message: "stopped by request" });
        break;
      case "start":
        if (LIVE_STATUSES.has(service.status) || service.status === "building") {
          throw new AppError("invalid_transition", `${service.name} is ${service.status}; stop it first, or use restart`);
        }
        this.requeue(service.id, { restart_state: EMPTY_RESTART_STATE });
        break;
      case "restart":
        if (service.status === "building") throw new AppError("invalid_transition", `${service.name} is building; wait for the build`);
        await runner.launched;
        await runner.stop("restarted");
        this.requeue(service.id, {});
        break;
      case "pause":
        if (service.status !== "running" && service.status !== "degraded") {
          throw new AppError("invalid_transition", `${service.name} is ${service.status}; only a running service can be paused`);
        }
        if (!runner.pause()) throw new AppError("invalid_transition", `${service.name} has no live process to pause`);
        this.update(service.id, { status: "paused", desired_state: "paused", status_message: "paused by request (SIGSTOP)" });
        break;
      case "resume":
        if (service.status !== "paused") throw new AppError("invalid_transition", `${service.name} is ${service.status}, not paused`);
        this.update(service.id, { status: "running", desired_state: "running", status_message: null });
        runner.resume();
        break;
    }
    // Whatever changed may free a slot (caps, GPUs) or satisfy a binding.
    this.schedule();
    return this.get(service.id);
  }

  /**
   * remove stops a service and deletes its record, runs, logs and builds. Its data directory
   * stays, and with it the user who owns it; a data dir left empty goes, and the service's own
   * user with it (releaseUser).
   */
  async remove(ident: string): Promise<void> {
    const service = this.find(ident);
    const dependents = this.o.store
      .listServices()
      .filter((other) => other.id !== service.id && this.currentSpec(other).spec.bindings.includes(service.name))
      .map((other) => other.name);
    this.update(service.id, { desired_state: "stopped" });
    const runner = this.runner(service.id);
    runner.abortSetup();
    await runner.launched;
    await runner.stop("deleted");
    runner.cancelPending();
    this.runners.delete(service.id);
    // A write of the account files in flight holds their locks: releaseUser below must not meet it.
    if (this.switchUsers) await this.users.idle();
    // The row as it ends: a launch under way when the delete came may have recorded its user since.
    const last = this.o.store.getService(service.id) ?? service;
    this.o.store.deleteService(service.id);
    this.changed(service.id);
    rmSync(this.serviceDir(service.id), { recursive: true, force: true });
    rmSync(this.buildsDir(service.id), { recursive: true, force: true });
    for (const dir of this.madeDirs.keys()) if (dir.startsWith(this.serviceDir(service.id))) this.madeDirs.delete(dir);
    const released = this.releaseUser(last);
    this.o.log.info({ service: service.name, dependents, ...(released ? { user_removed: released } : {}) }, "service deleted");
    this.schedule();
  }

  /**
   * releaseUser removes a deleted service's own user when its data dir is empty (decision 465):
   * nothing is kept that the user owns, and each batch job under a new name would otherwise
   * leave a user behind for ever (the ids run out after 4,336 names, and each new user costs a
   * rewrite of the account files, which grow with them). A data dir with anything in it stays, and its user
   * with it (decision 118); so does a user a process still runs as, or one the admin chose.
   * Runs without an await after the row is gone, so no launch of a new service of that name
   * can find the user in between. Answers the user's name when it was removed.
   */
  private releaseUser(service: ServiceRow): string | null {
    if (!this.switchUsers || service.run_as?.name !== serviceUserName(service.name)) return null;
    const dataDir = this.serviceDataDir(service.name);
    try {
      rmdirSync(dataDir);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") return null; // not empty: kept, with its owner
    }
    this.madeDirs.delete(dataDir);
    return removeServiceUsersOf(this.o.dataDir, { only: [service.name] }).length > 0 ? service.run_as.name : null;
  }

  /** requeue puts a service back in the queue, as submitted now, to be scheduled. */
  private requeue(serviceId: string, patch: Partial<ServiceRow>): void {
    this.runner(serviceId).cancelPending();
    this.update(serviceId, {
      desired_state: "running",
      status: "pending",
      status_message: "waiting to be scheduled",
      submitted_at: iso(this.now()),
      ...patch,
    });
    this.schedule();
  }

  // ---------------------------------------------------------------- scheduling

  private gpuRequest(id: string, spec: ServiceSpec, submittedAt: number): GpuRequest {
    return { id, gpus: spec.gpus, gpu_memory_mb: spec.gpu_memory_mb, priority: spec.priority, submitted_at: submittedAt };
  }

  /**
   * schedule runs one placement pass soon: once the event loop has run what this turn of it
   * found ready (setImmediate), so that the deploys of one turn (16 POSTs read at once, say) and
   * the exits it was told of share a pass, its store reads and its one commit.
   */
  schedule(): void {
    if (this.scheduleQueued || this.stopped || this.draining) return;
    this.scheduleQueued = true;
    setImmediate(() => {
      this.scheduleQueued = false;
      // A hand-over or a drain may have begun in this turn, after the call: no pass then (a
      // drain that does not go through schedules one when it resumes).
      if (this.stopped || this.draining) return;
      try {
        this.placementPass();
      } catch (error) {
        this.o.log.error({ err: error }, "scheduling pass failed");
      }
    });
  }

  /**
   * placementPass gathers what a pass needs from the store and the runners, plans it
   * (scheduler/plan.ts) and applies the plan. It reads only the pending rows (the store's
   * listPendingServices), and the live ones only when a pending service has a token cap or
   * wants GPUs, the only rules that look at what others hold: a flood of batch jobs no longer
   * makes every pass parse every live row. Its writes (the waits' messages, each launch's run
   * record and `scheduled`) are one transaction, committed before the pass returns and before
   * any of its launches spawns a process (decision 453).
   */
  private placementPass(): void {
    const pending: PendingService[] = [];
    const byId = new Map<string, ServiceRow>();
    for (const service of this.o.store.listPendingServices()) {
      if (this.runners.get(service.id)?.launching) continue;
      byId.set(service.id, service);
      const { spec } = this.currentSpec(service);
      const waiting = this.bindingWait(spec);
      this.runner(service.id).waitingOn(waiting.messages, waiting.pendingKeys);
      pending.push({
        ...this.gpuRequest(service.id, spec, Date.parse(service.submitted_at)),
        owner: ownerKey(service),
        caps: { max_concurrent_jobs: service.owner.max_concurrent_jobs, max_gpus: service.owner.max_gpus },
        bindingWaits: waiting.messages,
      });
    }
    if (pending.length === 0) return;
    const plan = planLaunches(pending, this.holdings(pending), this.o.gpus.snapshot().devices);
    this.o.store.transaction(() => {
      for (const { id, message } of plan.waiting) {
        const service = byId.get(id);
        if (service) this.setWaiting(service, message);
      }
      for (const { id, hold } of plan.launch) this.runner(id).start(hold);
    });
  }

  /**
   * holdings are what the live and launching services hold (GPUs, a token's concurrent jobs),
   * read only when a pending service's plan depends on them: a token cap or a GPU request.
   * Settled services (stopped, failed, completed, cancelled) hold nothing and are left out.
   */
  private holdings(pending: readonly PendingService[]): Holding[] {
    const capped = pending.some(
      (service) =>
        service.caps.max_concurrent_jobs !== null || service.caps.max_gpus !== null || service.gpus > 0 || service.gpu_memory_mb > 0,
    );
    if (!capped) return [];
    return this.o.store.listUnsettledServices().map((service) => {
      const runner = this.runners.get(service.id);
      return {
        id: service.id,
        owner: ownerKey(service),
        active: LIVE_STATUSES.has(service.status) || Boolean(runner?.launching),
        hold: runner?.gpuHold ?? null,
      };
    });
  }

  private setWaiting(service: ServiceRow, message: string): void {
    if (service.status_message !== message) this.update(service.id, { status_message: message });
  }

  private bindingWait(spec: ServiceSpec): { messages: string[]; pendingKeys: string[] } {
    const messages: string[] = [];
    const pendingKeys: string[] = [];
    for (const name of spec.bindings) {
      const bound = this.o.store.findService(name);
      if (!bound) {
        messages.push(`waiting for ${name}: no such service is deployed yet`);
        pendingKeys.push(`${envPrefix(name)}_HOST`, `${envPrefix(name)}_PORT`);
        continue;
      }
      const health = this.runners.get(bound.id)?.healthState;
      const hasProbe = this.currentSpec(bound).spec.health !== null;
      const ready = bound.status === "running" && (!hasProbe || health?.healthy === true);
      if (!ready) {
        const why = bound.status === "running" ? "its health check has not passed yet" : `it is ${bound.status}`;
        messages.push(`waiting for ${name}: ${why}`);
        pendingKeys.push(...Object.keys(bindingVariables(this.boundService(bound))));
      }
    }
    return { messages, pendingKeys: [...new Set(pendingKeys)].sort() };
  }

  private boundService(service: ServiceRow): BoundService {
    const version = this.currentSpec(service);
    const database = this.databaseOf(service);
    return {
      name: service.name,
      kind: service.kind,
      template_id: version.spec.template_id,
      port: version.spec.port,
      env: version.spec.env,
      secrets: this.openSecrets(version),
      database: database ? database.adapter.bindings(database.instance, envPrefix(service.name)) : undefined,
    };
  }

  private openSecrets(version: VersionRow): Record<string, string> {
    return version.sealed_secrets
      ? JSON.parse(this.o.secretBox.open(version.sealed_secrets, `${version.service_id}:${version.version}`))
      : {};
  }

  // ---------------------------------------------------------------- exits

  /**
   * onRunExit queues an exit the supervisor reported; the service's runner settles it (what
   * follows: scheduler/exit.ts). The exits told together (the launcher reports what ended while
   * the daemon was busy, dozens at a time under a flood of jobs) are settled together, once
   * this turn's notices are read.
   */
  private onRunExit(handle: RunHandle, exit: ExitRecord): void {
    this.unsettled.set(handle.runId, exit);
    this.exitProcesses.set(handle.runId, handle);
    if (this.settleDue) return;
    this.settleDue = true;
    queueMicrotask(() => {
      this.settleDue = false;
      this.settlePending();
    });
  }

  /**
   * settlePending records every exit the supervisor reported and the store has not taken yet,
   * in one transaction, each exit in a savepoint of its own: one the store refuses ends the
   * batch, those before it are committed, and it is tried again last. What follows an exit (its runner's state,
   * the waiters, the retry) follows only once the transaction committed. One exit of a service
   * goes in at a time: a second one (a stray older run) waits for the first's consequences.
   * It never throws: it runs from the supervisor's exit handler, where an uncaught SQLITE_FULL
   * used to end the daemon (issue 13). A settle refused for lack of space stays pending, the
   * service is known to have exited meanwhile (record() shows no process), and it is tried
   * again every second until the disk has room; the shim's exit.json keeps the truth for a
   * daemon that restarts first.
   */
  private settlePending(): void {
    const recorded: { runId: string; follow: () => void }[] = [];
    const services = new Set<string>();
    let failed: { error: unknown; runId: string | null } | null = null;
    try {
      this.o.store.transaction(() => {
        for (const [runId, exit] of this.unsettled) {
          try {
            const run = this.o.store.getRun(runId);
            if (run && run.ended_at === null) {
              if (services.has(run.service_id)) continue;
              services.add(run.service_id);
              const processes = this.exitProcesses.get(runId) ?? null;
              recorded.push({ runId, follow: this.runner(run.service_id).recordExit(run, exit, processes) });
            } else recorded.push({ runId, follow: () => undefined });
          } catch (error) {
            // Its savepoint is rolled back; the store may have rolled the whole transaction
            // back too (SQLITE_FULL can), so nothing more is written in it. It goes last, so
            // that a retry tries the others first.
            failed = { error, runId };
            this.unsettled.delete(runId);
            this.unsettled.set(runId, exit);
            break;
          }
        }
      });
    } catch (error) {
      // The commit itself was refused: none of them is on record.
      failed ??= { error, runId: null };
      recorded.length = 0;
    }
    for (const { runId } of recorded) {
      this.unsettled.delete(runId);
      this.exitProcesses.delete(runId);
    }
    // The exits are on disk a moment later, off the event loop: the launcher left their
    // records unsynced, since it told this daemon of them (decision 524).
    if (recorded.length > 0) void this.o.store.syncSoon();
    for (const { follow } of recorded) follow();
    if (failed && !this.settleFailing) {
      this.settleFailing = true;
      const { error, runId } = failed;
      this.o.log.error({ err: error, run: runId, disk_full: isDiskFull(error) }, "cannot record a service's exit yet: retrying");
    }
    if (this.unsettled.size === 0) {
      if (this.settleFailing) this.o.log.info("recorded the exits that were waiting for the disk");
      this.settleFailing = false;
      return;
    }
    // A second exit of a service waited for the first's: its turn is now.
    if (!failed && recorded.length > 0) {
      this.settlePending();
      return;
    }
    if (this.settleTimer || this.stopped) return;
    this.settleTimer = setTimeout(() => {
      this.settleTimer = null;
      this.settlePending();
    }, RETRY_SOON_MS);
    this.settleTimer.unref?.();
  }

  // ---------------------------------------------------------------- users

  /**
   * checkChosenUser resolves the admin's `user` to a user name, or answers 422: the host has
   * no such user, or the engine is not root and can run workloads only as itself.
   */
  private checkChosenUser(wanted: string): string {
    const user = this.users.resolve(wanted);
    const problem = !user
      ? `this host has no user ${wanted}`
      : !this.switchUsers && user.uid !== process.geteuid?.()
        ? `the engine runs unprivileged (uid ${process.geteuid?.()}) and can run workloads only as itself, not as ${user.name}`
        : null;
    if (problem || !user) throw new InputError([{ loc: ["body", "user"], msg: problem ?? "", type: "value_error", input: wanted }]);
    return user.name;
  }

  /**
   * logCauseOf reads a crashed run's output for its key line and cause (see LOG_CAUSES), with
   * the service's secrets redacted, and for a port clash finds who holds the port.
   */
  private logCauseOf(service: ServiceRow, version: VersionRow, lines: LogLine[]): LogCause | null {
    // A run that said nothing names no cause: no secrets are opened for a redactor with nothing to redact.
    if (lines.length === 0) return null;
    try {
      const cause = findLogCause(lines, redactor(this.secretValuesOf(version)));
      if (cause?.class !== "port_in_use") return cause;
      return explainPortClash(cause, version.spec, (pid) => this.serviceOfPid(pid));
    } catch (error) {
      this.o.log.warn({ err: error, service: service.name }, "cannot read the cause of a run's exit from its output");
      return null;
    }
  }

  /**
   * secretValuesOf lists the values a Diagnosis must never show: the service's secrets, its env
   * values under secret-looking names, and the secrets of the services bound to it.
   */
  private secretValuesOf(version: VersionRow): string[] {
    const secretName = /PASS|SECRET|TOKEN|KEY|CREDENTIAL|AUTH|PRIVATE/i;
    const values = Object.values(this.openSecrets(version));
    for (const [key, value] of Object.entries(version.spec.env)) if (secretName.test(key)) values.push(value);
    for (const name of version.spec.bindings) {
      const bound = this.o.store.findService(name);
      if (!bound) continue;
      const service = this.boundService(bound);
      values.push(...Object.values(service.secrets));
      for (const [key, value] of Object.entries(bindingVariables(service))) if (secretName.test(key)) values.push(value);
    }
    return values;
  }

  /**
   * serviceOfPid names the engine service a process belongs to: one whose live run is the
   * process or one of its ancestors, or whose run's cgroup (named by the run id) holds it.
   */
  private serviceOfPid(pid: number): string | null {
    const byPid = new Map<number, string>();
    const byRun = new Map<string, string>();
    const holders = new Map<number, string | null>();
    for (const [id, runner] of this.runners) {
      const handle = runner.handle;
      const name = handle ? this.o.store.getService(id)?.name : undefined;
      if (!handle || !name) continue;
      byPid.set(handle.pid, name);
      byRun.set(handle.runId, name);
      // A shim that holds one run names its service; a launcher holding several names none.
      holders.set(handle.shimPid, holders.has(handle.shimPid) ? null : name);
    }
    for (const [holder, name] of holders) if (name !== null && !byPid.has(holder)) byPid.set(holder, name);
    let current = pid;
    for (let depth = 0; depth < 64 && current > 1; depth++) {
      const name = byPid.get(current);
      if (name) return name;
      current = readProcessStat(current)?.ppid ?? 0;
    }
    try {
      for (const line of readFileSync(`/proc/${pid}/cgroup`, "utf8").split("\n")) {
        const name = byRun.get(basename(line.split(":").slice(2).join(":")));
        if (name) return name;
      }
    } catch {
      // gone, or no cgroups
    }
    return null;
  }

  /**
   * userNameOf is the user a service's workload runs (or will run) as, for its record and
   * Diagnosis: the admin's choice, PostgreSQL's and MariaDB's own user, or the service's own;
   * null: the engine's own (an unprivileged engine).
   */
  private userNameOf(service: ServiceRow, spec: ServiceSpec): string | null {
    if (!this.switchUsers) return spec.user ?? null;
    return spec.user ?? this.serverUserOf(spec) ?? serviceUserName(service.name);
  }

  /** recordedUser rebuilds the identity of a run started by an earlier daemon from the service's row. */
  private recordedUser(service: ServiceRow): WorkloadUser | null {
    if (!this.switchUsers || !service.run_as) return null;
    const { spec } = this.currentSpec(service);
    const groups = spec.user ? (this.users.resolve(spec.user)?.groups ?? []) : this.users.gpuGroups();
    const home = spec.user ? (this.users.resolve(spec.user)?.home ?? "/") : this.serviceDataDir(service.name);
    return { ...service.run_as, groups: [...new Set([...groups, ...this.fileBindingGroups(spec)])], home };
  }

  /**
   * fileBindingGroups are the groups of the databases `spec` binds to that bound services use
   * through their files (SQLite): each one's own group, which a root engine opens its data dir
   * and files to (decision 290). Read at every launch from the version being launched: a
   * binding removed by a patch or a redeploy takes the group away at the next launch. A
   * database that has not run yet has no user, and so no group to give.
   */
  private fileBindingGroups(spec: ServiceSpec): number[] {
    if (!this.switchUsers) return [];
    const groups: number[] = [];
    for (const name of spec.bindings) {
      const bound = this.o.store.findService(name);
      if (!bound?.run_as || !this.bindsThroughFiles(this.currentSpec(bound).spec)) continue;
      groups.push(bound.run_as.gid);
    }
    return groups;
  }

  /** bindsThroughFiles says whether `spec` is a managed database its bound services use through its files (SQLite). */
  private bindsThroughFiles(spec: ServiceSpec): boolean {
    const engine = spec.database?.engine;
    return Boolean(engine && this.databases.available(engine) && this.databases.get(engine).bindsThroughFiles);
  }

  /**
   * dataDirMode is the mode of a service's data dir: its user's alone (0700), but under a root
   * engine 2770 for a database its bound services use through its files (decision 290): the
   * group may make the journals SQLite writes beside the database, and setgid keeps what
   * either user makes there in the database's group.
   */
  private dataDirMode(spec: ServiceSpec): number {
    return this.switchUsers && this.bindsThroughFiles(spec) ? 0o2770 : 0o700;
  }

  /**
   * workloadUser returns who a service's code (its run, build and exec probes) runs as: null
   * (the engine's own user) when the engine cannot switch users or the database's adapter
   * runs its server as a user of its own (PostgreSQL, MariaDB); the admin's choice; or the
   * service's own user, made on first use, a Redis or SQLite service's included. The
   * service's data dir is given to that user (0700), and the row records it.
   */
  private async workloadUser(serviceId: string): Promise<WorkloadUser | null> {
    const service = this.o.store.getService(serviceId);
    if (!service || !this.switchUsers) return null;
    const { spec } = this.currentSpec(service);
    if (this.serverUserOf(spec)) return null;
    const dataDir = this.serviceDataDir(service.name);
    const dataDirMode = this.dataDirMode(spec);
    let user: WorkloadUser;
    if (spec.user) {
      const chosen = this.users.resolve(spec.user);
      if (!chosen) throw new Error(`the user ${spec.user} chosen for this service no longer exists on this host`);
      user = chosen;
    } else {
      user = await this.users.ensureServiceUser(service.name, dataDir, service.run_as);
    }
    await this.ensureDirAsync(dataDir, dataDirMode);
    // A stat and a listing read what the kernel has cached: done here, they add no wait to a restart.
    const owner = statSync(dataDir);
    if (owner.uid !== user.uid || owner.gid !== user.gid) {
      // First run as this user (an upgraded engine's services ran as root, or an admin changed
      // `user`): what is inside becomes the user's too, else it could not change its own files.
      // `chown -R` does not follow symbolic links (-P), so no link leads it out of the dir. A dir
      // just made (a new service's, the usual case) is empty: one chown of it is all, without a process.
      const empty = readdirSync(dataDir).length === 0;
      if (empty) await chown(dataDir, user.uid, user.gid);
      else {
        const chown = Bun.spawn(["chown", "-R", "-P", `${user.uid}:${user.gid}`, dataDir], { stdout: "ignore", stderr: "pipe" });
        const [stderr, code] = await Promise.all([new Response(chown.stderr).text(), chown.exited]);
        if (code !== 0) throw new Error(`could not give the data dir ${dataDir} to ${user.name}: ${stderr.trim().slice(0, 300)}`);
      }
      // An older engine made a database's dir 0750: the user's own is 0700, or a SQLite
      // database's 2770 (ensureDir sets it once per daemon; chown cleared the setgid bit). A
      // dir with the mode already, and no set-id bit for chown to clear, needs no chmod.
      if ((owner.mode & 0o7777) !== dataDirMode || (dataDirMode & 0o7000) !== 0) await chmod(dataDir, dataDirMode);
      // A new service's empty dir is no news (a line a batch job); files that changed owner are.
      if (!empty) this.o.log.info({ service: service.name, user: user.name, data_dir: dataDir }, "gave the service's data dir to its user");
    }
    // On record before the workload starts: a successor adopting it, and a delete removing
    // the user, read it from the row. The launches of one pass share the commit.
    const recorded: RecordedUser = { name: user.name, uid: user.uid, gid: user.gid };
    if (JSON.stringify(this.o.store.getService(serviceId)?.run_as) !== JSON.stringify(recorded)) {
      await this.o.store.writeSoon(() => {
        const current = this.o.store.getService(serviceId);
        if (current) this.o.store.updateService({ ...current, run_as: recorded });
      });
    }
    return user;
  }

  // ---------------------------------------------------------------- helpers

  private update(serviceId: string, patch: Partial<ServiceRow>): void {
    const service = this.o.store.getService(serviceId);
    if (!service) return;
    const updated = { ...service, ...patch, updated_at: iso(this.now()) };
    this.o.store.updateService(updated);
    this.changed(serviceId, updated);
  }

  private readonly changeListeners = new Set<ServiceChangeListener>();

  /** subscribe calls `listener` with a service's id after every change of its record, its deletion included. */
  subscribe(listener: ServiceChangeListener): () => void {
    this.changeListeners.add(listener);
    return () => this.changeListeners.delete(listener);
  }

  /** changed tells the listeners of a change of a service's row (`row`, when the caller has it). */
  private changed(serviceId: string, row?: ServiceRow): void {
    if (this.changeListeners.size === 0) return;
    const service = row ?? this.o.store.getService(serviceId);
    const change: ServiceChange = service
      ? { status: service.status, port: this.o.store.getVersion(service.id, service.version)?.spec.port ?? null }
      : null;
    for (const listener of this.changeListeners) {
      try {
        listener(serviceId, change);
      } catch (error) {
        this.o.log.error({ err: error }, "service change listener failed");
      }
    }
  }

  private readonly madeDirs = new Map<string, number>();

  /**
   * ensureDir makes a directory with its mode once per daemon (and again when the mode asked
   * for changes: a name deployed again as another kind of service): a recursive mkdir costs
   * more than a launch's spawn. Its parents must exist already (the data dir's layout, secureDataDir).
   */
  private ensureDir(dir: string, mode = 0o700): void {
    if (this.madeDirs.get(dir) === mode) return;
    // A plain mkdir first: the parents are there almost always, and Bun's recursive one costs
    // about five times as much (it walks the path); ENOENT falls back to it.
    let made = false;
    try {
      mkdirSync(dir, { mode });
      made = true;
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code === "ENOENT") mkdirSync(dir, { recursive: true, mode });
      else if (code !== "EEXIST" || !statSync(dir).isDirectory()) throw error;
    }
    if (this.chmodNeeded(made, mode)) chmodSync(dir, mode);
    this.madeDirs.set(dir, mode);
  }

  /**
   * chmodNeeded says whether a dir needs a chmod after its mkdir: one that was there already
   * (an older engine may have made it with another mode), a set-id bit (mkdir drops it), or
   * bits the umask took. A mode mkdir gave exactly needs none.
   */
  private chmodNeeded(made: boolean, mode: number): boolean {
    return !made || (mode & 0o7000) !== 0 || (mode & this.umask) !== 0;
  }

  /** ensureDirAsync is ensureDir off the event loop, for a launch's data dir: a new directory waits on the disk's journal. */
  private async ensureDirAsync(dir: string, mode = 0o700): Promise<void> {
    if (this.madeDirs.get(dir) === mode) return;
    let made = false;
    try {
      await mkdir(dir, { mode });
      made = true;
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code === "ENOENT") await mkdir(dir, { recursive: true, mode });
      else if (code !== "EEXIST" || !(await stat(dir)).isDirectory()) throw error;
    }
    if (this.chmodNeeded(made, mode)) await chmod(dir, mode);
    this.madeDirs.set(dir, mode);
  }

  /** umask is the daemon's, read once at start. */
  private readonly umask = process.umask();

  /** serviceDataDir is a service's own directory, `<data-dir>/data/<name>`, kept when the service is deleted. */
  serviceDataDir(name: string): string {
    return join(this.o.dataDir, "data", name);
  }

  /** ensureServiceDir makes services/ and services/<id>, the engine's own (0700). */
  private ensureServiceDir(serviceId: string): void {
    this.ensureDir(join(this.o.dataDir, "services"));
    this.ensureDir(this.serviceDir(serviceId));
  }

  /**
   * buildsDir holds a service's build checkouts, `<data-dir>/data/.builds/<id>`: under data/, the
   * one part of the data dir others may traverse, since a checkout is its run's cwd and the
   * service's user makes it. It goes with the service on delete (its data dir stays).
   */
  private buildsDir(serviceId: string): string {
    return join(this.o.dataDir, "data", BUILDS_DIR, serviceId);
  }

  serviceDir(serviceId: string): string {
    return join(this.o.dataDir, "services", serviceId);
  }

  logFile(serviceId: string): string {
    return join(this.serviceDir(serviceId), "logs", "output.log");
  }
}

function ownerKey(service: ServiceRow): string {
  return service.owner.token_id ?? "local";
}

/** PASSWORD_MASK stands for a secret in connection details shown without --reveal. */
const PASSWORD_MASK = "****";

/** kindInWords names a kind of service with its article: "a service", "a batch job". */
function kindInWords(kind: string): string {
  return kind === "batch" ? "a batch job" : `a ${kind}`;
}

/**
 * assertRepositoryReachable refuses, with the directory and the fix, a build from a local
 * repository (`file://` or a path) that the service's user may not read: the clone runs as
 * that user, never as the engine, so a closed directory would otherwise end in git's vague
 * "does not appear to be a git repository".
 */
function assertRepositoryReachable(repoUrl: string, user: WorkloadUser | null): void {
  if (!user) return;
  const path = repoUrl.startsWith("file://") ? decodeURIComponent(new URL(repoUrl).pathname) : repoUrl.startsWith("/") ? repoUrl : null;
  if (!path || !existsSync(path)) return; // a missing repository is git's to report
  const closed = firstUnreachableBy(path, user);
  if (!closed) return;
  throw new Error(
    `the repository ${path} is under ${closed}, which the service's user ${user.name} may not enter (builds clone as that user, not as the engine): let it read the repository (e.g. chmod o+rx ${closed}) or clone from a place it can reach`,
  );
}

/** stableJson writes a value with its object keys sorted and null fields left out, to compare specs. */
function stableJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(stableJson).join(",")}]`;
  if (value === null || typeof value !== "object") return JSON.stringify(value) ?? "null";
  const entries = Object.entries(value as Record<string, unknown>)
    .filter(([, field]) => field !== null && field !== undefined)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return `{${entries.map(([key, field]) => `${JSON.stringify(key)}:${stableJson(field)}`).join(",")}}`;
}

/** sameSpec says whether two versions' specs ask for the same thing (a patch that changes nothing makes no version). */
function sameSpec(a: ServiceSpec, b: ServiceSpec): boolean {
  return stableJson(a) === stableJson(b);
}

function sameSecrets(a: Record<string, string>, b: Record<string, string>): boolean {
  return stableJson(a) === stableJson(b);
}
