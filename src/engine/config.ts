import { statSync } from "node:fs";
import { availableParallelism, hostname as osHostname } from "node:os";
import { join, resolve } from "node:path";
import { invalid, LOG_LEVELS, type LogLevel, positiveInteger, userDataDir } from "../lib/config";
import { AppError } from "../lib/errors";

/** EngineConfig is the daemon's whole configuration, validated once at start-up. */
export interface EngineConfig {
  dataDir: string;
  /** dataDirWarning is logged at start-up when the default data dir needed a choice (see chooseDataDir). */
  dataDirWarning: string | undefined;
  host: string;
  port: number;
  socketPath: string;
  adminToken: string | undefined;
  logLevel: LogLevel;
  logToStdout: boolean;
  templatesDir: string | undefined;
  /** lastUsedFlushMs is how often coalesced token `last_used_at` updates are written. */
  lastUsedFlushMs: number;
  /** gpus declares GPUs (ENGINE_GPUS: "2", "2x24576", "RTX 4090:24564,A100:40960") instead of asking nvidia-smi. */
  gpus: string | undefined;
  /** nvidiaSmi is the nvidia-smi executable; by default it is looked up on PATH. */
  nvidiaSmi: string | undefined;
  /**
   * metricsIntervalS is how often GPUs and services are sampled for the history and /metrics
   * (ENGINE_METRICS_INTERVAL_S, default 5); 0 turns sampling off (docs/decisions.md 339).
   */
  metricsIntervalS: number;
  /** shimPath is a prebuilt process shim to use instead of the embedded or compiled one. */
  shimPath: string | undefined;
  /** serviceLogMaxBytes and serviceLogMaxFiles bound each service's log: the file rotates at the size, keeping that many files. */
  serviceLogMaxBytes: number;
  serviceLogMaxFiles: number;
  /** cgroups turns per-run memory cgroups (limits and OOM detection) on or off. */
  cgroups: boolean;
  /**
   * workloadEnv is the daemon's environment as it started, of which the processes it starts for
   * workloads (runs, builds, exec probes, database tools) inherit only what inheritedEnv picks.
   */
  workloadEnv: Record<string, string | undefined>;
  /** proxy configures the reverse proxy: its listeners, processes, ACME and mDNS. */
  proxy: ProxyConfig;
  /** mcpAllowedHosts are further host names `/mcp` answers to (ENGINE_MCP_ALLOWED_HOSTS), beyond the local ones. */
  mcpAllowedHosts: string[];
}

/** ProxyConfig is the reverse proxy's part of the configuration. */
export interface ProxyConfig {
  enabled: boolean;
  /** host the proxy listens on (ENGINE_PROXY_HOST, default 0.0.0.0: the proxy is how the LAN reaches services). */
  host: string;
  /** httpsPort and httpPort: null means "443 (80) when permitted, else 8443 (8080)"; 0 picks a free port. */
  httpsPort: number | null;
  httpPort: number | null;
  /** processes is how many proxy processes share the ports with SO_REUSEPORT. */
  processes: number;
  /** cpuAffinity "auto" pins each proxy process's event loop to one of the daemon's CPUs, in turn; "off" leaves them to the scheduler. */
  cpuAffinity: "auto" | "off";
  /** maxBodyBytes bounds a request body; larger ones answer 413. */
  maxBodyBytes: number;
  /** hostname is the machine's short name, used for `<service>-<hostname>.local`. */
  hostname: string;
  /** mdns selects how `.local` names are published. */
  mdns: "auto" | "bonjour" | "avahi" | "off";
  /** leafLifetimeMs is the lifetime of local-CA leaf certificates. */
  leafLifetimeMs: number;
  acme: AcmeConfig | null;
}

/** AcmeConfig points the proxy at an ACME directory for public domains. */
export interface AcmeConfig {
  directoryUrl: string;
  email: string | undefined;
  eab: { kid: string; hmacKey: string } | undefined;
  /** directoryCa is a PEM file trusted for the directory's own TLS (a private CA such as Pebble's). */
  directoryCaFile: string | undefined;
}

