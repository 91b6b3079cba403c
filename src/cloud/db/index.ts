import { Database as SqliteFile, type Statement } from "bun:sqlite";
import { mkdirSync, statfsSync } from "node:fs";
import { dirname } from "node:path";
import { SQL } from "bun";
import { AppError } from "../../lib/errors";
import { type Dialect, MIGRATIONS } from "./migrations";

export type { Dialect } from "./migrations";

/** Sql is Bun.SQL's tagged-template client, or one transaction's. */
export type Sql = SQL;

/** Param is a value bound to a prepared read's `$1`, `$2`, … */
export type Param = string | number | null;

/** PreparedRead runs one read statement, prepared once, with its parameters: the rows it answers. */
export type PreparedRead = (...params: Param[]) => Promise<Record<string, unknown>[]>;

/** DatabaseStats counts what the console asked of its database, so benches can prove a path made no reads. */
export interface DatabaseStats {
  /** statements counts top-level statements and transactions begun through `db.sql` and `db.transaction`. */
  statements: number;
}

/**
 * Database is the console's one store: Bun.SQL over `sqlite://` (the embedded default) or
 * `postgres://` (several replicas). Every statement is portable SQL that runs unchanged on
 * both; the few differences (how a row is locked, how a big integer comes back) are handled
 * here and in `num`, never in the modules.
 *
 * Portable rules the schema follows: TEXT ids, BIGINT milliseconds for time (PostgreSQL
 * returns int8 as a string: read them through `num`), INTEGER 0/1 for flags, `RETURNING` for
 * compare-and-set, `ON CONFLICT` for upserts. To lock a row for the rest of a transaction
 * portably, UPDATE it first (PostgreSQL then holds its row lock; SQLite's BEGIN IMMEDIATE
 * already holds the database's write lock): no `SELECT ... FOR UPDATE`, which SQLite lacks.
 */
export class Database {
  readonly stats: DatabaseStats = { statements: 0 };
  readonly #client: SQL;
  /** #directory holds the SQLite file (null on PostgreSQL and for :memory:): its free space is measured. */
  readonly #directory: string | null;
  /** #filename is the SQLite file (null on PostgreSQL and for :memory:): prepared reads open it again. */
  readonly #filename: string | null;
  /** #reader is the SQLite file's read-only connection for prepared reads, opened at the first. */
  #reader: SqliteFile | undefined;
  /** #diskFullAt is when a write last failed for lack of space, until a probe finds room again. */
  #diskFullAt: number | null = null;

  private constructor(
    readonly dialect: Dialect,
    client: SQL,
    filename: string | null = null,
  ) {
    this.#client = client;
    this.#filename = filename;
    this.#directory = filename === null ? null : dirname(filename);
  }

  /** open connects to the URL; a SQLite file's directory is created. Nothing is migrated yet. */
  static async open(url: string, options: { max?: number } = {}): Promise<Database> {
    if (url.startsWith("sqlite:") || url.startsWith("file:")) {
      const filename = url.replace(/^(sqlite|file):(\/\/)?/, "");
      if (filename !== ":memory:") mkdirSync(dirname(filename), { recursive: true });
      const client = new SQL({ adapter: "sqlite", filename, create: true, readwrite: true });
      const db = new Database("sqlite", client, filename === ":memory:" ? null : filename);
      try {
        // WAL lets readers run beside the one writer; a busy writer waits instead of failing.
        await client.unsafe("PRAGMA journal_mode = WAL");
        await client.unsafe("PRAGMA busy_timeout = 5000");
        await client.unsafe("PRAGMA foreign_keys = ON");
        await client.unsafe("PRAGMA synchronous = NORMAL");
      } catch (error) {
        await client.close().catch(() => {});
        // Opening creates the WAL and its 32 KiB index: on a full disk say so, not "disk I/O error".
        if (db.isDiskFull(error)) {
          throw new AppError("disk_full", `cannot open the database ${filename}: its disk is full; free some space and start again`);
        }
        throw error;
      }
      return db;
    }
    const client = new SQL({ url, max: options.max ?? 10, idleTimeout: 30, connectionTimeout: 10 });
    try {
      await client`SELECT 1`;
    } catch (error) {
      await client.close().catch(() => {});
      throw new AppError("database_unavailable", `cannot reach the database: ${(error as Error).message}`);
    }
    return new Database("postgres", client);
  }

