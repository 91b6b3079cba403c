import { createWriteStream, mkdirSync, rmSync } from "node:fs";
import { isAbsolute, join } from "node:path";
import { rootCertificates } from "node:tls";
import { fileURLToPath } from "node:url";
import { type Clock, iso } from "../../lib/clock";
import { randomId } from "../../lib/crypto";
import { AppError, isAppError } from "../../lib/errors";
import type { Logger } from "../../lib/logger";
import { InputError } from "../../lib/validation";
import { describeUnrecognised, readDumpSample } from "./formats";
import type { DatabaseEngines } from "./registry";
import type { DatabaseEngineName, DatabaseInstance, DumpFormat, DumpSample, RestoreProgress, ServerControl } from "./types";

/** LastDump is the record of a database service's latest restore, as Diagnosis shows it in `last_dump`. */
export interface LastDump {
  dump: string;
  format: string | null;
  engine: string;
  started_at: string;
  finished_at: string | null;
  duration_s: number | null;
  /** bytes is how much of the dump was read; total_bytes its size (null while a download has not said). */
  bytes: number;
  total_bytes: number | null;
  result: "running" | "ok" | "failed" | "timeout";
  message: string | null;
}

/** RestoreResult is the spec's Database restore result. */
export interface RestoreResult {
  service_name: string;
  dump: string;
  engine: string;
  duration_s: number;
}

/** RestoreTarget is a service as the restore path needs to know it. */
export interface RestoreTarget {
  serviceId: string;
  serviceName: string;
  kind: string;
  /** engine is the adapter that manages the service; null for a service that runs its own command. */
  engine: DatabaseEngineName | null;
  /** running is true when the service's server accepts connections (status running or degraded). */
  running: boolean;
  status: string;
  /** instance is null when engine is null. */
  instance: DatabaseInstance | null;
}

/** RestoreHost is what the restore path needs of the service manager. */
export interface RestoreHost {
  /** target resolves a service name, or throws database_not_found. */
  target(name: string): RestoreTarget;
  /** log appends one line (stream `engine`) to the service's log, which `engine logs -f` and the CLI's progress follow. */
  log(serviceId: string, line: string): void;
  /** recordDump stores the service's last_dump. */
  recordDump(serviceId: string, dump: LastDump): void;
  /** server stops and starts the service's server, for adapters that restore by replacing files. */
  server(serviceId: string): ServerControl;
}

export interface RestoreOptions {
  engines: DatabaseEngines;
  host: RestoreHost;
  clock: Clock;
  log: Logger;
  /** scratchDir holds downloaded dumps while they are restored. */
  scratchDir: string;
  /** trustedCas are PEM certificates trusted for https:// dumps besides the system's roots (the engine's local CA). */
  trustedCas?: () => string[];
}

/** PROGRESS_LOG_MS is how often progress is written to the service's log. */
const PROGRESS_LOG_MS = 1000;

/** progressLine is the log line the CLI parses: `restore: read <bytes> of <total|?> bytes (<pct>%)`. */
export function progressLine(progress: RestoreProgress): string {
  const total = progress.totalBytes;
  const pct = total ? ` (${Math.floor((progress.bytesRead / total) * 100)}%)` : "";
  return `restore: read ${progress.bytesRead} of ${total ?? "?"} bytes${pct}`;
}

/** PROGRESS_PATTERN matches progressLine's output. */
export const PROGRESS_PATTERN = /^restore: read (\d+) of (\d+|\?) bytes/;

class RestoreTimeout extends Error {
  constructor(readonly seconds: number) {
    super(`the restore passed its timeout of ${seconds} s`);
  }
}

function dumpInput(message: string, type: string, input: string, ctx: Record<string, unknown> = {}): InputError {
  return new InputError([{ loc: ["body", "dump"], msg: message, type, input, ctx }]);
}

/**
 * RestoreCoordinator runs POST /api/databases/{name}/restore: it resolves the target and the
 * dump (a path, a file:// URL or an https:// URL it downloads), recognises the dump's format,
 * refuses a dump of another engine, hands the restore to the engine's adapter under the
 * timeout, reports progress in the service's log, and records every attempt as last_dump.
 * One restore at a time per database: a second one is refused with restore_in_progress.
 */
export class RestoreCoordinator {
  private readonly busy = new Set<string>();

  constructor(private readonly o: RestoreOptions) {}

  /** inProgress says whether a restore into the service is under way. */
  inProgress(serviceId: string): boolean {
    return this.busy.has(serviceId);
  }

