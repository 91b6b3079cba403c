/**
 * The database adapter contract. One DatabaseEngine per engine (postgres, mariadb, redis,
 * sqlite) turns a `database` service into a managed server: the service manager asks the
 * adapter for the tools, the first-start initialization, the start and clean-stop commands,
 * the readiness check, the credentials and bindings; the restore coordinator asks it to
 * recognise and restore dumps. Adapters hold no state of their own: everything they need is
 * in the DatabaseInstance they are handed, and everything they keep is in its data dir.
 */

import type { RunAs } from "./tools";

/** DatabaseEngineName names an engine the engine can manage. */
export type DatabaseEngineName = "postgres" | "mariadb" | "redis" | "sqlite";

/** DATABASE_ENGINE_NAMES lists every engine name, in the order they are documented. */
export const DATABASE_ENGINE_NAMES: readonly DatabaseEngineName[] = ["postgres", "mariadb", "redis", "sqlite"];

/** MissingTool is a program the adapter needs that is not on the host, and the Debian package that provides it. */
export interface MissingTool {
  tool: string;
  /** debianPackage is what `apt-get install` needs, e.g. `postgresql`, `mariadb-client`, `redis-tools`, `sqlite3`. */
  debianPackage: string;
}

/** ToolReport is what detectTools found: the path of each tool by name, and what is missing. */
export interface ToolReport {
  found: Record<string, string>;
  missing: MissingTool[];
}

/**
 * DatabaseInstance is one database service as an adapter sees it. The manager builds it from
 * the service's current spec and its opened secrets; it is never logged, since `credentials`
 * holds passwords.
 */
export interface DatabaseInstance {
  serviceId: string;
  serviceName: string;
  /** dataDir is the service's data dir (SERVICE_DATA_DIR): the adapter keeps its files here and nowhere else. */
  dataDir: string;
  /** host is the address the server listens on and clients use: always loopback. */
  host: string;
  /** port is the TCP port the server listens on; null for engines without a server (SQLite). */
  port: number | null;
  /** credentials are the values credentials() returned at deploy (secrets included), plus any the deploy gave. */
  credentials: Record<string, string>;
  /** env is the environment tools run with: the daemon's PATH, HOME, LANG and the like, never secrets. */
  env: Record<string, string>;
  /**
   * owner is the service's own OS user (`eng-<name>`) when a root engine runs the server as
   * it, as any workload (engines whose serverUser is null: Redis, SQLite). Every file the
   * adapter makes in the data dir is given to it, and the programs that read or write the
   * service's files for it (its stop command, checks of a dump placed there) run as it.
   * For an adapter that binds through files (SQLite) its group is also that of the services
   * bound to it: the files it makes must be the group's too (decision 290).
   * Null or absent: the engine does not switch users, or the adapter runs as its serverUser.
   */
  owner?: RunAs | null;
}

/** ToolContext is handed to adapter steps that run programs: where their output goes, and when to give up. */
export interface ToolContext {
  /** log appends one line to the service's log (stream `engine`); it must never be given a secret. */
  log(line: string): void;
  /** signal is aborted when the step must stop (the service is being stopped or deleted, a restore timed out). */
  signal: AbortSignal;
}

/**
 * ConnectionDetails are how a client reaches a database: the URL bound services get and its
 * parts. `password` (and the URL) carry whatever the instance's credentials hold, so the
 * manager gets a masked form by handing in credentials whose secrets read `****`.
 */
export interface ConnectionDetails {
  /** url is what bound services get as DATABASE_URL (REDIS_URL for Redis). */
  url: string;
  host: string | null;
  port: number | null;
  database: string | null;
  user: string | null;
  /** path is the database file of an engine without a server (SQLite); null otherwise. */
  path: string | null;
  password: string | null;
}

/** ReadyResult is the outcome of one readiness check. */
export interface ReadyResult {
  ready: boolean;
  /** detail says what was seen, for the service's status message and Diagnosis ("accepts connections", "starting up", ...). */
  detail: string;
}

