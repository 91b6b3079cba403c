import { closeSync, existsSync, fstatSync, openSync, readSync, statSync } from "node:fs";
import type { LogLine } from "../../contract/engine";

/**
 * Service logs are the shim's files in the CRI logging format, one record a line:
 * `<RFC3339Nano> <stdout|stderr> <F|P> <text>` (P marks a line the shim had to split).
 */
export function parseLogLine(text: string): LogLine {
  const first = text.indexOf(" ");
  const second = text.indexOf(" ", first + 1);
  const third = text.indexOf(" ", second + 1);
  if (first < 0 || second < 0 || third < 0) return { ts: "", stream: "engine", line: text };
  return { ts: text.slice(0, first), stream: text.slice(first + 1, second), line: text.slice(third + 1) };
}

const TAIL_CHUNK = 256 * 1024;
const NEWLINE = 0x0a;

/**
 * LogCursor names a place in a service's log: just after a record, in the file with this inode
 * (the inode stays with a file as the shim rotates it to file.1, file.2, ...). It is the `id`
 * of every event of a followed log, so a client that reconnects with `Last-Event-ID` resumes
 * after the last record it got and misses none (docs/decisions.md 366).
 */
export interface LogCursor {
  inode: number;
  offset: number;
}

/** LogRecord is a log record and the cursor just after it. */
export interface LogRecord {
  line: LogLine;
  cursor: LogCursor;
}

/** formatCursor writes a cursor as an event id: `<inode>-<offset>`. */
export function formatCursor(cursor: LogCursor): string {
  return `${cursor.inode}-${cursor.offset}`;
}

/** parseCursor reads an event id back; null for anything that is not one. */
export function parseCursor(text: string | null | undefined): LogCursor | null {
  const match = /^(\d{1,20})-(\d{1,15})$/.exec(text?.trim() ?? "");
  if (!match) return null;
  const inode = Number(match[1]);
  const offset = Number(match[2]);
  return Number.isSafeInteger(inode) && Number.isSafeInteger(offset) ? { inode, offset } : null;
}

/**
 * splitRecords cuts whole records out of `bytes`, which start at byte `start` of the file with
 * `inode`; a last record without its newline yet is left out (`rest` is where it starts).
 */
function splitRecords(bytes: Buffer, start: number, inode: number): { records: LogRecord[]; rest: number } {
  const records: LogRecord[] = [];
  let from = 0;
  for (let newline = bytes.indexOf(NEWLINE); newline >= 0; newline = bytes.indexOf(NEWLINE, from)) {
    records.push({
      line: parseLogLine(bytes.toString("utf8", from, newline)),
      cursor: { inode, offset: start + newline + 1 },
    });
    from = newline + 1;
  }
  return { records, rest: from };
}

function lastRecordsOf(file: string, wanted: number): { records: LogRecord[]; end: LogCursor | null } {
  let fd: number;
  try {
    fd = openSync(file, "r");
  } catch {
    return { records: [], end: null }; // none yet (or gone): no records
  }
  try {
    const stats = fstatSync(fd);
    const size = stats.size;
    // Start with about what the lines need (every run's exit reads its tail), grow if short.
    let readFrom = Math.max(0, size - Math.min(TAIL_CHUNK, Math.max(16 * 1024, wanted * 256)));
    for (;;) {
      const buffer = Buffer.alloc(size - readFrom);
      readSync(fd, buffer, 0, buffer.length, readFrom);
      // A read that starts mid-file starts mid-record: the records begin after the first newline.
      const first = readFrom > 0 ? buffer.indexOf(NEWLINE) : -1;
      const last = buffer.lastIndexOf(NEWLINE);
      if (readFrom > 0 && first < 0) {
        // Not one whole record in this read: read more.
        readFrom = Math.max(0, size - (size - readFrom) * 4);
        continue;
      }
      const skip = first + 1;
      const { records } = splitRecords(buffer.subarray(skip), readFrom + skip, stats.ino);
      const end = { inode: stats.ino, offset: last >= 0 ? readFrom + last + 1 : 0 };
      if (records.length >= wanted || readFrom === 0) return { records: wanted === 0 ? [] : records.slice(-wanted), end };
      readFrom = Math.max(0, size - (size - readFrom) * 4);
    }
  } finally {
    closeSync(fd);
  }
}

/**
 * tailRecords returns the last `count` records of a log and its rotated predecessors (file.1,
 * file.2, ...), each with its cursor, and `end`: where following the log picks up, just after
 * the last whole record of the current file (a record still being written comes with the follow).
 */
export function tailRecords(file: string, count: number, maxFiles: number): { records: LogRecord[]; end: LogCursor } {
  const current = lastRecordsOf(file, Math.max(0, count));
  // A log that does not exist yet: every record of the file that appears is after this cursor.
  const end = current.end ?? { inode: 0, offset: 0 };
  let records = count > 0 ? current.records : [];
  for (let index = 1; index < Math.max(1, maxFiles) && records.length < count; index++) {
    records = [...lastRecordsOf(`${file}.${index}`, count - records.length).records, ...records];
  }
  return { records, end };
}

/** MTIME_MARGIN_MS: a file's mtime comes from the kernel's coarse clock, a tick behind the time of the write at most. */
const MTIME_MARGIN_MS = 1000;

