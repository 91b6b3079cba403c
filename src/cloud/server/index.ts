import { hkdfSync } from "node:crypto";
import { accessSync, constants, mkdirSync } from "node:fs";
import { TUNNEL_PATH } from "../../contract/relay";
import { SecretBox } from "../../lib/crypto";
import { AppError } from "../../lib/errors";
import { loadSecretKey } from "../../lib/files";
import { clientAddress } from "../../lib/forwarded";
import { lastResortResponse, pathOf } from "../../lib/http";
import { createLogger, type Logger } from "../../lib/logger";
import { VERSION } from "../../lib/version";
import { AccountStore } from "../accounts";
import { AuditLog } from "../audit";
import { SessionStore, sweepAuthRows } from "../auth";
import type { CloudConfig } from "../config";
import type { CloudDeps, CloudRoutes, CloudSweep } from "../context";
import { Database } from "../db";
import { sweepLinkRows } from "../link";
import {
  type BoxProvider,
  type BoxProxy,
  boxProxy,
  createProvider,
  ManagedService,
  Provisioner,
  type ProvisionerOptions,
} from "../managed";
import { ConsoleMetrics } from "../metrics";
import { NodeStore } from "../nodes";
import { createAccessTokenVerifier, sweepAssistantRows } from "../oauth";
import type { AccessTokenVerifier } from "../oauth/grant";
import { DatabaseBuckets, MemoryBuckets, RateLimiter } from "../ratelimit";
import { ConsoleMcpEndpoint, RelayHub, type RelayHubOptions, type TunnelSocketData } from "../relay";
import { buildCloudApp } from "./app";
import { API_MODULES } from "./modules";

export type { CloudDeps, CloudRoutes } from "../context";

/** SWEEP_INTERVAL_MS is how often the worker role deletes what has expired. */
const SWEEP_INTERVAL_MS = 60_000;

/**
 * SWEEPS are the modules' own sweeps, run by the worker role each round under the name its log
 * line gives their counts: each module deletes its own rows, and one that fails leaves the
 * others to run.
 */
const SWEEPS: Record<string, CloudSweep> = {
  auth: sweepAuthRows,
  link: sweepLinkRows,
  assistants: (deps, now) => sweepAssistantRows(deps.db, now),
};

export interface CloudOptions {
  /** log replaces the logger built from the config (tests pass a silent one). */
  log?: Logger;
  /** modules replaces the API role's route plugins (tests mount one module alone). */
  modules?: CloudRoutes[];
  /**
   * verifyAccessToken checks assistants' tokens on `/mcp`. Unset: the tokens the console's own
   * authorization server issued (src/cloud/oauth); tests may pass another.
   */
  verifyAccessToken?: AccessTokenVerifier;
  /** relay replaces the relay's timings (tests: a short dead-tunnel deadline and call timeout). */
  relay?: Pick<RelayHubOptions, "callTimeoutMs" | "deadAfterMs">;
  /** clock is the time the hosted-machine rules read (trial hour, idle sleep, update spacing); tests move it. */
  clock?: () => number;
  /** provider replaces the configured hosted-machine provider (tests pass a scripted one). */
  provider?: BoxProvider | null;
  /** provisioner tunes the provisioner of the `provisioner` and `all` roles (tests shorten its intervals). */
  provisioner?: ProvisionerOptions;
}

/** RunningCloud is a started console: where it listens, its modules, and how to stop it. */
export interface RunningCloud {
  url: string;
  port: number;
  deps: CloudDeps;
  secrets: SecretBox;
  /** provisioner is the hosted-machine provisioner this process runs (roles `provisioner` and `all`), or null. */
  provisioner: Provisioner | null;
  stop(): Promise<void>;
}

/**
 * sourceResolver answers each request's client address: the socket's peer, or, when the peer
 * is a configured proxy, the address X-Forwarded-For names (src/lib/forwarded).
 */
function sourceResolver(config: CloudConfig, server: () => Bun.Server<TunnelSocketData> | null) {
  return (request: Request): string => {
    const peer = server()?.requestIP(request)?.address ?? "unknown";
    return clientAddress(peer, request.headers.get("x-forwarded-for"), config.trustedProxies);
  };
}

/**
 * startCloud is the console's composition root: it opens and migrates the database, builds
 * the modules, and starts what the role asks for: `api` serves HTTP (and the hosted machines'
 * `/boxes/` proxy), `worker` sweeps expired rows, `provisioner` reconciles hosted machines
 * with their provider, `all` does all three. Health and ready are served by every role.
 * `stop` is safe after a partial start.
 */
