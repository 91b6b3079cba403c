import { fstatSync, ftruncateSync, openSync, write, writeSync } from "node:fs";
import { join } from "node:path";
import pino from "pino";
import type { LogLevel } from "./config";

export type Logger = pino.Logger;

/**
 * SECRET_FIELDS are the names of every field that can hold a secret (OWASP ASVS 16.2.5: no
 * secrets in logs). redactSecrets replaces them, at the top of a line's fields and one level
 * down (`body.token`), and `headers.authorization` / `headers.cookie` two levels down
 * (`request.headers.authorization`), before a line is written: what pino's `redact` paths
 * `token`, `*.token`, `*.headers.authorization` did, in one pass over the fields instead of
 * one per path (its interpreter parsed ~30 paths on every line: 0.15 ms of a batch job's cost).
 */
export const SECRET_FIELDS: ReadonlySet<string> = new Set([
  "token",
  "secret",
  "secrets",
  "password",
  "authorization",
  "admin_token",
  "adminToken",
  "cookie",
  "device_code",
  "user_code",
  "client_secret",
  "credential",
]);
const HEADER_SECRETS = ["authorization", "cookie"] as const;
const CENSOR = "[redacted]";

/** redactSecrets returns `fields` with every secret replaced: the same object when none is there, else a copy (the caller's objects stay as they were). */
export function redactSecrets(fields: Record<string, unknown>): Record<string, unknown> {
  let out: Record<string, unknown> | null = null;
  for (const key of Object.keys(fields)) {
    const value = fields[key];
    let next: unknown = value;
    if (SECRET_FIELDS.has(key)) next = CENSOR;
    else if (typeof value === "object" && value !== null) next = redactInner(value as Record<string, unknown>);
    if (next !== value) {
      out ??= { ...fields };
      out[key] = next;
    }
  }
  return out ?? fields;
}

/**
 * redactInner redacts one level down (SECRET_FIELDS) and a `headers` object's two (a copy where
 * anything changed). An array's keys are its indices, never a secret's name: it is never copied.
 */
function redactInner(value: Record<string, unknown>): unknown {
  let out: Record<string, unknown> | null = null;
  const copy = (): Record<string, unknown> => {
    // An Error keeps its message and stack only through pino's own serializer: serialize it first.
    out ??= value instanceof Error ? { ...pino.stdSerializers.err(value) } : { ...value };
    return out;
  };
  for (const key of Object.keys(value)) {
    const inner = value[key];
    if (SECRET_FIELDS.has(key)) copy()[key] = CENSOR;
    else if (key === "headers" && typeof inner === "object" && inner !== null) {
      const headers = inner as Record<string, unknown>;
      if (HEADER_SECRETS.some((name) => Object.hasOwn(headers, name))) {
        const redacted: Record<string, unknown> = { ...headers };
        for (const name of HEADER_SECRETS) if (Object.hasOwn(redacted, name)) redacted[name] = CENSOR;
        copy()[key] = redacted;
      }
    }
  }
  return out ?? value;
}

export interface LoggerOptions {
  level: LogLevel;
  /** dataDir receives the log file; omit for a logger that writes nowhere but stdout. */
  dataDir?: string;
  /** fileName is the log file's name in dataDir (default `engine.log`). */
  fileName?: string;
  stdout: boolean;
  /** stdoutFd is the descriptor written as "stdout" (default 1; tests pass a file's). */
  stdoutFd?: number;
  /** retryMs is how often a failing sink is tried again, at most (default 1000). */
  retryMs?: number;
}

/** SinkState is what a sink reports about itself (tests and diagnostics read it). */
export interface SinkState {
  name: string;
  failing: boolean;
  /** dropped counts the lines lost since the sink last worked. */
  dropped: number;
  /** error is the code of the failure that started the current outage. */
  error: string | null;
}

/** QUEUE_LIMIT_BYTES bounds what an asynchronous sink holds while its reader is slow. */
const QUEUE_LIMIT_BYTES = 4 * 1024 * 1024;

