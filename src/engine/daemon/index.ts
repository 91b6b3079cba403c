import { accessSync, chmodSync, constants, existsSync, mkdirSync, readdirSync, readlinkSync, rmSync, statSync } from "node:fs";
import { getPriority } from "node:os";
import { dirname, join } from "node:path";
import { type Clock, systemClock } from "../../lib/clock";
import { AppError } from "../../lib/errors";
import { createLogger, type Logger } from "../../lib/logger";
import { givePriorityBack, HANDOVER_BOOST, lowerFor, lowerWhileStarting, raiseWhileHandingOver, restorePriority } from "../../lib/priority";
import { removeStaleNames, warmSocketCalls } from "../../lib/sockets";
import { VERSION } from "../../lib/version";
import type { DaemonControl, UpgradeAccepted } from "../api";
import type { EngineConfig } from "../config";
import { firstUnreachable, lookupUser } from "../databases";
import type { EngineMetrics } from "../metrics";
import type { ProxyController } from "../proxy";
import type { ServiceDirectory } from "../services";
import { appliedMigrations, type Database, storeIsCurrent } from "../store";
import { readProcessStat, type Supervisor } from "../supervisor";
import { dataDirModes } from "../users";
import { EngineBus, type EngineContext, type Module, ModuleRunner } from "./context";
import {
  ControlSocket,
  connectPredecessor,
  HANDOVER_ENV,
  type HandingOver,
  HandoverError,
  handOver,
  Phases,
  type SuccessorChannel,
  type SuccessorRole,
  storeUnchanged,
  type ToSuccessor,
} from "./handover";
import { ApiListeners } from "./listeners";
import {
  apiModule,
  catalogModule,
  linkModule,
  localCaModule,
  metricsModule,
  proxyModule,
  rejectionGuard,
  samplingModule,
  servicesModule,
  storeModule,
  supervisorModule,
  type TunnelTimings,
  tokensModule,
} from "./modules";
import { commandLine, pidsAwaitingReap, reapWhenGone, reexecSelf, SAME_IMAGE } from "./reexec";
import { runsCompiled, type StagedUpgrade, stageUpgrade } from "./upgrade";

export { HANDOVER_ENV, type SuccessorRole, takeSuccessorRole } from "./handover";
export { runsCompiled } from "./upgrade";

export interface DaemonOptions {
  clock?: Clock;
  /**
   * restart replaces the process after a drain, instead of handing over to a new process
   * (tests that run the daemon inside the test process: it returns only an Error, on failure).
   */
  restart?: () => Error | undefined;
  /** successor makes this start take over from a running engine (takeSuccessorRole, set by a restart). */
  successor?: SuccessorRole | null;
  /** decorateServices lets tests wrap the service directory (to inject a fault, say). */
  decorateServices?: (services: ServiceDirectory) => ServiceDirectory;
  /** proxyCommand starts a proxy process instead of the engine's own (tests). */
  proxyCommand?: string[];
  /** tunnel replaces the link tunnel's timings, and how it opens its socket (tests: short heartbeats, a tap on the frames). */
  tunnel?: TunnelTimings;
}

/** RunningDaemon is a started engine. stop() is safe to call more than once. */
export interface RunningDaemon {
  config: EngineConfig;
  url: string;
  /** browserUrl is where a browser on this machine reaches the API and the web UI (loopback for a wildcard host). */
  browserUrl: string;
  port: number;
  socketPath: string;
  log: Logger;
  /** proxy is the reverse proxy's controller (tests use it to run a renewal check at once). */
  proxy: ProxyController;
  /** metrics samples GPUs and services (tests take a sample at once rather than wait 5 s). */
  metrics: EngineMetrics;
  stop(): Promise<void>;
  /** keptRunning names, after stop(), the services left running for the next start to adopt. */
  readonly keptRunning: readonly string[];
  /** restarted resolves when a requested restart has drained and closed everything. */
  readonly restarting: Promise<void> | undefined;
  /** standin is true for a successor that serves only until its parent, re-executed, takes over. */
  readonly standin: boolean;
}

/**
 * DATABASE_USERS are the system users the engine runs database servers as when it is root
 * (PostgreSQL and MariaDB refuse to run as root): they must traverse the data dir to data/<name>.
 */
const DATABASE_USERS = ["postgres", "mysql"] as const;

/** unusableDataDir is the one error for a data dir the engine cannot use, with what failed where. */
function unusableDataDir(dataDir: string, error: unknown, where?: string): AppError {
  const code = (error as NodeJS.ErrnoException).code ?? (error as Error).message;
  const place = where && where !== dataDir ? `: it cannot be created in ${where};` : ":";
  return new AppError(
    "data_dir_unwritable",
    `the data dir ${dataDir} is not usable (${code})${place} choose another with --data-dir or ENGINE_DATA_DIR`,
  );
}

