import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { chmodSync, existsSync, mkdirSync, readFileSync, rmdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import pino from "pino";
import { ServiceFiles } from "../../../src/engine/services/files";
import { tempDir } from "../../helpers";

let root: string;
let files: ServiceFiles;
beforeEach(() => {
  root = tempDir();
  files = new ServiceFiles(root, pino({ level: "silent" }));
});
afterEach(() => {
  rmSync(root, { recursive: true, force: true });
});

/** modeOf is a path's permission bits, set-id and sticky bits included. */
const modeOf = (path: string): number => statSync(path).mode & 0o7777;

/** LOG_LINE is a line the engine writes into a service's log: a nanosecond timestamp, the stream, a full line. */
const LOG_LINE = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z engine F (.*)$/;

function logLines(serviceId: string): string[] {
  const text = readFileSync(files.logFile(serviceId), "utf8");
  expect(text.endsWith("\n")).toBe(true);
  return text.slice(0, -1).split("\n");
}

test("lays a service's files out under the data dir", () => {
  expect({
    dataDir: files.dataDir("app"),
    serviceDir: files.serviceDir("svc_1"),
    logFile: files.logFile("svc_1"),
    buildLog: files.buildLog("svc_1"),
    buildsDir: files.buildsDir("svc_1"),
  }).toEqual({
    dataDir: join(root, "data", "app"),
    serviceDir: join(root, "services", "svc_1"),
    logFile: join(root, "services", "svc_1", "logs", "output.log"),
    buildLog: join(root, "services", "svc_1", "build.log"),
    buildsDir: join(root, "data", ".builds", "svc_1"),
  });
});

// ensure and ensureAsync are the same contract, one on the event loop and one off it: both pass one suite.
describe.each([
  ["ensure", (dir: string, mode?: number) => files.ensure(dir, mode)],
  ["ensureAsync", (dir: string, mode?: number) => files.ensureAsync(dir, mode)],
] as const)("%s", (_name, ensure) => {
  // 0775 and 0777 lose bits to the usual umask (022), which a chmod gives back.
  test.each([
    ["0700", 0o700],
    ["0711", 0o711],
    ["0750", 0o750],
    ["0775", 0o775],
    ["0777", 0o777],
  ])("makes a directory with mode %s", async (_octal, mode) => {
    const dir = join(root, "made");
    await ensure(dir, mode);
    expect(statSync(dir).isDirectory()).toBe(true);
    expect(modeOf(dir)).toBe(mode);
  });

  test("makes a directory 0700 when no mode is asked", async () => {
    await ensure(join(root, "made"));
    expect(modeOf(join(root, "made"))).toBe(0o700);
  });

  test("makes the parents that are missing too", async () => {
    const dir = join(root, "a", "b", "c");
    await ensure(dir, 0o750);
    expect(modeOf(dir)).toBe(0o750);
    expect(statSync(join(root, "a", "b")).isDirectory()).toBe(true);
  });

  test("does nothing for a directory it made with the same mode, and applies another mode", async () => {
    const dir = join(root, "made");
    await ensure(dir, 0o700);
    chmodSync(dir, 0o755);
    // Made once per daemon: the second ensure neither stats nor changes it.
    await ensure(dir, 0o700);
    expect(modeOf(dir)).toBe(0o755);
    await ensure(dir, 0o750);
    expect(modeOf(dir)).toBe(0o750);
  });

  test("gives a directory that was there already the mode asked", async () => {
    const dir = join(root, "older");
    mkdirSync(dir, { mode: 0o755 });
    await ensure(dir, 0o700);
    expect(modeOf(dir)).toBe(0o700);
  });

  // 02750 loses no bit to the usual umask: only the set-id bit calls for the chmod.
  test.each([
    ["02770", 0o2770],
    ["02750", 0o2750],
  ])("applies set-group-id mode %s exactly, which mkdir alone drops", async (_octal, mode) => {
    const dir = join(root, "shared");
    await ensure(dir, mode);
    expect(modeOf(dir)).toBe(mode);
  });

  test("refuses a path that is a file", async () => {
    const path = join(root, "file");
    writeFileSync(path, "x");
    await expect(Promise.resolve().then(() => ensure(path, 0o700))).rejects.toMatchObject({ code: "EEXIST" });
    expect(statSync(path).isFile()).toBe(true);
  });

  test("makes a directory again after forget, once someone else removed it", async () => {
    const dir = join(root, "made");
    await ensure(dir);
    rmdirSync(dir);
    // Still known as made: nothing is done.
    await ensure(dir);
    expect(existsSync(dir)).toBe(false);
    files.forget(dir);
    await ensure(dir);
    expect(modeOf(dir)).toBe(0o700);
  });
});

test("two launches asking for one directory at once share its making: one attempt, one outcome", async () => {
  // A path under a file cannot be made: each attempt would fail with an error of its own.
  writeFileSync(join(root, "file"), "x");
  const dir = join(root, "file", "data");
  const both = await Promise.allSettled([files.ensureAsync(dir, 0o700), files.ensureAsync(dir, 0o700)]);
  const [first, second] = both.map((result) => (result.status === "rejected" ? result.reason : null));
  expect(first).toMatchObject({ code: "ENOTDIR" });
  expect(second).toBe(first);
  // Once that attempt is over, the next one tries again.
  const again = await files.ensureAsync(dir, 0o700).catch((error: unknown) => error);
  expect(again).toMatchObject({ code: "ENOTDIR" });
  expect(again).not.toBe(first);
});

test.each([
  ["traversable", true, 0o711],
  ["private", false, 0o700],
])("ensureBuildsDir %s gives data/ and data/.builds their mode and the service's folder 0700", (_kind, traversable, mode) => {
  const dir = files.ensureBuildsDir("svc_1", traversable);
  expect(dir).toBe(files.buildsDir("svc_1"));
  expect(modeOf(join(root, "data"))).toBe(mode);
  expect(modeOf(join(root, "data", ".builds"))).toBe(mode);
  expect(modeOf(dir)).toBe(0o700);
  expect(modeOf(join(root, "services"))).toBe(0o700);
  expect(modeOf(files.serviceDir("svc_1"))).toBe(0o700);
});

test("appendLog writes one line from the engine in the shim's format, making the log's folders", () => {
  files.appendLog("svc_1", "build failed:\nexit 1\n");
  files.appendLog("svc_1", "retrying");
  expect(modeOf(join(files.serviceDir("svc_1"), "logs"))).toBe(0o700);
  const lines = logLines("svc_1");
  expect(lines).toHaveLength(2);
  expect(lines[0]).toMatch(LOG_LINE);
  expect(lines[0]!.match(LOG_LINE)![1]).toBe("build failed: exit 1 ");
  expect(lines[1]!.match(LOG_LINE)![1]).toBe("retrying");
  // The timestamp is now's, in nanoseconds.
  const stamp = Date.parse(lines[1]!.slice(0, 23));
  expect(Math.abs(Date.now() - stamp)).toBeLessThan(60_000);
});

test("removeService removes the engine's directory and the build checkouts, keeps the data dir, and forgets what it made", () => {
  files.ensureBuildsDir("svc_1", false);
  writeFileSync(join(files.buildsDir("svc_1"), "checkout"), "x");
  files.ensure(files.dataDir("app"));
  writeFileSync(join(files.dataDir("app"), "kept"), "data");
  files.appendLog("svc_1", "before");
  // Another service whose id starts with the same characters keeps its files.
  files.appendLog("svc_10", "other");

  files.removeService("svc_1");
  expect(existsSync(files.serviceDir("svc_1"))).toBe(false);
  expect(existsSync(files.buildsDir("svc_1"))).toBe(false);
  expect(readFileSync(join(files.dataDir("app"), "kept"), "utf8")).toBe("data");
  expect(logLines("svc_10")).toHaveLength(1);

  // A service deployed again under the same id has its directories made again.
  files.appendLog("svc_1", "after");
  expect(modeOf(files.serviceDir("svc_1"))).toBe(0o700);
  expect(logLines("svc_1").map((line) => line.match(LOG_LINE)![1])).toEqual(["after"]);
});

test("ensureBuildsDir makes the builds dir again after removeService, which forgot it with the service's own dir", () => {
  files.ensureBuildsDir("svc_1", false);
  files.removeService("svc_1");
  const dir = files.ensureBuildsDir("svc_1", false);
  expect(statSync(dir).isDirectory()).toBe(true);
});
