import { homedir } from "node:os";
import { join, resolve } from "node:path";
import { AppError } from "./errors";

/** LogLevel is one of pino's level names. */
export type LogLevel = "fatal" | "error" | "warn" | "info" | "debug" | "trace" | "silent";
const LOG_LEVELS: readonly LogLevel[] = ["fatal", "error", "warn", "info", "debug", "trace", "silent"];

/** EngineConfig is the daemon's whole configuration, validated once at start-up. */
export interface EngineConfig {
  dataDir: string;
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
  /** shimPath is a prebuilt process shim to use instead of the embedded or compiled one. */
  shimPath: string | undefined;
  /** serviceLogMaxBytes and serviceLogMaxFiles bound each service's log: the file rotates at the size, keeping that many files. */
  serviceLogMaxBytes: number;
  serviceLogMaxFiles: number;
  /** cgroups turns per-run memory cgroups (limits and OOM detection) on or off. */
  cgroups: boolean;
  /** workloadEnv is the part of the daemon's environment workloads inherit (PATH, HOME, LANG, ...). */
  workloadEnv: Record<string, string | undefined>;
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
  shimPath?: string;
  serviceLogMaxBytes?: string | number;
  serviceLogMaxFiles?: string | number;
  cgroups?: boolean;
  workloadEnv?: Record<string, string | undefined>;
}

export const DEFAULT_PORT = 9321;

/** defaultDataDir follows the XDG base directory rules: `$XDG_DATA_HOME/engine`, else `~/.local/share/engine`. */
export function defaultDataDir(env: Record<string, string | undefined> = process.env): string {
  const base = env.XDG_DATA_HOME && env.XDG_DATA_HOME.length > 0 ? env.XDG_DATA_HOME : join(homedir(), ".local", "share");
  return join(base, "engine");
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
    shimPath: env.ENGINE_SHIM || undefined,
    serviceLogMaxBytes: env.ENGINE_SERVICE_LOG_MAX_BYTES || undefined,
    serviceLogMaxFiles: env.ENGINE_SERVICE_LOG_MAX_FILES || undefined,
    cgroups: env.ENGINE_CGROUPS ? !["0", "off", "false", "no"].includes(env.ENGINE_CGROUPS.toLowerCase()) : undefined,
    workloadEnv: { ...env },
  };
}

function positiveInteger(field: string, raw: string | number, min: number, max: number): number {
  const value = typeof raw === "number" ? raw : /^\d+$/.test(raw) ? Number(raw) : Number.NaN;
  if (!Number.isInteger(value) || value < min || value > max) throw invalid(field, `must be an integer from ${min} to ${max}`, raw);
  return value;
}

function invalid(field: string, message: string, value: unknown): AppError {
  return new AppError("config_invalid", `config: ${field}: ${message} (got ${JSON.stringify(value)})`, { field });
}

/**
 * resolveConfig merges flags over the environment over defaults and validates the result.
 * It fails with the name of the first bad field, so a typo never starts a half-configured daemon.
 */
export function resolveConfig(flags: ConfigInput, env: ConfigInput = configFromEnv()): EngineConfig {
  const merged: ConfigInput = { ...env };
  for (const [key, value] of Object.entries(flags)) if (value !== undefined) (merged as Record<string, unknown>)[key] = value;

  const dataDir = resolve(merged.dataDir ?? defaultDataDir());
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
    shimPath: merged.shimPath ? resolve(merged.shimPath) : undefined,
    serviceLogMaxBytes: positiveInteger("service_log_max_bytes", merged.serviceLogMaxBytes ?? 10 * 1024 * 1024, 4096, 2 ** 40),
    serviceLogMaxFiles: positiveInteger("service_log_max_files", merged.serviceLogMaxFiles ?? 5, 1, 100),
    cgroups: merged.cgroups ?? true,
    workloadEnv: merged.workloadEnv ?? { ...process.env },
  };
}
