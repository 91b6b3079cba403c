import { rm } from "node:fs/promises";
import { join } from "node:path";
import type { LogLine } from "../../contract/engine";
import { type Clock, iso } from "../../lib/clock";
import { randomId } from "../../lib/crypto";
import { isDiskFull } from "../../lib/errors";
import type { Logger } from "../../lib/logger";
import { HealthMonitor, type HealthState } from "../health";
import type { LogCause } from "../services/diagnose";
import { startsAgainSoon } from "../services/restart-policy";
import type { GpuHold, RunRow, ServiceRow, ServiceStore, VersionRow } from "../services/store";
import type { ExitRecord, LaunchResult, RunHandle, Supervisor } from "../supervisor";
import type { WorkloadUser } from "../users";
import { planExit } from "./exit";
import { type HookHost, type Launch, type ManagedDatabase, PREPARE_HOOKS, runPrestart, userEnv } from "./hooks";
import { describeStopCommand, runStopCommand, stopCommandOf } from "./stop";

/** RunNotRecorded stops a launch whose run record was rolled back with its placement pass. */
class RunNotRecorded extends Error {
  constructor(runId: string) {
    super(`the run ${runId} was not recorded: its placement pass did not commit`);
  }
}

/** RETRY_SOON_MS is how soon a launch or a requeue the disk refused is tried again. */
export const RETRY_SOON_MS = 1000;
/** READY_POLL_MS bounds how often a starting database is asked whether it accepts connections. */
const READY_POLL_MS = { first: 50, max: 1000 };

/** RunnerHost is what a runner reads from the rest of the engine besides the hooks' needs. */
export interface RunnerHost extends HookHost {
  /** database is a managed database service's adapter and instance; null for other services. */
  database(service: ServiceRow): ManagedDatabase | null;
  logFile(serviceId: string): string;
  /** runOutput is the last lines (KEY_SCAN_LINES) of a run's own output, read when it exits. */
  runOutput(serviceId: string, run: RunRow): LogLine[];
  /** crashCause reads a crashed run's output for its key line and cause, with secrets redacted (services/diagnose). */
  crashCause(service: ServiceRow, version: VersionRow, output: LogLine[]): LogCause | null;
}

/** RunnerContext is all a runner may use: the store, the supervisor, the clock, and two calls back. */
export interface RunnerContext {
  store: ServiceStore;
  supervisor: Supervisor;
  log: Logger;
  clock: Clock;
  host: RunnerHost;
  /** changed tells the coordinator's subscribers that a service's record changed (`row`: as written, when the caller has it). */
  changed(serviceId: string, row?: ServiceRow): void;
  /** schedule asks for a placement pass soon (what ended may free a slot; what started may unblock a binding). */
  schedule(): void;
  /** exited queues an exit the supervisor will never report (a launch that failed before its process existed). */
  exited(runId: string, exit: ExitRecord): void;
  /** handedOver says whether the daemon has handed its workloads over to the next one. */
  handedOver(): boolean;
}

/**
 * ServiceRunner runs one service, as Nomad's task runner runs one task: it owns the live run's
 * handle and GPU hold, the health monitor, the retry timer, the stop in progress and who waits
 * for it, and the launch under way. `start` launches through the hooks, `stop` ends the run on
 * purpose, `onExit` settles an exit (exit.ts) and arms the retry. The coordinator
 * (ServiceManager) decides when; the runner does, and writes every change to the store first.
 */
export class ServiceRunner {
  private run: RunHandle | null = null;
  private hold: GpuHold | null = null;
  /** user is who the live run (and so its exec probes) runs as; null: the engine's own user. */
  private user: WorkloadUser | null = null;
  private health: HealthMonitor | null = null;
  /** lastHealth is the monitor's last reported state; it outlives the monitor (bindings read it). */
  private lastHealth: HealthState | null = null;
  private healthKill = false;
  /** waits say what a pending service's bindings wait for, and which variables they will give (Diagnosis). */
  private waits: { messages: string[]; pendingKeys: string[] } = { messages: [], pendingKeys: [] };
  private envSource = "none";
  private launchingNow = false;
  /** launchUnderWay settles when the launch under way has started its process (or failed): a stop waits for it. */
  private launchUnderWay: Promise<void> | null = null;
  private setup: AbortController | null = null;
  /** build aborts the version build under way (the coordinator runs builds; a requeue or delete cancels them). */
  private build: AbortController | null = null;
  private retryTimer: ReturnType<typeof setTimeout> | null = null;
  /** stopping is set while a user's stop, restart, redeploy or delete ends the run on purpose. */
  private stopping = false;
  private readonly exitWaiters: (() => void)[] = [];
  private forcedKill = false;
  private stopMethod: string | null = null;