  async restore(name: string, dump: string, timeoutS: number): Promise<RestoreResult> {
    const target = this.o.host.target(name);
    if (target.kind !== "database" && target.engine === null) {
      // "web is a service", "train is a batch job": the kind in words, never "a service service".
      const kind = target.kind === "batch" ? "a batch job" : `a ${target.kind}`;
      throw new AppError("not_a_database", `${target.serviceName} is ${kind}, not a database: nothing to restore into`);
    }
    if (target.engine === null || target.instance === null) {
      throw new AppError(
        "not_a_database",
        `${target.serviceName} is a database service that runs its own command; the engine restores only databases it manages (deploy with an engine or a database template)`,
      );
    }
    const adapter = this.o.engines.get(target.engine);
    if (this.busy.has(target.serviceId)) {
      throw new AppError("restore_in_progress", `a restore into ${target.serviceName} is already under way; wait for it to finish`);
    }
    this.busy.add(target.serviceId);
    const started = this.o.clock.now();
    const startedMs = performance.now();
    const record: LastDump = {
      dump,
      format: null,
      engine: target.engine,
      started_at: iso(started),
      finished_at: null,
      duration_s: null,
      bytes: 0,
      total_bytes: null,
      result: "running",
      message: null,
    };
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(new RestoreTimeout(timeoutS)), timeoutS * 1000);
    const log = (line: string) => this.o.host.log(target.serviceId, line);
    let downloaded: string | null = null;
    let lastLogged = 0;
    const progress = (update: RestoreProgress) => {
      record.bytes = update.bytesRead;
      record.total_bytes = update.totalBytes;
      const now = performance.now();
      if (now - lastLogged >= PROGRESS_LOG_MS || update.bytesRead === update.totalBytes) {
        lastLogged = now;
        log(progressLine(update));
      }
    };
    const finish = (result: LastDump["result"], message: string | null) => {
      record.result = result;
      record.message = message;
      record.finished_at = iso(this.o.clock.now());
      record.duration_s = Math.round((performance.now() - startedMs) / 10) / 100;
      this.o.host.recordDump(target.serviceId, { ...record });
    };
    try {
      assertToolsPresent(adapter.label, adapter.detectTools(target.instance.env));
      log(`restore: starting from ${describeSource(dump)} (timeout ${timeoutS} s)`);
      let path = localPath(dump);
      if (path === null) {
        downloaded = join(this.o.scratchDir, `download-${randomId("d").slice(2)}`);
        await this.download(dump, downloaded, controller.signal, progress);
        path = downloaded;
      }
      const sample = readSample(path, dump);
      record.total_bytes = sample.totalBytes;
      const format = chooseFormat(this.o.engines.sniff(sample), target, sample, dump);
      record.format = format.format;
      if (adapter.hasServer && !target.running) {
        throw new AppError(
          "database_not_running",
          `${target.serviceName} is ${target.status}: start it (and wait until it is running) before restoring into it`,
        );
      }
      this.o.host.recordDump(target.serviceId, { ...record });
      log(`restore: ${format.description}, ${sample.totalBytes} bytes`);
      this.o.log.info({ service: target.serviceName, format: format.format, bytes: sample.totalBytes }, "restore started");
      const outcome = await adapter.restore({
        instance: target.instance,
        sample,
        format,
        signal: controller.signal,
        log,
        progress,
        server: this.o.host.server(target.serviceId),
      });
      record.bytes = outcome.bytes;
      finish("ok", outcome.detail);
      log(`restore: done in ${record.duration_s} s (${outcome.detail})`);
      this.o.log.info({ service: target.serviceName, duration_s: record.duration_s }, "restore finished");
      return { service_name: target.serviceName, dump, engine: target.engine, duration_s: record.duration_s ?? 0 };
    } catch (error) {
      const timedOut = controller.signal.aborted && controller.signal.reason instanceof RestoreTimeout;
      if (timedOut) {
        const message = `stopped after ${timeoutS} s (timeout_s); ${target.serviceName} was left as it was before the restore`;
        finish("timeout", message);
        log(`restore: ${message}`);
        this.o.log.warn({ service: target.serviceName, timeout_s: timeoutS }, "restore timed out");
        throw new AppError("restore_timed_out", `the restore into ${target.serviceName} ${message}`);
      }
      const message = error instanceof InputError ? (error.detail[0]?.msg ?? error.message) : (error as Error).message;
      finish("failed", message);
      log(`restore: failed: ${message}`);
      this.o.log.warn({ service: target.serviceName, err: message }, "restore failed");
      if (error instanceof InputError || isAppError(error)) throw error;
      throw dumpInput(`the restore failed and ${target.serviceName} was left as it was: ${message}`, "restore_failed", dump, {
        format: record.format,
      });
    } finally {
      clearTimeout(timer);
      if (downloaded) rmSync(downloaded, { recursive: true, force: true });
      this.busy.delete(target.serviceId);
    }
  }

  /** download fetches an https:// dump into `to`, reporting the bytes received. */
  private async download(url: string, to: string, signal: AbortSignal, progress: (update: RestoreProgress) => void): Promise<void> {
    mkdirSync(this.o.scratchDir, { recursive: true, mode: 0o700 });
    const extra = this.o.trustedCas?.() ?? [];
    let response: Response;
    try {
      response = await fetch(url, {
        signal,
        redirect: "follow",
        tls: extra.length > 0 ? { ca: [...rootCertificates, ...extra] } : undefined,
      } as RequestInit);
    } catch (error) {
      if (signal.aborted) throw signal.reason;
      throw dumpInput(`could not download the dump: ${(error as Error).message}`, "dump_unreadable", url);
    }
    if (!response.ok || !response.body) {
      throw dumpInput(`could not download the dump: the server answered ${response.status}`, "dump_unreadable", url, {
        status: response.status,
      });
    }
    const total = Number(response.headers.get("content-length")) || null;
    const file = createWriteStream(to, { mode: 0o600 });
    let received = 0;
    try {
      const reader = response.body.getReader();
      for (let next = await reader.read(); !next.done; next = await reader.read()) {
        const chunk = next.value;
        received += chunk.length;
        if (!file.write(chunk)) await new Promise((resolve) => file.once("drain", resolve));
        progress({ bytesRead: received, totalBytes: total });
      }
    } catch (error) {
      if (signal.aborted) throw signal.reason;
      throw dumpInput(`the download of the dump broke off: ${(error as Error).message}`, "dump_unreadable", url);
    } finally {
      await new Promise((resolve) => file.end(resolve));
    }
  }
}