interface SinkEvents {
  /** failed is called once when the sink starts failing. */
  failed(sink: LineSink, code: string): void;
  /** recovering composes the line that says what was lost; it is written with the probe. */
  recovering(sink: LineSink, dropped: number): string;
  /** recovered is called once the probe, and so that line, was written. */
  recovered(sink: LineSink, line: string): void;
}

interface Entry {
  text: string;
  /** lines is how many log lines the entry holds (0 for the logger's own notices). */
  lines: number;
  /** recovery holds the dropped count a probe reports, and the notice that reports it. */
  recovery?: { dropped: number; notice: string };
}

/**
 * LineSink writes whole log lines to one descriptor and never throws, never blocks on a
 * failing one and never retries in a loop: a sink that fails (ENOSPC, EDQUOT, EIO, EPIPE...)
 * drops and counts lines, is tried again at most every retryMs when a line comes, and says so
 * once on each edge. pino's own destination retried a full disk every 100 ms forever and threw
 * its other errors uncaught (issue 13).
 *
 * A regular file is written synchronously: a full disk answers at once, and nothing is lost
 * or reordered at exit. A pipe, terminal or socket is written asynchronously, one write at a
 * time from a bounded queue, so a reader that stops reading cannot stall the event loop.
 */
export class LineSink {
  readonly name: string;
  private fd: number | null;
  private readonly open: (() => number) | null;
  private readonly sync: boolean;
  private readonly retryMs: number;
  private readonly events: SinkEvents;
  private failing = false;
  /** announced is true from the failure notice until the recovery notice. */
  private announced = false;
  private error: string | null = null;
  private dropped = 0;
  private lastTry = 0;
  /** midLine is true when a line was cut by a failure: the next write starts a new line. */
  private midLine = false;
  private queue: Entry[] = [];
  private queuedBytes = 0;
  private writing = false;
  private pumpDue = false;
  private retryTimer: ReturnType<typeof setTimeout> | null = null;

  constructor(options: { name: string; fd?: number; open?: () => number; retryMs: number; events: SinkEvents }) {
    this.name = options.name;
    this.open = options.open ?? null;
    this.retryMs = options.retryMs;
    this.events = options.events;
    this.fd = options.fd ?? null;
    if (this.fd === null && this.open) {
      try {
        this.fd = this.open();
      } catch (error) {
        // A log file that cannot be opened (a full disk with no inode left, say) is a failing
        // sink, not a reason to refuse to start.
        this.fail(codeOf(error));
      }
    }
    this.sync = this.fd === null ? true : isRegularFile(this.fd);
  }

  state(): SinkState {
    return { name: this.name, failing: this.failing, dropped: this.dropped, error: this.error };
  }

  /** write takes one line (ending in a newline); it never throws. */
  write(line: string): void {
    if (!this.failing) {
      this.put({ text: line, lines: 1 });
      return;
    }
    const now = Date.now();
    if (now - this.lastTry < this.retryMs) {
      this.dropped++;
      return;
    }
    this.lastTry = now;
    if (this.fd === null) {
      try {
        this.fd = this.open?.() ?? null;
      } catch {
        // still not there
      }
      if (this.fd === null) {
        this.dropped++;
        return;
      }
    }
    // The probe: the notice of what was lost and this line go in one write, so a reader of
    // the sink sees the gap where it is.
    const dropped = this.dropped;
    const notice = this.events.recovering(this, dropped);
    const text = (this.midLine ? "\n" : "") + notice + line;
    this.failing = false;
    this.dropped = 0;
    this.midLine = false;
    this.put({ text, lines: 1, recovery: { dropped, notice } });
  }

  /** writeNotice writes a line the logger itself composed, when the sink works. */
  writeNotice(line: string): void {
    if (!this.failing) this.put({ text: line, lines: 0 });
  }