  constructor(
    readonly serviceId: string,
    private readonly ctx: RunnerContext,
  ) {}

  /** handle is the live run's process handle; null when no process runs. */
  get handle(): RunHandle | null {
    return this.run;
  }

  /** gpuHold is what the live (or launching) run holds of the GPUs. */
  get gpuHold(): GpuHold | null {
    return this.hold;
  }

  /** healthState is the health monitor's last reported state. */
  get healthState(): HealthState | null {
    return this.lastHealth;
  }

  /** launching is true from a launch's start until its process is known (or the launch failed). */
  get launching(): boolean {
    return this.launchingNow;
  }

  /** launched settles when the launch under way, if any, has started its process or failed. */
  get launched(): Promise<void> | null {
    return this.launchUnderWay;
  }

  /** diagnosisInputs is what Diagnosis reads of the runner: what the bindings wait for, the env's sources. */
  diagnosisInputs(): { bindingMessages: string[]; pendingEnvKeys: string[]; envSource: string } {
    return { bindingMessages: this.waits.messages, pendingEnvKeys: this.waits.pendingKeys, envSource: this.envSource };
  }

  /** waitingOn records what the service's bindings wait for, from the latest placement pass. */
  waitingOn(messages: string[], pendingKeys: string[]): void {
    this.waits = { messages, pendingKeys };
  }

  /** beginBuild aborts the build under way and returns the controller of the next; endBuild forgets it if still current. */
  beginBuild(): AbortController {
    this.build?.abort();
    this.build = new AbortController();
    return this.build;
  }

  endBuild(controller: AbortController): void {
    if (this.build === controller) this.build = null;
  }

  /** healthNow is the live monitor's state, or the last one reported while the service is live. */
  healthNow(live: boolean): HealthState | null {
    return this.health ? this.health.state() : live ? this.lastHealth : null;
  }

  /** start launches the service now with `hold`; a launch that throws is tried again a moment later. */
  start(hold: GpuHold | null): void {
    const launched = this.launchWith(hold).catch((error) => this.launchFailed(error));
    this.launchUnderWay = launched;
    void launched.finally(() => {
      if (this.launchUnderWay === launched) this.launchUnderWay = null;
    });
  }

