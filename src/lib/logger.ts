import { openSync } from "node:fs";
import { join } from "node:path";
import pino from "pino";
import type { LogLevel } from "./config";

export type Logger = pino.Logger;

/**
 * REDACTED_PATHS lists every field that can hold a secret. pino replaces them before a line
 * is written (OWASP ASVS 16.2.5: no secrets in logs).
 */
export const REDACTED_PATHS = [
  "token",
  "*.token",
  "secret",
  "*.secret",
  "secrets",
  "*.secrets",
  "password",
  "*.password",
  "authorization",
  "*.authorization",
  "headers.authorization",
  "*.headers.authorization",
  "admin_token",
  "*.admin_token",
  "adminToken",
  "*.adminToken",
  "cookie",
  "*.cookie",
  "headers.cookie",
  "*.headers.cookie",
  "device_code",
  "*.device_code",
  "user_code",
  "*.user_code",
  "client_secret",
  "*.client_secret",
  "credential",
  "*.credential",
];

export interface LoggerOptions {
  level: LogLevel;
  /** dataDir receives the log file; omit for a logger that writes nowhere but stdout. */
  dataDir?: string;
  /** fileName is the log file's name in dataDir (default `engine.log`). */
  fileName?: string;
  stdout: boolean;
}

/**
 * createLogger returns a pino logger writing JSON lines to `<dataDir>/engine.log` and to
 * stdout. It uses destinations, not transports: transports start worker files that a
 * `bun build --compile` binary cannot find.
 */
export function createLogger(options: LoggerOptions): { log: Logger; flush: () => void } {
  const streams: pino.StreamEntry[] = [];
  const destinations: pino.DestinationStream[] = [];
  if (options.stdout) {
    const out = pino.destination({ dest: 1, sync: false });
    destinations.push(out);
    streams.push({ stream: out, level: options.level === "silent" ? "fatal" : options.level });
  }
  if (options.dataDir) {
    // The file is opened here, synchronously, so the destination is ready at once: an exit
    // during start-up then flushes cleanly instead of failing on a half-open stream.
    const fd = openSync(join(options.dataDir, options.fileName ?? "engine.log"), "a", 0o600);
    const file = pino.destination({ dest: fd, sync: false });
    destinations.push(file);
    streams.push({ stream: file, level: options.level === "silent" ? "fatal" : options.level });
  }
  const log = pino(
    {
      level: options.level,
      base: { pid: process.pid },
      redact: { paths: REDACTED_PATHS, censor: "[redacted]" },
      timestamp: pino.stdTimeFunctions.isoTime,
    },
    pino.multistream(streams),
  );
  const flush = () => {
    for (const destination of destinations) {
      try {
        (destination as unknown as { flushSync(): void }).flushSync();
      } catch {
        // A destination that has not opened yet has nothing to flush.
      }
    }
  };
  return { log, flush };
}
