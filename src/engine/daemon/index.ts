import { X509Certificate } from "node:crypto";
import {
  accessSync,
  chmodSync,
  constants,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
} from "node:fs";
import { getPriority } from "node:os";
import { dirname, join } from "node:path";
import { type Clock, systemClock } from "../../lib/clock";
import type { EngineConfig } from "../../lib/config";
import { SecretBox } from "../../lib/crypto";
import { AppError, isDiskFull } from "../../lib/errors";
import { pathOf } from "../../lib/http";
import { createLogger, type Logger } from "../../lib/logger";
import { lowerWhileStarting, restorePriority } from "../../lib/priority";
import { removeStaleNames } from "../../lib/sockets";
import { VERSION } from "../../lib/version";
import { createApi, type DaemonControl, type UpgradeAccepted } from "../api";
import { bootstrapAdminToken, LINK_PRINCIPAL, TokenStore } from "../auth";
import { firstUnreachable, lookupUser } from "../databases";
import { GpuInventory } from "../gpu";
import {
  assistantPrincipal,
  checkAssertion,
  IdentityStore,
  loadSecretKey,
  MetadataRefresher,
  TunnelClient,
  type TunnelClientOptions,
  VcsTokenStore,
} from "../link";
import { McpEndpoint, warmMcpTools } from "../mcp";
import { MdnsPublisher } from "../mdns";
import { EngineMetrics } from "../metrics";
import { type CaDescription, ProxyController } from "../proxy";
import { type ServiceDirectory, ServiceManager, ServiceStore } from "../services";
import { appliedMigrations, openStore, storeIsCurrent } from "../store";
import { readProcessStat, Supervisor } from "../supervisor";
import { bundledTemplateSources, readTemplateDir, TemplateCatalog } from "../templates";
import { AcmeIssuer, LeafCertificates, LocalCa, leavesDirectory, pkiDirectory, trustStatus } from "../tls";
import {
  canSwitchUsers,
  dataDirModes,
  describeModeChange,
  firstClosedParent,
  type ModeChange,
  modeChangesSince,
  secureDataDir,
  tightened,
} from "../users";
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
  type ToSuccessor,
} from "./handover";
import { ApiListeners, warmHandlers } from "./listeners";
import { checkReady } from "./ready";
import { commandLine, reapWhenGone, reexecSelf, SAME_IMAGE } from "./reexec";
import { runsCompiled, type StagedUpgrade, stageUpgrade } from "./upgrade";

export { HANDOVER_ENV, type SuccessorRole, takeSuccessorRole } from "./handover";
export { runsCompiled } from "./upgrade";

/** LISTING is the assertion the tunnel lists the MCP tools under: read-only, and it calls no route. */
const LISTING = {
  account_id: "-",
  node_id: "-",
  client_id: "engine-cloud relay",
  grant_id: "tools",
  scopes: ["engine:read"],
  expires_at: "9999-12-31T00:00:00.000Z",
};

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
  tunnel?: Pick<TunnelClientOptions, "heartbeatMs" | "deadAfterMs" | "backoff" | "stableMs" | "unlinkedPollMs" | "open">;
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
 * withRoutableUrl works around a router assumption: Elysia finds the path by searching for "/"
 * from index 11, so a one- to three-letter host (`curl --unix-socket s http://x/api/...`, or
 * `Host: a`) would be misrouted. Such rare requests are rebuilt with the host `localhost`.
 */