/**
 * checkDataDir says, before anything is written, whether the data dir can be used: it is a
 * directory the engine may read, write and enter, or it does not exist yet and its nearest
 * existing parent is a directory the engine may create it in.
 */
function checkDataDir(dataDir: string): void {
  let dir = dataDir;
  while (!existsSync(dir) && dirname(dir) !== dir) dir = dirname(dir);
  try {
    if (!statSync(dir).isDirectory()) throw Object.assign(new Error("not a directory"), { code: "ENOTDIR" });
    accessSync(dir, dir === dataDir ? constants.W_OK | constants.R_OK | constants.X_OK : constants.W_OK | constants.X_OK);
  } catch (error) {
    throw unusableDataDir(dataDir, error, dir);
  }
}

/** PreparedDataDir is what prepareDataDir found and did. */
interface PreparedDataDir {
  /** created is the topmost directory this start made (the data dir or a parent), undefined when it existed. */
  created: string | undefined;
  /** modesBefore are the modes of the engine's entries before the start changed any (dataDirModes). */
  modesBefore: Map<string, number>;
}

/**
 * prepareDataDir creates the data dir and proves it writable, with one clear error if not.
 *
 * As root the data dir and its data/ folder are 0711, set again at every start as dockerd does
 * with /var/lib/docker: the database servers run as their own users (postgres, mysql) and must
 * traverse both to reach data/<name>, which they own. Traverse-only lists nothing, and
 * everything else in the data dir is root's and closed to others (the socket 0600, secrets
 * 0600, folders 0750 or 0700). A directory others may write to (a shared one such as /tmp) is
 * never changed. As another user the workloads run as the engine's own user: 0700.
 */
function prepareDataDir(dataDir: string, asRoot: boolean): PreparedDataDir {
  const mode = asRoot ? 0o711 : 0o700;
  let created: string | undefined;
  let modesBefore: Map<string, number>;
  try {
    if (!existsSync(dataDir)) created = mkdirSync(dataDir, { recursive: true, mode });
    if (!statSync(dataDir).isDirectory()) throw new Error("it is not a directory");
    accessSync(dataDir, constants.W_OK | constants.R_OK | constants.X_OK);
    modesBefore = dataDirModes(dataDir);
    if (asRoot) {
      const data = join(dataDir, "data");
      mkdirSync(data, { recursive: true, mode });
      for (const dir of [dataDir, data]) {
        const current = statSync(dir).mode;
        if ((current & 0o7022) === 0 && (current & 0o777) !== mode) chmodSync(dir, mode);
      }
    }
  } catch (error) {
    if (created) rmSync(created, { recursive: true, force: true });
    throw unusableDataDir(dataDir, error);
  }
  return { created, modesBefore };
}

/**
 * probePort binds a port for a moment, without SO_REUSEPORT, so that one another program holds
 * (or one this user may not bind) fails the start before anything is written. The real bind
 * comes later and can still lose a race; the start then undoes what it wrote (startDaemon).
 */
function probePort(host: string, port: number, inUse: string, other: string): void {
  if (port === 0) return;
  try {
    Bun.listen({ hostname: host, port, socket: { data() {} } }).stop(true);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "EADDRINUSE") throw new AppError("port_in_use", inUse);
    throw new AppError("config_invalid", `${other} (${code ?? (error as Error).message})`);
  }
}

/**
 * preflight checks what can fail a start before the start writes anything: another engine on
 * the data dir, a data dir that cannot be made or written, a port another program holds (the
 * API's, and the proxy's where the user chose them), an ACME CA file that cannot be read. A
 * failed start thus leaves no data dir, admin token, database or PKI behind.
 */
async function preflight(config: EngineConfig): Promise<void> {
  await refuseSecondEngine(config.socketPath);
  checkDataDir(config.dataDir);
  probePort(
    config.host,
    config.port,
    `port ${config.port} on ${config.host} is already in use (another engine?): choose another with --port or ENGINE_PORT`,
    `cannot listen on ${config.host}:${config.port}`,
  );
  const proxy = config.proxy;
  // Proxy processes a previous daemon left serving hold their ports, and this start adopts them.
  if (proxy.enabled && !hasProxyProcessRecords(config.dataDir)) {
    for (const [name, port] of [
      ["HTTPS", proxy.httpsPort],
      ["HTTP", proxy.httpPort],
    ] as const) {
      if (port === null) continue; // a default port falls back, and the API starts without the proxy
      probePort(
        proxy.host,
        port,
        `the proxy's ${name} port ${port} on ${proxy.host} is already in use: choose other ports with --https-port/--http-port (ENGINE_HTTPS_PORT/ENGINE_HTTP_PORT) or ENGINE_PROXY=off`,
        `the proxy cannot listen on ${proxy.host}:${port}`,
      );
    }
  }
  const caFile = proxy.acme?.directoryCaFile;
  if (caFile) {
    try {
      accessSync(caFile, constants.R_OK);
    } catch (error) {
      throw new AppError("config_invalid", `config: acme_ca_file: cannot read ${caFile} (${(error as NodeJS.ErrnoException).code})`);
    }
  }
}

