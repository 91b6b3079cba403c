import { afterAll, beforeAll, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { Database } from "../../../src/cloud/db";
import { isAppError } from "../../../src/lib/errors";
import { tempDir } from "../../helpers";
import { mountTmpfs, type Tmpfs } from "../../tmpfs";
import { POSTGRES_URL, postgresAvailable } from "../helpers";

// What each driver throws, as observed on a real full tmpfs (test/cloud/server/disk-full.test.ts
// exercises the real ones end to end); the classifier reads only these fields.
const SQLITE_FULL = { name: "SQLiteError", code: "SQLITE_FULL", errno: 13, message: "database or disk is full" };
const SQLITE_IOERR = { name: "SQLiteError", code: "SQLITE_IOERR_WRITE", errno: 778, message: "disk I/O error" };
const SQLITE_UNIQUE = { name: "SQLiteError", code: "SQLITE_CONSTRAINT_UNIQUE", errno: 2067, message: "UNIQUE constraint failed" };
const PG_DISK_FULL = {
  name: "PostgresError",
  code: "ERR_POSTGRES_SERVER_ERROR",
  errno: "53100",
  message: 'could not extend file "base/1/2"',
};
const PG_OOM = { name: "PostgresError", code: "ERR_POSTGRES_SERVER_ERROR", errno: "53200", message: "out of memory" };
const ENOSPC = { name: "Error", code: "ENOSPC", errno: -28, message: "ENOSPC: no space left on device, write" };

let disk: Tmpfs;
let sqlite: Database;
let roomy: Database;
const roomyDir = tempDir("engine-cloud-db-");
beforeAll(async () => {
  disk = mountTmpfs("8m");
  sqlite = await Database.open(`sqlite://${join(disk.dir, "cloud.db")}`);
  await sqlite.migrate();
  roomy = await Database.open(`sqlite://${join(roomyDir, "cloud.db")}`);
  await roomy.migrate();
});
afterAll(async () => {
  await sqlite?.close();
  await roomy?.close();
  rmSync(roomyDir, { recursive: true, force: true });
  disk?.free();
  disk?.unmount();
});

test.each([
  ["SQLITE_FULL", SQLITE_FULL, true],
  ["an I/O error with room on the disk (a bad disk, not a full one)", SQLITE_IOERR, false],
  ["a unique violation", SQLITE_UNIQUE, false],
  ["PostgreSQL's disk_full on SQLite's handle", PG_DISK_FULL, false],
  ["a plain ENOSPC from elsewhere (the log is not the database)", ENOSPC, false],
  ["nothing", null, false],
])("on SQLite with room, %s is disk full: %p", async (_label, error, full) => {
  expect(roomy.isDiskFull(error)).toBe(full);
});

test("on SQLite, an I/O error counts as disk full only while the filesystem is below the floor; writable follows", async () => {
  expect(sqlite.isDiskFull(SQLITE_IOERR)).toBe(false);
  expect(await sqlite.writable()).toBe(true);
  disk.fill();
  // Below the floor ready says so before any write fails.
  expect(await sqlite.writable()).toBe(false);
  expect(sqlite.isDiskFull(SQLITE_IOERR)).toBe(true);
  let thrown: unknown;
  try {
    await sqlite.sql`INSERT INTO audit (id, action, created_at) VALUES ('aud_1', 'test', 1)`;
  } catch (error) {
    thrown = error;
  }
  expect(sqlite.isDiskFull(thrown)).toBe(true);
  disk.free();
  expect(await sqlite.writable()).toBe(true);
  await sqlite.sql`INSERT INTO audit (id, action, created_at) VALUES ('aud_2', 'test', 2)`;
  const [row] = await sqlite.sql`PRAGMA integrity_check`;
  expect(row).toEqual({ integrity_check: "ok" });
});

test.skipIf(!(await postgresAvailable()))("on PostgreSQL, SQLSTATE 53100 is disk full and 53200 (out of memory) is not", async () => {
  const db = await Database.open(POSTGRES_URL, { max: 1 });
  try {
    expect(db.isDiskFull(PG_DISK_FULL)).toBe(true);
    for (const error of [PG_OOM, SQLITE_FULL, ENOSPC, null]) expect(db.isDiskFull(error)).toBe(false);
    // Remembered, so ready probes: here the probe succeeds (the test database has room) and clears it.
    expect(await db.writable()).toBe(true);
  } finally {
    await db.close();
  }
});

test("a SQLite database opened on a full disk says disk_full, and opens once there is room", async () => {
  const path = join(disk.dir, "closed.db");
  const first = await Database.open(`sqlite://${path}`);
  await first.migrate();
  await first.close();
  disk.fill();
  try {
    let refused: unknown;
    try {
      await (await Database.open(`sqlite://${path}`)).close();
    } catch (error) {
      refused = error;
    }
    expect(isAppError(refused) && refused.code).toBe("disk_full");
  } finally {
    disk.free();
  }
  const again = await Database.open(`sqlite://${path}`);
  expect(await again.migrate()).toEqual([]);
  await again.close();
});