/**
 * linesSince returns the last `count` lines of a log written at `since` (a log line's stamp, as
 * parseLogLine reads it) or later: a run's own output, read at each of its exits. The rotated
 * files are read only while they can hold such a line: not once a line older than `since` was
 * read, and not a file last written before `since` (nor those rotated before it). A run that
 * printed nothing used to look for every rotated file (four checks, by default) at its exit.
 */
export function linesSince(file: string, count: number, maxFiles: number, since: string): LogLine[] {
  if (count <= 0) return [];
  let records = lastRecordsOf(file, count).records;
  const sinceMs = Date.parse(`${since}Z`);
  const older = (record: LogRecord | undefined) => record !== undefined && record.line.ts !== "" && record.line.ts < since;
  for (let index = 1; index < Math.max(1, maxFiles) && records.length < count && !older(records[0]); index++) {
    const rotated = `${file}.${index}`;
    const written = statSync(rotated, { throwIfNoEntry: false })?.mtimeMs;
    if (written === undefined || written < sinceMs - MTIME_MARGIN_MS) break;
    records = [...lastRecordsOf(rotated, count - records.length).records, ...records];
  }
  return records.map((record) => record.line).filter((line) => line.ts >= since);
}

/** tailLog returns the last `count` records of a log and its rotated predecessors (file.1, file.2, ...). */
export function tailLog(file: string, count: number, maxFiles: number): LogLine[] {
  if (count <= 0) return [];
  return tailRecords(file, count, maxFiles).records.map((record) => record.line);
}

/** OpenLog is one file of a log, open, with its inode. */
interface OpenLog {
  fd: number;
  inode: number;
}

function openLog(path: string): OpenLog | null {
  try {
    const fd = openSync(path, "r");
    return { fd, inode: fstatSync(fd).ino };
  } catch {
    return null;
  }
}

/**
 * followLog yields the records of a log after `from` (a cursor of tailRecords or of an earlier
 * event; the current end when absent), following the log across rotations: the open
 * descriptor is read to its end before the new file is opened, so no record written just
 * before a rotation is skipped. A cursor in a rotated file resumes there and reads the newer
 * files after it; one no file has any more (rotated out, or not a cursor of this log) resumes
 * at the oldest file kept, as nothing newer was lost.
 */
export async function* followLog(
  file: string,
  signal: AbortSignal,
  options: { from?: LogCursor; maxFiles?: number; pollMs?: number } = {},
): AsyncGenerator<LogRecord> {
  const pollMs = options.pollMs ?? 100;
  let current: OpenLog | null = null;
  let position = 0;
  let pending = Buffer.alloc(0);
  const from = options.from;
  try {
    if (from) {
      // Oldest first: file.N-1 ... file.1, then the current file.
      const chain: OpenLog[] = [];
      for (let index = Math.max(1, options.maxFiles ?? 1) - 1; index >= 1; index--) {
        const rotated = openLog(`${file}.${index}`);
        if (rotated) chain.push(rotated);
      }
      const head = openLog(file);
      let at = chain.findIndex((log) => log.inode === from.inode);
      if (head && head.inode === from.inode) at = chain.length;
      let offset = at >= 0 ? from.offset : 0;
      if (at < 0) at = 0;
      try {
        for (let index = at; index < chain.length; index++) {
          const log = chain[index] as OpenLog;
          const size = fstatSync(log.fd).size;
          const start = Math.min(index === at ? offset : 0, size);
          const bytes = Buffer.alloc(size - start);
          readSync(log.fd, bytes, 0, bytes.length, start);
          for (const record of splitRecords(bytes, start, log.inode).records) {
            if (signal.aborted) return;
            yield record;
          }
          offset = 0;
        }
      } finally {
        for (const log of chain) closeSync(log.fd);
      }
      current = head;
      position = head ? Math.min(offset, fstatSync(head.fd).size) : 0;
    } else {
      current = openLog(file);
      position = current ? fstatSync(current.fd).size : 0;
    }
    const buffer = Buffer.alloc(64 * 1024);
    const aborted = new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
    while (!signal.aborted) {
      if (current === null) {
        current = openLog(file);
        position = 0;
        pending = Buffer.alloc(0);
      }
      if (current !== null) {
        const log: OpenLog = current;
        const chunks: Buffer[] = [pending];
        const start = position - pending.length;
        let read = readSync(log.fd, buffer, 0, buffer.length, position);
        while (read > 0) {
          position += read;
          chunks.push(Buffer.from(buffer.subarray(0, read)));
          read = readSync(log.fd, buffer, 0, buffer.length, position);
        }
        const bytes = chunks.length === 1 ? pending : Buffer.concat(chunks);
        const { records, rest } = splitRecords(bytes, start, log.inode);
        pending = bytes.subarray(rest);
        for (const record of records) yield record;
        const onDisk = existsSync(file) ? statSync(file).ino : null;
        if (onDisk !== log.inode) {
          closeSync(log.fd);
          current = null;
          continue;
        }
      }
      await Promise.race([Bun.sleep(pollMs), aborted]);
    }
  } finally {
    if (current !== null) closeSync(current.fd);
  }
}