  /** sql runs one statement: `await db.sql\`SELECT ...\``. Inside a transaction, use its own `tx`. */
  get sql(): SQL {
    this.stats.statements += 1;
    return this.#client;
  }

  /**
   * prepareRead prepares a read statement once, for a path that runs it on every request (an
   * assistant's every call): `text` names its parameters `$1`, `$2`, … On SQLite it runs on a
   * read-only connection of its own to the same file (WAL: it reads what was committed, as the
   * main connection does) as a statement prepared at its first use and kept, since Bun.SQL
   * prepares each tagged statement anew there. On PostgreSQL (and an in-memory SQLite) it is
   * Bun.SQL's parameterized query, which PostgreSQL prepares once per connection. Writes stay on
   * `sql` and `transaction`.
   */
  prepareRead(text: string): PreparedRead {
    if (this.dialect === "sqlite" && this.#filename !== null) {
      const sqliteText = text.replace(/\$(\d+)/g, "?$1");
      let statement: Statement | undefined;
      return async (...params) => {
        this.stats.statements += 1;
        statement ??= this.#readerConnection().query(sqliteText);
        return statement.all(...params) as Record<string, unknown>[];
      };
    }
    return async (...params) => {
      this.stats.statements += 1;
      return (await this.#client.unsafe(text, params)) as Record<string, unknown>[];
    };
  }

  #readerConnection(): SqliteFile {
    if (!this.#reader) {
      const reader = new SqliteFile(this.#filename as string, { readonly: true });
      reader.exec("PRAGMA busy_timeout = 5000");
      this.#reader = reader;
    }
    return this.#reader;
  }

  /**
   * transaction runs `fn` in one transaction, committed when it returns and rolled back when
   * it throws. On SQLite the transaction takes the write lock at once (BEGIN IMMEDIATE), so
   * two read-then-write transactions cannot both read the old row.
   */
  transaction<T>(fn: (tx: SQL) => Promise<T>): Promise<T> {
    this.stats.statements += 1;
    const mode = this.dialect === "sqlite" ? "IMMEDIATE" : "";
    return (mode ? this.#client.begin(mode, fn as never) : this.#client.begin(fn as never)) as Promise<T>;
  }

  /** ping answers whether the database takes a query now (for /api/ready). */
  async ping(): Promise<boolean> {
    try {
      await this.#client`SELECT 1`;
      return true;
    } catch {
      return false;
    }
  }

  /**
   * isDiskFull says whether an error is the database refusing a write for lack of space, and
   * remembers it for `writable`. SQLite reports ENOSPC as SQLITE_FULL; its SQLITE_IOERR_*
   * codes cover every I/O failure, so one counts only when the file's filesystem is in fact
   * below the floor. PostgreSQL reports ENOSPC on a data or temporary file as SQLSTATE 53100
   * `disk_full` (its `errcode_for_file_access`); the statement failed and its transaction
   * rolled back, so nothing was half-stored. (Running out of WAL space stops the PostgreSQL
   * server itself: the console then sees an unreachable database, not this.)
   */
  isDiskFull(error: unknown): boolean {
    const e = error as { code?: unknown; errno?: unknown; message?: unknown } | null;
    const code = typeof e?.code === "string" ? e.code : "";
    let full: boolean;
    if (this.dialect === "sqlite")
      full = code === "SQLITE_FULL" || (code.startsWith("SQLITE_IOERR") && this.#freeBytes() < FREE_FLOOR_BYTES);
    else full = code === "53100" || e?.errno === "53100";
    if (full) this.#diskFullAt = Date.now();
    return full;
  }

  /** #freeBytes is the room left for this process on the SQLite file's filesystem (root may use the reserved blocks). */
  #freeBytes(): number {
    if (!this.#directory) return Number.POSITIVE_INFINITY;
    try {
      const stats = statfsSync(this.#directory);
      const blocks = process.getuid?.() === 0 ? stats.bfree : stats.bavail;
      return Number(blocks) * Number(stats.bsize);
    } catch {
      return Number.POSITIVE_INFINITY;
    }
  }

  /**
   * writable answers whether a write would be stored now (GET /api/ready's
   * `database_writable`). It costs nothing while no write has failed for lack of space —
   * on SQLite, one statfs of the file's filesystem, false below FREE_FLOOR_BYTES before any
   * write fails. After such a failure it probes, until a probe succeeds: on SQLite the free
   * space must be back above the floor and a committed write must succeed; on PostgreSQL a
   * rolled-back transaction creates a table and inserts a row, which makes the server
   * allocate a new file and extend it by a block in the default tablespace — a rolled-back
   * insert into an existing table can land in a page with room and prove nothing.
   */
  async writable(): Promise<boolean> {
    if (this.dialect === "sqlite" && this.#freeBytes() < FREE_FLOOR_BYTES) return false;
    if (this.#diskFullAt === null) return true;
    try {
      if (this.dialect === "sqlite") {
        await this.#client.begin("IMMEDIATE", async (tx) => {
          await tx`INSERT INTO write_probe (id, at) VALUES (1, ${Date.now()}) ON CONFLICT (id) DO UPDATE SET at = excluded.at`;
        });
      } else {
        await this.#client.begin(async (tx) => {
          await tx`CREATE TABLE write_probe_scratch (pad TEXT)`;
          await tx`INSERT INTO write_probe_scratch (pad) VALUES ('x')`;
          throw new ProbeDone();
        });
      }
    } catch (error) {
      if (!(error instanceof ProbeDone)) return false;
    }
    this.#diskFullAt = null;
    return true;
  }

  /**
   * migrate applies the append-only migrations not yet applied, each in its own transaction
   * with its id recorded. On PostgreSQL an advisory lock serializes replicas starting together.
   */
  async migrate(): Promise<string[]> {
    const table = "CREATE TABLE IF NOT EXISTS schema_migrations (id TEXT PRIMARY KEY, applied_at BIGINT NOT NULL)";
    if (this.dialect === "postgres") {
      // One transaction holds the advisory lock and applies everything: PostgreSQL's DDL is transactional.
      return (await this.#client.begin(async (tx) => {
        await tx`SELECT pg_advisory_xact_lock(732190481)`;
        await tx.unsafe(table);
        return this.#apply(tx, false);
      })) as string[];
    }
    await this.#client.unsafe(table);
    return this.#apply(this.#client, true);
  }

