import { mkdirSync } from "node:fs";
import { dirname } from "node:path";
import { SQL } from "bun";
import { AppError } from "../../lib/errors";
import { MIGRATIONS } from "./migrations";

export type Dialect = "sqlite" | "postgres";

/** Sql is Bun.SQL's tagged-template client, or one transaction's. */
export type Sql = SQL;

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

  private constructor(
    readonly dialect: Dialect,
    client: SQL,
  ) {
    this.#client = client;
  }

  /** open connects to the URL; a SQLite file's directory is created. Nothing is migrated yet. */
  static async open(url: string, options: { max?: number } = {}): Promise<Database> {
    if (url.startsWith("sqlite:") || url.startsWith("file:")) {
      const filename = url.replace(/^(sqlite|file):(\/\/)?/, "");
      if (filename !== ":memory:") mkdirSync(dirname(filename), { recursive: true });
      const client = new SQL({ adapter: "sqlite", filename, create: true, readwrite: true });
      // WAL lets readers run beside the one writer; a busy writer waits instead of failing.
      await client.unsafe("PRAGMA journal_mode = WAL");
      await client.unsafe("PRAGMA busy_timeout = 5000");
      await client.unsafe("PRAGMA foreign_keys = ON");
      await client.unsafe("PRAGMA synchronous = NORMAL");
      return new Database("sqlite", client);
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
    await this.#client.close();
  }
}

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