function withRoutableUrl(request: Request): Request {
  const slash = request.url.indexOf("/", request.url.indexOf("//") + 2);
  if (slash >= 11 || slash === -1) return request;
  return new Request(`http://localhost${request.url.slice(slash)}`, request);
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
 * reportModeChanges logs what the start changed in the data dir's modes. Modes that were looser
 * than the engine keeps (an older engine's, a chmod, a copy made with another umask) are a
 * warning naming each path with its mode before and after: something may have read them.
 */
function reportModeChanges(changes: ModeChange[], log: Logger): void {
  const looser = changes.filter(tightened).map(describeModeChange);
  const other = changes.filter((change) => !tightened(change)).map(describeModeChange);
  if (looser.length > 0) {
    log.warn({ tightened: looser }, `the data dir had modes looser than the engine keeps; tightened ${looser.join(", ")}`);
  }
  if (other.length > 0) log.info({ changed: other }, "set the modes of the data dir");
}

/**
 * isolateWorkloads runs before the first workload starts: it gives the data dir the modes that
 * keep the engine's state from workloads (secureDataDir; also tightening an older engine's
 * layout) and says, once, what isolation this engine can give.
 */
function isolateWorkloads(dataDir: string, log: Logger, modesBefore: Map<string, number>): void {
  const switching = canSwitchUsers();
  secureDataDir(dataDir, switching);
  reportModeChanges(modeChangesSince(modesBefore), log);
  if (!switching) {
    log.warn(
      { uid: process.geteuid?.() },
      "the engine runs unprivileged, so every workload runs as the engine's own user and can read its data dir (admin.token, secret.key, engine.db): a submitter token means code execution as this user. Run the engine as root to run each service as a user of its own (docs/roles.md)",
    );
    return;
  }
  const closed = firstClosedParent(dataDir);
  if (closed) {
    log.warn(
      { data_dir: dataDir, closed },
      "service users cannot reach their data dirs: a directory above the data dir is not searchable by others (chmod o+x it, or choose a data dir such as /var/lib/engine)",
    );
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

/** FIRST_ANSWER_WAIT_MS bounds how long a successor defers its slower start-up work for the first request after its switch. */
const FIRST_ANSWER_WAIT_MS = 250;
/** HELLO_TIMEOUT_MS bounds how long a new process may take to start and say hello (a loaded machine). */
const HELLO_TIMEOUT_MS = 120_000;
/** PEER_REAP_MS bounds the wait for the children of the pid before its execve to exit (a proxy process drains for up to 30 s). */
const PEER_REAP_MS = 120_000;
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
async function awaitRelease(taking: Taking, log: Logger): Promise<void> {
  try {
    await taking.channel.next("released", Math.max(0, taking.order.deadline - Date.now()) + RELEASE_MARGIN_MS);
  } catch (error) {
    const state = readProcessStat(taking.order.pid)?.state;
    if (state !== undefined && state !== "Z" && state !== "X") throw error;
    log.warn({ predecessor_pid: taking.order.pid }, "the previous engine went away during the hand-over: taking over all the same");
  }
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

/**
 * logTakeOver says, once the first request held since the switch has been answered (or after
 * 10 s without one), how long each step of this successor's take-over took (decision 440):
 * `window_ms`, from its bind to that answer, is when new requests wait.
 */
function logTakeOver(taking: Taking, listeners: ApiListeners, log: Logger): void {
  taking.phases.mark("api");
  void Promise.race([listeners.firstAnswer(), Bun.sleep(10_000)]).then(() => {
    taking.phases.mark("first_answer");
    log.info({ standin: taking.role.standin, phases_ms: taking.phases.ms, window_ms: taking.phases.since("bind") }, "took the work over");
  });
}

/** Taking is a successor's hand-over, from the control connection to the predecessor's switch. */
interface Taking {
  role: SuccessorRole;
  channel: SuccessorChannel;
  order: Extract<ToSuccessor, { type: "switch" }>;
  /** phases time the successor's steps from the switch on (decision 440). */
  phases: Phases;
}

/**
 * startSuccessor starts an engine that takes over from the running one (docs/decisions.md
 * 360-363): it checks the data dir, does the slow work that needs nothing exclusive (the MCP
 * tool validators), says hello on the predecessor's control socket, and waits to be told to
 * switch; startIn then binds the listeners, waits for the predecessor to release its modules,
 * and starts its own. The predecessor answers the API meanwhile; no port probe or
 * second-engine check applies, as the predecessor holds both on purpose.
 */
async function startSuccessor(config: EngineConfig, options: DaemonOptions, role: SuccessorRole): Promise<RunningDaemon> {
  checkDataDir(config.dataDir);
  const asRoot = process.getuid?.() === 0;
  const prepared = prepareDataDir(config.dataDir, asRoot);
  warmMcpTools();
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
  try {
    return await startIn(config, options, asRoot, prepared.modesBefore, { role, channel, order, phases: new Phases() });
  } catch (error) {
    channel.send({ type: "failed", message: (error as Error).message });
    channel.close();
    throw error;
  }
}

/** startIn starts every module on a prepared data dir; on failure it undoes what it started. */
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
  const cleanups: (() => void | Promise<void>)[] = [flush];
  /** keptRunning names the services whose processes the stop left running, for the next start. */
  let keptRunning: string[] = [];
  // The last resort of issue 13: work started in the background (a `void` promise: a build, a
  // database readiness wait, a certificate renewal) whose write the disk refused must not end
  // the daemon; its owner tries again or the next action redoes it. Any other rejection still
  // ends the process, as it would with no handler, by being thrown again.
  const onRejection = (reason: unknown) => {
    if (!isDiskFull(reason)) throw reason;
    log.error({ err: reason }, "a background write was refused for lack of space");
  };
  process.on("unhandledRejection", onRejection);
  cleanups.push(() => {
    process.off("unhandledRejection", onRejection);
  });
  const runCleanups = async () => {
    while (cleanups.length > 0) {
      const cleanup = cleanups.pop();
      try {
        await cleanup?.();
      } catch (error) {
        log.error({ err: error }, "cleanup failed");
      }
    }
  };

  try {
    removeStaleNames(config.dataDir);
    // The shim's notify socket and the API's listeners come first for a successor, which holds
    // the requests that arrive from the switch on until its modules are up (decision 360).
    const supervisor = new Supervisor({
      dataDir: config.dataDir,
      log,
      shimPath: config.shimPath,
      logMaxBytes: config.serviceLogMaxBytes,
      logMaxFiles: config.serviceLogMaxFiles,
      cgroups: config.cgroups,
    });
    // The local CA exists from the first start, so `engine ca` and the status always have a root.
    // Reading whether the system trusts it runs certutil: a successor starts it before the switch.
    const ca = new LocalCa({ dir: pkiDirectory(config.dataDir), clock, hostname: config.proxy.hostname });
    const rootPem = ca.rootPem();
    const trustReading = trustStatus(rootPem).catch(() => ({ system: false, nss: null }));
    let listeners: ApiListeners | null = null;
    // A successor builds everything that needs nothing exclusive, the API included, before it
    // takes the ports: the store is shared (WAL) while no migration is pending (decision 441).
    let tookPorts = false;
    const takePorts = async () => {
      if (!taking || tookPorts) return;
      tookPorts = true;
      const held = bindAsSuccessor(taking, config, supervisor, log);
      listeners = held;
      cleanups.push(() => held.close());
      await awaitRelease(taking, log);
      taking.phases.mark("wait_release");
    };
    const dbPath = join(config.dataDir, "engine.db");
    if (taking && !storeIsCurrent(dbPath)) await takePorts();
    const db = openStore(dbPath);
    cleanups.push(() => db.close());

    const tokens = new TokenStore(db, clock);

    const templates = new TemplateCatalog(
      [...bundledTemplateSources(), ...readTemplateDir(config.templatesDir ?? join(config.dataDir, "templates"))],
      log,
    );
    const secretKey = loadSecretKey(config.dataDir);
    const vcs = new VcsTokenStore(db, secretKey, clock);

    const gpus = new GpuInventory({ declared: config.gpus, nvidiaSmiPath: config.nvidiaSmi, log, clock });
    // https:// dumps may come from services the engine serves with its local CA (made below).
    let localCaPem: string | null = null;
    const proxyHolder: { controller: ProxyController | null } = { controller: null };
    const metrics = new EngineMetrics({
      version: VERSION,
      hostname: config.proxy.hostname,
      log,
      nvidiaSmiPath: config.nvidiaSmi,
      gpusDeclared: Boolean(config.gpus?.trim()),
      intervalMs: config.metricsIntervalS * 1000,
      proxyCounts: () => proxyHolder.controller?.requestCounts() ?? [],
    });
    const manager = new ServiceManager({
      store: new ServiceStore(db),
      supervisor,
      gpus,
      templates,
      vcs,
      secretBox: new SecretBox(secretKey),
      clock,
      log,
      dataDir: config.dataDir,
      logMaxFiles: config.serviceLogMaxFiles,
      env: config.workloadEnv,
      trustedCas: () => (localCaPem ? [localCaPem] : []),
      onRestoreEnded: (service, dump) => metrics.restoreEnded(service, dump.engine, dump.result, dump.duration_s ?? 0),
    });
    const services = options.decorateServices ? options.decorateServices(manager) : manager;
    /** startModules starts what owns the engine's state: for a successor, once its predecessor released it. */
    const startModules = async () => {
      tokens.start(config.lastUsedFlushMs);
      cleanups.push(() => tokens.stop());
      bootstrapAdminToken(tokens, config.dataDir, config.adminToken, log);
      if (!supervisor.cgroup) log.warn({ reason: supervisor.cgroupReason }, "memory limits are not enforced: no usable memory cgroup");
      supervisor.start();
      cleanups.push(() => supervisor.stop());
      // Workloads outlive the daemon: stopping it hands them over, it never kills them.
      cleanups.push(() => {
        keptRunning = manager
          .list()
          .filter((service) => service.pid !== null)
          .map((service) => service.name);
        manager.handOver();
        if (keptRunning.length === 0) return;
        log.info(
          { services: keptRunning },
          `${keptRunning.length === 1 ? "1 service keeps" : `${keptRunning.length} services keep`} running under their shims and the next engine start adopts them; to stop them all, run \`engine services stop --all\` while the engine runs`,
        );
      });
      isolateWorkloads(config.dataDir, log, modesBefore);
      taking?.phases.mark("start");
      await manager.start();
      supervisor.replayEarlyNotices();
      taking?.phases.mark("adopt");
    };

    localCaPem = rootPem;
    const rootSubject = new X509Certificate(rootPem).subject.replaceAll("\n", ", ");
    let trust = await trustReading;
    let trustReadAt = Date.now();
    const describeCa = (): CaDescription => {
      // Reading NSS runs certutil: the status answers with the last reading and refreshes it
      // in the background at most every 30 s, not on every request.
      if (Date.now() - trustReadAt > 30_000) {
        trustReadAt = Date.now();
        void trustStatus(rootPem)
          .then((value) => {
            trust = value;
          })
          .catch(() => undefined);
      }
      return {
        initialized: true,
        subject: rootSubject,
        fingerprint_sha256: ca.rootFingerprintSha256(),
        not_after: ca.rootNotAfter().toISOString(),
        intermediate_not_after: ca.intermediateNotAfter().toISOString(),
        root_path: ca.rootPath,
        trusted_in_system: trust.system,
        trusted_in_nss: trust.nss,
      };
    };
    let handingOver = false;

    /** closing ends the API's event streams when this daemon hands over: their clients reconnect to the successor. */
    const closing = new AbortController();
    let restarting: Promise<void> | undefined;
    // A stand-in serves only until its parent, re-executed, takes over: it starts no restart of its own.
    if (taking?.role.standin) restarting = new Promise<void>(() => undefined);

    /** leftChildren are this process's children that outlive its release: the proxy processes the successor retires. */
    let leftChildren: number[] = [];
    /** handingOverSide is what this daemon does at each step of handing its work to a successor. */
    const handingOverSide = (): HandingOver => ({
      log,
      port: (listeners as ApiListeners).port,
      async retire(deadline) {
        closing.abort();
        await relayed.mcp?.stop();
        await (listeners as ApiListeners).retire(deadline);
      },
      async release() {
        // The proxy processes keep serving; the successor's retire them once its own have bound.
        try {
          leftChildren = proxyHolder.controller?.status().respawn.pids ?? [];
        } catch {
          leftChildren = [];
        }
        handingOver = true;
        await runCleanups();
      },
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
      await services.drain(deadline);
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
        services.resumeAfterDrain();
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
          await answersHealth(config.socketPath, child.pid, upgrade.staged.facts.cli, upgrade.healthTimeoutS * 1000).catch(
            (error: Error) => {
              throw new HandoverError(error.message, "active");
            },
          );
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
          (listeners as ApiListeners).reclaim();
          supervisor.reclaimNotify();
          services.resumeAfterDrain();
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
          (listeners as ApiListeners).reclaim();
          supervisor.reclaimNotify();
        }
        log.error(
          { err: (error as Error).message, stage },
          "the re-executed engine did not take over from this stand-in: stopping, so that the engine's supervisor starts it afresh",
        );
        clearInterval(watch);
        control.close();
        await runCleanups();
        flush();
        process.exit(1);
      }
    };

    /** legacyRestart is the restart of a daemon run inside a test process (options.restart): drain, stop, call it. */
    const legacyRestart = async (drainTimeoutS: number, restart: () => Error | undefined): Promise<void> => {
      await Bun.sleep(10);
      await services.drain(Date.now() + drainTimeoutS * 1000);
      handingOver = true;
      await runCleanups();
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
          staged = await stageUpgrade(request.binary, target, appliedMigrations(db));
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

    const requireProxy = (): ProxyController => {
      if (!proxyHolder.controller) throw new AppError("draining", "the proxy is starting; try again in a moment");
      return proxyHolder.controller;
    };
    // Where browsers reach the engine, known once the listener is up (port 0 in tests).
    let browserUrl: string | undefined;
    const linkIdentity = new IdentityStore(config.dataDir, clock);
    // The tunnel to the console (the relay) answers with the MCP endpoint and the API, both
    // made below; it starts once they are up.
    const relayed: { mcp?: McpEndpoint; api?: ReturnType<typeof createApi> } = {};
    const tunnel = new TunnelClient({
      identity: linkIdentity,
      log,
      clock,
      ...options.tunnel,
      handlers: {
        async tools() {
          const answer = await relayed.mcp!.relay("tools/list", {}, { principal: assistantPrincipal(LISTING), owner: "relay" });
          if ("error" in answer) throw new Error(answer.error.message);
          return answer.result.tools as never;
        },
        gpus: () =>
          gpus
            .snapshot()
            .devices.slice(0, 64)
            .map((device) => ({
              index: device.index,
              name: device.name.slice(0, 128),
              memory_total_mb: device.memory_total_mb,
              mig_profile: device.mig_profile,
            })),
        async call(node, message) {
          const refusal = checkAssertion(message.assertion, node, clock.now());
          if (refusal) return { error: refusal };
          const answer = await relayed.mcp!.relay(
            "tools/call",
            { name: message.tool, arguments: message.arguments },
            { principal: assistantPrincipal(message.assertion), owner: `grant:${message.assertion.grant_id}` },
          );
          return answer;
        },
        async vcsToken(message) {
          // The same route, validation and log line as the HTTP push, as the link itself.
          const request = new Request("http://localhost/api/link/vcs-token", {
            method: "PUT",
            headers: { "content-type": "application/json", accept: "application/json" },
            body: JSON.stringify(message.push ?? null),
          });
          relayed.api!.actAs(request, LINK_PRINCIPAL);
          const response = await relayed.api!.app.handle(request);
          const text = await response.text();
          let body: unknown = null;
          try {
            body = text ? JSON.parse(text) : null;
          } catch {
            body = { error: { code: "internal", message: `the engine answered ${response.status} with a body that is not JSON` } };
          }
          return { status: response.status, body };
        },
      },
    });
    const api = createApi({
      baseUrl: () => browserUrl,
      linkIdentity: () => linkIdentity.read(),
      linkTunnel: () => tunnel.status(),
      log,
      version: VERSION,
      startedAt,
      tokens,
      templates,
      vcs,
      proxy: {
        status: () => requireProxy().status(),
        addDomain: (service, domain, prefix) => requireProxy().addDomain(service, domain, prefix),
        removeDomain: (service, domain) => requireProxy().removeDomain(service, domain),
      },
      services,
      daemon,
      metrics,
      closing: closing.signal,
      ready: () => checkReady({ dataDir: config.dataDir, db, logSinks: sinks }),
    });

    // MCP for assistants lives beside the API on its port, outside /api and its contract
    // (decision 200): its tool calls go into the API app in-process, as the caller.
    const mcp = new McpEndpoint({
      tokens,
      dispatch: (request, principal) => {
        if (principal) api.actAs(request, principal);
        return api.app.handle(request);
      },
      log,
      clock,
      version: VERSION,
      hostname: config.proxy.hostname,
      listenHost: config.host,
      allowedHosts: config.mcpAllowedHosts,
    });
    mcp.start();
    cleanups.push(() => mcp.stop());
    relayed.mcp = mcp;
    relayed.api = api;
    const handleTcp = (request: Request) =>
      mcp.handles(pathOf(request.url)) ? mcp.fetch(request) : api.app.handle(withRoutableUrl(request));
    const handleUnix = (raw: Request) => {
      const request = withRoutableUrl(raw);
      api.markLocal(request);
      return api.app.handle(request);
    };
    if (taking) {
      // The first requests after the switch must not pay for cold code (decision 441).
      await warmHandlers(handleTcp, handleUnix, taking.order.port);
      taking.phases.mark("prepare");
      await takePorts();
    }
    await startModules();
    listeners ??= ApiListeners.bind({ host: config.host, port: config.port, socketPath: config.socketPath, log });
    const bound = listeners;
    cleanups.push(() => bound.close());
    bound.serve(handleTcp, handleUnix);
    if (taking) {
      logTakeOver(taking, bound, log);
      // The requests held since the switch are answered before the slower work below (the
      // first metrics sample scans /proc, the proxy processes start): decision 441.
      await Promise.race([bound.firstAnswer(), Bun.sleep(FIRST_ANSWER_WAIT_MS)]);
    }
    // Sampling starts once the services are adopted, and stops before they are handed over.
    metrics.start(manager);
    cleanups.push(() => metrics.stop());
    const browserHost = config.host === "0.0.0.0" || config.host === "::" ? "127.0.0.1" : config.host;
    browserUrl = `http://${browserHost.includes(":") ? `[${browserHost}]` : browserHost}:${bound.port}`;

    // A linked engine keeps its hosted base domain current; unlinked, the refresher does nothing.
    const linkMetadata = new MetadataRefresher({ identity: new IdentityStore(config.dataDir, clock), log });
    linkMetadata.start();
    cleanups.push(() => linkMetadata.stop());
    // Linked or not: an unlinked engine's tunnel waits for an identity (`engine link` while it runs).
    tunnel.start();
    cleanups.push(() => tunnel.stop());

    const port = bound.port;
    // A stand-in leaves the proxy processes of the engine it stands in for serving their last
    // routes: the re-executed engine retires them once its own have bound (decision 368).
    const proxied = taking?.role.standin !== true;
    const acmeConfig = config.proxy.acme;
    const acme =
      acmeConfig && proxied
        ? new AcmeIssuer({
            directoryUrl: acmeConfig.directoryUrl,
            email: acmeConfig.email,
            eab: acmeConfig.eab,
            dir: join(pkiDirectory(config.dataDir), "acme"),
            directoryCa: acmeConfig.directoryCaFile ? readFileSync(acmeConfig.directoryCaFile, "utf8") : undefined,
            log,
            clock,
            onChallenge: (token, keyAuthorization) => proxyHolder.controller?.setChallenge(token, keyAuthorization),
            onCertificate: (domain, certificate) => proxyHolder.controller?.acceptAcmeCertificate(domain, certificate),
          })
        : null;
    const mdns =
      proxied && config.proxy.enabled && config.proxy.mdns !== "off" ? new MdnsPublisher({ backend: config.proxy.mdns, log }) : null;
    await mdns?.start();
    const proxy = new ProxyController({
      config: config.proxy,
      dataDir: config.dataDir,
      apiPort: port,
      db,
      services,
      log,
      clock,
      certificates: new LeafCertificates({
        ca,
        dir: leavesDirectory(config.dataDir),
        clock,
        lifetimeMs: config.proxy.leafLifetimeMs,
      }),
      describeCa,
      acme,
      mdns,
      command: options.proxyCommand,
    });
    if (proxied) {
      proxyHolder.controller = proxy;
      cleanups.push(() => (handingOver ? proxy.handOver() : proxy.stop()));
      await proxy.start();
    }
    const url = `http://${config.host.includes(":") ? `[${config.host}]` : config.host}:${port}`;
    log.info(
      { url, port, socket: config.socketPath, data_dir: config.dataDir, version: VERSION, templates: templates.list().length },
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
      for (const pid of role.peerPids) void reapWhenGone(pid, PEER_REAP_MS);
    }

    let stopped = false;
    return {
      config,
      url,
      browserUrl,
      port,
      socketPath: config.socketPath,
      log,
      proxy,
      metrics,
      get restarting() {
        return restarting;
      },
      get keptRunning() {
        return keptRunning;
      },
      standin: standinControl !== null,
      async stop() {
        if (stopped) return;
        stopped = true;
        await runCleanups();
        standinControl?.close();
      },
    };
  } catch (error) {
    await runCleanups();
    throw error;
  }
}
