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

function lastLinesOf(file: string, wanted: number): string[] {
  if (!existsSync(file)) return [];
  const size = statSync(file).size;
  // Start with about what the lines need (every run's exit reads its tail), grow if short.
  let readFrom = Math.max(0, size - Math.min(TAIL_CHUNK, Math.max(16 * 1024, wanted * 256)));
  for (;;) {
    const fd = openSync(file, "r");
    const buffer = Buffer.alloc(size - readFrom);
    try {
      readSync(fd, buffer, 0, buffer.length, readFrom);
    } finally {
      closeSync(fd);
    }
    const lines = buffer.toString("utf8").split("\n");
    if (lines.at(-1) === "") lines.pop();
    if (readFrom > 0) lines.shift(); // may start mid-record
    if (lines.length >= wanted || readFrom === 0) return lines.slice(-wanted);
    readFrom = Math.max(0, size - (size - readFrom) * 4);
  }
}

/** tailLog returns the last `count` records of a log and its rotated predecessors (file.1, file.2, ...). */
export function tailLog(file: string, count: number, maxFiles: number): LogLine[] {
  if (count <= 0) return [];
  let lines: string[] = [];
  for (let index = 0; index < Math.max(1, maxFiles) && lines.length < count; index++) {
    const path = index === 0 ? file : `${file}.${index}`;
    lines = [...lastLinesOf(path, count - lines.length), ...lines];
  }
  return lines.map(parseLogLine);
}

/**
 * followLog yields records appended to a log from its current end, following it across
 * rotations: the open descriptor is read to its end before the new file is opened, so no
 * record written just before a rotation is skipped.
 */
export async function* followLog(file: string, signal: AbortSignal, pollMs = 100): AsyncGenerator<LogLine> {
  let fd: number | null = null;
  let position = 0;
  let pending = "";
  const open = (fromEnd: boolean) => {
    if (!existsSync(file)) return;
    fd = openSync(file, "r");
    position = fromEnd ? fstatSync(fd).size : 0;
  };
  open(true);
  const buffer = Buffer.alloc(64 * 1024);
  const aborted = new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
  try {
    while (!signal.aborted) {
      if (fd === null) open(false);
      if (fd !== null) {
        let read = readSync(fd, buffer, 0, buffer.length, position);
        while (read > 0) {
          position += read;
          pending += buffer.toString("utf8", 0, read);
          read = readSync(fd, buffer, 0, buffer.length, position);
        }
        let newline = pending.indexOf("\n");
        while (newline >= 0) {
          yield parseLogLine(pending.slice(0, newline));
          pending = pending.slice(newline + 1);
          newline = pending.indexOf("\n");
        }
        const current = existsSync(file) ? statSync(file).ino : null;
        if (current !== fstatSync(fd).ino) {
          closeSync(fd);
          fd = null;
          pending = "";
          continue;
        }
      }
      await Promise.race([Bun.sleep(pollMs), aborted]);
    }
  } finally {
    if (fd !== null) closeSync(fd);
  }
}