/**
 * DumpSample is what format sniffing sees of a dump: the first bytes (after gunzip when the
 * file is gzip-compressed), or, for a directory, the names of its entries.
 */
export interface DumpSample {
  /** path is the dump on local disk (a URL is downloaded first). */
  path: string;
  /** name is the dump's file name as the user gave it (a URL's last path segment). */
  name: string;
  isDirectory: boolean;
  /** gzip is true when the file is gzip-compressed; head is then the start of the decompressed content. */
  gzip: boolean;
  /** head is up to the first 64 KiB of the content; empty for a directory. */
  head: Uint8Array;
  /** entries are a directory dump's file names; empty for a file. */
  entries: string[];
  /** totalBytes is the size on disk: the file's, or the sum of a directory's files. */
  totalBytes: number;
}

/**
 * DumpFormat is a recognised dump. `certain` matches carry the tool's own marker (a magic
 * number, a "-- PostgreSQL database dump" header); `likely` matches are SQL text without one,
 * which the target engine may try.
 */
export interface DumpFormat {
  engine: DatabaseEngineName;
  /** format is the stable name recorded in last_dump: postgres-custom, postgres-directory, postgres-tar, postgres-sql, mysql-sql, redis-rdb, sqlite-db, sqlite-sql, sql. */
  format: string;
  confidence: "certain" | "likely";
  gzip: boolean;
  /** description says what was recognised, in words ("PostgreSQL custom-format archive (PGDMP, v1.14)"). */
  description: string;
}

/** RestoreProgress is how far a restore has read its dump. totalBytes is null when the size is unknown. */
export interface RestoreProgress {
  bytesRead: number;
  totalBytes: number | null;
}

/** ServerControl lets an adapter stop and start the service's server, for engines that restore by replacing files (Redis RDB). */
export interface ServerControl {
  /** stop stops the server cleanly (the adapter's stop command) and resolves once it has exited. */
  stop(): Promise<void>;
  /** start starts it again and resolves once it accepts connections; it rejects if it does not. */
  start(): Promise<void>;
}

/** RestoreJob is one restore as the coordinator hands it to an adapter. */
export interface RestoreJob extends ToolContext {
  instance: DatabaseInstance;
  sample: DumpSample;
  format: DumpFormat;
  /**
   * signal (from ToolContext) is aborted when timeout_s passes: the adapter must stop its
   * tools at once and leave the database as it was before the restore, then reject.
   */
  progress(progress: RestoreProgress): void;
  server: ServerControl;
}

/** RestoreOutcome is what an adapter reports of a restore that succeeded. */
export interface RestoreOutcome {
  /** bytes is how much of the dump was read. */
  bytes: number;
  /** detail is a short note for last_dump ("restored into a staging database and swapped by rename"). */
  detail: string;
}

/**
 * DatabaseEngine is one engine's adapter. Implementations live in src/engine/databases/<engine>.ts
 * and are listed in registry.ts; test/engine/databases holds the suite each must pass.
 */
export interface DatabaseEngine {
  /** name is the engine's id, as templates' `deploy_defaults.engine` and deploys' `engine` name it. */
  readonly name: DatabaseEngineName;
  /** label is the engine's name in messages ("PostgreSQL"). */
  readonly label: string;
  /** hasServer is false for engines without a server process of their own (SQLite): they get no port. */
  readonly hasServer: boolean;
  /**
   * serverUser is the OS user a root engine's adapter runs its server and tools as by itself
   * (through setpriv), for servers that refuse root: PostgreSQL's `postgres`, MariaDB's
   * `mysql`. null: the engine runs the server as the service's own user, as any workload,
   * and hands that user to the adapter as `instance.owner`.
   */
  readonly serverUser: string | null;
  /**
   * bindsThroughFiles is true where a bound service uses the database's files itself rather
   * than a server (SQLite). A root engine then opens the data dir to the database service's
   * group (2770, the files 0660) and gives each service bound to it that group at its launch.
   */
  readonly bindsThroughFiles: boolean;