/** hasProxyProcessRecords says whether a previous daemon recorded proxy processes (<data-dir>/proxy/*.pid). */
function hasProxyProcessRecords(dataDir: string): boolean {
  try {
    return readdirSync(join(dataDir, "proxy")).some((file) => file.endsWith(".pid"));
  } catch {
    return false;
  }
}

/**
 * warnUnreachableData says at start-up, rather than at a database's first deploy, when a data
 * dir given explicitly lies where the database users cannot reach (under /root, say).
 */
function warnUnreachableData(dataDir: string, log: Logger): void {
  for (const name of DATABASE_USERS) {
    const user = lookupUser(name);
    const blocked = user ? firstUnreachable(join(dataDir, "data", "service"), user) : null;
    if (blocked) {
      log.warn(
        { user: name, directory: blocked },
        `database services that run as ${name} cannot start: ${name} may not enter ${blocked}; choose a data dir they can reach (the default as root, /var/lib/engine, is one) or let ${name} search ${blocked}`,
      );
    }
  }
}

/** refuseSecondEngine fails the start when an engine answers on the data dir's socket. */
async function refuseSecondEngine(socketPath: string): Promise<void> {
  if (!existsSync(socketPath)) return;
  const alive = await fetch("http://engine/api/health", { unix: socketPath, signal: AbortSignal.timeout(1000) })
    .then(() => true)
    .catch(() => false);
  if (alive) throw new AppError("port_in_use", `another engine is already running on this data dir (socket ${socketPath})`);
}

/**
 * startDaemon is the engine's composition root: it starts every module in order and returns
 * a handle whose stop() undoes them in reverse, also after a partial start.
 */
export async function startDaemon(config: EngineConfig, options: DaemonOptions = {}): Promise<RunningDaemon> {
  if (options.successor) return startSuccessor(config, options, options.successor);
  await preflight(config);
  const asRoot = process.getuid?.() === 0;
  const prepared = prepareDataDir(config.dataDir, asRoot);
  try {
    return await startIn(config, options, asRoot, prepared.modesBefore, null);
  } catch (error) {
    // A first start that fails all the same (a port taken since the preflight, say) leaves no
    // data dir behind: what it wrote there (admin token, database, PKI) would belong to no one.
    if (prepared.created) rmSync(prepared.created, { recursive: true, force: true });
    throw error;
  }
}

/** FIRST_ANSWER_WAIT_MS bounds how long a successor defers its slower start-up work for the requests held since its switch. */
const FIRST_ANSWER_WAIT_MS = 250;
/**
 * SUCCESSOR_FIRST_SAMPLE_MS puts a successor's first metrics sample (a scan of /proc that holds
 * the event loop 5-25 ms) a second past its start, out of the moments its clients reconnect and
 * its proxy processes start (decision 514); the history misses one point at most.
 */
const SUCCESSOR_FIRST_SAMPLE_MS = 1000;
/** HELLO_TIMEOUT_MS bounds how long a new process may take to start and say hello (a loaded machine). */
const HELLO_TIMEOUT_MS = 120_000;
/** STANDIN_WAIT_MS is how long a stand-in waits for its re-executed parent to take over. */
const STANDIN_WAIT_MS = 120_000;

/** RestartTarget is what a restart runs next: the same image, or an upgrade's staged binary. */
interface RestartTarget {
  drainTimeoutS: number;
  /** image is the executable the stand-in runs and this pid re-executes. */
  image: string;
  upgrade: { staged: StagedUpgrade; healthTimeoutS: number } | null;
}

/** getOwnPriority is this process's CPU priority, which a successor started lower is given back at its switch. */
function getOwnPriority(): number | null {
  try {
    return process.getuid?.() === 0 ? getPriority(0) : null;
  } catch {
    return null;
  }
}

/** exitIfFailed ends the process with 75 (EX_TEMPFAIL) when an execve failed, for a supervisor to start it again. */
function exitIfFailed(failure: Error | undefined): void {
  if (!failure) return;
  console.error(`engine: restart failed: ${failure.message}; exiting with 75 so a supervisor restarts the engine`);
  process.exit(75);
}

/** withoutHandover is an environment without the hand-over variables. */
function withoutHandover(env: Record<string, string | undefined>): Record<string, string | undefined> {
  const copy = { ...env };
  for (const key of Object.values(HANDOVER_ENV)) delete copy[key];
  return copy;
}

/**
 * runningBinary is the path this process's executable was started from, which an upgrade
 * replaces. The kernel marks it " (deleted)" once that name was renamed over, even when a
 * rollback linked the same file back; the previous binary is kept from the running image
 * itself either way (upgrade.ts keepPrevious).
 */
function runningBinary(): string {
  const path = readlinkSync("/proc/self/exe");
  return path.endsWith(" (deleted)") ? path.slice(0, -" (deleted)".length) : path;
}

