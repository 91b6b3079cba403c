import type { LogLine } from "../../contract/engine";

/** LogShape is what the `logs` tool asks of a service's latest lines, once they are read. */
export interface LogShape {
  /** tail keeps at most this many of the matching lines, the latest. */
  tail: number;
  /** since keeps lines written at or after this instant (ms since the epoch); lines without a time are dropped. */
  since?: number;
  /** grep keeps lines whose text contains this fixed string (as `grep -F`). */
  grep?: string;
  ignoreCase?: boolean;
  /** maxBytes bounds the rendered text; what is kept is its END, the latest lines. */
  maxBytes: number;
}

/** ShapedLogs are the lines kept, in order, and what was left out. */
export interface ShapedLogs {
  lines: LogLine[];
  /** text is the lines as `<ts> <stream> <line>`, one a line: what the assistant reads. */
  text: string;
  matched: number;
  omitted_lines: number;
  truncated: boolean;
  bytes: number;
}

/** TRUNCATION_MARK starts a line whose beginning was cut to fit the byte cap. */
export const TRUNCATION_MARK = "…";

/**
 * parseLogTime reads a log record's RFC 3339 time, nanoseconds included (the shim writes
 * `2026-01-02T03:04:05.123456789Z`, which Date.parse does not take), to milliseconds.
 */
export function parseLogTime(ts: string): number | null {
  const match = /^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$/.exec(ts);
  if (!match) return null;
  const millis = (match[2] ?? "").slice(0, 3).padEnd(3, "0");
  const value = Date.parse(`${match[1]}.${millis}${match[3]}`);
  return Number.isNaN(value) ? null : value;
}

/**
 * parseSince reads the `since` argument: an RFC 3339 time, or a duration back from `now`
 * (`90s`, `15m`, `2h`, `1d`, as `docker logs --since` takes). It answers null when it is neither.
 */
export function parseSince(value: string, now: number): number | null {
  const relative = /^(\d{1,9})(s|m|h|d)$/.exec(value.trim());
  if (relative) {
    const unit = { s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 }[relative[2] as "s" | "m" | "h" | "d"];
    return now - Number(relative[1]) * unit;
  }
  const absolute = parseLogTime(value.trim()) ?? Date.parse(value.trim());
  return Number.isNaN(absolute) ? null : absolute;
}

const renderLine = (line: LogLine) => `${line.ts} ${line.stream} ${line.line}`;

/**
 * lastBytes cuts `text` to at most `maxBytes` UTF-8 bytes from its end, never inside a
 * character, and marks the cut.
 */
function lastBytes(text: string, maxBytes: number): string {
  const budget = maxBytes - Buffer.byteLength(TRUNCATION_MARK);
  const bytes = Buffer.from(text);
  let start = Math.max(0, bytes.length - budget);
  // A UTF-8 continuation byte is 10xxxxxx: step forward to the start of a character.
  while (start < bytes.length && ((bytes[start] as number) & 0xc0) === 0x80) start++;
  return `${TRUNCATION_MARK}${bytes.subarray(start).toString()}`;
}

/**
 * shapeLogs filters a service's latest lines (`since`, then `grep`), keeps the last `tail`
 * of them, and then drops whole lines from the START until the rendered text fits `maxBytes`:
 * the end of the output is what an assistant diagnosing a crash needs. When even the last
 * line alone is over the cap, its beginning is cut and marked with TRUNCATION_MARK.
 */
export function shapeLogs(input: LogLine[], shape: LogShape): ShapedLogs {
  const needle = shape.grep === undefined ? undefined : shape.ignoreCase ? shape.grep.toLowerCase() : shape.grep;
  const matching = input.filter((line) => {
    if (shape.since !== undefined) {
      const at = parseLogTime(line.ts);
      if (at === null || at < shape.since) return false;
    }
    if (needle !== undefined) {
      const text = shape.ignoreCase ? line.line.toLowerCase() : line.line;
      if (!text.includes(needle)) return false;
    }
    return true;
  });
  const tailed = shape.tail > 0 ? matching.slice(-shape.tail) : [];
  const kept: LogLine[] = [];
  let bytes = 0;
  let truncated = false;
  for (let index = tailed.length - 1; index >= 0; index--) {
    const line = tailed[index] as LogLine;
    const size = Buffer.byteLength(renderLine(line)) + (kept.length > 0 ? 1 : 0);
    if (bytes + size <= shape.maxBytes) {
      kept.unshift(line);
      bytes += size;
      continue;
    }
    truncated = true;
    if (kept.length === 0) {
      // The last line alone is over the cap: keep its end.
      const prefix = `${line.ts} ${line.stream} `;
      const room = shape.maxBytes - Buffer.byteLength(prefix);
      if (room > Buffer.byteLength(TRUNCATION_MARK)) {
        const cut = { ...line, line: lastBytes(line.line, room) };
        kept.unshift(cut);
        bytes = Buffer.byteLength(renderLine(cut));
      }
    }
    break;
  }
  const text = kept.map(renderLine).join("\n");
  return {
    lines: kept,
    text,
    matched: matching.length,
    omitted_lines: tailed.length - kept.length,
    truncated,
    bytes: Buffer.byteLength(text),
  };
}