  private async launchWith(hold: GpuHold | null): Promise<void> {
    const { store, supervisor, host } = this.ctx;
    const service = store.getService(this.serviceId);
    if (!service) return;
    this.launchingNow = true;
    this.hold = hold;
    const version = this.ctx.store.currentVersion(service);
    const { spec } = version;
    const runId = randomId("run");
    const dataDir = host.serviceDataDir(service.name);
    const setup = new AbortController();
    const launch: Launch = {
      service,
      version,
      spec,
      runId,
      runDir: join(host.serviceDir(service.id), "runs", runId),
      dataDir,
      cwd: version.build_dir ?? spec.cwd ?? dataDir,
      hold,
      database: host.database(service),
      parts: { engine: engineVariables(service, spec.port, dataDir, runId), bindings: {}, secrets: {}, gpu: {} },
      env: {},
      injectedKeys: [],
      envSource: "none",
      argv: spec.command,
      user: null,
      signal: setup.signal,
      status: (message) => this.update({ status_message: message }),
    };
    for (const hook of PREPARE_HOOKS) hook.run(launch, host);
    this.envSource = launch.envSource;
    this.waits = { ...this.waits, pendingKeys: [] };
    // The run is on record before its shim exists: a daemon that dies while the shim starts
    // finds the run on start and recovers it from its directory, never starting a second copy.
    store.transaction(() => {
      store.insertRun(newRun(launch, iso(this.ctx.clock.now())));
      this.update({
        status: "scheduled",
        status_message: hold ? `placed on GPU ${hold.visible_ids.join(",")}` : null,
        current_run_id: runId,
      });
    });
    let result: LaunchResult;
    this.setup = setup;
    try {
      await runPrestart(launch, host);
      // The record was written in the placement pass's transaction, committed when the pass
      // returned: if that commit failed (a full disk), no process may start for a run not on record.
      if (!store.getRun(runId)) throw new RunNotRecorded(runId);
      const { argv, env, cwd, user } = launch;
      result = await supervisor.launch({
        runId,
        runDir: launch.runDir,
        logFile: host.logFile(service.id),
        argv,
        env,
        cwd,
        memoryMb: spec.memory_mb,
        user,
        spare: startsAgainSoon(service.kind, spec.restart, service.restart_state),
      });
    } catch (error) {
      if (error instanceof RunNotRecorded) {
        this.hold = null;
        throw error; // launchFailed: the service is still pending, and tried again a moment later
      }
      result = {
        ok: false,
        exit: {
          exitCode: null,
          signal: null,
          endedAt: iso(this.ctx.clock.now()),
          // A run directory or data dir refused for lack of space is the disk's fault, not the
          // service's: the exit plan queues it again instead of failing it.
          execError: isDiskFull(error) ? "ENOSPC" : "ESETUP",
          execStage: "setup",
          execMessage: (error as Error).message,
          oomKilled: false,
          lost: false,
        },
      };
    } finally {
      this.setup = null;
      this.user = launch.user;
    }
    this.launchingNow = false;
    if (this.ctx.handedOver()) return; // the next daemon recovers the run from its directory
    if (!store.getService(this.serviceId)) {
      if (result.ok) supervisor.signal(result.handle, "SIGKILL");
      return;
    }
    if (!result.ok) return this.ctx.exited(runId, result.exit);
    const { handle } = result;
    // A workload that exits at once can be reported, and settled, before this point: its
    // settle recorded the processes the supervisor reported with its exit.
    const recorded = store.getRun(runId);
    if (recorded?.ended_at !== null) {
      if (recorded?.shim_pid === null) store.recordRunProcesses(runId, handle);
      return;
    }
    const { database } = launch;
    this.run = handle;
    this.ctx.log.info(
      { service: service.name, workload_pid: handle.pid, run: runId },
      database ? "database server started" : "service started",
    );
    if (database) {
      store.transaction(() => {
        store.recordRunProcesses(runId, handle);
        // A database is `running` only once it accepts connections: until then it stays scheduled.
        this.update({ status_message: `waiting for ${database.adapter.label} to accept connections` });
      });
      return void this.awaitDatabaseReady(runId, database);
    }
    this.startHealth();
    // The launches the launcher reported together go on record as running in one commit, on
    // the next turn of the event loop (a crash before it finds the run by its directory, as
    // one between the spawn and any commit does). By then the run may have been settled, its
    // processes with it, or the service stopped or paused: only a run still scheduled becomes running.
    store
      .writeSoon(() => {
        if (this.ctx.handedOver() || store.getRun(runId)?.ended_at !== null) return;
        store.recordRunProcesses(runId, handle);
        const now = store.getService(this.serviceId);
        if (now?.current_run_id === runId && now.status === "scheduled") this.update({ status: "running", status_message: null });
      })
      .then(
        () => this.ctx.schedule(), // services bound to this one may now start
        (error) => this.ctx.log.error({ err: error, service: service.name, run: runId }, "could not record a started service as running"),
      );
  }

  /**
   * launchFailed handles a launch that threw before its run was settled: on a full disk the
   * run could not be recorded (so nothing was started, or the supervisor reports its exit).
   * The service stays pending and is scheduled again a moment later.
   */
  private launchFailed(error: unknown): void {
    this.launchingNow = false;
    this.ctx.log.error({ err: error, service: this.serviceId, disk_full: isDiskFull(error) }, "launch failed: trying again");
    if (!this.retryTimer) this.scheduleSoon();
  }

  /**
   * adopt takes over a run a previous daemon started, found still running: no restart counted
   * (the manager logs one line for all it adopted). A database still starting is running once
   * it accepts connections, as at launch.
   */
  adopt(service: ServiceRow, run: RunRow, handle: RunHandle, user: WorkloadUser | null): void {
    this.run = handle;
    this.hold = run.gpus;
    this.user = user;
    const database = this.ctx.host.database(service);
    if (database && service.status === "scheduled" && service.desired_state !== "stopped") {
      return void this.awaitDatabaseReady(run.id, database);
    }
    if (service.status === "scheduled") this.update({ status: "running", status_message: null });
    if (service.desired_state === "stopped") void this.stop("stopped");
    else if (service.status !== "paused") this.startHealth();
  }

