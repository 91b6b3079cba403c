import { X509Certificate } from "node:crypto";
import { accessSync, chmodSync, constants, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import type { Server } from "bun";
import { type Clock, systemClock } from "../../lib/clock";
import type { EngineConfig } from "../../lib/config";
import { SecretBox } from "../../lib/crypto";
import { AppError, isDiskFull } from "../../lib/errors";
import { lastResortResponse, pathOf } from "../../lib/http";
import { createLogger, type Logger } from "../../lib/logger";
import { VERSION } from "../../lib/version";
import { createApi, type DaemonControl } from "../api";
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
import { McpEndpoint } from "../mcp";
import { MdnsPublisher } from "../mdns";
import { EngineMetrics } from "../metrics";
import { type CaDescription, ProxyController } from "../proxy";
import { type ServiceDirectory, ServiceManager, ServiceStore } from "../services";
import { openStore } from "../store";
import { Supervisor } from "../supervisor";
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
import { checkReady } from "./ready";
import { reexecSelf } from "./reexec";

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
   * restart replaces the process after a drain; the default re-executes it in place and
   * returns only an Error, on failure. Tests pass their own.
   */
  restart?: () => Error | undefined;
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
 * serveSafety gives the Bun.serve options both of the engine's listeners take: never Bun's
 * development error page (it shows the working directory, stack frames and source lines),
 * and an error that escapes the app answers the error envelope (decision 142).
 */
function serveSafety(log: Logger) {
  return { development: false, error: (error: Error) => lastResortResponse(log, error) } as const;
}

function listen(config: EngineConfig, log: Logger, fetchHandler: (request: Request) => Response | Promise<Response>): Server<undefined> {
  try {
    return Bun.serve({ hostname: config.host, port: config.port, fetch: fetchHandler, idleTimeout: 120, ...serveSafety(log) });
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "EADDRINUSE") {
      throw new AppError(
        "port_in_use",
        `port ${config.port} on ${config.host} is already in use (another engine?): choose another with --port or ENGINE_PORT`,
      );
    }
    throw new AppError("config_invalid", `cannot listen on ${config.host}:${config.port}: ${(error as Error).message}`);
  }
}

/**
 * startDaemon is the engine's composition root: it starts every module in order and returns
 * a handle whose stop() undoes them in reverse, also after a partial start.
 */
export async function startDaemon(config: EngineConfig, options: DaemonOptions = {}): Promise<RunningDaemon> {
  await preflight(config);
  const asRoot = process.getuid?.() === 0;
  const prepared = prepareDataDir(config.dataDir, asRoot);
  try {
    return await startIn(config, options, asRoot, prepared.modesBefore);
  } catch (error) {
    // A first start that fails all the same (a port taken since the preflight, say) leaves no
    // data dir behind: what it wrote there (admin token, database, PKI) would belong to no one.
    if (prepared.created) rmSync(prepared.created, { recursive: true, force: true });
    throw error;
  }
}

