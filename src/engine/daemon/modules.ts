import { X509Certificate } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { SecretBox } from "../../lib/crypto";
import { AppError, isDiskFull } from "../../lib/errors";
import { pathOf } from "../../lib/http";
import type { Logger } from "../../lib/logger";
import { removeStaleNames } from "../../lib/sockets";
import { VERSION } from "../../lib/version";
import { type Api, createApi, type DaemonControl } from "../api";
import { bootstrapAdminToken, LINK_PRINCIPAL, TokenStore } from "../auth";
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
import { type Checkpointer, startCheckpointer } from "../store/checkpointer";
import { Supervisor } from "../supervisor";
import { bundledTemplateSources, readTemplateDir, TemplateCatalog } from "../templates";
import { AcmeIssuer, LeafCertificates, LocalCa, leavesDirectory, pkiDirectory, trustStatus } from "../tls";
import {
  canSwitchUsers,
  describeModeChange,
  firstClosedParent,
  type ModeChange,
  modeChangesSince,
  secureDataDir,
  spreadServiceTrees,
  tightened,
} from "../users";
import type { Module } from "./context";
import { ApiListeners, warmHandlers } from "./listeners";
import { checkReady } from "./ready";

// The daemon's modules, in the order startIn lists them. Each adapts one part of the engine
// (which keeps its own narrow constructor, so its tests build it alone) to the one lifecycle.

/**
 * rejectionGuard is the last resort of issue 13: work started in the background (a `void`
 * promise: a build, a database readiness wait, a certificate renewal) whose write the disk
 * refused must not end the daemon; its owner tries again or the next action redoes it. Any
 * other rejection still ends the process, as it would with no handler, by being thrown again.
 */
export function rejectionGuard(): Module {
  let onRejection: ((reason: unknown) => void) | null = null;
  return {
    name: "rejection-guard",
    provision({ log }) {
      onRejection = (reason: unknown) => {
        if (!isDiskFull(reason)) throw reason;
        log.error({ err: reason }, "a background write was refused for lack of space");
      };
      process.on("unhandledRejection", onRejection);
    },
    start() {},
    stop() {
      if (onRejection) process.off("unhandledRejection", onRejection);
      onRejection = null;
    },
  } satisfies Module;
}

/**
 * supervisorModule makes the supervisor of the workloads' shims. It comes first: a successor
 * binds the shims' notify socket before its switch (takeOverModule), and the supervisor's sweep
 * starts with the services (servicesModule).
 */
export function supervisorModule(): Module {
  let supervisor: Supervisor | null = null;
  return {
    name: "supervisor",
    provision({ config, log, bus }) {
      removeStaleNames(config.dataDir);
      supervisor = bus.provide(
        "supervisor",
        new Supervisor({
          dataDir: config.dataDir,
          log,
          shimPath: config.shimPath,
          logMaxBytes: config.serviceLogMaxBytes,
          logMaxFiles: config.serviceLogMaxFiles,
          cgroups: config.cgroups,
        }),
      );
    },
    start() {},
    stop() {
      supervisor?.stop();
    },
  } satisfies Module;
}

/**
 * localCaModule makes the local CA, which exists from the first start, so `engine ca` and the
 * status always have a root. Reading whether the system trusts it runs certutil: it starts
 * here, before a successor's switch, and the proxy module takes the reading.
 */
export function localCaModule(): Module {
  return {
    name: "local-ca",
    provision({ config, clock, bus }) {
      const ca = new LocalCa({ dir: pkiDirectory(config.dataDir), clock, hostname: config.proxy.hostname });
      const rootPem = ca.rootPem();
      bus.provide("ca", { ca, rootPem, trust: trustStatus(rootPem).catch(() => ({ system: false, nss: null })) });
    },
    start() {},
    stop() {},
  } satisfies Module;
}

/** CHECKPOINTER_DELAY_MS is how long after its start the daemon moves its checkpoints to a worker. */
const CHECKPOINTER_DELAY_MS = 3000;

/**
 * storeModule opens the engine's database; the context's store reads it from then on. A
 * successor provisions it before its switch only when opening it writes nothing (storeIsCurrent:
 * the store is shared with the predecessor through WAL); otherwise it starts the plain way,
 * opening it after the release (decision 441).
 */