/** ConfigInput is what flags and the environment may set; every field is optional. */
export interface ConfigInput {
  dataDir?: string;
  host?: string;
  port?: string | number;
  adminToken?: string;
  logLevel?: string;
  logToStdout?: boolean;
  templatesDir?: string;
  lastUsedFlushMs?: number;
  gpus?: string;
  nvidiaSmi?: string;
  metricsIntervalS?: string | number;
  shimPath?: string;
  serviceLogMaxBytes?: string | number;
  serviceLogMaxFiles?: string | number;
  cgroups?: boolean;
  workloadEnv?: Record<string, string | undefined>;
  proxy?: boolean;
  proxyHost?: string;
  httpsPort?: string | number;
  httpPort?: string | number;
  proxyProcesses?: string | number;
  proxyCpuAffinity?: string;
  proxyMaxBodyMb?: string | number;
  hostname?: string;
  mdns?: string;
  leafLifetimeHours?: string | number;
  acmeDirectory?: string;
  acmeEmail?: string;
  acmeEabKid?: string;
  acmeEabHmac?: string;
  acmeCaFile?: string;
  mcpAllowedHosts?: string;
}

export const DEFAULT_PORT = 9321;

/**
 * INHERITED_ENV names the daemon's variables every process it starts for a workload inherits
 * (the run, its build, its exec probes, a database's tools): where programs and libraries are
 * (PATH, LD_LIBRARY_PATH, CUDA_HOME), who and where the user is, and the locale. Everything
 * else a workload gets is explicit (its deploy's env, bindings, secrets, GPUs), so the daemon's
 * own settings (ENGINE_ADMIN_TOKEN, say) never reach one.
 */
export const INHERITED_ENV: readonly string[] = [
  "PATH",
  "HOME",
  "USER",
  "LOGNAME",
  "LANG",
  "LC_ALL",
  "TZ",
  "TMPDIR",
  "LD_LIBRARY_PATH",
  "CUDA_HOME",
];

/**
 * NETWORK_ENV names what a build inherits beyond INHERITED_ENV: it fetches a repository, so it
 * needs the host's HTTP proxies and its ssh agent for ssh URLs. A run does not get them.
 */
export const NETWORK_ENV: readonly string[] = [
  "SSH_AUTH_SOCK",
  "HTTP_PROXY",
  "HTTPS_PROXY",
  "NO_PROXY",
  "http_proxy",
  "https_proxy",
  "no_proxy",
];

/**
 * inheritedEnv is the part of `env` (the daemon's environment: config.workloadEnv, or this
 * process's where no config is at hand) that a process started for a workload inherits: the
 * INHERITED_ENV variables that are set, and those of `extra` (NETWORK_ENV for a build). It is
 * the one place that decides it, for runs, builds, exec probes and database tools alike.
 */
export function inheritedEnv(env: Record<string, string | undefined> = process.env, extra: readonly string[] = []): Record<string, string> {
  const inherited: Record<string, string> = {};
  for (const name of [...INHERITED_ENV, ...extra]) {
    const value = env[name];
    if (value !== undefined) inherited[name] = value;
  }
  return inherited;
}

/** SYSTEM_DATA_ROOT is where a daemon running as root keeps its state: the FHS's /var/lib, as dockerd and nomad do. */
export const SYSTEM_DATA_ROOT = "/var/lib";

/** DataDirChoice is the engine's default data dir, with a warning for the operator when the choice needs one. */
export interface DataDirChoice {
  path: string;
  warning: string | undefined;
}

/**
 * chooseDataDir picks the engine's default data dir. As an unprivileged user it is the XDG
 * one (userDataDir). As root it is /var/lib/engine, whatever XDG_DATA_HOME says (a `sudo -E`
 * must not put root's state in a user's home): root's home is 0700, and the database servers
 * the engine runs as their own users (postgres, mysql) must traverse the path to their data.
 *
 * A root install made before this default kept its state in root's XDG dir. While that dir
 * exists, is root's, and /var/lib/engine does not exist, it stays in use with a warning that
 * says how to move it, as Syncthing did when its default moved: starting empty would look like
 * every service and token lost, and refusing to start would turn an upgrade into a crash loop
 * under systemd. A dir that is not root's (a user's, reached through a `sudo -E` that kept HOME
 * or XDG_DATA_HOME) is never taken over. `owner` (the uid of a path, null when it does not
 * exist) is injectable for tests.
 */
