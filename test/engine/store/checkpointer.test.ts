import type { Database } from "bun:sqlite";
import { afterEach, describe, expect, test } from "bun:test";
import { readdirSync, readFileSync, readlinkSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { openStore } from "../../../src/engine/store";
import { type Checkpointer, startCheckpointer } from "../../../src/engine/store/checkpointer";
import { eventually, tempDir } from "../../helpers";

const PAGE = 4096;
const dirs: string[] = [];
const open: { db: Database; checkpointer: Checkpointer | null }[] = [];

afterEach(async () => {
  for (const item of open.splice(0)) {
    item.checkpointer?.stop();
    item.db.close();
  }
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

function store(): { db: Database; path: string } {
  const dir = tempDir("engine-test-checkpoint-");
  dirs.push(dir);
  const path = join(dir, "engine.db");
  const db = openStore(path);
  db.exec("CREATE TABLE blobs (id INTEGER PRIMARY KEY, body BLOB)");
  return { db, path };
}

/** writePages commits `count` rows of one page each, one commit apiece (as the daemon commits). */
function writePages(db: Database, count: number): void {
  const insert = db.query("INSERT INTO blobs (body) VALUES (?)");
  for (let i = 0; i < count; i++) insert.run(new Uint8Array(PAGE - 200));
}

/** workerThreads counts this process's threads that run a Worker (Bun names them so). */
function workerThreads(): number {
  return readdirSync("/proc/self/task").filter((tid) => readFileSync(`/proc/self/task/${tid}/comm`, "utf8").trim() === "Worker").length;
}

const autocheckpoint = (db: Database) =>
  db.query<{ wal_autocheckpoint: number }, []>("PRAGMA wal_autocheckpoint").get()?.wal_autocheckpoint;

describe("the checkpoint worker", () => {
  test("the connection stops checkpointing in its commits; the worker copies the WAL into the database", async () => {
    const { db, path } = store();
    const failures: string[] = [];
    // A worker that does not look for a minute: what the file does meanwhile is the connection's
    // doing alone (a worker looking every 50 ms checkpointed in the middle of a slow write).
    const idle = startCheckpointer(db, path, (message) => failures.push(message), { everyMs: 60_000, idleMs: 60_000 });
    const entry: (typeof open)[number] = { db, checkpointer: idle };
    open.push(entry);
    // Until the worker is ready, the connection keeps checkpointing.
    await eventually(() => autocheckpoint(db) === 0, { timeoutMs: 10_000 });
    const before = statSync(path).size;
    // 1500 pages: past SQLite's own 1000, which the connection no longer acts on.
    writePages(db, 1500);
    expect(statSync(path).size).toBe(before);
    idle.stop();
    // A worker that looks: it copies the waiting pages once its idle period has passed.
    entry.checkpointer = startCheckpointer(db, path, (message) => failures.push(message), { everyMs: 50, idleMs: 2000 });
    await eventually(() => statSync(path).size >= before + 1500 * PAGE, { timeoutMs: 10_000 });
    expect(db.query<{ n: number }, []>("SELECT COUNT(*) AS n FROM blobs").get()?.n).toBe(1500);
    expect(failures).toEqual([]);
  });

  test("a quiet WAL is checkpointed only once an idle period has passed, so commits do not start it over at every turn", async () => {
    const { db, path } = store();
    const checkpointer = startCheckpointer(db, path, () => {}, { everyMs: 20, idleMs: 3000 });
    open.push({ db, checkpointer });
    await eventually(() => autocheckpoint(db) === 0, { timeoutMs: 10_000 });
    const before = statSync(path).size;
    writePages(db, 100);
    await Bun.sleep(300);
    expect(statSync(path).size).toBe(before);
    // Once the idle period has passed, what waits is copied.
    await eventually(() => statSync(path).size >= before + 100 * PAGE, { timeoutMs: 10_000 });
  });

  test("a WAL past the restart length starts over from its beginning, while the writes go on", async () => {
    const { db, path } = store();
    const checkpointer = startCheckpointer(db, path, () => {}, { everyMs: 20, idleMs: 20, checkpointFrames: 50, restartFrames: 100 });
    open.push({ db, checkpointer });
    // Writes that never pause for long: 3000 pages in batches of 50, a few ms apart.
    for (let batch = 0; batch < 60; batch++) {
      writePages(db, 50);
      await Bun.sleep(5);
    }
    // Without a restart the WAL would hold all 3000 pages (12.4 MB); it started over instead
    // (how often depends on how soon the worker's thread gets a core, on a busy machine too).
    expect(statSync(`${path}-wal`).size).toBeLessThan(2500 * PAGE);
    expect(db.query<{ n: number }, []>("SELECT COUNT(*) AS n FROM blobs").get()?.n).toBe(3000);
  });

  test("stop ends the worker and gives the connection its automatic checkpoint back", async () => {
    // The workers of the tests before end on their own threads, a moment after their stop.
    await eventually(() => workerThreads() === 0, { timeoutMs: 10_000 });
    const { db, path } = store();
    const checkpointer = startCheckpointer(db, path, () => {}, { everyMs: 60_000, idleMs: 60_000 });
    open.push({ db, checkpointer: null });
    await eventually(() => autocheckpoint(db) === 0, { timeoutMs: 10_000 });
    expect(workerThreads()).toBe(1);
    checkpointer.stop();
    expect(autocheckpoint(db)).toBe(1000);
    await eventually(() => workerThreads() === 0, { timeoutMs: 10_000 });
    // The connection checkpoints in its commits again: 1500 pages pass its 1000.
    const before = statSync(path).size;
    writePages(db, 1500);
    expect(statSync(path).size).toBeGreaterThanOrEqual(before + 1000 * (PAGE - 200));
    checkpointer.stop();
  });

  test("stop resolves once the worker's connection is closed, not before", async () => {
    const { db, path } = store();
    /**
     * descriptors counts this process's open descriptors of the WAL: one a connection. (SQLite
     * keeps a closed connection's descriptor of the database file itself open while another
     * connection of the process holds locks there, since closing it would drop those.)
     */
    const descriptors = () =>
      readdirSync("/proc/self/fd").filter((fd) => {
        try {
          return readlinkSync(`/proc/self/fd/${fd}`) === `${path}-wal`;
        } catch {
          return false; // closed meanwhile
        }
      }).length;
    writePages(db, 5);
    const own = descriptors();
    const checkpointer = startCheckpointer(db, path, () => {}, { everyMs: 20, idleMs: 20, checkpointFrames: 1 });
    open.push({ db, checkpointer: null });
    await eventually(() => autocheckpoint(db) === 0, { timeoutMs: 10_000 });
    writePages(db, 50);
    await eventually(() => descriptors() > own, { timeoutMs: 10_000 }); // the worker's connection has the files open
    await checkpointer.stop();
    // The worker's connection is closed: the store's close after it is the last.
    expect(own).toBe(1);
    expect(descriptors()).toBe(own);
  });

  test("a worker that cannot open the database hands the checkpoints back to the connection and says so", async () => {
    const { db } = store();
    const failures: string[] = [];
    const checkpointer = startCheckpointer(db, join(dirs[0] ?? "", "gone", "engine.db"), (message) => failures.push(message), {
      everyMs: 20,
      idleMs: 20,
    });
    open.push({ db, checkpointer });
    await eventually(() => failures.length > 0, { timeoutMs: 10_000 });
    expect(autocheckpoint(db)).toBe(1000);
    expect(failures.join("\n")).toMatch(/the checkpoint worker ended \(.*\); the database checkpoints in its commits again/);
  });

  test("a checkpoint that fails is reported once, not at every turn", async () => {
    const { db } = store();
    const notADatabase = join(dirs[0] ?? "", "not-a-database");
    writeFileSync(notADatabase, "this is not a database, and it is long enough to be read as a header".repeat(20));
    const failures: string[] = [];
    const checkpointer = startCheckpointer(db, notADatabase, (message) => failures.push(message), { everyMs: 10, idleMs: 10 });
    open.push({ db, checkpointer });
    await eventually(() => failures.length > 0, { timeoutMs: 10_000 });
    await Bun.sleep(200);
    expect(failures).toEqual(["file is not a database"]);
  });
});