  /**
   * detectTools looks for the server, client and restore programs on the host (PATH, then
   * the engine's usual install directories) and names the Debian package of each one missing.
   */
  detectTools(env: Record<string, string>): ToolReport;

  /**
   * credentials returns the credentials of a new database service: values the deploy gave
   * (`given`, from its env and secrets) are kept, missing ones are generated. `secrets` are
   * sealed with the service's secrets and never returned by the API; `env` are plain
   * settings (user and database names). Called at every deploy; a redeploy passes the
   * previous version's values in `given`, so generated passwords stay the same.
   */
  credentials(serviceName: string, given: Record<string, string>): { secrets: Record<string, string>; env: Record<string, string> };

  /**
   * bindings are the variables the database gives to services bound to it, beyond the
   * `<NAME>_HOST`/`<NAME>_PORT` every service gives: `DATABASE_URL`, `<NAME>_URL`, `<NAME>_USER`,
   * `<NAME>_PASSWORD`, `<NAME>_DATABASE` and the client's own conventions (libpq's `PG*`, `REDIS_URL`).
   * `prefix` is the bound service's variable prefix (`my-db` → `MY_DB`).
   */
  bindings(instance: DatabaseInstance, prefix: string): Record<string, string>;

  /** connection says how clients reach the database: the URL of `bindings` and its parts. */
  connection(instance: DatabaseInstance): ConnectionDetails;

  /**
   * initialize prepares the data dir before every start; the first time it creates the
   * database (initdb, mariadb-install-db, a Redis config, an empty SQLite file) with the
   * instance's credentials. It must be idempotent and must not start the server.
   */
  initialize(instance: DatabaseInstance, context: ToolContext): Promise<void>;

  /**
   * startCommand is the argv the supervisor runs (under the shim) as the service's process:
   * the server in the foreground, listening on instance.host:instance.port only.
   */
  startCommand(instance: DatabaseInstance): string[];

  /**
   * ready says whether the server accepts connections, with a real protocol exchange using
   * the instance's credentials (a query, a PING), not only a TCP connect. The service is
   * `running` only once this returns ready.
   */
  ready(instance: DatabaseInstance, signal: AbortSignal): Promise<ReadyResult>;

  /**
   * location says where clients reach a database without a server (SQLite: its file), for the
   * service's log line when it is ready; engines with a server are reached at host:port.
   */
  location?(instance: DatabaseInstance): string;

  /**
   * afterReady runs once the server first accepts connections after a start: it creates the
   * application database or user the credentials name, if missing. Idempotent; optional.
   */
  afterReady?(instance: DatabaseInstance, context: ToolContext): Promise<void>;

  /**
   * stopCommand is the engine's own clean shutdown (`pg_ctl stop -m fast`, `mariadb-admin
   * shutdown`, Redis `SHUTDOWN SAVE`). The manager runs it, waits for the server process to
   * exit, and sends SIGKILL only when the service's stop_timeout_s passes (which Diagnosis
   * reports as a forced kill). null means SIGTERM to the server is itself the clean stop.
   */
  stopCommand(instance: DatabaseInstance): string[] | null;

  /**
   * sniff recognises a dump this engine restores, or returns null. The coordinator asks every
   * engine, so a dump of another engine is named (409 wrong engine) rather than tried.
   */
  sniff(sample: DumpSample): DumpFormat | null;

  /**
   * restore loads a dump into the instance, reporting progress as it reads. On success the
   * database holds the dump's data; on failure or abort (job.signal) it must hold what it held
   * before, or the adapter's documented guarantee says otherwise. It rejects with an Error
   * whose message names the tool's complaint (never a password).
   */
  restore(job: RestoreJob): Promise<RestoreOutcome>;
}