export function chooseDataDir(
  env: Record<string, string | undefined> = process.env,
  uid: number = process.getuid?.() ?? -1,
  owner: (path: string) => number | null = ownerOf,
): DataDirChoice {
  if (uid !== 0) return { path: userDataDir(env), warning: undefined };
  const system = join(SYSTEM_DATA_ROOT, "engine");
  const legacy = userDataDir(env);
  if (owner(system) !== null || owner(legacy) !== 0) return { path: system, warning: undefined };
  return {
    path: legacy,
    warning:
      `the data dir ${legacy} is the old default for root, kept because ${system} does not exist yet; ` +
      `database services cannot start where their users (postgres, mysql) cannot enter, as under /root. ` +
      `To move it: stop every service, stop the engine, run mv ${legacy} ${system}, and start the engine again ` +
      `(or set ENGINE_DATA_DIR=${legacy} to keep it and silence this warning)`,
  };
}

function ownerOf(path: string): number | null {
  try {
    return statSync(path).uid;
  } catch {
    return null;
  }
}

/** defaultDataDir is the path chooseDataDir picks: what --data-dir and ENGINE_DATA_DIR default to, for the daemon and the CLI alike. */
export function defaultDataDir(env: Record<string, string | undefined> = process.env, uid: number = process.getuid?.() ?? -1): string {
  return chooseDataDir(env, uid).path;
}

/** configFromEnv reads the ENGINE_* variables. It is the only place that reads process.env for the daemon. */
export function configFromEnv(env: Record<string, string | undefined> = process.env): ConfigInput {
  return {
    dataDir: env.ENGINE_DATA_DIR || undefined,
    host: env.ENGINE_HOST || undefined,
    port: env.ENGINE_PORT || undefined,
    adminToken: env.ENGINE_ADMIN_TOKEN || undefined,
    logLevel: env.ENGINE_LOG_LEVEL || undefined,
    templatesDir: env.ENGINE_TEMPLATES_DIR || undefined,
    gpus: env.ENGINE_GPUS || undefined,
    nvidiaSmi: env.ENGINE_NVIDIA_SMI || undefined,
    metricsIntervalS: env.ENGINE_METRICS_INTERVAL_S || undefined,
    shimPath: env.ENGINE_SHIM || undefined,
    serviceLogMaxBytes: env.ENGINE_SERVICE_LOG_MAX_BYTES || undefined,
    serviceLogMaxFiles: env.ENGINE_SERVICE_LOG_MAX_FILES || undefined,
    cgroups: env.ENGINE_CGROUPS ? !["0", "off", "false", "no"].includes(env.ENGINE_CGROUPS.toLowerCase()) : undefined,
    workloadEnv: { ...env },
    proxy: env.ENGINE_PROXY ? !["0", "off", "false", "no"].includes(env.ENGINE_PROXY.toLowerCase()) : undefined,
    proxyHost: env.ENGINE_PROXY_HOST || undefined,
    httpsPort: env.ENGINE_HTTPS_PORT || undefined,
    httpPort: env.ENGINE_HTTP_PORT || undefined,
    proxyProcesses: env.ENGINE_PROXY_PROCESSES || undefined,
    proxyCpuAffinity: env.ENGINE_PROXY_CPU_AFFINITY || undefined,
    proxyMaxBodyMb: env.ENGINE_PROXY_MAX_BODY_MB || undefined,
    hostname: env.ENGINE_HOSTNAME || undefined,
    mdns: env.ENGINE_MDNS || undefined,
    leafLifetimeHours: env.ENGINE_LEAF_LIFETIME_HOURS || undefined,
    acmeDirectory: env.ENGINE_ACME_DIRECTORY || undefined,
    acmeEmail: env.ENGINE_ACME_EMAIL || undefined,
    acmeEabKid: env.ENGINE_ACME_EAB_KID || undefined,
    acmeEabHmac: env.ENGINE_ACME_EAB_HMAC || undefined,
    acmeCaFile: env.ENGINE_ACME_CA_FILE || undefined,
    mcpAllowedHosts: env.ENGINE_MCP_ALLOWED_HOSTS || undefined,
  };
}

