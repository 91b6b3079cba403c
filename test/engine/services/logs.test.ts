import { afterEach, describe, expect, test } from "bun:test";
import { appendFileSync, renameSync, rmSync, statSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { followLog, formatCursor, type LogCursor, type LogRecord, parseCursor, tailRecords } from "../../../src/engine/services";
import { linesSince } from "../../../src/engine/services/logs";
import { eventually, tempDir } from "../../helpers";

const cleanups: (() => void)[] = [];
afterEach(() => {
  while (cleanups.length > 0) cleanups.pop()?.();
});

function logDir(): string {
  const dir = tempDir();
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** record writes one CRI record, as the shim does. */
const record = (text: string) => `2026-11-23T10:00:00.000000000Z stdout F ${text}\n`;

/** follow collects what followLog yields into an array until stopped. */
function follow(file: string, from: LogCursor | undefined, maxFiles = 3) {
  const stop = new AbortController();
  const got: LogRecord[] = [];
  const done = (async () => {
    for await (const entry of followLog(file, stop.signal, { from, maxFiles, pollMs: 10 })) got.push(entry);
  })();
  cleanups.push(() => stop.abort());
  return {
    got,
    texts: () => got.map((entry) => entry.line.line),
    async stop() {
      stop.abort();
      await done;
    },
  };
}

describe("log cursors (the ids of a followed log)", () => {
  test.each([
    ["12-0", { inode: 12, offset: 0 }],
    ["981273-4096", { inode: 981273, offset: 4096 }],
    ["", null],
    ["12", null],
    ["12-", null],
    ["-5", null],
    ["a-1", null],
    ["1-2-3", null],
    ["99999999999999999999-1", null],
  ])("parseCursor(%p)", (text, cursor) => {
    expect(parseCursor(text)).toEqual(cursor);
    if (cursor) expect(formatCursor(cursor)).toBe(text);
  });

  test("the tail's records carry the cursor just after each; the end leaves out a record still being written", () => {
    const file = join(logDir(), "out.log");
    writeFileSync(file, `${record("one")}${record("two")}${record("three")}2026-11-23T10:00:00Z stdout P half`);
    const inode = statSync(file).ino;
    const { records, end } = tailRecords(file, 2, 1);
    expect(records.map((entry) => entry.line.line)).toEqual(["two", "three"]);
    expect(records.map((entry) => entry.cursor)).toEqual([
      { inode, offset: record("one").length + record("two").length },
      { inode, offset: record("one").length + record("two").length + record("three").length },
    ]);
    expect(end).toEqual(records[1]?.cursor as LogCursor);
    expect(tailRecords(file, 0, 1).records).toEqual([]);
    expect(tailRecords(join(logDir(), "none.log"), 5, 1)).toEqual({ records: [], end: { inode: 0, offset: 0 } });
  });

  test("following from a cursor resumes exactly after it, multibyte text included", async () => {
    const file = join(logDir(), "out.log");
    writeFileSync(file, `${record("héllo ✓")}${record("b")}${record("c")}`);
    const cursor = tailRecords(file, 3, 1).records[0]?.cursor as LogCursor;
    const follower = follow(file, cursor);
    await eventually(() => follower.got.length === 2);
    appendFileSync(file, record("d ✓"));
    await eventually(() => follower.got.length === 3);
    await follower.stop();
    expect(follower.texts()).toEqual(["b", "c", "d ✓"]);
    // Each record's cursor resumes after it, and the last equals the file's end.
    expect(follower.got.at(-1)?.cursor).toEqual({ inode: statSync(file).ino, offset: statSync(file).size });
  });

  test("a cursor in a rotated file resumes there and reads the newer files after it", async () => {
    const dir = logDir();
    const file = join(dir, "out.log");
    writeFileSync(file, `${record("1")}${record("2")}`);
    const cursor = tailRecords(file, 2, 3).records[0]?.cursor as LogCursor;
    // The shim rotates: out.log -> out.log.1 (its inode goes with it), a new out.log.
    renameSync(file, `${file}.1`);
    writeFileSync(file, record("3"));
    const follower = follow(file, cursor);
    await eventually(() => follower.got.length === 2);
    appendFileSync(file, record("4"));
    await eventually(() => follower.got.length === 3);
    await follower.stop();
    expect(follower.texts()).toEqual(["2", "3", "4"]);
  });

  test("a cursor no file has any more resumes at the oldest file kept; a log that did not exist yet is read from its start", async () => {
    const dir = logDir();
    const file = join(dir, "out.log");
    writeFileSync(`${file}.1`, record("old"));
    writeFileSync(file, record("new"));
    const gone = follow(file, { inode: 1, offset: 10 });
    await eventually(() => gone.got.length === 2);
    await gone.stop();
    expect(gone.texts()).toEqual(["old", "new"]);

    const later = join(dir, "later.log");
    const fresh = follow(later, tailRecords(later, 10, 3).end);
    await Bun.sleep(30);
    writeFileSync(later, `${record("first")}${record("second")}`);
    await eventually(() => fresh.got.length === 2);
    await fresh.stop();
    expect(fresh.texts()).toEqual(["first", "second"]);
  });

  test("a follow across a rotation misses nothing written just before it", async () => {
    const dir = logDir();
    const file = join(dir, "out.log");
    writeFileSync(file, "");
    const follower = follow(file, tailRecords(file, 0, 3).end);
    appendFileSync(file, record("a"));
    await eventually(() => follower.got.length === 1);
    appendFileSync(file, record("b"));
    renameSync(file, `${file}.1`);
    writeFileSync(file, record("c"));
    await eventually(() => follower.got.length === 3);
    await follower.stop();
    expect(follower.texts()).toEqual(["a", "b", "c"]);
  });
});

describe("linesSince (a run's own output, read at its exit)", () => {
  const at = (iso: string, text: string) => `${iso.replace(/Z$/, "")}000000Z stdout F ${text}\n`;
  const since = "2026-11-23T10:00:05.000";
  const texts = (file: string, count = 50) => linesSince(file, count, 5, since).map((line) => line.line);

  test("the current file's lines from `since` on; an older line there ends the search", () => {
    const file = join(logDir(), "service.log");
    writeFileSync(
      file,
      at("2026-11-23T10:00:04.000Z", "before") + at("2026-11-23T10:00:05.000Z", "first") + at("2026-11-23T10:00:06.000Z", "second"),
    );
    // A rotated file with lines stamped later: never read, since the current file began before the run.
    writeFileSync(`${file}.1`, at("2026-11-23T10:00:07.000Z", "impossible"));
    expect(texts(file)).toEqual(["first", "second"]);
    expect(texts(file, 1)).toEqual(["second"]);
  });

  test("a rotated file written since the run started is read, one written before it is not, nor any older", () => {
    const file = join(logDir(), "service.log");
    writeFileSync(file, at("2026-11-23T10:00:06.000Z", "after rotation"));
    writeFileSync(`${file}.1`, at("2026-11-23T10:00:04.000Z", "earlier run") + at("2026-11-23T10:00:05.500Z", "before rotation"));
    utimesSync(`${file}.1`, new Date("2026-11-23T10:00:05.600Z"), new Date("2026-11-23T10:00:05.600Z"));
    writeFileSync(`${file}.2`, at("2026-11-23T10:00:05.700Z", "stamped late in an old file"));
    utimesSync(`${file}.2`, new Date("2026-11-23T09:00:00.000Z"), new Date("2026-11-23T09:00:00.000Z"));
    expect(texts(file)).toEqual(["before rotation", "after rotation"]);

    // file.1 last written an hour before the run: neither it nor file.2 is read.
    utimesSync(`${file}.1`, new Date("2026-11-23T09:00:00.000Z"), new Date("2026-11-23T09:00:00.000Z"));
    utimesSync(`${file}.2`, new Date("2026-11-23T10:00:06.000Z"), new Date("2026-11-23T10:00:06.000Z"));
    expect(texts(file)).toEqual(["after rotation"]);
  });

  test("a run that printed nothing: no lines, and a log that is not there is no error", () => {
    const dir = logDir();
    expect(texts(join(dir, "absent.log"))).toEqual([]);
    const file = join(dir, "service.log");
    writeFileSync(file, at("2026-11-23T10:00:01.000Z", "an earlier run's"));
    expect(texts(file)).toEqual([]);
  });
});