export function storeModule(open: (store: ReturnType<typeof openStore>) => void): Module {
  let db: ReturnType<typeof openStore> | null = null;
  let path = "";
  let checkpointer: Checkpointer | null = null;
  let later: ReturnType<typeof setTimeout> | null = null;
  return {
    name: "store",
    provision({ config }) {
      path = join(config.dataDir, "engine.db");
      db = openStore(path);
      open(db);
    },
    // Its WAL checkpoints move to a worker thread a moment after the start: a new thread's
    // runtime, started inside a restart's hand-over, took cores from it (decision 502).
    start({ log }) {
      if (!db || checkpointer || later) return;
      const store = db;
      later = setTimeout(() => {
        later = null;
        checkpointer = startCheckpointer(store, path, (message, ended) =>
          log.warn(
            { err: message },
            ended
              ? "the state database's checkpoint worker ended; its commits checkpoint again"
              : "the state database's checkpoint failed; it is tried again",
          ),
        );
      }, CHECKPOINTER_DELAY_MS);
      later.unref?.();
    },
    async stop() {
      if (later) clearTimeout(later);
      later = null;
      // The worker's connection closes first, so this close is the last and nothing of the store
      // is left working in the data dir after the stop.
      const stopping = checkpointer?.stop();
      checkpointer = null;
      await stopping;
      db?.close();
    },
  } satisfies Module;
}

/**
 * tokensModule makes the token store (provision: it only reads until started) and starts it (its
 * coalesced `last_used_at` writes), making the admin token on a first start.
 */
export function tokensModule(): Module {
  let tokens: TokenStore | null = null;
  let started = false;
  return {
    name: "tokens",
    provision({ store, clock, bus }) {
      tokens = bus.provide("tokens", new TokenStore(store, clock));
    },
    start({ config, log }) {
      if (!tokens) return;
      started = true;
      tokens.start(config.lastUsedFlushMs);
      bootstrapAdminToken(tokens, config.dataDir, config.adminToken, log);
    },
    stop() {
      if (!started) return;
      started = false;
      tokens?.stop();
    },
  } satisfies Module;
}

/** catalogModule reads the templates (bundled, then the templates dir's) and opens the sealed code-host tokens. */
export function catalogModule(): Module {
  return {
    name: "catalog",
    provision({ config, store, clock, log, bus }) {
      bus.provide(
        "templates",
        new TemplateCatalog(
          [...bundledTemplateSources(), ...readTemplateDir(config.templatesDir ?? join(config.dataDir, "templates"))],
          log,
        ),
      );
      const secretKey = bus.provide("secretKey", loadSecretKey(config.dataDir));
      bus.provide("vcs", new VcsTokenStore(store, secretKey, clock));
    },
    start() {},
    stop() {},
  } satisfies Module;
}

/** metricsModule makes the metrics registry, which the services report restores to; sampling starts after them (samplingModule). */
export function metricsModule(): Module {
  return {
    name: "metrics",
    provision({ config, log, bus }) {
      bus.provide(
        "metrics",
        new EngineMetrics({
          version: VERSION,
          hostname: config.proxy.hostname,
          log,
          nvidiaSmiPath: config.nvidiaSmi,
          gpusDeclared: Boolean(config.gpus?.trim()),
          intervalMs: config.metricsIntervalS * 1000,
          proxyCounts: () => bus.find("proxy")?.requestCounts() ?? [],
        }),
      );
    },
    start() {},
    stop() {},
  } satisfies Module;
}

/** ServicesModule is the services' module; keptRunning names, after stop(), the services left running for the next start. */
export interface ServicesModule extends Module {
  readonly keptRunning: readonly string[];
  /** storeWrites is how many writes to the services, versions and runs this process made (null before provision): a predecessor says it at the switch and the release (decision 533). */
  readonly storeWrites: number | null;
}

/**
 * servicesModule makes the GPU inventory and the service manager (provision), then starts the
 * supervisor's sweep and the manager, which adopts the workloads a previous engine left running.
 * Workloads outlive the daemon: stopping it hands them over, it never kills them.
 */