/** rollBack puts the previous binary back, saying so; a failure is logged, as the engine serves on either way. */
function rollBack(staged: StagedUpgrade, log: Logger): void {
  try {
    staged.rollback();
    log.warn({ binary: staged.target, previous: staged.previous }, "rolled the binary back to the previous one");
  } catch (error) {
    log.error({ err: error, binary: staged.target, previous: staged.previous }, "could not roll the binary back");
  }
}

/**
 * answersHealth waits until GET /api/health on the unix socket answers from process `pid` with
 * `version`, or throws after `timeoutMs`: an upgrade's new binary must serve before it stays.
 */
async function answersHealth(socketPath: string, pid: number, version: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = "no answer";
  while (Date.now() < deadline) {
    try {
      const response = await fetch("http://engine/api/health", { unix: socketPath, signal: AbortSignal.timeout(2000) });
      const health = (await response.json()) as { pid?: number; version?: string };
      if (response.ok && health.pid === pid && health.version === version) return;
      last = `answered ${response.status} from pid ${health.pid} version ${health.version}`;
    } catch (error) {
      last = (error as Error).message;
    }
    await Bun.sleep(50);
  }
  throw new Error(`the new binary did not answer /api/health within ${Math.round(timeoutMs / 1000)} s (${last})`);
}

/** RELEASE_MARGIN_MS is how long past the drain deadline a successor waits for its predecessor to release its work. */
const RELEASE_MARGIN_MS = 60_000;

/**
 * awaitRelease waits for the predecessor's `released`. A predecessor that went away without
 * saying it (killed) released everything by dying, and the successor goes on; one that is
 * alive and silent fails the start.
 */
async function awaitRelease(taking: Taking, log: Logger): Promise<Extract<ToSuccessor, { type: "released" }> | null> {
  try {
    return await taking.channel.next("released", Math.max(0, taking.order.deadline - Date.now()) + RELEASE_MARGIN_MS);
  } catch (error) {
    const state = readProcessStat(taking.order.pid)?.state;
    if (state !== undefined && state !== "Z" && state !== "X") throw error;
    log.warn({ predecessor_pid: taking.order.pid }, "the previous engine went away during the hand-over: taking over all the same");
    return null;
  }
}

/** Taking is a successor's hand-over, from the control connection to the predecessor's switch. */
interface Taking {
  role: SuccessorRole;
  channel: SuccessorChannel;
  order: Extract<ToSuccessor, { type: "switch" }>;
  /** phases time the successor's steps from the switch on (decision 440). */
  phases: Phases;
  /** raised says the process runs raised until what waited is answered (decision 527). */
  raised: boolean;
}

/**
 * startSuccessor starts an engine that takes over from the running one (docs/decisions.md
 * 360-363): it checks the data dir, says hello on the predecessor's control socket, and waits
 * to be told to switch; startIn then binds the listeners, waits for the predecessor to release
 * its modules, and starts its own. The predecessor answers the API meanwhile; no port probe or
 * second-engine check applies, as the predecessor holds both on purpose.
 */
async function startSuccessor(config: EngineConfig, options: DaemonOptions, role: SuccessorRole): Promise<RunningDaemon> {
  checkDataDir(config.dataDir);
  const asRoot = process.getuid?.() === 0;
  const prepared = prepareDataDir(config.dataDir, asRoot);
  let channel: SuccessorChannel;
  try {
    channel = await connectPredecessor(role.control);
  } catch (error) {
    throw new AppError("config_invalid", `cannot reach the engine to take over from at ${role.control}: ${(error as Error).message}`);
  }
  channel.send({ type: "hello", pid: process.pid, version: VERSION });
  let order: Extract<ToSuccessor, { type: "switch" }>;
  try {
    order = await channel.next("switch", HELLO_TIMEOUT_MS);
  } catch (error) {
    channel.close();
    throw new AppError("config_invalid", `the engine to take over from did not hand over: ${(error as Error).message}`);
  } finally {
    // The predecessor started this process at a lower priority (decision 368): it is given back
    // now, as requests wait for this process from the switch on.
    if (role.priority !== null) restorePriority(0, role.priority);
  }
  const taking: Taking = { role, channel, order, phases: new Phases(), raised: false };
  try {
    return await startIn(config, options, asRoot, prepared.modesBefore, taking);
  } catch (error) {
    if (taking.raised) givePriorityBack();
    channel.send({ type: "failed", message: (error as Error).message });
    channel.close();
    throw error;
  }
}