/** startIn starts every module on a prepared data dir; on failure it undoes what it started. */
async function startIn(
  config: EngineConfig,
  options: DaemonOptions,
  asRoot: boolean,
  modesBefore: Map<string, number>,
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
    // The preflight found no engine answering on the socket: one still there is a crash's.
    rmSync(config.socketPath, { force: true });
    const db = openStore(join(config.dataDir, "engine.db"));
    cleanups.push(() => db.close());

    const tokens = new TokenStore(db, clock);
    tokens.start(config.lastUsedFlushMs);
    cleanups.push(() => tokens.stop());
    bootstrapAdminToken(tokens, config.dataDir, config.adminToken, log);

    const templates = new TemplateCatalog(
      [...bundledTemplateSources(), ...readTemplateDir(config.templatesDir ?? join(config.dataDir, "templates"))],
      log,
    );
    const secretKey = loadSecretKey(config.dataDir);
    const vcs = new VcsTokenStore(db, secretKey, clock);

    const supervisor = new Supervisor({
      dataDir: config.dataDir,
      log,
      shimPath: config.shimPath,
      logMaxBytes: config.serviceLogMaxBytes,
      logMaxFiles: config.serviceLogMaxFiles,
      cgroups: config.cgroups,
    });
    if (!supervisor.cgroup) log.warn({ reason: supervisor.cgroupReason }, "memory limits are not enforced: no usable memory cgroup");
    supervisor.start();
    cleanups.push(() => supervisor.stop());
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
    await manager.start();
    const services = options.decorateServices ? options.decorateServices(manager) : manager;
    // Sampling starts once the services are adopted, and stops before they are handed over.
    metrics.start(manager);
    cleanups.push(() => metrics.stop());

    // The local CA exists from the first start, so `engine ca` and the status always have a root.
    const ca = new LocalCa({ dir: pkiDirectory(config.dataDir), clock, hostname: config.proxy.hostname });
    const rootPem = ca.rootPem();
    localCaPem = rootPem;
    const rootSubject = new X509Certificate(rootPem).subject.replaceAll("\n", ", ");
    let trust = await trustStatus(rootPem).catch(() => ({ system: false, nss: null }));
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

    let restarting: Promise<void> | undefined;
    const daemon: DaemonControl = {
      requestRestart(drainTimeoutS) {
        if (restarting) throw new AppError("draining", "a restart is already under way");
        log.info({ drain_timeout_s: drainTimeoutS }, "restart requested: draining");
        restarting = (async () => {
          // Let the 202 reach the client before the listener goes away.
          await Bun.sleep(10);
          await services.drain(Date.now() + drainTimeoutS * 1000);
          // The proxy processes keep serving through the re-exec; the next daemon retires them.
          handingOver = true;
          await runCleanups();
          const failure = (options.restart ?? reexecSelf)();
          if (failure) {
            console.error(`engine: restart failed: ${failure.message}; exiting with 75 so a supervisor restarts the engine`);
            process.exit(75);
          }
        })();
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
    const tcp = listen(config, log, (request) =>
      mcp.handles(pathOf(request.url)) ? mcp.fetch(request) : api.app.handle(withRoutableUrl(request)),
    );
    const browserHost = config.host === "0.0.0.0" || config.host === "::" ? "127.0.0.1" : config.host;
    browserUrl = `http://${browserHost.includes(":") ? `[${browserHost}]` : browserHost}:${tcp.port ?? config.port}`;
    cleanups.push(() => tcp.stop(true));
    // The socket counts as admin and the data dir may be 0711 (root): a umask of 077 makes it
    // private from the moment it exists, before the chmod that states its mode.
    const umask = process.umask(0o077);
    let unix: Server<undefined>;
    try {
      unix = Bun.serve({
        unix: config.socketPath,
        ...serveSafety(log),
        fetch(raw) {
          const request = withRoutableUrl(raw);
          api.markLocal(request);
          return api.app.handle(request);
        },
      });
    } finally {
      process.umask(umask);
    }
    chmodSync(config.socketPath, 0o600);
    cleanups.push(() => {
      unix.stop(true);
      rmSync(config.socketPath, { force: true });
    });

    // A linked engine keeps its hosted base domain current; unlinked, the refresher does nothing.
    const linkMetadata = new MetadataRefresher({ identity: new IdentityStore(config.dataDir, clock), log });
    linkMetadata.start();
    cleanups.push(() => linkMetadata.stop());
    // Linked or not: an unlinked engine's tunnel waits for an identity (`engine link` while it runs).
    tunnel.start();
    cleanups.push(() => tunnel.stop());

    const port = tcp.port ?? config.port;
    const acmeConfig = config.proxy.acme;
    const acme = acmeConfig
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
    const mdns = config.proxy.enabled && config.proxy.mdns !== "off" ? new MdnsPublisher({ backend: config.proxy.mdns, log }) : null;
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
    proxyHolder.controller = proxy;
    cleanups.push(() => (handingOver ? proxy.handOver() : proxy.stop()));
    await proxy.start();
    const url = `http://${config.host.includes(":") ? `[${config.host}]` : config.host}:${port}`;
    log.info(
      { url, port, socket: config.socketPath, data_dir: config.dataDir, version: VERSION, templates: templates.list().length },
      "listening",
    );

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
      async stop() {
        if (stopped) return;
        stopped = true;
        await runCleanups();
      },
    };
  } catch (error) {
    await runCleanups();
    throw error;
  }
}