export function servicesModule(
  modesBefore: Map<string, number>,
  decorate: ((services: ServiceDirectory) => ServiceDirectory) | undefined,
): ServicesModule {
  let manager: ServiceManager | null = null;
  let serviceStore: ServiceStore | null = null;
  let started = false;
  let keptRunning: string[] = [];
  let log: Logger | null = null;
  return {
    name: "services",
    get keptRunning() {
      return keptRunning;
    },
    get storeWrites() {
      return serviceStore?.writeCount ?? null;
    },
    async provision(ctx) {
      const { config, store, clock, bus } = ctx;
      log = ctx.log;
      const supervisor = bus.get("supervisor");
      const metrics = bus.get("metrics");
      // https:// dumps may come from services the engine serves with its local CA.
      const { rootPem } = bus.get("ca");
      const gpus = bus.provide("gpus", new GpuInventory({ declared: config.gpus, nvidiaSmiPath: config.nvidiaSmi, log, clock }));
      serviceStore = new ServiceStore(store);
      manager = new ServiceManager({
        store: serviceStore,
        supervisor,
        gpus,
        templates: bus.get("templates"),
        vcs: bus.get("vcs"),
        secretBox: new SecretBox(bus.get("secretKey")),
        clock,
        log,
        dataDir: config.dataDir,
        logMaxFiles: config.serviceLogMaxFiles,
        env: config.workloadEnv,
        trustedCas: () => [rootPem],
        onRestoreEnded: (service, dump) => metrics.restoreEnded(service, dump.engine, dump.result, dump.duration_s ?? 0),
      });
      bus.provide("manager", manager);
      bus.provide("services", decorate ? decorate(manager) : manager);
      // Reading the GPUs needs nothing exclusive: a successor does it before the switch (decision 463).
      await gpus.refresh();
      // So does reading the workload users' groups, which adopting them needs (decision 481).
      manager.warmAdoption();
      // And closing the data dir to the workloads: a predecessor did it already, so a successor
      // changes nothing; not in the window where new requests wait (0.4-7.7 ms there, decision 535).
      isolateWorkloads(config.dataDir, ctx.log, modesBefore);
    },
    async start({ log, bus }) {
      if (!manager) return;
      const supervisor = bus.get("supervisor");
      if (!supervisor.cgroup) log.warn({ reason: supervisor.cgroupReason }, "memory limits are not enforced: no usable memory cgroup");
      started = true;
      // A successor provisioned while its predecessor still wrote the store: it keeps the rows
      // it read then only where the predecessor wrote none of them since (decision 533). A
      // first start read them with nobody else writing, and keeps them.
      if (bus.find("handover")?.storeUnchanged === false) serviceStore?.forget();
      supervisor.start();
      await manager.start();
      supervisor.replayEarlyNotices();
    },
    async stop() {
      // A manager only provisioned adopted nothing: what runs is still the predecessor's.
      if (!manager || !started) return;
      keptRunning = manager.liveWorkloads().map((workload) => workload.name);
      manager.handOver();
      serviceStore?.handOver();
      const stopped = manager;
      manager = null;
      // A new service user's write of the account files holds their locks: it ends here, not
      // after this daemon, where the next engine (or a test's clean-up) met the locks as busy.
      await stopped.accountsIdle();
      if (keptRunning.length === 0) return;
      log?.info(
        { services: keptRunning },
        `${keptRunning.length === 1 ? "1 service keeps" : `${keptRunning.length} services keep`} running under their shims and the next engine start adopts them; to stop them all, run \`engine services stop --all\` while the engine runs`,
      );
    },
  } satisfies ServicesModule;
}

/**
 * samplingModule samples GPUs and services for the history and /metrics once the services are
 * adopted, and stops before they are handed over. `firstSampleInMs` puts the first sample off:
 * a restart's successor takes it once the API's pollers are served again (decision 514).
 */
export function samplingModule(firstSampleInMs = 0): Module {
  let metrics: EngineMetrics | null = null;
  return {
    name: "sampling",
    start({ bus }) {
      metrics = bus.get("metrics");
      metrics.start(bus.get("manager"), firstSampleInMs);
    },
    stop() {
      metrics?.stop();
    },
  } satisfies Module;
}

/** LISTING is the assertion the tunnel lists the MCP tools under: read-only, and it calls no route. */
const LISTING = {
  account_id: "-",
  node_id: "-",
  client_id: "engine-cloud relay",
  grant_id: "tools",
  scopes: ["engine:read"],
  expires_at: "9999-12-31T00:00:00.000Z",
};

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

