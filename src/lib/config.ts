import { homedir } from "node:os";
import { join } from "node:path";
import { AppError } from "./errors";

/** LogLevel is one of pino's level names. */
export type LogLevel = "fatal" | "error" | "warn" | "info" | "debug" | "trace" | "silent";
export const LOG_LEVELS: readonly LogLevel[] = ["fatal", "error", "warn", "info", "debug", "trace", "silent"];

/**
 * userDataDir follows the XDG base directory rules: `$XDG_DATA_HOME/<name>`, else
 * `~/.local/share/<name>` (`engine` for the daemon, `engine-cloud` for the console).
 */
export function userDataDir(env: Record<string, string | undefined> = process.env, name = "engine"): string {
  const base = env.XDG_DATA_HOME && env.XDG_DATA_HOME.length > 0 ? env.XDG_DATA_HOME : join(homedir(), ".local", "share");
  return join(base, name);
}

/** positiveInteger reads an integer setting in [min, max] or fails naming the field. */
export function positiveInteger(field: string, raw: string | number, min: number, max: number): number {
  const value = typeof raw === "number" ? raw : /^\d+$/.test(raw) ? Number(raw) : Number.NaN;
  if (!Number.isInteger(value) || value < min || value > max) throw invalid(field, `must be an integer from ${min} to ${max}`, raw);
  return value;
}

/** invalid is the config_invalid error for one field, with the value that failed. */
export function invalid(field: string, message: string, value: unknown): AppError {
  return new AppError("config_invalid", `config: ${field}: ${message} (got ${JSON.stringify(value)})`, { field });
}