  /** flushSync writes what is queued, synchronously, dropping it if the sink fails (exit). */
  flushSync(): void {
    if (this.retryTimer) clearTimeout(this.retryTimer);
    this.retryTimer = null;
    const pending = this.queue.map((entry) => entry.text).join("");
    this.queue = [];
    this.queuedBytes = 0;
    if (pending && this.fd !== null && !this.failing) {
      try {
        writeAll(this.fd, Buffer.from(pending));
      } catch {
        // Exiting: a sink that fails now loses its last lines, the process still exits.
      }
    }
  }

  private put(entry: Entry): void {
    if (this.fd === null) return;
    if (this.sync) {
      try {
        writeAll(this.fd, Buffer.from(entry.text));
      } catch (error) {
        this.lost([entry], codeOf(error));
        return;
      }
      this.succeeded([entry]);
      return;
    }
    if (this.queuedBytes + entry.text.length > QUEUE_LIMIT_BYTES) {
      // The reader does not keep up: lose this line rather than memory or the event loop.
      this.lost([entry], "EAGAIN");
      return;
    }
    this.queue.push(entry);
    this.queuedBytes += entry.text.length;
    this.pumpSoon();
  }

  /**
   * pumpSoon starts the queue's write once this turn of the event loop is done, so the lines
   * of one turn go in one write: a write is a trip through the thread pool and back, and a
   * flood of batch jobs logged three lines each, one write apiece.
   */
  private pumpSoon(): void {
    if (this.pumpDue || this.writing) return;
    this.pumpDue = true;
    setImmediate(() => {
      this.pumpDue = false;
      this.pump();
    });
  }

  private lost(entries: Entry[], code: string): void {
    for (const entry of entries) this.dropped += entry.lines + (entry.recovery?.dropped ?? 0);
    if (code === "short") this.midLine = true;
    this.fail(code === "short" ? "ENOSPC" : code);
  }

  private succeeded(entries: Entry[]): void {
    for (const entry of entries) {
      if (!entry.recovery) continue;
      this.announced = false;
      this.error = null;
      this.events.recovered(this, entry.recovery.notice);
    }
  }

  private fail(code: string): void {
    this.failing = true;
    this.lastTry = Date.now();
    if (this.announced) return;
    this.announced = true;
    this.error = code;
    this.events.failed(this, code);
  }

  /** pump writes the queue asynchronously, one write in flight at a time. */
  private pump(): void {
    if (this.writing || this.failing || this.fd === null || this.queue.length === 0) return;
    const entries = this.queue;
    const chunk = Buffer.from(entries.map((entry) => entry.text).join(""));
    this.queue = [];
    this.queuedBytes = 0;
    this.writing = true;
    const fd = this.fd;
    const attempt = (buffer: Buffer) => {
      write(fd, buffer, 0, buffer.length, null, (error, written) => {
        if (error && codeOf(error) === "EAGAIN") {
          // A full non-blocking pipe: try the rest again soon, without a busy loop.
          this.retryTimer = setTimeout(() => {
            this.retryTimer = null;
            attempt(buffer);
          }, 20);
          this.retryTimer.unref?.();
          return;
        }
        if (error) {
          this.writing = false;
          // What was queued behind the failed write is lost with it.
          const behind = this.queue;
          this.queue = [];
          this.queuedBytes = 0;
          this.lost([...entries, ...behind], buffer.length < chunk.length ? "short" : codeOf(error));
          return;
        }
        if (written < buffer.length) {
          attempt(buffer.subarray(written));
          return;
        }
        this.writing = false;
        this.succeeded(entries);
        this.pump();
      });
    };
    attempt(chunk);
  }
}

/**
 * writeAll writes the whole buffer or throws. A write cut short on a regular file is undone
 * (the file is truncated back), so the file only ever holds whole lines; a cut one elsewhere
 * throws the code "short" and the next write starts a new line.
 */
function writeAll(fd: number, buffer: Buffer): void {
  let offset = 0;
  while (offset < buffer.length) {
    let written: number;
    try {
      written = writeSync(fd, buffer, offset, buffer.length - offset);
    } catch (error) {
      if (offset > 0 && !undoCut(fd, offset)) throw Object.assign(new Error("short write"), { code: "short", cause: error });
      throw error;
    }
    if (written <= 0) throw Object.assign(new Error("no progress"), { code: "EIO" });
    offset += written;
  }
}