export async function startCloud(config: CloudConfig, options: CloudOptions = {}): Promise<RunningCloud> {
  const cleanups: (() => Promise<void> | void)[] = [];
  const stop = async () => {
    for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  };
  try {
    mkdirSync(config.dataDir, { recursive: true, mode: 0o700 });
    try {
      accessSync(config.dataDir, constants.W_OK);
    } catch {
      throw new AppError("data_dir_unwritable", `the data dir ${config.dataDir} is not writable`);
    }
    let log = options.log;
    if (!log) {
      const made = createLogger({ level: config.logLevel, dataDir: config.dataDir, stdout: config.logToStdout, fileName: "cloud.log" });
      log = made.log;
      cleanups.push(made.flush);
    }
    const db = await Database.open(config.databaseUrl);
    cleanups.push(() => db.close());
    const applied = await db.migrate();
    if (applied.length > 0) log.info({ migrations: applied }, "database migrated");

    const secretKey = config.secretKey ? Buffer.from(config.secretKey, "base64") : loadSecretKey(config.dataDir);
    const secrets = new SecretBox(secretKey);
    const accounts = new AccountStore(db);
    let server: Bun.Server<TunnelSocketData> | null = null;
    const site = { publicUrl: config.publicUrl, hostedBaseDomain: config.hostedBaseDomain };
    const nodes = new NodeStore(db);
    const relay = new RelayHub({ nodes, log, ...options.relay });
    const metrics = new ConsoleMetrics({ db, token: config.metricsToken, online: () => relay.onlineCount() });
    const audit = new AuditLog(db);
    const provider = options.provider !== undefined ? options.provider : createProvider(config.managed, config.dataDir, log);
    const managed = new ManagedService({
      db,
      accounts,
      nodes,
      audit,
      provider,
      config: config.managed,
      clock: options.clock ?? Date.now,
      publicUrl: () => site.publicUrl,
      log,
    });
    const deps: CloudDeps = {
      config,
      log,
      version: VERSION,
      startedAt: Date.now(),
      db,
      accounts,
      sessions: new SessionStore(db, { idleMs: config.sessionIdleMs, absoluteMs: config.sessionAbsoluteMs }),
      nodes,
      audit,
      managed,
      limiter: new RateLimiter(config.rateLimits === "database" ? new DatabaseBuckets(db) : new MemoryBuckets(), Date.now, (limit) =>
        metrics.rateLimited(limit),
      ),
      secrets,
      deriveKey: (purpose) => Buffer.from(hkdfSync("sha256", secretKey, Buffer.alloc(0), `engine-cloud:${purpose}`, 32)),
      readyChecks: {},
      site,
      relay,
      // The authorization server's own verifier (src/cloud/oauth): the tokens it issued, read
      // with their grant and account at every call, so a revocation ends them at once.
      verifyAccessToken: options.verifyAccessToken ?? createAccessTokenVerifier({ db }),
      sourceOf: sourceResolver(config, () => server),
    };

    if (config.role === "worker" || config.role === "all") {
      const sweep = async () => {
        const now = Date.now();
        const swept: Record<string, Record<string, number>> = {};
        let removed = 0;
        for (const [name, sweepModule] of Object.entries(SWEEPS)) {
          try {
            swept[name] = await sweepModule(deps, now);
            removed += Object.values(swept[name]).reduce((a, b) => a + b, 0);
          } catch (error) {
            log.warn({ module: name, err: (error as Error).message }, "sweep failed; retrying next round");
          }
        }
        if (removed > 0) log.info(swept, "swept");
      };
      const timer = setInterval(sweep, SWEEP_INTERVAL_MS);
      timer.unref?.();
      cleanups.push(() => clearInterval(timer));
    }

    let provisioner: Provisioner | null = null;
    if ((config.role === "provisioner" || config.role === "all") && provider) {
      const started = new Provisioner(managed, options.provisioner);
      provisioner = started;
      managed.onChange = () => started.kick();
      await started.start();
      cleanups.push(() => started.stop());
    }

    deps.readyChecks.database = () => db.ping();
    const serving = config.role === "api" || config.role === "all";
    const modules = serving ? (options.modules ?? API_MODULES) : [];
    const app = buildCloudApp(deps, modules);
    metrics.learn(app.routes);
    const answerCounted = async (request: Request): Promise<Response> => {
      const response = await app.handle(request);
      await metrics.observe(request, response);
      return response;
    };
    // The relay (the engines' tunnels) and the assistants' /mcp are served by the API role,
    // beside the app and outside /api (decision 240).
    const serveRelay = serving;
    const mcp = new ConsoleMcpEndpoint({
      verifier: () => deps.verifyAccessToken,
      hub: relay,
      nodes,
      publicUrl: () => site.publicUrl,
      log,
      version: VERSION,
    });
    const proxy: BoxProxy | null = serving && provider ? boxProxy(deps, managed) : null;
    try {
      const bound = log;
      server = Bun.serve<TunnelSocketData>({
        hostname: config.host,
        port: config.port,
        // GET /metrics is outside the app and its contract (decision 330); every answer of the app is counted.
        fetch: (request, listener) => {
          const path = pathOf(request.url);
          if (request.method === "GET" && path === "/metrics") return metrics.handle(request, listener.requestIP(request)?.address);
          if (serveRelay) {
            if (path === TUNNEL_PATH) return relay.upgrade(request, listener);
            if (mcp.handles(path)) return mcp.fetch(request);
          }
          if (proxy?.matches(request)) return proxy.handle(request);
          return answerCounted(request);
        },
        websocket: relay.websocket,
        idleTimeout: 30,
        // Never Bun's development error page (cwd, stack, source lines); an error that escapes the
        // app answers the error envelope (decision 142).
        development: false,
        error: (error) => lastResortResponse(bound, error),
      });
    } catch (error) {
      throw new AppError("port_in_use", `cannot listen on ${config.host}:${config.port}: ${(error as Error).message}`);
    }
    const bound = server;
    cleanups.push(() => bound.stop(true));
    if (serveRelay) {
      relay.start();
      mcp.start();
      // Stopped before the listener: engines are told 1001 (going away) and reconnect with backoff.
      cleanups.push(() => mcp.stop());
      cleanups.push(() => relay.stop());
    }
    const port = bound.port ?? config.port;
    if (config.port === 0 && site.publicUrl.endsWith(":0")) site.publicUrl = site.publicUrl.replace(/:0$/, `:${port}`);
    log.info(
      {
        url: `http://${config.host}:${port}`,
        role: config.role,
        dialect: db.dialect,
        public_url: site.publicUrl,
        trusted_proxies: config.trustedProxies.entries,
      },
      "engine-cloud listening",
    );
    return { url: `http://${config.host === "0.0.0.0" ? "127.0.0.1" : config.host}:${port}`, port, deps, secrets, provisioner, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}