  /**
   * awaitDatabaseReady keeps a started database `scheduled` until its adapter says it accepts
   * connections, then makes it `running` (and lets services bound to it start). It gives up
   * only when the run ends or the daemon hands over: a server in crash recovery may take long.
   */
  private async awaitDatabaseReady(runId: string, { adapter, instance }: ManagedDatabase): Promise<void> {
    const { host, log } = this.ctx;
    let delay = READY_POLL_MS.first;
    let lastDetail = "";
    const live = () => !this.ctx.handedOver() && this.run?.runId === runId && this.ctx.supervisor.isWatching(runId);
    const note = (line: string) => host.appendLog(this.serviceId, line);
    while (live()) {
      const result = await adapter
        .ready(instance, new AbortController().signal)
        .catch((error: Error) => ({ ready: false, detail: error.message }));
      if (!live()) return;
      if (result.ready) {
        try {
          await adapter.afterReady?.(instance, { log: note, signal: new AbortController().signal });
        } catch (error) {
          note(`after start: ${(error as Error).message}`);
        }
        if (!live() || this.ctx.store.getService(this.serviceId)?.status !== "scheduled") return;
        this.update({ status: "running", status_message: null });
        // SQLite has no server and no port: it is ready at its file.
        const where = adapter.hasServer ? null : (adapter.location?.(instance) ?? instance.dataDir);
        note(where ? `${adapter.label} ready at ${where}` : `${adapter.label} accepts connections on ${instance.host}:${instance.port}`);
        log.info({ service: instance.serviceName, engine: adapter.name }, where ? "database ready" : "database accepts connections");
        this.startHealth();
        this.ctx.schedule(); // services bound to it may now start
        return;
      }
      if (result.detail !== lastDetail) {
        lastDetail = result.detail;
        const waiting = adapter.hasServer ? `waiting for ${adapter.label} to accept connections` : `waiting for ${adapter.label}`;
        this.update({ status_message: `${waiting}: ${result.detail}` });
      }
      await Bun.sleep(delay);
      delay = Math.min(READY_POLL_MS.max, delay * 2);
    }
  }

  /** abortSetup stops a database's initialization under way: its launch fails instead of starting. */
  abortSetup(): void {
    this.setup?.abort();
  }

  /**
   * stop ends the live run on purpose: SIGTERM to the process group (SIGCONT first if it is
   * paused), or a database's own clean stop, then SIGKILL after the spec's stop timeout. It
   * resolves when the shim has recorded the exit. Purposeful ends are not counted by the
   * restart policy.
   */
  async stop(reason: string): Promise<void> {
    const { supervisor, host, log } = this.ctx;
    const handle = this.run;
    if (!handle || !supervisor.isWatching(handle.runId)) return;
    const service = this.ctx.store.getService(this.serviceId);
    const timeoutS = service ? this.ctx.store.currentVersion(service).spec.stop_timeout_s : 10;
    this.stopping = true;
    this.stopHealth();
    const ended = new Promise<void>((resolve) => this.exitWaiters.push(resolve));
    const database = service ? host.database(service) : null;
    const stopArgv = database ? stopCommandOf(database) : null;
    this.forcedKill = false;
    this.stopMethod = stopArgv ? describeStopCommand(stopArgv) : "SIGTERM";
    log.info({ service: service?.name, reason, method: this.stopMethod }, "stopping the service's process group");
    // A paused process must run again to stop; a database's own stop command needs it awake too.
    supervisor.signal(handle, "SIGCONT");
    if (stopArgv && database) {
      host.appendLog(this.serviceId, `stop: ${this.stopMethod}`);
      void this.cleanStop(stopArgv, database.instance.env, handle);
    } else {
      supervisor.signal(handle, "SIGTERM");
    }
    const timer = setTimeout(() => {
      if (!supervisor.signal(handle, "SIGKILL")) return;
      this.forcedKill = true;
      host.appendLog(
        this.serviceId,
        `stop: ${this.stopMethod} did not end the process within ${timeoutS} s (stop_timeout_s): sent SIGKILL`,
      );
      log.warn({ service: service?.name, method: this.stopMethod, timeout_s: timeoutS }, "clean stop timed out: killed");
    }, timeoutS * 1000);
    await ended;
    clearTimeout(timer);
    this.stopping = false;
  }

  /** cleanStop runs a database's own clean stop; when it fails, SIGTERM is sent instead. */
  private async cleanStop(argv: string[], env: Record<string, string>, handle: RunHandle): Promise<void> {
    const stopped = await runStopCommand(argv, env, (line) => this.ctx.host.appendLog(this.serviceId, line));
    if (!stopped) this.ctx.supervisor.signal(handle, "SIGTERM");
  }

