import { Database } from "bun:sqlite";
import { afterEach, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { migrate, openStore, storeIsCurrent } from "../../../src/engine/store";
import { MIGRATIONS } from "../../../src/engine/store/migrations";
import { tempDir } from "../../helpers";

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});
function dbPath(): string {
  const dir = tempDir();
  dirs.push(dir);
  return join(dir, "engine.db");
}

describe("store", () => {
  test("pragmas: WAL, synchronous NORMAL, busy timeout, foreign keys", () => {
    const db = openStore(dbPath());
    try {
      expect(db.query<{ journal_mode: string }, []>("PRAGMA journal_mode").get()?.journal_mode).toBe("wal");
      expect(db.query<{ synchronous: number }, []>("PRAGMA synchronous").get()?.synchronous).toBe(1);
      expect(db.query<{ timeout: number }, []>("PRAGMA busy_timeout").get()?.timeout).toBe(5000);
      expect(db.query<{ foreign_keys: number }, []>("PRAGMA foreign_keys").get()?.foreign_keys).toBe(1);
    } finally {
      db.close();
    }
  });

  test("migrations apply once, in order, and are recorded", () => {
    const path = dbPath();
    openStore(path).close();
    const db = openStore(path);
    try {
      const ids = db
        .query<{ id: string }, []>("SELECT id FROM schema_migrations ORDER BY id")
        .all()
        .map((r) => r.id);
      expect(ids).toEqual(MIGRATIONS.map((m) => m.id));
      expect(migrate(db, MIGRATIONS)).toEqual([]);
    } finally {
      db.close();
    }
  });

  test("migration ids are unique, dated and ascending (append-only)", () => {
    const ids = MIGRATIONS.map((m) => m.id);
    expect(new Set(ids).size).toBe(ids.length);
    for (const id of ids) expect(id).toMatch(/^\d{4}-\d{2}-\d{2}-\d{2}-[a-z0-9-]+$/);
    expect([...ids].sort()).toEqual(ids);
  });

  test("a failing migration leaves nothing half-applied", () => {
    const db = new Database(":memory:");
    const broken = [...MIGRATIONS, { id: "2099-01-01-01-broken", sql: "CREATE TABLE half (x); THIS IS NOT SQL;" }];
    expect(() => migrate(db, broken)).toThrow();
    expect(db.query("SELECT name FROM sqlite_master WHERE name = 'half'").get()).toBeNull();
    expect(db.query("SELECT id FROM schema_migrations WHERE id = '2099-01-01-01-broken'").get()).toBeNull();
  });

  test("a database written by a newer engine is refused with a clear error", () => {
    const path = dbPath();
    const db = openStore(path);
    db.query("INSERT INTO schema_migrations (id, applied_at) VALUES ('2099-01-01-01-future', 'x')").run();
    db.close();
    expect(() => openStore(path)).toThrow(/written by a newer engine/);
  });

  test("storeIsCurrent: true only when the database has exactly the migrations this engine knows", () => {
    const path = dbPath();
    expect(storeIsCurrent(path)).toBe(false); // no database yet
    openStore(path, MIGRATIONS.slice(0, -1)).close();
    expect(storeIsCurrent(path)).toBe(false); // one migration pending
    openStore(path).close();
    expect(storeIsCurrent(path)).toBe(true);
    const db = new Database(path);
    db.run("INSERT INTO schema_migrations (id, applied_at) VALUES ('2999-01-01-newer', '2999-01-01T00:00:00Z')");
    db.close();
    expect(storeIsCurrent(path)).toBe(false); // written by a newer engine
  });
});
