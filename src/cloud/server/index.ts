import { hkdfSync } from "node:crypto";
import { accessSync, constants, mkdirSync } from "node:fs";
import { SecretBox } from "../../lib/crypto";
import { AppError } from "../../lib/errors";
import { loadSecretKey } from "../../lib/files";
import { clientAddress } from "../../lib/forwarded";
import { lastResortResponse, pathOf } from "../../lib/http";
import { createLogger, type Logger } from "../../lib/logger";
import { VERSION } from "../../lib/version";
import { AccountStore } from "../accounts";
import { AuditLog } from "../audit";
import { SessionStore } from "../auth/sessions";
import type { CloudConfig } from "../config";
import { Database } from "../db";
import { ConsoleMetrics } from "../metrics";
import { NodeStore } from "../nodes";
import { sweepAssistantRows } from "../oauth";
import { DatabaseBuckets, MemoryBuckets, RateLimiter } from "../ratelimit";
import { buildCloudApp, type CloudRoutes } from "./app";
import type { CloudDeps } from "./deps";
import { API_MODULES } from "./modules";

export type { CloudRoutes } from "./app";
export type { CloudDeps } from "./deps";

/** SWEEP_INTERVAL_MS is how often the worker role deletes what has expired. */
const SWEEP_INTERVAL_MS = 60_000;
/** KEEP_EXPIRED_MS keeps expired link rows a day for support questions, then deletes them. */
const KEEP_EXPIRED_MS = 86_400_000;

export interface CloudOptions {
  /** log replaces the logger built from the config (tests pass a silent one). */
  log?: Logger;
  /** modules replaces the API role's route plugins (tests mount one module alone). */
  modules?: CloudRoutes[];
}

/** RunningCloud is a started console: where it listens, its modules, and how to stop it. */
export interface RunningCloud {
  url: string;
  port: number;
  deps: CloudDeps;
  secrets: SecretBox;
  stop(): Promise<void>;
}

/**
 * sourceResolver answers each request's client address: the socket's peer, or, when the peer
 * is a configured proxy, the address X-Forwarded-For names (src/lib/forwarded).
 */
function sourceResolver(config: CloudConfig, server: () => Bun.Server<undefined> | null) {
  return (request: Request): string => {
    const peer = server()?.requestIP(request)?.address ?? "unknown";
    return clientAddress(peer, request.headers.get("x-forwarded-for"), config.trustedProxies);
  };
}

/**
 * startCloud is the console's composition root: it opens and migrates the database, builds
 * the modules, and starts what the role asks for: `api` serves HTTP, `worker` sweeps expired
 * rows, `all` does both. Health and ready are served by every role. `stop` is safe after a
 * partial start.
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
    let server: Bun.Server<undefined> | null = null;
    const metrics = new ConsoleMetrics({ db, token: config.metricsToken });
    const site = { publicUrl: config.publicUrl, hostedBaseDomain: config.hostedBaseDomain };
    const deps: CloudDeps = {
      config,
      log,
      version: VERSION,
      startedAt: Date.now(),
      db,
      accounts,
      sessions: new SessionStore(db, { idleMs: config.sessionIdleMs, absoluteMs: config.sessionAbsoluteMs }),
      nodes: new NodeStore(db),
      audit: new AuditLog(db),
      limiter: new RateLimiter(config.rateLimits === "database" ? new DatabaseBuckets(db) : new MemoryBuckets(), Date.now, (limit) =>
        metrics.rateLimited(limit),
      ),
      secrets,
      deriveKey: (purpose) => Buffer.from(hkdfSync("sha256", secretKey, Buffer.alloc(0), `engine-cloud:${purpose}`, 32)),
      readyChecks: {},
      site,
      sourceOf: sourceResolver(config, () => server),
    };

    if (config.role !== "api") {
      const sweep = async () => {
        try {
          const now = Date.now();
          const sessions = await deps.sessions.sweep();
          const devices = await db.sql`DELETE FROM device_requests WHERE expires_at < ${now - KEEP_EXPIRED_MS} RETURNING id`;
          const codes = await db.sql`DELETE FROM link_codes WHERE expires_at < ${now - KEEP_EXPIRED_MS} RETURNING id`;
          const logins = await db.sql`DELETE FROM login_attempts WHERE expires_at < ${now} RETURNING id`;
          const assistants = await sweepAssistantRows(db, now);
          const removed = sessions + devices.length + codes.length + logins.length + Object.values(assistants).reduce((a, b) => a + b, 0);
          if (removed > 0)
            log.info({ sessions, device_requests: devices.length, link_codes: codes.length, logins: logins.length, assistants }, "swept");
        } catch (error) {
          log.warn({ err: (error as Error).message }, "sweep failed; retrying next round");
        }
      };
      const timer = setInterval(sweep, SWEEP_INTERVAL_MS);
      timer.unref?.();
      cleanups.push(() => clearInterval(timer));
    }

    deps.readyChecks.database = () => db.ping();
    const modules = config.role === "worker" ? [] : (options.modules ?? API_MODULES);
    const app = buildCloudApp(deps, modules);
    metrics.learn(app.routes);
    try {
      const bound = log;
      server = Bun.serve({
        hostname: config.host,
        port: config.port,
        // GET /metrics is outside the app and its contract (decision 330); every other answer is counted.
        fetch: async (request) => {
          if (request.method === "GET" && pathOf(request.url) === "/metrics") {
            return metrics.handle(request, server?.requestIP(request)?.address);
          }
          const response = await app.handle(request);
          await metrics.observe(request, response);
          return response;
        },
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
    return { url: `http://${config.host === "0.0.0.0" ? "127.0.0.1" : config.host}:${port}`, port, deps, secrets, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}