function optionalPort(field: string, raw: string | number | undefined): number | null {
  return raw === undefined ? null : positiveInteger(field, raw, 0, 65535);
}

/** shortHostname is the first label of the host name, lower-cased and cut to what a DNS label allows. */
export function shortHostname(name: string): string {
  const label = (name.split(".")[0] ?? "")
    .toLowerCase()
    .replace(/[^a-z0-9-]/g, "-")
    .replace(/^-+|-+$/g, "");
  return label.slice(0, 40) || "engine";
}

function resolveProxy(merged: ConfigInput): ProxyConfig {
  const hostname = shortHostname(merged.hostname ?? osHostname());
  if (merged.hostname !== undefined && hostname !== merged.hostname) {
    throw invalid("hostname", "must be one DNS label: lower-case letters, digits and hyphens", merged.hostname);
  }
  const mdns = merged.mdns ?? "auto";
  const cpuAffinity = merged.proxyCpuAffinity ?? "auto";
  if (cpuAffinity !== "auto" && cpuAffinity !== "off") throw invalid("proxy_cpu_affinity", "must be auto or off", cpuAffinity);
  if (!["auto", "bonjour", "avahi", "off"].includes(mdns)) throw invalid("mdns", "must be auto, bonjour, avahi or off", mdns);
  const proxyHost = merged.proxyHost ?? "0.0.0.0";
  if (!/^[A-Za-z0-9.:[\]-]+$/.test(proxyHost)) throw invalid("proxy_host", "must be a host name or an IP address", proxyHost);
  let acme: AcmeConfig | null = null;
  if (merged.acmeDirectory) {
    if (!/^https?:\/\//.test(merged.acmeDirectory)) throw invalid("acme_directory", "must be an http(s) URL", merged.acmeDirectory);
    if ((merged.acmeEabKid === undefined) !== (merged.acmeEabHmac === undefined)) {
      throw new AppError("config_invalid", "config: acme_eab: set both ENGINE_ACME_EAB_KID and ENGINE_ACME_EAB_HMAC, or neither", {
        field: "acme_eab",
      });
    }
    acme = {
      directoryUrl: merged.acmeDirectory,
      email: merged.acmeEmail,
      eab: merged.acmeEabKid && merged.acmeEabHmac ? { kid: merged.acmeEabKid, hmacKey: merged.acmeEabHmac } : undefined,
      directoryCaFile: merged.acmeCaFile ? resolve(merged.acmeCaFile) : undefined,
    };
  }
  return {
    enabled: merged.proxy ?? true,
    host: proxyHost,
    httpsPort: optionalPort("https_port", merged.httpsPort),
    httpPort: optionalPort("http_port", merged.httpPort),
    // One proxy process per core, like nginx's `worker_processes auto` (docs/decisions.md 430).
    processes: positiveInteger("proxy_processes", merged.proxyProcesses ?? Math.min(64, Math.max(1, availableParallelism())), 1, 64),
    // Each process's event loop on a CPU of its own, like nginx's `worker_cpu_affinity auto` (decision 521).
    cpuAffinity,
    maxBodyBytes: positiveInteger("proxy_max_body_mb", merged.proxyMaxBodyMb ?? 1024, 1, 1024 * 1024) * 1024 * 1024,
    hostname,
    mdns: mdns as ProxyConfig["mdns"],
    leafLifetimeMs: positiveInteger("leaf_lifetime_hours", merged.leafLifetimeHours ?? 168, 1, 24 * 366) * 3600_000,
    acme,
  };
}

/**
 * resolveConfig merges flags over the environment over defaults and validates the result.
 * It fails with the name of the first bad field, so a typo never starts a half-configured daemon.
 */
export function resolveConfig(flags: ConfigInput, env: ConfigInput = configFromEnv()): EngineConfig {
  const merged: ConfigInput = { ...env };
  for (const [key, value] of Object.entries(flags)) if (value !== undefined) (merged as Record<string, unknown>)[key] = value;

  const dataDirChoice = merged.dataDir === undefined ? chooseDataDir() : { path: merged.dataDir, warning: undefined };
  const dataDir = resolve(dataDirChoice.path);
  const rawPort = merged.port ?? DEFAULT_PORT;
  const port = typeof rawPort === "number" ? rawPort : /^\d+$/.test(rawPort) ? Number(rawPort) : Number.NaN;
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw invalid("port", "must be an integer from 0 to 65535", rawPort);

  const host = merged.host ?? "127.0.0.1";
  if (!/^[A-Za-z0-9.:[\]-]+$/.test(host)) throw invalid("host", "must be a host name or an IP address", host);

  const logLevel = (merged.logLevel ?? "info") as LogLevel;
  if (!LOG_LEVELS.includes(logLevel)) throw invalid("log_level", `must be one of ${LOG_LEVELS.join(", ")}`, merged.logLevel);

  const adminToken = merged.adminToken;
  if (adminToken !== undefined && (adminToken.length < 16 || adminToken.length > 512 || !/^[\x21-\x7e]+$/.test(adminToken))) {
    // The value itself is a secret: report only its length.
    throw new AppError(
      "config_invalid",
      `config: admin_token: ENGINE_ADMIN_TOKEN must be 16 to 512 printable characters without spaces (got ${adminToken.length} characters)`,
      { field: "admin_token" },
    );
  }

  const socketPath = join(dataDir, "engine.sock");
  // sockaddr_un.sun_path holds 108 bytes on Linux, the terminating NUL included.
  if (Buffer.byteLength(socketPath) > 107) throw invalid("data_dir", "is too long for its unix socket path (at most 95 bytes)", dataDir);

  return {
    dataDir,
    dataDirWarning: dataDirChoice.warning,
    host,
    port,
    socketPath,
    adminToken,
    logLevel,
    logToStdout: merged.logToStdout ?? true,
    templatesDir: merged.templatesDir ? resolve(merged.templatesDir) : undefined,
    lastUsedFlushMs: merged.lastUsedFlushMs ?? 5000,
    gpus: merged.gpus,
    nvidiaSmi: merged.nvidiaSmi,
    metricsIntervalS: positiveInteger("metrics_interval_s", merged.metricsIntervalS ?? 5, 0, 3600),
    shimPath: merged.shimPath ? resolve(merged.shimPath) : undefined,
    serviceLogMaxBytes: positiveInteger("service_log_max_bytes", merged.serviceLogMaxBytes ?? 10 * 1024 * 1024, 4096, 2 ** 40),
    serviceLogMaxFiles: positiveInteger("service_log_max_files", merged.serviceLogMaxFiles ?? 5, 1, 100),
    cgroups: merged.cgroups ?? true,
    workloadEnv: merged.workloadEnv ?? { ...process.env },
    proxy: resolveProxy(merged),
    mcpAllowedHosts: resolveMcpAllowedHosts(merged.mcpAllowedHosts),
  };
}

/** resolveMcpAllowedHosts reads ENGINE_MCP_ALLOWED_HOSTS: comma-separated host names, without ports. */
function resolveMcpAllowedHosts(raw: string | undefined): string[] {
  if (raw === undefined) return [];
  const hosts = raw
    .split(",")
    .map((host) => host.trim().toLowerCase())
    .filter((host) => host !== "");
  for (const host of hosts) {
    if (!/^(\[[0-9a-f:.]+\]|[a-z0-9]([a-z0-9.-]*[a-z0-9])?)$/.test(host)) {
      throw invalid("mcp_allowed_hosts", "must be comma-separated host names (no scheme, no port)", raw);
    }
  }
  return hosts;
}