  async #apply(client: SQL, ownTransactions: boolean): Promise<string[]> {
    const done = new Set((await client`SELECT id FROM schema_migrations`).map((row: { id: string }) => row.id));
    const applied: string[] = [];
    for (const migration of MIGRATIONS) {
      if (done.has(migration.id)) continue;
      const apply = async (tx: SQL) => {
        for (const statement of migration.statements(this.dialect)) await tx.unsafe(statement);
        await tx`INSERT INTO schema_migrations (id, applied_at) VALUES (${migration.id}, ${Date.now()})`;
      };
      if (ownTransactions) await client.begin(apply as never);
      else await apply(client);
      applied.push(migration.id);
    }
    return applied;
  }

  async close(): Promise<void> {
    this.#reader?.close();
    this.#reader = undefined;
    await this.#client.close();
  }
}

/**
 * FREE_FLOOR_BYTES is the free space below which a SQLite database counts as unwritable:
 * a commit appends to the WAL and a checkpoint may grow the file by as much again.
 */
export const FREE_FLOOR_BYTES = 1024 * 1024;

/** ProbeDone rolls the PostgreSQL write probe back once its insert has succeeded. */
class ProbeDone extends Error {}

/** num reads a BIGINT or INTEGER column: PostgreSQL returns int8 as a string, SQLite as a number. */
export function num(value: unknown): number {
  return typeof value === "number" ? value : Number(value);
}

/** optionalNum reads a nullable BIGINT column. */
export function optionalNum(value: unknown): number | null {
  return value === null || value === undefined ? null : num(value);
}

/** isUniqueViolation tells a unique-constraint failure from other errors on both dialects. */
export function isUniqueViolation(error: unknown): boolean {
  const e = error as { code?: string; errno?: string | number; message?: string };
  return e?.code === "23505" || e?.errno === "23505" || /UNIQUE constraint failed|duplicate key value/i.test(e?.message ?? "");
}