/** startIn starts every module on a prepared data dir, in order; on failure it stops the started ones in reverse. */
async function startIn(
  config: EngineConfig,
  options: DaemonOptions,
  asRoot: boolean,
  modesBefore: Map<string, number>,
  taking: Taking | null,
): Promise<RunningDaemon> {
  const clock = options.clock ?? systemClock;
  const startedAt = Date.now();
  const { log, flush, sinks } = createLogger({ level: config.logLevel, dataDir: config.dataDir, stdout: config.logToStdout });
  if (config.dataDirWarning) log.warn({ data_dir: config.dataDir }, config.dataDirWarning);
  if (asRoot) warnUnreachableData(config.dataDir, log);
  const bus = new EngineBus();
  let store: Database | null = null;
  const ctx: EngineContext = {
    config,
    log,
    clock,
    bus,
    get store() {
      if (!store) throw new Error("the engine's store is asked for before the store module opened it");
      return store;
    },
  };
  const running = new ModuleRunner(ctx);

  let handingOver = false;

  /** closing ends the API's event streams when this daemon hands over: their clients reconnect to the successor. */
  const closing = new AbortController();
  let restarting: Promise<void> | undefined;
  /**
   * started resolves once every module has started, the proxy's processes last. The API answers,
   * and takes a restart, before that: a restart begun meanwhile waits for it, as a hand-over in
   * the middle of the proxy's start would leave the generation of processes being started
   * without retiring the one before, serving on beside every later one (decision 528).
   */
  const started = Promise.withResolvers<void>();
  let startedAll = false;
  /** afterStart waits for the start of every module (until `deadline` at most), saying so when it has to. */
  const afterStart = async (deadline: number): Promise<void> => {
    if (startedAll) return;
    log.info("the restart waits for this engine to finish starting (its proxy processes start last)");
    await Promise.race([started.promise, Bun.sleep(Math.max(0, deadline - Date.now()))]);
  };
  // A stand-in serves only until its parent, re-executed, takes over: it starts no restart of its own.
  if (taking?.role.standin) restarting = new Promise<void>(() => undefined);

  /** leftChildren are this process's children that outlive its release: the proxy processes the successor retires, the shim launcher. */
  let leftChildren: number[] = [];
  /** handingOverSide is what this daemon does at each step of handing its work to a successor. */
  const handingOverSide = (): HandingOver => ({
    log,
    port: bus.get("listeners").port,
    async retire(deadline) {
      closing.abort();
      await bus.find("mcp")?.stop();
      await bus.get("listeners").retire(deadline);
    },
    async release() {
      // The proxy processes keep serving; the successor's retire them once its own have bound.
      try {
        leftChildren = bus.find("proxy")?.status().respawn.pids ?? [];
      } catch {
        leftChildren = [];
      }
      // The shim launcher holds its runs on once the supervisor stops (its stdin closes), and
      // exits after the last: the new image reaps it then, as it does the launchers of the
      // images before this one that still hold runs.
      const launcher = bus.find("supervisor")?.launcherPid;
      leftChildren = [...new Set([...leftChildren, ...(launcher ? [launcher] : []), ...pidsAwaitingReap()])];
      handingOver = true;
      return running.stop();
    },
    storeWrites: () => services.storeWrites,
  });

  /**
   * restartByHandover is a drain restart without a gap (decisions 360-363): drain, start a
   * new process (the same image, or an upgrade's binary) that takes the listeners and the
   * work over as a stand-in, then re-execute this pid in place and take them back from it,
   * so that whoever supervises the pid keeps the right one. A stand-in that never says hello
   * or cannot bind leaves this daemon serving (an upgrade rolls its binary back); one that
   * fails after this daemon released its work (or, for an upgrade, does not answer
   * /api/health in time) is killed and this daemon starts again in place, from the previous
   * binary for an upgrade.
   */
  const restartByHandover = async (target: RestartTarget): Promise<void> => {
    // Let the 202 reach the client first.
    await Bun.sleep(10);
    const deadline = Date.now() + target.drainTimeoutS * 1000;
    await afterStart(deadline);
    await bus.get("services").drain(deadline);
    const upgrade = target.upgrade;
    let control: ControlSocket | null = null;
    let child: ReturnType<typeof Bun.spawn> | null = null;
    let active: { control: string | null };
    try {
      control = new ControlSocket(config.dataDir);
      const argv = commandLine();
      const priority = getOwnPriority();
      child = Bun.spawn([target.image, ...argv.slice(1)], {
        argv0: argv[0],
        env: {
          ...process.env,
          [HANDOVER_ENV.control]: control.path,
          [HANDOVER_ENV.standin]: "1",
          ...(priority === null ? {} : { [HANDOVER_ENV.priority]: String(priority) }),
        },
        stdin: "ignore",
        stdout: "inherit",
        stderr: "inherit",
      });
      lowerWhileStarting(child.pid);
    } catch (error) {
      control?.close();
      if (upgrade) rollBack(upgrade.staged, log);
      bus.get("services").resumeAfterDrain();
      log.error(
        { err: error },
        `${upgrade ? "the upgrade" : "the restart"} failed: the new process could not be started; this engine keeps serving`,
      );
      restarting = undefined;
      return;
    }
    try {
      const channel = await control.accept(HELLO_TIMEOUT_MS, child.exited).catch((error: Error) => {
        throw new HandoverError(error.message, "hello");
      });
      ({ active } = await handOver(channel, handingOverSide(), {
        deadline,
        drainMs: target.drainTimeoutS * 1000,
        standin: true,
        helloTimeoutMs: HELLO_TIMEOUT_MS,
      }));
      if (upgrade) {
        await answersHealth(config.socketPath, child.pid, upgrade.staged.facts.cli, upgrade.healthTimeoutS * 1000).catch((error: Error) => {
          throw new HandoverError(error.message, "active");
        });
      }
    } catch (error) {
      child.kill("SIGKILL");
      // Reaped before anything else: an execve below would leave it a zombie nobody waits for.
      await Promise.race([child.exited, Bun.sleep(5000)]);
      control.close();
      removeStaleNames(config.dataDir);
      if (upgrade) rollBack(upgrade.staged, log);
      // Anything else than a HandoverError came after this daemon released its work.
      const stage = error instanceof HandoverError ? error.stage : "active";
      const what = upgrade ? `the upgrade to ${upgrade.staged.facts.cli}` : "the restart";
      if (stage === "hello" || stage === "switched") {
        // Nothing was handed over: this daemon takes back any socket the new process renamed, and serves on.
        bus.get("listeners").reclaim();
        bus.get("supervisor").reclaimNotify();
        bus.get("services").resumeAfterDrain();
        log.error(
          { err: (error as Error).message, successor_pid: child.pid },
          `${what} failed: the new process did not take over; this engine keeps serving`,
        );
        restarting = undefined;
        return;
      }
      log.error(
        { err: (error as Error).message, successor_pid: child.pid },
        `${what} failed after this engine had handed over: starting again in place${upgrade ? " from the previous binary" : ""}`,
      );
      flush();
      exitIfFailed(reexecSelf(withoutHandover(process.env), upgrade ? upgrade.staged.target : SAME_IMAGE));
      return;
    }
    control.close();
    log.info({ stand_in_pid: child.pid }, "the new process serves; re-executing in place to take the work back from it");
    // The new image starts at a lower priority too, beside the stand-in that serves.
    const priority = lowerWhileStarting(0);
    const env = {
      ...withoutHandover(process.env),
      [HANDOVER_ENV.control]: active.control ?? "",
      [HANDOVER_ENV.peers]: [child.pid, ...leftChildren].join(","),
      ...(priority === null ? {} : { [HANDOVER_ENV.priority]: String(priority) }),
    };
    flush(); // what was logged goes out before the image is replaced
    exitIfFailed(reexecSelf(env, target.image));
  };

  /**
   * standIn is a stand-in's wait for its parent, re-executed in place, to take the work back.
   * It then exits. If the parent goes away instead (its new image failed to start), the
   * stand-in stops too, leaving the workloads running, so that whatever supervises the
   * engine's pid starts it afresh rather than finding the ports held by an orphan.
   */
  const standIn = async (control: ControlSocket, drainMs: number): Promise<void> => {
    const parent = process.ppid;
    let orphaned!: () => void;
    const parentGone = new Promise<void>((resolve) => {
      orphaned = resolve;
    });
    const watch = setInterval(() => {
      if (process.ppid !== parent) orphaned();
    }, 250);
    try {
      const channel = await control.accept(STANDIN_WAIT_MS, parentGone).catch((error: Error) => {
        throw new HandoverError(error.message, "hello");
      });
      await handOver(channel, handingOverSide(), {
        deadline: Date.now() + drainMs,
        drainMs,
        standin: false,
        helloTimeoutMs: HELLO_TIMEOUT_MS,
      });
      clearInterval(watch);
      control.close();
      flush();
      process.exit(0);
    } catch (error) {
      const stage = error instanceof HandoverError ? error.stage : "hello";
      if (stage === "hello" || stage === "switched") {
        bus.get("listeners").reclaim();
        bus.get("supervisor").reclaimNotify();
      }
      log.error(
        { err: (error as Error).message, stage },
        "the re-executed engine did not take over from this stand-in: stopping, so that the engine's supervisor starts it afresh",
      );
      clearInterval(watch);
      control.close();
      await running.stop();
      flush();
      process.exit(1);
    }
  };

  /** legacyRestart is the restart of a daemon run inside a test process (options.restart): drain, stop, call it. */
  const legacyRestart = async (drainTimeoutS: number, restart: () => Error | undefined): Promise<void> => {
    await Bun.sleep(10);
    const deadline = Date.now() + drainTimeoutS * 1000;
    await afterStart(deadline);
    await bus.get("services").drain(deadline);
    handingOver = true;
    await running.stop();
    exitIfFailed(restart());
  };

  const daemon: DaemonControl = {
    requestRestart(drainTimeoutS) {
      if (restarting) throw new AppError("draining", "a restart is already under way");
      log.info({ drain_timeout_s: drainTimeoutS }, "restart requested: draining");
      restarting = options.restart
        ? legacyRestart(drainTimeoutS, options.restart)
        : restartByHandover({ drainTimeoutS, image: SAME_IMAGE, upgrade: null });
    },
    async requestUpgrade(request): Promise<UpgradeAccepted> {
      if (restarting) throw new AppError("draining", "a restart or an upgrade is already under way");
      if (options.restart || !runsCompiled()) {
        throw new AppError(
          "not_supported",
          "`engine upgrade` replaces the compiled binary, and this engine runs from source (bun cli/engine.ts): update the checkout and run `engine restart` instead",
        );
      }
      let staging!: () => void;
      restarting = new Promise<void>((resolve) => {
        staging = resolve;
      });
      let staged: StagedUpgrade;
      try {
        const target = runningBinary();
        staged = await stageUpgrade(request.binary, target, appliedMigrations(ctx.store));
        try {
          staged.swap();
        } catch (error) {
          staged.discard();
          throw new AppError(
            "binary_invalid",
            `cannot put the new binary in place of ${target}: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`,
            { loc: ["body", "binary"] },
          );
        }
      } catch (error) {
        restarting = undefined;
        staging();
        throw error;
      }
      log.info(
        {
          from_version: VERSION,
          to_version: staged.facts.cli,
          binary: staged.target,
          previous: staged.previous,
          drain_timeout_s: request.drain_timeout_s,
        },
        "upgrade requested: the new binary is in place; draining",
      );
      restarting = restartByHandover({
        drainTimeoutS: request.drain_timeout_s,
        image: staged.target,
        upgrade: { staged, healthTimeoutS: request.health_timeout_s },
      });
      staging();
      return {
        from_version: VERSION,
        to_version: staged.facts.cli,
        binary: staged.target,
        previous: staged.previous,
        store_schema: staged.facts.store_schema,
      };
    },
  };

  // A successor provisions every module (the store, the tokens, the catalog, the metrics, the
  // service manager, the API and MCP, warmed) before its take-over binds the ports, when the
  // store is shared with its predecessor through WAL, i.e. opening it writes nothing (decision
  // 441); with a migration pending it takes the ports first and provisions and starts each
  // module in turn, as a plain start does.
  const provisionFirst = taking !== null && storeIsCurrent(join(config.dataDir, "engine.db"));
  const services = servicesModule(modesBefore, options.decorateServices);
  const api = apiModule({
    startedAt,
    daemon,
    closing: closing.signal,
    logSinks: sinks,
    tunnel: options.tunnel,
    warmPort: provisionFirst ? taking?.order.port : undefined,
  });
  const proxy = proxyModule({ proxied: taking?.role.standin !== true, handingOver: () => handingOver, command: options.proxyCommand });
  const sampling = samplingModule(taking ? SUCCESSOR_FIRST_SAMPLE_MS : 0);
  // The order is the start's: a successor binds the API's listeners and the shims' notify
  // socket before anything that owns state starts, and holds the requests that arrive from its
  // switch on until the API serves (decision 360); the services adopt the workloads before
  // sampling and the API start. A successor samples after its first answer (decision 441), and
  // takes its first sample a second after its start (decision 514).
  await running.start(
    [
      { name: "log", start() {}, stop: flush } satisfies Module,
      rejectionGuard(),
      supervisorModule(),
      localCaModule(),
      ...(taking ? [takeOverModule(taking)] : []),
      storeModule((opened) => {
        store = opened;
      }),
      tokensModule(),
      catalogModule(),
      metricsModule(),
      ...(taking ? [phaseMark(taking, "start")] : []),
      services,
      ...(taking ? [phaseMark(taking, "adopt"), api, firstAnswerModule(taking), sampling] : [sampling, api]),
      linkModule(),
      proxy,
    ],
    { provisionFirst },
  );
  startedAll = true;
  started.resolve();

  const port = bus.get("listeners").port;
  const url = `http://${config.host.includes(":") ? `[${config.host}]` : config.host}:${port}`;
  log.info(
    {
      url,
      port,
      socket: config.socketPath,
      data_dir: config.dataDir,
      version: VERSION,
      templates: bus.get("templates").list().length,
      store_kept: bus.find("handover")?.storeUnchanged,
    },
    "listening",
  );

  // A successor tells its predecessor it serves; a stand-in then waits for its parent,
  // re-executed in place, to take the work back (decision 361).
  let standinControl: ControlSocket | null = null;
  if (taking) {
    const { role, channel } = taking;
    if (role.standin) standinControl = new ControlSocket(config.dataDir);
    channel.send({ type: "active", control: standinControl?.path ?? null });
    channel.close();
    if (standinControl) void standIn(standinControl, taking.order.drain_ms);
    // The stand-in and the proxy processes end within their drain; a shim launcher once its last run has ended.
    for (const pid of role.peerPids) void reapWhenGone(pid);
  }

  let stopped = false;
  return {
    config,
    url,
    browserUrl: api.browserUrl as string,
    port,
    socketPath: config.socketPath,
    log,
    proxy: proxy.controller as ProxyController,
    metrics: bus.get("metrics"),
    get restarting() {
      return restarting;
    },
    get keptRunning() {
      return services.keptRunning;
    },
    standin: standinControl !== null,
    async stop() {
      if (stopped) return;
      stopped = true;
      await running.stop();
      standinControl?.close();
    },
  };
}

