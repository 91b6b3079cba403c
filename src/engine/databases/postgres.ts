import { randomBytes } from "node:crypto";
import { chownSync, existsSync, mkdirSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { SQL } from "bun";
import { randomId } from "../../lib/crypto";
import { AppError } from "../../lib/errors";
import { InputError } from "../../lib/validation";
import { feedFile } from "./feed";
import { sniffFormat } from "./formats";
import {
  assertTools,
  asUser,
  FileProgress,
  findTools,
  firstUnreachable,
  lastLines,
  lookupUser,
  type RunAs,
  runTool,
  type ToolSpec,
} from "./tools";
import type {
  ConnectionDetails,
  DatabaseEngine,
  DatabaseInstance,
  DumpFormat,
  DumpSample,
  ReadyResult,
  RestoreJob,
  RestoreOutcome,
  ToolContext,
  ToolReport,
} from "./types";

const SERVER_TOOLS: ToolSpec[] = [
  { tool: "initdb", debianPackage: "postgresql" },
  { tool: "postgres", debianPackage: "postgresql" },
  { tool: "pg_ctl", debianPackage: "postgresql" },
];
const CLIENT_TOOLS: ToolSpec[] = [
  { tool: "psql", debianPackage: "postgresql-client" },
  { tool: "pg_restore", debianPackage: "postgresql-client" },
];

/** IDENTIFIER is what the engine accepts as a user or database name: plain identifiers, which need no quoting in URLs either. */
const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;

/** quoteIdent quotes an SQL identifier. */
function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

/** PROGRESS_INTERVAL_MS is how often a restore's read position is sampled. */
const PROGRESS_INTERVAL_MS = 250;
/** TOOL_LOG_LINES caps how many lines of a restore tool's output go to the service's log. */
const TOOL_LOG_LINES = 50;

/** pgBinDirs are the directories the server's programs are looked for in before PATH: PG_BIN, then Debian's versioned dirs, newest first. */
function pgBinDirs(env: Record<string, string>): string[] {
  const dirs: string[] = [];
  if (env.PG_BIN) dirs.push(env.PG_BIN);
  try {
    const versions = readdirSync("/usr/lib/postgresql")
      .filter((name) => /^\d+$/.test(name))
      .sort((a, b) => Number(b) - Number(a));
    for (const version of versions) dirs.push(`/usr/lib/postgresql/${version}/bin`);
  } catch {
    // not Debian's layout
  }
  return dirs;
}

interface Settings {
  user: string;
  password: string;
  database: string;
}

function settingsOf(instance: DatabaseInstance): Settings {
  const user = instance.credentials.POSTGRES_USER ?? "postgres";
  return {
    user,
    password: instance.credentials.POSTGRES_PASSWORD ?? "",
    database: instance.credentials.POSTGRES_DB ?? user,
  };
}

function pgdata(instance: DatabaseInstance): string {
  return join(instance.dataDir, "pgdata");
}

/**
 * PostgresEngine runs a PostgreSQL cluster per database service: initdb into
 * `<data dir>/pgdata` with scram-sha-256 and a generated superuser password, `postgres` in the
 * foreground on 127.0.0.1 (no Unix socket), `pg_ctl stop -m fast` to stop, and restores into
 * a staging database swapped in by rename only when the restore succeeded.
 *
 * PostgreSQL refuses to run as root: an engine running as root runs the server programs as
 * the `postgres` system user (which Debian's postgresql package creates) through setpriv.
 */
export class PostgresEngine implements DatabaseEngine {
  readonly name = "postgres" as const;
  readonly label = "PostgreSQL";
  readonly hasServer = true;
  readonly serverUser = "postgres";
  readonly bindsThroughFiles = false;

  detectTools(env: Record<string, string>): ToolReport {
    return findTools([...SERVER_TOOLS, ...CLIENT_TOOLS], env, pgBinDirs(env));
  }

  private tools(env: Record<string, string>): Record<string, string> {
    return assertTools(this.label, this.detectTools(env));
  }

  /** runAs is the user the server's programs run as: null (the engine's own user) unless the engine is root. */
  private runAs(): RunAs | null {
    if (process.getuid?.() !== 0) return null;
    const user = lookupUser(this.serverUser);
    if (!user) {
      throw new AppError(
        "database_tools_missing",
        "PostgreSQL refuses to run as root and this host has no postgres user for the engine to run it as: install the Debian package postgresql (which creates it) or run the engine as an unprivileged user",
      );
    }
    return user;
  }

  credentials(_serviceName: string, given: Record<string, string>) {
    const user = given.POSTGRES_USER ?? "postgres";
    const database = given.POSTGRES_DB ?? user;
    const problems = [
      ["POSTGRES_USER", user],
      ["POSTGRES_DB", database],
    ]
      .filter(([, value]) => !IDENTIFIER.test(value as string))
      .map(([key, value]) => ({
        loc: ["body", "env", key as string],
        msg: `${key} must be a plain identifier (letters, digits and _, at most 63, not starting with a digit)`,
        type: "value_error",
        input: value,
      }));
    if (problems.length > 0) throw new InputError(problems);
    // 24 random bytes, URL-safe: no character that needs escaping in DATABASE_URL.
    const password = given.POSTGRES_PASSWORD ?? randomBytes(24).toString("base64url");
    return { secrets: { POSTGRES_PASSWORD: password }, env: { POSTGRES_USER: user, POSTGRES_DB: database } };
  }

  connection(instance: DatabaseInstance): ConnectionDetails {
    const { user, password, database } = settingsOf(instance);
    const enc = encodeURIComponent;
    const url = `postgresql://${enc(user)}:${enc(password)}@${instance.host}:${instance.port ?? ""}/${enc(database)}`;
    return { url, host: instance.host, port: instance.port, database, user, path: null, password };
  }

  bindings(instance: DatabaseInstance, prefix: string): Record<string, string> {
    const { user, password, database } = settingsOf(instance);
    const port = String(instance.port ?? "");
    const { url } = this.connection(instance);
    return {
      DATABASE_URL: url,
      [`${prefix}_URL`]: url,
      [`${prefix}_USER`]: user,
      [`${prefix}_PASSWORD`]: password,
      [`${prefix}_DATABASE`]: database,
      PGHOST: instance.host,
      PGPORT: port,
      PGUSER: user,
      PGPASSWORD: password,
      PGDATABASE: database,
    };
  }

  async initialize(instance: DatabaseInstance, context: ToolContext): Promise<void> {
    const tools = this.tools(instance.env);
    const runAs = this.runAs();
    const dir = pgdata(instance);
    mkdirSync(instance.dataDir, { recursive: true, mode: 0o750 });
    if (runAs) {
      chownSync(instance.dataDir, runAs.uid, runAs.gid);
      const blocked = firstUnreachable(dir, runAs);
      if (blocked) {
        throw new Error(
          `PostgreSQL refuses to run as root, so the engine runs it as the user ${runAs.user}, who may not enter ${blocked}: choose a data dir ${runAs.user} can reach (the default as root, /var/lib/engine, is one), run the engine as an unprivileged user, or let ${runAs.user} search ${blocked} (e.g. chgrp ${runAs.user} ${blocked} && chmod g+x ${blocked})`,
        );
      }
    }
    if (existsSync(join(dir, "PG_VERSION"))) return;
    const { user, password } = settingsOf(instance);
    rmSync(dir, { recursive: true, force: true });
    mkdirSync(dir, { mode: 0o700 });
    const passwordFile = join(instance.dataDir, `.initdb-${randomId("pw").slice(3, 15)}`);
    writeFileSync(passwordFile, `${password}\n`, { mode: 0o600 });
    if (runAs) {
      chownSync(dir, runAs.uid, runAs.gid);
      chownSync(passwordFile, runAs.uid, runAs.gid);
    }
    context.log(`initializing a PostgreSQL cluster in ${dir}`);
    try {
      const run = await runTool(
        asUser(runAs, [
          tools.initdb as string,
          "-D",
          dir,
          "-U",
          user,
          `--pwfile=${passwordFile}`,
          "--auth=scram-sha-256",
          "-E",
          "UTF8",
          "--locale=C.UTF-8",
        ]),
        { env: instance.env, cwd: instance.dataDir, signal: context.signal, onLine: context.log },
      );
      if (run.exitCode !== 0) {
        rmSync(dir, { recursive: true, force: true });
        throw new Error(`initdb failed (exit ${run.exitCode ?? run.signal}): ${lastLines(run.output)}`);
      }
    } finally {
      rmSync(passwordFile, { force: true });
    }
  }

  startCommand(instance: DatabaseInstance): string[] {
    const tools = this.tools(instance.env);
    return asUser(this.runAs(), [
      tools.postgres as string,
      "-D",
      pgdata(instance),
      "-h",
      instance.host,
      "-p",
      String(instance.port),
      // No Unix socket: its path would have to fit in 107 bytes, and clients use TCP.
      "-k",
      "",
    ]);
  }

  private connect(instance: DatabaseInstance, database: string): SQL {
    const { user, password } = settingsOf(instance);
    return new SQL({
      hostname: instance.host,
      port: instance.port ?? 5432,
      username: user,
      password,
      database,
      max: 1,
      connectionTimeout: 5,
      idleTimeout: 5,
    });
  }

  async ready(instance: DatabaseInstance): Promise<ReadyResult> {
    const client = this.connect(instance, "postgres");
    try {
      await client`SELECT 1`;
      return { ready: true, detail: "accepts connections" };
    } catch (error) {
      const message = (error as Error).message;
      if (/password authentication failed/.test(message)) {
        return {
          ready: false,
          detail: `refuses the service's credentials (${message}): the data dir was initialized with another password; deploy with that POSTGRES_PASSWORD, or remove ${pgdata(instance)} to start empty`,
        };
      }
      return { ready: false, detail: message };
    } finally {
      await client.close().catch(() => undefined);
    }
  }

  async afterReady(instance: DatabaseInstance, context: ToolContext): Promise<void> {
    const { user, database } = settingsOf(instance);
    const client = this.connect(instance, "postgres");
    try {
      // A restore cut short by a stop or a crash leaves its staging database: no restore runs while the server starts.
      const stale =
        await client`SELECT datname FROM pg_database WHERE datname LIKE ${"engine\\_restore\\_%"} OR datname LIKE ${"engine\\_replaced\\_%"}`;
      for (const row of stale as { datname: string }[]) {
        await client.unsafe(`DROP DATABASE IF EXISTS ${quoteIdent(row.datname)} WITH (FORCE)`);
        context.log(`dropped ${row.datname}, left by an interrupted restore`);
      }
      void this.prepareSpare(instance);
      if (database === "postgres") return;
      const rows = await client`SELECT 1 FROM pg_database WHERE datname = ${database}`;
      if (rows.length === 0) {
        await client.unsafe(`CREATE DATABASE ${quoteIdent(database)} OWNER ${quoteIdent(user)}`);
        context.log(`created the database ${database}`);
      }
    } finally {
      await client.close().catch(() => undefined);
    }
  }

  stopCommand(instance: DatabaseInstance): string[] | null {
    const tools = this.tools(instance.env);
    // -W: pg_ctl sends the fast-shutdown signal and returns; the manager waits for the server to exit.
    return asUser(this.runAs(), [tools.pg_ctl as string, "stop", "-D", pgdata(instance), "-m", "fast", "-W"]);
  }

  sniff(sample: DumpSample): DumpFormat | null {
    return sniffFormat("postgres", sample);
  }

  async restore(job: RestoreJob): Promise<RestoreOutcome> {
    const { instance, sample, format } = job;
    const tools = this.tools(instance.env);
    if (format.format === "postgres-sql" || format.format === "sql") assertRestorablePlain(sample);
    const { user, password, database } = settingsOf(instance);
    // The swap renames the target: the connection doing it must be to another database.
    const admin = this.connect(instance, database === "postgres" ? "template1" : "postgres");
    const staging = `engine_restore_${randomId("r")
      .slice(2, 14)
      .toLowerCase()
      .replace(/[^a-z0-9]/g, "x")}`;
    let created = false;
    try {
      await claimStaging(admin, staging, user);
      created = true;
      job.log(`restoring ${format.description} into a staging database, ${staging}`);
      if (job.signal.aborted) throw job.signal.reason;
      const env = {
        ...instance.env,
        PGHOST: instance.host,
        PGPORT: String(instance.port),
        PGUSER: user,
        PGPASSWORD: password,
        PGDATABASE: staging,
        PGAPPNAME: "engine-restore",
        PGCONNECT_TIMEOUT: "10",
      };
      const archive = format.format !== "postgres-sql" && format.format !== "sql";
      // psql runs a plain dump's meta-commands (`\!` runs a shell), so it runs as the server's
      // own OS user and reads the dump from the engine through stdin: then a dump can do no more
      // than its SQL already can as the database superuser (COPY ... PROGRAM runs as that user
      // too), and never anything as the engine's user. pg_restore has no meta-commands.
      const fromStdin = sample.gzip || !archive;
      const source = fromStdin ? "-" : sample.path;
      const argv = archive
        ? [
            tools.pg_restore as string,
            "--no-owner",
            "--no-privileges",
            "--exit-on-error",
            "--dbname",
            staging,
            ...(sample.gzip ? [] : [source]),
          ]
        : asUser(this.runAs(), [tools.psql as string, "-X", "-q", "-o", "/dev/null", "-v", "ON_ERROR_STOP=1", "-f", source]);
      let logged = 0;
      const progress = new FileProgress(sample.path, sample.totalBytes);
      let timer: ReturnType<typeof setInterval> | null = null;
      const run = await runTool(argv, {
        env,
        signal: job.signal,
        stdin: fromStdin ? "pipe" : "ignore",
        onLine: (line) => {
          if (logged++ < TOOL_LOG_LINES) job.log(`${archive ? "pg_restore" : "psql"}: ${line}`);
        },
        onSpawn: async (proc) => {
          if (fromStdin) {
            await feedFile(sample.path, proc.stdin as never, {
              gzip: sample.gzip,
              signal: job.signal,
              onRead: (bytes) => job.progress({ bytesRead: bytes, totalBytes: sample.totalBytes }),
            });
          } else {
            timer = setInterval(() => job.progress(progress.sample([proc.pid])), PROGRESS_INTERVAL_MS);
          }
        },
      }).finally(() => {
        if (timer) clearInterval(timer);
      });
      if (run.exitCode !== 0) {
        throw new Error(`${archive ? "pg_restore" : "psql"} failed (exit ${run.exitCode ?? run.signal}): ${lastLines(run.output)}`);
      }
      job.progress({ bytesRead: sample.totalBytes, totalBytes: sample.totalBytes });
      if (job.signal.aborted) throw job.signal.reason;
      // The commit point: from here the swap runs to its end whatever the timeout says.
      await swapIn(admin, database, staging);
      created = false;
      job.log(`swapped the restored database in as ${database}`);
      return { bytes: sample.totalBytes, detail: `restored into the staging database ${staging}, renamed to ${database} on success` };
    } finally {
      if (created) {
        const dropped = await admin
          .unsafe(`DROP DATABASE IF EXISTS ${quoteIdent(staging)} WITH (FORCE)`)
          .then(() => true)
          .catch(() => false);
        job.log(
          dropped
            ? `dropped the staging database ${staging}; ${database} is unchanged`
            : `${database} is unchanged; the staging database ${staging} could not be dropped now and is dropped when the server next starts`,
        );
      }
      await admin.close().catch(() => undefined);
      // The next restore's staging database is made now, while nothing waits for it.
      void this.prepareSpare(instance).then((made) => {
        if (made) job.log(`prepared ${SPARE_DATABASE} for the next restore`);
      });
    }
  }

  /**
   * prepareSpare creates the spare staging database if it is missing: an empty database,
   * closed to connections, that the next restore renames into its staging database. Creating
   * one costs a fixed ~0.2–0.3 s (template0's 7.5 MB copied through the WAL), which a restore
   * would otherwise pay before it reads a byte. Failures are only logged by the caller.
   */
  private async prepareSpare(instance: DatabaseInstance): Promise<boolean> {
    const { user } = settingsOf(instance);
    const client = this.connect(instance, "template1");
    try {
      if ((await client`SELECT 1 FROM pg_database WHERE datname = ${SPARE_DATABASE}`).length > 0) return false;
      await client.unsafe(
        `CREATE DATABASE ${quoteIdent(SPARE_DATABASE)} OWNER ${quoteIdent(user)} TEMPLATE template0 ENCODING 'UTF8' ALLOW_CONNECTIONS false`,
      );
      return true;
    } catch {
      return false; // the server stopped, or another call made it first
    } finally {
      await client.close().catch(() => undefined);
    }
  }
}

/** SPARE_DATABASE is the empty database kept ready to be the next restore's staging database. */
export const SPARE_DATABASE = "engine_spare";

/**
 * claimStaging makes the restore's staging database: the spare renamed (and opened to
 * connections) when there is one, else a new empty database. Nobody can have connected to the
 * spare, so it is as empty as a new one.
 */
async function claimStaging(admin: SQL, staging: string, user: string): Promise<void> {
  try {
    await admin.unsafe(`ALTER DATABASE ${quoteIdent(SPARE_DATABASE)} RENAME TO ${quoteIdent(staging)}`);
    await admin.unsafe(`ALTER DATABASE ${quoteIdent(staging)} OWNER TO ${quoteIdent(user)}`);
    await admin.unsafe(`ALTER DATABASE ${quoteIdent(staging)} WITH ALLOW_CONNECTIONS true`);
  } catch {
    await admin.unsafe(`CREATE DATABASE ${quoteIdent(staging)} OWNER ${quoteIdent(user)} TEMPLATE template0 ENCODING 'UTF8'`);
  }
}

/**
 * assertRestorablePlain refuses plain dumps that would leave the staging database: those made
 * with --create (they CREATE and \connect to their own database) and pg_dumpall's cluster dumps.
 */
function assertRestorablePlain(sample: DumpSample): void {
  const text = new TextDecoder().decode(sample.head);
  const why = /PostgreSQL database cluster dump/.test(text)
    ? "it is a pg_dumpall cluster dump"
    : /^CREATE DATABASE /m.test(text) || /^\\connect /m.test(text)
      ? "it was made with --create (it creates and connects to its own database)"
      : null;
  if (why) {
    throw new InputError([
      {
        loc: ["body", "dump"],
        msg: `the dump cannot be restored into one database: ${why}; dump one database without --create (pg_dump -Fc or plain)`,
        type: "dump_unsupported",
        input: sample.name,
      },
    ]);
  }
}

/**
 * swapIn replaces `target` with `staging`: it closes `target` to new connections, ends the
 * ones it has, renames both in one transaction, and drops the old one. A client that
 * reconnects between the termination and the rename is ended again (a few tries).
 */
async function swapIn(admin: SQL, target: string, staging: string): Promise<void> {
  const exists = (await admin`SELECT 1 FROM pg_database WHERE datname = ${target}`).length > 0;
  if (!exists) {
    await admin.unsafe(`ALTER DATABASE ${quoteIdent(staging)} RENAME TO ${quoteIdent(target)}`);
    return;
  }
  const old = `engine_replaced_${randomId("r")
    .slice(2, 14)
    .toLowerCase()
    .replace(/[^a-z0-9]/g, "x")}`;
  await admin.unsafe(`ALTER DATABASE ${quoteIdent(target)} WITH ALLOW_CONNECTIONS false`);
  let lastError: unknown = null;
  for (let attempt = 0; attempt < 50; attempt++) {
    await admin`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = ${target} AND pid <> pg_backend_pid()`;
    try {
      await admin.begin(async (tx) => {
        await tx.unsafe(`ALTER DATABASE ${quoteIdent(target)} RENAME TO ${quoteIdent(old)}`);
        await tx.unsafe(`ALTER DATABASE ${quoteIdent(staging)} RENAME TO ${quoteIdent(target)}`);
      });
      lastError = null;
      break;
    } catch (error) {
      lastError = error;
      if (!/being accessed by other users/.test((error as Error).message)) break;
      await Bun.sleep(100);
    }
  }
  if (lastError) {
    await admin.unsafe(`ALTER DATABASE ${quoteIdent(target)} WITH ALLOW_CONNECTIONS true`).catch(() => undefined);
    throw lastError;
  }
  // The swap is done; an old copy that will not drop is only disk space (named engine_replaced_*).
  await admin.unsafe(`DROP DATABASE ${quoteIdent(old)} WITH (FORCE)`).catch(() => undefined);
}