  /** pause stops the live process with SIGSTOP and its health checks; false when there is no live process. */
  pause(): boolean {
    if (!this.run || !this.ctx.supervisor.signal(this.run, "SIGSTOP")) return false;
    this.stopHealth();
    return true;
  }

  /** resume continues a paused process and its health checks. */
  resume(): void {
    if (this.run) this.ctx.supervisor.signal(this.run, "SIGCONT");
    this.startHealth();
  }

  /**
   * recordExit settles a run's exit in the store: planExit (exit.ts) decides, and one transaction
   * (a savepoint of the caller's, which settles the exits reported together) records it. It
   * answers what follows once that is committed: the runner forgets the process, wakes stop()'s
   * waiters and arms the retry. It throws when the store refuses the write (a full disk):
   * nothing was half-settled, and the coordinator tries again.
   */
  recordExit(run: RunRow, exit: ExitRecord, processes: RunHandle | null = null): () => void {
    const { store, host, log } = this.ctx;
    const service = store.getService(this.serviceId);
    if (!service) return () => undefined;
    const version = this.ctx.store.currentVersion(service);
    const plan = planExit({
      service,
      spec: version.spec,
      run,
      exit,
      output: host.runOutput(this.serviceId, run),
      stopping: this.stopping,
      waited: this.exitWaiters.length > 0,
      healthKill: this.healthKill,
      forcedKill: this.forcedKill,
      stopMethod: this.stopMethod,
      nowMs: this.ctx.clock.now().getTime(),
      crashCause: (output) => host.crashCause(service, version, output),
    });
    const settled = { ...service, ...plan.patch, updated_at: iso(this.ctx.clock.now()) };
    const pruned = store.transaction(() => {
      // A run that ended before its launch recorded its processes: they go with its exit.
      if (run.shim_pid === null && processes) store.recordRunProcesses(run.id, processes);
      store.endRun(run.id, exit.endedAt, plan.runExit, plan.endReason);
      store.updateService(settled);
      return store.pruneRuns(this.serviceId);
    });
    return () => {
      // Stored: now the process's own state follows. The dropped runs' directories go off the
      // event loop: on a busy disk an unlink waits for the journal, and a restart waited for it.
      for (const dir of pruned) void rm(dir, { recursive: true, force: true }).catch(() => undefined);
      this.forcedKill = false;
      this.run = null;
      this.hold = null;
      this.stopHealth();
      this.healthKill = false;
      this.ctx.changed(this.serviceId, settled);
      const { exitCode: exit_code, signal, oomKilled: oom_killed } = exit;
      log.info({ service: service.name, run: run.id, exit_code, signal, oom_killed, reason: plan.endReason }, "service process ended");
      for (const resolve of this.exitWaiters.splice(0)) resolve();
      if (plan.retryDelayMs !== null) this.armRetry(plan.retryDelayMs);
      if (plan.requeue && !this.retryTimer && !this.ctx.handedOver()) this.scheduleSoon();
      else this.ctx.schedule();
    };
  }