/**
 * takeOverModule is a successor's side of the switch (decision 360): it binds the API's
 * listeners and the shims' notify socket, says it switched, and waits for its predecessor to
 * release the modules it starts next. Its start follows every module's provision where the
 * successor provisions first (decision 441): `prepare` is then the time they took.
 */
function takeOverModule(taking: Taking): Module {
  let listeners: ApiListeners | null = null;
  return {
    name: "take-over",
    provision({ log }) {
      // The descriptor scan and the steering right after the bind call into the C library:
      // load those calls now, not while new connections wait for this process (decision 483).
      warmSocketCalls();
      // Said before the bind: a process's first log line costs it 4-10 ms on a PVM guest (the
      // logger's code run for the first time), which the adoption's line used to pay in the
      // window where new requests wait (decision 516).
      log.info({ standin: taking.role.standin, port: taking.order.port }, "taking the work over: binding the listeners");
    },
    async start({ config, log, bus }) {
      // What preparing left for the collector is collected now, before the window where new
      // requests wait (with it, the window's steps took a third less time), and at a lower
      // priority, so the engine that still serves keeps its CPU (decision 534).
      lowerFor(() => Bun.gc(true));
      taking.phases.mark("prepare");
      // New requests wait for this process from its bind on: it runs raised until it has answered them (decision 527).
      taking.raised = raiseWhileHandingOver();
      listeners = bus.provide("listeners", bindAsSuccessor(taking, config, bus.get("supervisor"), log));
      const released = await awaitRelease(taking, log);
      bus.provide("handover", { storeUnchanged: storeUnchanged(taking.order, released) });
      taking.phases.mark("wait_release");
    },
    stop() {
      listeners?.close();
    },
  } satisfies Module;
}