/** TunnelTimings are the link tunnel's timings, and how it opens its socket, which tests replace. */
export type TunnelTimings = Pick<TunnelClientOptions, "heartbeatMs" | "deadAfterMs" | "backoff" | "stableMs" | "unlinkedPollMs" | "open">;

/** ApiModuleOptions are what the API module takes from the composition root rather than from the bus. */
export interface ApiModuleOptions {
  startedAt: number;
  daemon: DaemonControl;
  /** closing ends the API's event streams when the daemon hands over: their clients reconnect to the successor. */
  closing: AbortSignal;
  logSinks: Parameters<typeof checkReady>[0]["logSinks"];
  /** tunnel replaces the link tunnel's timings, and how it opens its socket (tests). */
  tunnel: TunnelTimings | undefined;
  /**
   * warmPort, for a successor that provisions before its switch, is the port its first clients
   * call: the provision then sends its handlers their requests in-process (warmHandlers, decision 441).
   */
  warmPort?: number;
}

/** ApiModule is the API's module; browserUrl is where a browser on this machine reaches the API and the web UI, once it listens. */
export interface ApiModule extends Module {
  readonly browserUrl: string | undefined;
}

/**
 * apiModule serves the API and, beside it on its port, MCP for assistants (decision 200: its
 * tool calls go into the API app in-process, as the caller), on the listeners a successor bound
 * at its switch or on its own. Its provision builds both and the tunnel to the console (the
 * relay), which answers with both (the link module starts it); its start binds and serves.
 */