  /**
   * armRetry makes a restarting (or retrying) service pending again after `delayMs`, the restart
   * policy's backoff. With no backoff it does so at once, without a timer's turn of the event loop.
   */
  armRetry(delayMs: number): void {
    if (this.retryTimer) clearTimeout(this.retryTimer);
    this.retryTimer = null;
    if (delayMs <= 0) {
      this.retryNow();
      return;
    }
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      this.retryNow();
    }, delayMs);
  }

  private retryNow(): void {
    const service = this.ctx.store.getService(this.serviceId);
    if (service?.desired_state !== "running") return;
    if (service.status !== "restarting" && service.status !== "retrying") return;
    try {
      this.update({
        status: "pending",
        status_message: "waiting to be scheduled",
        restart_state: { ...service.restart_state, next_retry_at: null },
      });
    } catch (error) {
      // A timer must not throw (that ends the daemon): on a full disk, try again shortly.
      this.ctx.log.error({ err: error, service: service.name, disk_full: isDiskFull(error) }, "cannot schedule a restart yet: retrying");
      this.armRetry(RETRY_SOON_MS);
      return;
    }
    this.ctx.schedule();
  }

  /** scheduleSoon asks for a placement pass a moment from now (the disk may have room by then). */
  private scheduleSoon(): void {
    if (this.ctx.handedOver()) return;
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      this.ctx.schedule();
    }, RETRY_SOON_MS);
    this.retryTimer.unref?.();
  }

  /** cancelPending drops a retry that is waiting and a build under way. */
  cancelPending(): void {
    if (this.retryTimer) clearTimeout(this.retryTimer);
    this.retryTimer = null;
    this.build?.abort();
    this.build = null;
  }

  /** handOver stops everything in-process (timers, probes, builds, setups) and leaves the run to the next daemon. */
  handOver(): void {
    if (this.retryTimer) clearTimeout(this.retryTimer);
    this.health?.stop();
    this.build?.abort();
    this.setup?.abort();
  }

  /** startHealth starts the spec's health probe for the live run (none: nothing to watch). */
  startHealth(): void {
    const service = this.ctx.store.getService(this.serviceId);
    if (!service || this.ctx.handedOver()) return;
    const { spec } = this.ctx.store.currentVersion(service);
    this.stopHealth();
    if (!spec.health) return;
    // The start period counts from the run's start: a monitor started again for a workload that
    // has been up a while (resumed, or adopted by a restarted daemon) gives it no fresh grace.
    const run = service.current_run_id ? this.ctx.store.getRun(service.current_run_id) : null;
    const startedAt = run?.started_at ? Date.parse(run.started_at) : undefined;
    const monitor = new HealthMonitor(
      spec.health,
      // An exec probe is the service's code too: it runs as the workload's user.
      {
        host: "127.0.0.1",
        port: spec.health.port ?? spec.port,
        cwd: spec.cwd ?? undefined,
        env: userEnv(this.user),
        inherited: this.ctx.host.baseEnv,
        user: this.user,
      },
      { onChange: (state) => this.onHealth(monitor, state) },
      { now: () => this.ctx.clock.now().getTime(), startedAt: Number.isFinite(startedAt) ? startedAt : undefined },
    );
    this.health = monitor;
    this.lastHealth = null;
    monitor.start();
  }

  private stopHealth(): void {
    this.health?.stop();
    this.health = null;
  }

  private onHealth(monitor: HealthMonitor, state: HealthState): void {
    if (this.health !== monitor) return;
    this.lastHealth = state;
    const service = this.ctx.store.getService(this.serviceId);
    if (!service) return;
    if (state.healthy === true && service.status === "degraded") {
      this.update({ status: "running", status_message: null });
    } else if (state.healthy === false && service.status === "running") {
      this.update({ status: "degraded", status_message: `health check failing: ${state.last?.detail ?? "no detail"}` });
    }
    if (state.healthy === true) this.ctx.schedule(); // dependents may be waiting on this
    const { spec } = this.ctx.store.currentVersion(service);
    if (!state.threshold_reached || spec.restart.policy === "never" || !this.run) return;
    this.ctx.log.warn(
      { service: service.name, failures: state.consecutive_failures },
      "health check failed past its threshold: restarting",
    );
    this.healthKill = true;
    this.stopHealth();
    const handle = this.run;
    this.ctx.supervisor.signal(handle, "SIGTERM");
    setTimeout(() => this.ctx.supervisor.signal(handle, "SIGKILL"), spec.stop_timeout_s * 1000);
  }

  /** update writes a change of the service's row and tells the subscribers. */
  private update(patch: Partial<ServiceRow>): void {
    const service = this.ctx.store.getService(this.serviceId);
    if (!service) return;
    const updated = { ...service, ...patch, updated_at: iso(this.ctx.clock.now()) };
    this.ctx.store.updateService(updated);
    this.ctx.changed(this.serviceId, updated);
  }
}

/** engineVariables are what the engine tells every run of itself: its service, version, data dir, run and port. */
function engineVariables(service: ServiceRow, port: number | null, dataDir: string, runId: string): Record<string, string> {
  const vars: Record<string, string> = {
    SERVICE_NAME: service.name,
    SERVICE_ID: service.id,
    SERVICE_VERSION: String(service.version),
    SERVICE_DATA_DIR: dataDir,
    ENGINE_RUN_ID: runId,
  };
  if (port !== null) vars.PORT = String(port);
  return vars;
}

function newRun(launch: Launch, startedAt: string): RunRow {
  const { runId: id, service, runDir: run_dir, hold: gpus, injectedKeys: env_keys } = launch;
  return {
    ...{ id, service_id: service.id, version: service.version, run_dir, gpus, env_keys, started_at: startedAt },
    ...{ shim_pid: null, shim_start: null, pid: null, pid_start: null, cgroup_dir: null, ended_at: null, exit: null, end_reason: null },
  };
}