/**
 * bindAsSuccessor is a successor's switch: it binds the API port beside its predecessor's and
 * renames its unix sockets over the paths (new connections are this process's from then on,
 * held until it serves), and says `switched`; the predecessor then releases its work.
 */
function bindAsSuccessor(taking: Taking, config: EngineConfig, supervisor: Supervisor, log: Logger): ApiListeners {
  const listeners = ApiListeners.bind({ host: config.host, port: taking.order.port, socketPath: config.socketPath, log });
  try {
    supervisor.bindNotify();
  } catch (error) {
    listeners.close();
    throw error;
  }
  taking.channel.send({ type: "switched" });
  taking.phases.mark("bind");
  return listeners;
}

/** phaseMark marks a step of a successor's take-over where the list reaches it (decision 440). */
function phaseMark(taking: Taking, name: string): Module {
  return {
    name: `phase ${name}`,
    start() {
      taking.phases.mark(name);
    },
    stop() {},
  } satisfies Module;
}

/**
 * firstAnswerModule follows a successor's API: it logs, once the first request held since the
 * switch has been answered (or after 10 s without one), how long each step of the take-over
 * took (decision 440; `window_ms`, from its bind to that answer, is when new requests wait),
 * and holds the modules after it (the first metrics sample scans /proc, the proxy processes
 * start) until that answer and the other requests in flight by then (held since the switch)
 * are answered, at most FIRST_ANSWER_WAIT_MS in all (decisions 441, 511).
 */
