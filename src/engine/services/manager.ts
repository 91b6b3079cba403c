import { chownSync, existsSync, rmSync } from "node:fs";
import { join } from "node:path";
import type {
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
import { AppError } from "../../lib/errors";
import type { Logger } from "../../lib/logger";
import { InputError } from "../../lib/validation";
import { assertServiceInScope, inScope, type Principal } from "../auth";
import { runBuild } from "../builds";
import type { DatabaseEngines, LastDump, ServerControl } from "../databases";
import { checkPossible, type GpuInventory } from "../gpu";
import type { VcsTokenStore } from "../link";
import { describeExit, ExitSettler, gpuRequestOf, Placement, type RunnerHost, ServiceRunner, userEnv } from "../scheduler";
import { type ProcessStat, processTreeUsage, type Supervisor } from "../supervisor";
import type { TemplateCatalog } from "../templates";
import { canSwitchUsers, firstUnreachableBy, ServiceUsers, serviceUserName, type WorkloadUser } from "../users";
import { ManagedDatabases } from "./databases";
import { buildDiagnosis, CrashReader, KEY_SCAN_LINES, type LiveRun } from "./diagnose";
import { assembleRunEnv, assertNoBindingCycle, type BoundService, envPrefix } from "./env";
import { ServiceFiles } from "./files";
import { WorkloadIdentities } from "./identities";
import type { ServiceChange, ServiceChangeListener, ServiceDirectory } from "./index";
import { followLog, type LogCursor, type LogRecord, linesSince, tailLog, tailRecords } from "./logs";
import { EMPTY_RESTART_STATE, restartsInWindow } from "./restart-policy";
import { ServiceSecrets } from "./secrets";
import { applyPatch, deployOf, normalizeDeploy, type ServiceSpec } from "./spec";
import {
  EMPTY_FORENSICS,
  ENDED_STATUSES,
  handleOf,
  LIVE_STATUSES,
  type LiveWorkload,
  type RunRow,
  type ServiceRow,
  type ServiceStore,
  type VersionRow,
} from "./store";

/** DeployWrite is what a deploy wrote (ServiceManager.writeDeploy): a new service, a new version, or nothing. */
type DeployWrite =
  | { kind: "created"; row: ServiceRow }
  | { kind: "version"; id: string; version: number; wasLive: boolean; staysStopped: boolean }
  | { kind: "unchanged"; id: string };

/** GPU_REFRESH_MS is how often the GPU inventory is asked again. */
const GPU_REFRESH_MS = 60_000;
/** GPU_FRESH_MS is how recent a refresh made before start (a successor's, while it prepared) may be to stand for start's own. */
const GPU_FRESH_MS = 10_000;
/** DIAGNOSIS_LOG_LINES is how many of the latest log lines a Diagnosis carries. */
const DIAGNOSIS_LOG_LINES = 50;

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
 * at any point can reconcile on start. Running is the scheduler's (src/engine/scheduler): a
 * Placement pass decides who launches (plan.ts), each service's ServiceRunner launches
 * (through the prestart hooks), stops, watches health and settles its exits (exit.ts), and
 * the ExitSettler records the exits reported together in one commit. The parts it holds own
 * their state (decision 536): ServiceFiles (directories and logs), ServiceSecrets,
 * ManagedDatabases (adapters, connection details, restores), WorkloadIdentities (the OS
 * user each workload runs as) and diagnose's CrashReader. The runners read them through one
 * RunnerHost.
 */
export class ServiceManager implements ServiceDirectory {
  private readonly runners = new Map<string, ServiceRunner>();
  private draining = false;
  private stopped = false;
  private gpuTimer: ReturnType<typeof setInterval> | null = null;
  private readonly o: ManagerOptions;
  private readonly files: ServiceFiles;
  private readonly secrets: ServiceSecrets;
  private readonly databases: ManagedDatabases;
  private readonly identities: WorkloadIdentities;
  private readonly exits: ExitSettler;
  private readonly placement: Placement;
  private readonly crashes: CrashReader;

  private readonly host: RunnerHost;

  constructor(options: ManagerOptions) {
    this.o = options;
    const switchUsers = options.switchUsers ?? canSwitchUsers();
    this.files = new ServiceFiles(options.dataDir, options.log);
    this.secrets = new ServiceSecrets(options.secretBox);
    this.databases = new ManagedDatabases({
      store: options.store,
      files: this.files,
      secrets: this.secrets,
      clock: options.clock,
      log: options.log,
      env: options.env,
      engines: options.databases,
      switchUsers,
      scratchDir: join(options.dataDir, "tmp", "restores"),
      trustedCas: options.trustedCas,
      server: (serviceId) => this.restoreServer(serviceId),
      onRestoreEnded: options.onRestoreEnded,
    });
    this.identities = new WorkloadIdentities({
      store: options.store,
      files: this.files,
      databases: this.databases,
      log: options.log,
      users: options.users ?? new ServiceUsers(),
      switchUsers,
      dataDir: options.dataDir,
    });
    this.exits = new ExitSettler({
      store: options.store,
      log: options.log,
      recordExit: (serviceId, run, exit, processes) => this.runner(serviceId).recordExit(run, exit, processes),
      handedOver: () => this.stopped,
    });
    this.placement = new Placement({
      store: options.store,
      gpus: options.gpus,
      log: options.log,
      runner: (serviceId) => this.runner(serviceId),
      made: (serviceId) => this.runners.get(serviceId),
      boundService: (service) => this.boundService(service),
      note: (serviceId, message) => this.update(serviceId, { status_message: message }),
      held: () => this.stopped || this.draining,
    });
    this.crashes = new CrashReader({
      store: options.store,
      log: options.log,
      secrets: this.secrets,
      boundService: (service) => this.boundService(service),
      liveRuns: () => this.liveRuns(),
    });
    this.host = this.makeHost();
    options.supervisor.onExit((handle, exit) => this.exits.told(handle, exit));
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
          this.exits.queue(runId, exit);
          this.exits.settle();
        },
        handedOver: () => this.stopped,
      });
      this.runners.set(id, runner);
    }
    return runner;
  }

  /** host is what the runners and their launch hooks read of the engine: directories, users, secrets, bound services, logs. */
  private makeHost(): RunnerHost {
    const { files, identities } = this;
    return {
      baseEnv: this.o.env,
      serviceDataDir: (name) => files.dataDir(name),
      serviceDir: (serviceId) => files.serviceDir(serviceId),
      ensureDir: (dir, mode) => files.ensureAsync(dir, mode),
      dataDirMode: (spec) => identities.dataDirMode(spec),
      findService: (name) => this.o.store.findService(name),
      boundService: (service) => this.boundService(service),
      openSecrets: (version) => this.secrets.open(version),
      workloadUser: (serviceId) => identities.ensure(serviceId),
      fileBindingGroups: (spec) => identities.fileBindingGroups(spec),
      appendLog: (serviceId, line) => files.appendLog(serviceId, line),
      database: (service) => this.databases.of(service),
      logFile: (serviceId) => files.logFile(serviceId),
      runOutput: (serviceId, run) =>
        linesSince(files.logFile(serviceId), KEY_SCAN_LINES, this.o.logMaxFiles, run.started_at.replace(/Z$/, "")),
      crashCause: (service, version, output) => this.crashes.causeOf(service, version, output),
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
    this.exits.settle();
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
          if (this.identities.startedAsRoot(service)) {
            this.o.log.warn(
              { service: service.name, user: serviceUserName(service.name) },
              "this service was started as root by an older engine: restart it to run it as its own user",
            );
          }
          this.runner(service.id).adopt(service, run, handle, this.identities.forAdoption(service));
          adopted.services.push(service.name);
          adopted.workload_pids.push(handle.pid);
          continue;
        }
        this.o.log.info({ service: service.name, exit: found.exit }, "a service ended while the daemon was away");
        this.exits.queue(run.id, found.exit);
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
      } else if (!ENDED_STATUSES.has(service.status)) {
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
      this.identities.warm(service);
    }
  }

  /**
   * handOver stops everything this daemon does in-process (timers, probes, builds) and leaves
   * workloads running under their shims, for the next daemon to adopt.
   */
  handOver(): void {
    this.stopped = true;
    if (this.gpuTimer) clearInterval(this.gpuTimer);
    this.exits.stop();
    for (const runner of this.runners.values()) runner.handOver();
  }

  /** accountsIdle resolves once no write of the account files (a new service user's) is in flight or due. */
  accountsIdle(): Promise<void> {
    return this.identities.idle();
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
      .flatMap((run) =>
        run.pid !== null && this.exits.pending(run.run_id) === undefined ? [{ id: run.id, name: run.name, pid: run.pid }] : [],
      );
  }

  /** record is a service's record for the API; `runs` are the current runs when the caller read them all at once. */
  record(service: ServiceRow, runs?: ReadonlyMap<string, RunRow>): ServiceRecord {
    const { spec } = this.o.store.currentVersion(service);
    const runner = this.runner(service.id);
    const runId = service.current_run_id;
    const run = runId ? (runs ? (runs.get(runId) ?? null) : this.o.store.getRun(runId)) : null;
    // An exit the store could not take yet (a full disk) is still an exit: no process is shown.
    const pendingExit = run ? this.exits.pending(run.id) : undefined;
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
      user: this.identities.nameOf(service, spec),
      connection: this.databases.masked(service, spec),
      created_at: service.created_at,
      updated_at: service.updated_at,
      started_at: live ? run.started_at : null,
    };
  }

  diagnose(ident: string): Diagnosis {
    const service = this.find(ident);
    const version = this.o.store.currentVersion(service);
    const runner = this.runner(service.id);
    return buildDiagnosis({
      service,
      version,
      latest: this.o.store.latestVersion(service.id) ?? version,
      runs: this.o.store.lastRuns(service.id, 1),
      // The monitor's own state is the latest; the runner's healthState is its last reported change.
      healthState: runner.healthNow(LIVE_STATUSES.has(service.status)),
      ...runner.diagnosisInputs(),
      logs: tailLog(this.files.logFile(service.id), DIAGNOSIS_LOG_LINES, this.o.logMaxFiles),
      nowMs: this.now().getTime(),
      lastDump: this.o.store.getLastDump(service.id),
      user: this.identities.nameOf(service, version.spec),
      cwd: version.build_dir ?? version.spec.cwd ?? this.files.dataDir(service.name),
    });
  }

  /**
   * revealConnection answers a managed database's connection details in full, password
   * included (the route is admin only), and logs who asked (ManagedDatabases.reveal).
   */
  revealConnection(ident: string, principal: Principal): RevealedConnection {
    return this.databases.reveal(this.find(ident), principal);
  }

  /** restoreDatabase restores a dump into a database service; see RestoreCoordinator. */
  restoreDatabase(
    name: string,
    dump: string,
    timeoutS: number,
  ): Promise<{ service_name: string; dump: string; engine: string; duration_s: number }> {
    return this.databases.restores.restore(name, dump, timeoutS);
  }

  /** restoreServer stops and starts a database's server for a restore that replaces its files. */
  private restoreServer(serviceId: string): ServerControl {
    return {
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
    };
  }

  logs(ident: string, tail: number): LogLine[] {
    const service = this.find(ident);
    return tailLog(this.files.logFile(service.id), tail, this.o.logMaxFiles);
  }

  logRecords(ident: string, tail: number): { records: LogRecord[]; end: LogCursor } {
    const service = this.find(ident);
    return tailRecords(this.files.logFile(service.id), tail, this.o.logMaxFiles);
  }

  followLogs(ident: string, signal: AbortSignal, from: LogCursor): AsyncGenerator<LogRecord> {
    const service = this.find(ident);
    return followLog(this.files.logFile(service.id), signal, { from, maxFiles: this.o.logMaxFiles });
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
    const latest = this.o.store.latestVersion(service.id) ?? this.o.store.currentVersion(service);
    const body = applyPatch(deployOf(latest.spec, this.secrets.open(latest)), patch);
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
    if (spec.user) spec.user = this.identities.checkChosen(spec.user);
    await this.databases.prepareSpec(spec, secrets, this.o.store.findService(spec.name));
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
      for (const other of this.o.store.listServices()) graph.set(other.name, this.o.store.currentVersion(other).spec.bindings);
      assertNoBindingCycle(spec.name, spec.bindings, graph);
    }
    if (principal.maxGpus !== null && spec.gpus > principal.maxGpus) {
      throw new AppError("cap_exceeded", `this token may hold at most ${principal.maxGpus} GPUs; the deploy asks for ${spec.gpus}`);
    }
    const impossible = checkPossible(this.o.gpus.snapshot().devices, gpuRequestOf("new", spec, 0));
    if (impossible) throw new AppError("gpu_request_impossible", impossible);
    this.assertPortFree(spec);

    const now = iso(this.now());
    const existing = this.o.store.findService(spec.name);
    const seal = (id: string, version: number) => this.secrets.seal(id, version, secrets);
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
    if (mode.patch && latest && sameSpec(latest.spec, spec) && sameSecrets(this.secrets.open(latest), secrets)) {
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
      if (this.o.store.currentVersion(other).spec.port !== spec.port) continue;
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
    const workDir = join(this.files.buildsDir(serviceId), String(version));
    rmSync(workDir, { recursive: true, force: true });
    const buildsDir = this.files.ensureBuildsDir(serviceId, this.identities.switching);
    const credential = this.o.vcs.credentialFor(row.spec.build.repo_url);
    const env = assembleRunEnv({ base: this.o.env, engine: {}, bindings: {}, env: row.spec.env, secrets: {}, gpu: {} }).env;
    let result: Awaited<ReturnType<typeof runBuild>>;
    try {
      // The build runs the repository's code: as the service's user, in a directory it owns.
      const user = await this.identities.ensure(serviceId);
      if (user) chownSync(buildsDir, user.uid, user.gid);
      assertRepositoryReachable(row.spec.build.repo_url, user);
      for (const [key, value] of Object.entries(userEnv(user))) if (!(key in row.spec.env)) env[key] = value;
      result = await runBuild(row.spec.build, {
        workDir,
        logPath: this.files.buildLog(serviceId),
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
   * user with it (WorkloadIdentities.release).
   */
  async remove(ident: string): Promise<void> {
    const service = this.find(ident);
    const dependents = this.o.store
      .listServices()
      .filter((other) => other.id !== service.id && this.o.store.currentVersion(other).spec.bindings.includes(service.name))
      .map((other) => other.name);
    this.update(service.id, { desired_state: "stopped" });
    const runner = this.runner(service.id);
    runner.abortSetup();
    await runner.launched;
    await runner.stop("deleted");
    runner.cancelPending();
    this.runners.delete(service.id);
    // A write of the account files in flight holds their locks: the release below must not meet it.
    if (this.identities.switching) await this.identities.idle();
    // The row as it ends: a launch under way when the delete came may have recorded its user since.
    const last = this.o.store.getService(service.id) ?? service;
    this.o.store.deleteService(service.id);
    this.changed(service.id);
    this.files.removeService(service.id);
    const released = this.identities.release(last);
    this.o.log.info({ service: service.name, dependents, ...(released ? { user_removed: released } : {}) }, "service deleted");
    this.schedule();
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

  /** schedule asks for a placement pass soon (scheduler/placement.ts): what changed may free a slot or satisfy a binding. */
  schedule(): void {
    this.placement.schedule();
  }

  /** liveRuns are the runs the runners hold now, with their services' names. */
  private *liveRuns(): Generator<LiveRun> {
    for (const [id, runner] of this.runners) {
      const handle = runner.handle;
      const service = handle ? this.o.store.getService(id)?.name : undefined;
      if (handle && service) yield { service, handle };
    }
  }

  private boundService(service: ServiceRow): BoundService {
    const version = this.o.store.currentVersion(service);
    const database = this.databases.of(service);
    return {
      name: service.name,
      kind: service.kind,
      template_id: version.spec.template_id,
      port: version.spec.port,
      env: version.spec.env,
      secrets: this.secrets.open(version),
      database: database ? database.adapter.bindings(database.instance, envPrefix(service.name)) : undefined,
    };
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
