import { constants, Database } from "bun:sqlite";
import { chmodSync, closeSync, existsSync, openSync } from "node:fs";
import { AppError, isDiskFull } from "../../lib/errors";
import { MIGRATIONS, type Migration } from "./migrations";

export type { Database } from "bun:sqlite";

/**
 * PRAGMAS are set in this one place for every connection: WAL so readers never block the
 * writer, synchronous=NORMAL (durable at checkpoints, safe with WAL), a busy timeout instead
 * of SQLITE_BUSY errors under contention, and enforced foreign keys.
 */
const PRAGMAS = ["journal_mode = WAL", "synchronous = NORMAL", "busy_timeout = 5000", "foreign_keys = ON"];

/** openStore opens (creating if needed) the engine's database and applies pending migrations. */
export function openStore(path: string, migrations: readonly Migration[] = MIGRATIONS): Database {
  let db: Database;
  try {
    keepPrivate(path);
    db = new Database(path, { create: true, strict: true });
  } catch (error) {
    throw new AppError("data_dir_unwritable", `cannot open the state database ${path}: ${(error as Error).message}`);
  }
  try {
    for (const pragma of PRAGMAS) db.exec(`PRAGMA ${pragma}`);
    // The WAL and its index (-shm) stay on disk after close: a daemon restarted on a full disk
    // can open the database again (creating a 32 KiB -shm needs room; issue 13).
    db.fileControl(constants.SQLITE_FCNTL_PERSIST_WAL, 1);
    migrate(db, migrations);
  } catch (error) {
    db.close();
    const code = (error as { code?: string }).code;
    if (isDiskFull(error) || code === "SQLITE_IOERR_SHMSIZE") {
      throw new AppError("disk_full", `cannot open the state database ${path}: its disk is full; free some space and start again`);
    }
    throw error;
  }
  return db;
}

/**
 * keepPrivate makes the database file 0600 before SQLite opens it: SQLite gives its -wal and
 * -shm files the mode of the database, and the data dir may be traversable by others (0711 as
 * root), so a mode from the umask (0644) would let any local user read the tokens' digests and
 * the services' sealed secrets. Files an older engine made 0644 are closed too.
 */
function keepPrivate(path: string): void {
  if (path === ":memory:" || path.startsWith("file:")) return;
  closeSync(openSync(path, "a", 0o600));
  for (const file of [path, `${path}-wal`, `${path}-shm`]) if (existsSync(file)) chmodSync(file, 0o600);
}

/** STORE_MIGRATIONS are the ids of the migrations this engine knows, oldest first: its store schema. */
export const STORE_MIGRATIONS: readonly string[] = MIGRATIONS.map((migration) => migration.id);

/** appliedMigrations lists the ids of the migrations a database has, in the order they sort (dated ids). */
export function appliedMigrations(db: Database): string[] {
  return db
    .query<{ id: string }, []>("SELECT id FROM schema_migrations ORDER BY id")
    .all()
    .map((row) => row.id);
}

/**
 * storeIsCurrent says whether the database at `path` has exactly the migrations this engine
 * knows, so that opening it changes nothing: a restart's successor may then open it while the
 * engine it takes over from still writes (WAL), and build its modules before the switch.
 */
export function storeIsCurrent(path: string, migrations: readonly Migration[] = MIGRATIONS): boolean {
  let db: Database | undefined;
  try {
    db = new Database(path, { readonly: true, strict: true });
    const applied = db.query<{ id: string }, []>("SELECT id FROM schema_migrations").all();
    const known = new Set(migrations.map((migration) => migration.id));
    return applied.length === known.size && applied.every((row) => known.has(row.id));
  } catch {
    return false;
  } finally {
    db?.close();
  }
}

/** migrate applies, in order and each in its own transaction, the migrations not yet recorded. */
export function migrate(db: Database, migrations: readonly Migration[]): string[] {
  db.exec("CREATE TABLE IF NOT EXISTS schema_migrations (id TEXT PRIMARY KEY, applied_at TEXT NOT NULL)");
  const applied = new Set(
    db
      .query<{ id: string }, []>("SELECT id FROM schema_migrations")
      .all()
      .map((row) => row.id),
  );
  const known = new Set(migrations.map((m) => m.id));
  const unknown = [...applied].filter((id) => !known.has(id));
  if (unknown.length > 0) {
    // A newer engine wrote this database; running older code over it could corrupt it.
    throw new AppError(
      "config_invalid",
      `the state database has migrations this engine does not know (${unknown.join(", ")}): it was written by a newer engine`,
    );
  }
  const ran: string[] = [];
  for (const migration of migrations) {
    if (applied.has(migration.id)) continue;
    db.transaction(() => {
      db.exec(migration.sql);
      db.query("INSERT INTO schema_migrations (id, applied_at) VALUES (?, ?)").run(migration.id, new Date().toISOString());
    })();
    ran.push(migration.id);
  }
  return ran;
}