function undoCut(fd: number, cut: number): boolean {
  try {
    const stats = fstatSync(fd);
    if (!stats.isFile()) return false;
    ftruncateSync(fd, stats.size - cut);
    return true;
  } catch {
    return false;
  }
}

function isRegularFile(fd: number): boolean {
  try {
    return fstatSync(fd).isFile();
  } catch {
    return true;
  }
}

function codeOf(error: unknown): string {
  return (error as NodeJS.ErrnoException)?.code ?? "EIO";
}

/** noticeLine formats a line in pino's own shape, for what the logger says about its sinks. */
function noticeLine(level: number, fields: Record<string, unknown>, msg: string): string {
  return `${JSON.stringify({ level, time: new Date().toISOString(), pid: process.pid, ...fields, msg })}\n`;
}

/** withoutPidKey renames a `pid` field to `other_pid`: the line's one `pid` is the engine's. */
function withoutPidKey(fields: Record<string, unknown>): Record<string, unknown> {
  if (!Object.hasOwn(fields, "pid")) return fields;
  const { pid, ...rest } = fields;
  return { ...rest, other_pid: pid };
}

/**
 * createLogger returns a pino logger writing JSON lines to `<dataDir>/engine.log` and to
 * stdout. It uses its own sinks, not pino transports: transports start worker files that a
 * `bun build --compile` binary cannot find. Logging never blocks or ends the process: see
 * LineSink. `sinks` reports each sink's state.
 */
export function createLogger(options: LoggerOptions): { log: Logger; flush: () => void; sinks: () => SinkState[] } {
  const sinks: LineSink[] = [];
  const retryMs = options.retryMs ?? 1000;
  const events: SinkEvents = {
    failed(sink, code) {
      // Said once, on the sinks that still work; the failing one cannot hear it.
      const line = noticeLine(40, { sink: sink.name, code }, `${sink.name} is not writable (${code}): dropping log lines until it is`);
      for (const other of sinks) if (other !== sink) other.writeNotice(line);
    },
    recovering(sink, dropped) {
      return noticeLine(40, { sink: sink.name, dropped }, `dropped ${dropped} log lines while ${sink.name} was not writable`);
    },
    recovered(sink, line) {
      for (const other of sinks) if (other !== sink) other.writeNotice(line);
    },
  };
  const streams: pino.StreamEntry[] = [];
  const level = options.level === "silent" ? "fatal" : options.level;
  if (options.stdout) {
    const sink = new LineSink({ name: "stdout", fd: options.stdoutFd ?? 1, retryMs, events });
    sinks.push(sink);
    streams.push({ stream: sink, level });
  }
  if (options.dataDir) {
    const path = join(options.dataDir, options.fileName ?? "engine.log");
    // The file is opened here, synchronously, so the sink is ready at once: an exit during
    // start-up then flushes cleanly instead of failing on a half-open stream.
    const sink = new LineSink({ name: path, open: () => openSync(path, "a", 0o600), retryMs, events });
    sinks.push(sink);
    streams.push({ stream: sink, level });
  }
  const base = { pid: process.pid };
  const log = pino(
    {
      level: options.level,
      base,
      // A line's `pid` is the engine's own (base). A field also named `pid` (a workload's, a
      // proxy process's) would give the line a second `pid` key, which JSON readers resolve
      // differently (jq keeps the last, others the first): it is written as `other_pid`
      // instead, so every line has exactly one `pid`. (pino gives child loggers no bindings
      // formatter: the engine makes none, and a child must not bind `pid`.)
      formatters: { log: (fields) => withoutPidKey(redactSecrets(fields)) },
      timestamp: pino.stdTimeFunctions.isoTime,
    },
    pino.multistream(streams),
  );
  const flush = () => {
    for (const sink of sinks) sink.flushSync();
  };
  return { log, flush, sinks: () => sinks.map((sink) => sink.state()) };
}