function assertToolsPresent(label: string, report: { missing: { tool: string; debianPackage: string }[] }): void {
  if (report.missing.length === 0) return;
  const packages = [...new Set(report.missing.map((m) => m.debianPackage))].join(" ");
  throw new AppError(
    "database_tools_missing",
    `${label} restores need ${report.missing.map((m) => m.tool).join(", ")}, not found on this host: install the Debian package ${packages} (apt-get install ${packages})`,
    { missing: report.missing },
  );
}

function describeSource(dump: string): string {
  return dump.startsWith("https://") ? new URL(dump).origin + new URL(dump).pathname : dump;
}

/** localPath turns a path or a file:// URL into a local path; null for an https:// URL. Anything else is a 422. */
function localPath(dump: string): string | null {
  if (dump.startsWith("https://")) {
    try {
      new URL(dump);
    } catch {
      throw dumpInput("the dump URL is not a valid URL", "value_error", dump);
    }
    return null;
  }
  if (dump.startsWith("file://")) {
    try {
      return fileURLToPath(dump);
    } catch (error) {
      throw dumpInput(`the file:// URL names no local file: ${(error as Error).message}`, "value_error", dump);
    }
  }
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(dump)) {
    throw dumpInput("the dump must be a path on this host, a file:// URL or an https:// URL", "value_error", dump);
  }
  if (!isAbsolute(dump))
    throw dumpInput("the dump path must be absolute (the engine does not share the caller's directory)", "value_error", dump);
  return dump;
}

function readSample(path: string, dump: string): DumpSample {
  try {
    return readDumpSample(path, dump.split("/").pop() || dump);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code ?? "error";
    const why = code === "ENOENT" ? "no such file" : code === "EACCES" ? "permission denied" : (error as Error).message;
    throw dumpInput(`the dump cannot be read: ${why}`, "dump_unreadable", dump, { detected: why });
  }
}

/**
 * chooseFormat picks the format to restore as: the target engine's certain match; else, when
 * another engine's format is certain, a 409 naming it; else the target's likely (plain SQL)
 * match; else a 422 saying what the dump looks like.
 */
function chooseFormat(matches: DumpFormat[], target: RestoreTarget, sample: DumpSample, dump: string): DumpFormat {
  const engine = target.engine as DatabaseEngineName;
  const own = matches.find((m) => m.engine === engine && m.confidence === "certain");
  if (own) return own;
  const other = matches.find((m) => m.engine !== engine && m.confidence === "certain");
  if (other) {
    throw new AppError(
      "dump_engine_mismatch",
      `the dump is a ${other.description}, but ${target.serviceName} is a ${engine} database: restore it into a ${other.engine} database`,
      { detected: other.format, engine: other.engine },
    );
  }
  const likely = matches.find((m) => m.engine === engine);
  if (likely) return likely;
  const detected = describeUnrecognised(sample);
  throw dumpInput(`the dump is not a format the engine recognises: ${detected}`, "dump_unrecognized", dump, { detected });
}