export function apiModule(options: ApiModuleOptions): ApiModule {
  let browserUrl: string | undefined;
  let mcp: McpEndpoint | null = null;
  let listeners: ApiListeners | null = null;
  let handlers: Record<"tcp" | "unix", (request: Request) => Response | Promise<Response>> | null = null;
  return {
    name: "api",
    get browserUrl() {
      return browserUrl;
    },
    async provision({ config, store, clock, log, bus }) {
      const gpus = bus.get("gpus");
      const linkIdentity = new IdentityStore(config.dataDir, clock);
      const tunnel: TunnelClient = bus.provide(
        "tunnel",
        new TunnelClient({
          identity: linkIdentity,
          log,
          clock,
          ...options.tunnel,
          handlers: {
            async tools() {
              const answer = await endpoint.relay("tools/list", {}, { principal: assistantPrincipal(LISTING), owner: "relay" });
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
              const answer = await endpoint.relay(
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
              api.actAs(request, LINK_PRINCIPAL);
              const response = await api.app.handle(request);
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
        }),
      );
      const runningProxy = () => {
        const proxy = bus.find("proxy");
        if (!proxy) throw new AppError("draining", "the proxy is starting; try again in a moment");
        return proxy;
      };
      const api: Api = bus.provide(
        "api",
        createApi({
          baseUrl: () => browserUrl,
          linkIdentity: () => linkIdentity.read(),
          linkTunnel: () => tunnel.status(),
          log,
          version: VERSION,
          startedAt: options.startedAt,
          tokens: bus.get("tokens"),
          templates: bus.get("templates"),
          vcs: bus.get("vcs"),
          proxy: {
            status: () => runningProxy().status(),
            addDomain: (service, domain, prefix) => runningProxy().addDomain(service, domain, prefix),
            removeDomain: (service, domain) => runningProxy().removeDomain(service, domain),
          },
          services: bus.get("services"),
          daemon: options.daemon,
          metrics: bus.get("metrics"),
          closing: options.closing,
          ready: () => checkReady({ dataDir: config.dataDir, db: store, logSinks: options.logSinks }),
        }),
      );
      const endpoint: McpEndpoint = new McpEndpoint({
        tokens: bus.get("tokens"),
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
      mcp = bus.provide("mcp", endpoint);
      endpoint.start();
      handlers = {
        tcp: (request) => (endpoint.handles(pathOf(request.url)) ? endpoint.fetch(request) : api.app.handle(withRoutableUrl(request))),
        unix: (raw) => {
          const request = withRoutableUrl(raw);
          api.markLocal(request);
          return api.app.handle(request);
        },
      };
      // The first requests after a successor's switch must not pay for cold code (decision 441).
      if (options.warmPort !== undefined) await warmHandlers(handlers.tcp, handlers.unix, options.warmPort);
    },
    start({ config, log, bus }) {
      if (!handlers) return;
      listeners =
        bus.find("listeners") ??
        bus.provide("listeners", ApiListeners.bind({ host: config.host, port: config.port, socketPath: config.socketPath, log }));
      listeners.serve(handlers.tcp, handlers.unix);
      const browserHost = config.host === "0.0.0.0" || config.host === "::" ? "127.0.0.1" : config.host;
      browserUrl = `http://${browserHost.includes(":") ? `[${browserHost}]` : browserHost}:${listeners.port}`;
    },
    async stop() {
      listeners?.close();
      await mcp?.stop();
    },
  } satisfies ApiModule;
}

/**
 * linkModule keeps a linked engine's hosted base domain current (unlinked, the refresher does
 * nothing) and opens the tunnel to the console; an unlinked engine's tunnel waits for an
 * identity (`engine link` while it runs).
 */
export function linkModule(): Module {
  let metadata: MetadataRefresher | null = null;
  let tunnel: TunnelClient | null = null;
  return {
    name: "link",
    start({ config, clock, log, bus }) {
      metadata = new MetadataRefresher({ identity: new IdentityStore(config.dataDir, clock), log });
      metadata.start();
      tunnel = bus.get("tunnel");
      tunnel.start();
    },
    async stop() {
      await tunnel?.stop();
      await metadata?.stop();
    },
  } satisfies Module;
}

/** ProxyModuleOptions are what the proxy module takes from the composition root. */
export interface ProxyModuleOptions {
  /**
   * proxied is false for a stand-in, which leaves the proxy processes of the engine it stands in
   * for serving their last routes: the re-executed engine retires them once its own have bound (decision 368).
   */
  proxied: boolean;
  /** handingOver says, when the module stops, whether the daemon hands its work to a successor: the proxy processes then keep serving. */
  handingOver: () => boolean;
  /** command starts a proxy process instead of the engine's own (tests). */
  command: string[] | undefined;
}

/** ProxyModule is the reverse proxy's module; controller is the proxy's controller once made (started only where proxied). */
export interface ProxyModule extends Module {
  readonly controller: ProxyController | null;
}

/** proxyModule starts ACME, the mDNS publisher and the reverse proxy with its certificates from the local CA. */
export function proxyModule(options: ProxyModuleOptions): ProxyModule {
  let controller: ProxyController | null = null;
  let started = false;
  return {
    name: "proxy",
    get controller() {
      return controller;
    },
    async start({ config, store, clock, log, bus }) {
      const { ca, rootPem, trust: trustReading } = bus.get("ca");
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
      const acmeConfig = config.proxy.acme;
      const acme =
        acmeConfig && options.proxied
          ? new AcmeIssuer({
              directoryUrl: acmeConfig.directoryUrl,
              email: acmeConfig.email,
              eab: acmeConfig.eab,
              dir: join(pkiDirectory(config.dataDir), "acme"),
              directoryCa: acmeConfig.directoryCaFile ? readFileSync(acmeConfig.directoryCaFile, "utf8") : undefined,
              log,
              clock,
              onChallenge: (token, keyAuthorization) => bus.find("proxy")?.setChallenge(token, keyAuthorization),
              onCertificate: (domain, certificate) => bus.find("proxy")?.acceptAcmeCertificate(domain, certificate),
            })
          : null;
      const mdns =
        options.proxied && config.proxy.enabled && config.proxy.mdns !== "off"
          ? new MdnsPublisher({ backend: config.proxy.mdns, log })
          : null;
      await mdns?.start();
      controller = new ProxyController({
        config: config.proxy,
        dataDir: config.dataDir,
        apiPort: bus.get("listeners").port,
        db: store,
        services: bus.get("services"),
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
        command: options.command,
      });
      if (!options.proxied) return;
      bus.provide("proxy", controller);
      started = true;
      await controller.start();
    },
    async stop() {
      if (!controller || !started) return;
      started = false;
      await (options.handingOver() ? controller.handOver() : controller.stop());
    },
  } satisfies ProxyModule;
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
  spreadServiceTrees(dataDir);
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