function firstAnswerModule(taking: Taking): Module {
  return {
    name: "first-answer",
    async start({ log, bus }) {
      const listeners = bus.get("listeners");
      const raised = taking.raised;
      taking.phases.mark("api");
      void Promise.race([listeners.firstAnswer(), Bun.sleep(10_000)]).then(() => {
        taking.phases.mark("first_answer");
        log.info(
          {
            standin: taking.role.standin,
            phases_ms: taking.phases.ms,
            window_ms: taking.phases.since("bind"),
            store_kept: bus.find("handover")?.storeUnchanged,
            raised_priority: raised ? -HANDOVER_BOOST : undefined,
          },
          "took the work over",
        );
      });
      const until = performance.now() + FIRST_ANSWER_WAIT_MS;
      await Promise.race([listeners.firstAnswer(), Bun.sleep(FIRST_ANSWER_WAIT_MS)]);
      // The first answer is one request's: the first metrics sample took the event loop for
      // 5-25 ms right after it, while the others held since the switch still waited (decision 511).
      while (listeners.inFlight() > 0 && performance.now() < until) await Bun.sleep(1);
      // What waited is answered: the raise since the bind is given back (decision 527).
      if (raised) givePriorityBack();
      taking.raised = false;
    },
    stop() {},
  } satisfies Module;
}
