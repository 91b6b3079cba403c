import { hkdfSync } from "node:crypto";
import { accessSync, constants, mkdirSync } from "node:fs";
import { SecretBox } from "../../lib/crypto";
import { AppError } from "../../lib/errors";
import { loadSecretKey } from "../../lib/files";
import { clientAddress } from "../../lib/forwarded";
import { lastResortResponse } from "../../lib/http";
import { createLogger, type Logger } from "../../lib/logger";
import { VERSION } from "../../lib/version";
import { AccountStore } from "../accounts";
import { AuditLog } from "../audit";
import { SessionStore } from "../auth/sessions";
import type { CloudConfig } from "../config";
import { Database } from "../db";
import {
  type BoxProvider,
  type BoxProxy,
  boxProxy,
  createProvider,
  ManagedService,
  Provisioner,
  type ProvisionerOptions,
} from "../managed";
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
function sourceResolver(config: CloudConfig, server: () => Bun.Server<undefined> | null) {
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
    let server: Bun.Server<undefined> | null = null;
    const site = { publicUrl: config.publicUrl, hostedBaseDomain: config.hostedBaseDomain };
    const nodes = new NodeStore(db);
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
      limiter: new RateLimiter(config.rateLimits === "database" ? new DatabaseBuckets(db) : new MemoryBuckets()),
      secrets,
      deriveKey: (purpose) => Buffer.from(hkdfSync("sha256", secretKey, Buffer.alloc(0), `engine-cloud:${purpose}`, 32)),
      readyChecks: {},
      site,
      sourceOf: sourceResolver(config, () => server),
    };

    if (config.role === "worker" || config.role === "all") {
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
    const proxy: BoxProxy | null = serving && provider ? boxProxy(deps, managed) : null;
    try {
      const bound = log;
      server = Bun.serve({
        hostname: config.host,
        port: config.port,
        fetch: (request) => (proxy?.matches(request) ? proxy.handle(request) : app.handle(request)),
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
    return { url: `http://${config.host === "0.0.0.0" ? "127.0.0.1" : config.host}:${port}`, port, deps, secrets, provisioner, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}
