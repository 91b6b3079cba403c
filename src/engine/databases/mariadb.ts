import { createHash, randomBytes } from "node:crypto";
import { chownSync, closeSync, existsSync, mkdirSync, openSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { userInfo } from "node:os";
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

const TOOLS: ToolSpec[] = [
  { tool: "mariadbd", debianPackage: "mariadb-server" },
  { tool: "mariadb-install-db", debianPackage: "mariadb-server" },
  { tool: "mariadb", debianPackage: "mariadb-client" },
  { tool: "mariadb-admin", debianPackage: "mariadb-client" },
];

/** SBIN_DIRS are searched after PATH: Debian installs mariadbd in /usr/sbin, which an unprivileged PATH lacks. */
const SBIN_DIRS = ["/usr/local/sbin", "/usr/sbin"];

/** DATABASE_NAME is what the engine accepts as the application database's name: no quoting needed in URLs or SQL. */
const DATABASE_NAME = /^[A-Za-z0-9_]{1,64}$/;
/** SYSTEM_DATABASES are the server's own schemas, never an application database. */
const SYSTEM_DATABASES = new Set(["mysql", "information_schema", "performance_schema", "sys"]);
/** STAGING_PREFIX and REPLACED_PREFIX name the databases a restore makes; afterReady drops any left over. */
const STAGING_PREFIX = "engine_restore_";
const REPLACED_PREFIX = "engine_replaced_";

/** SOCKET_PATH_MAX is the longest Unix socket path Linux accepts (sun_path is 108 bytes with its NUL). */
const SOCKET_PATH_MAX = 107;
const PROGRESS_INTERVAL_MS = 250;
const TOOL_LOG_LINES = 50;

/** quoteIdent quotes a MariaDB identifier. */
function quoteIdent(name: string): string {
  return `\`${name.replaceAll("`", "``")}\``;
}

/** quoteString quotes a MariaDB string literal (NO_BACKSLASH_ESCAPES or not). */
function quoteString(value: string): string {
  return `'${value.replaceAll("\\", "\\\\").replaceAll("'", "''")}'`;
}

/** nativePasswordHash is mysql_native_password's stored form of a password: '*' and SHA1(SHA1(password)) in hex. */
export function nativePasswordHash(password: string): string {
  const stage1 = createHash("sha1").update(password, "utf8").digest();
  return `*${createHash("sha1").update(stage1).digest("hex").toUpperCase()}`;
}

/** stagingName is a new name for a restore's databases and user: the prefix and 12 lowercase letters and digits. */
function stagingName(prefix: string): string {
  return `${prefix}${randomId("r")
    .slice(2, 14)
    .toLowerCase()
    .replace(/[^a-z0-9]/g, "x")}`;
}

interface Settings {
  password: string;
  database: string;
}

function settingsOf(instance: DatabaseInstance): Settings {
  return {
    password: instance.credentials.MARIADB_ROOT_PASSWORD ?? "",
    database: instance.credentials.MARIADB_DATABASE ?? defaultDatabase(instance.serviceName),
  };
}

/** defaultDatabase names the application database after the service: `my-db` → `my_db`. */
function defaultDatabase(serviceName: string): string {
  const name = serviceName.replace(/[^A-Za-z0-9_]/g, "_").slice(0, 64);
  return name || "app";
}

/** datadir is the server's data directory inside the service's data dir. */
function datadir(instance: DatabaseInstance): string {
  return join(instance.dataDir, "mariadb");
}

/** runDir holds the server's socket, pid file, init file and the only directory it may read or write files in. */
function runDir(instance: DatabaseInstance): string {
  return join(instance.dataDir, "run");
}

/**
 * socketPath is the server's Unix socket: in the run dir, or, when that path is longer than
 * Linux allows, in a directory under /tmp named by a digest of the data dir.
 */
export function mariadbSocket(instance: DatabaseInstance): string {
  const inRunDir = join(runDir(instance), "mariadbd.sock");
  if (Buffer.byteLength(inRunDir) <= SOCKET_PATH_MAX) return inRunDir;
  const digest = createHash("sha256").update(instance.dataDir).digest("hex").slice(0, 16);
  return join("/tmp", `engine-mariadb-${digest}`, "mariadbd.sock");
}

/**
 * osUserName is the name of the OS user this process runs as, from /etc/passwd (os.userInfo
 * under Bun answers "unknown" when USER is unset, as it is under a service manager).
 */
export function osUserName(): string {
  const uid = process.getuid?.() ?? -1;
  try {
    for (const line of readFileSync("/etc/passwd", "utf8").split("\n")) {
      const [name, , id] = line.split(":");
      if (name && Number(id) === uid) return name;
    }
  } catch {
    // no passwd file
  }
  return userInfo().username;
}

/** engineUser is the OS user the engine runs as: its MariaDB account of the same name logs in over the socket without a password. */
function engineUser(): string {
  return osUserName();
}

/**
 * MariaDbEngine runs a MariaDB server per database service: mariadb-install-db into
 * `<data dir>/mariadb`, `mariadbd --no-defaults` in the foreground on 127.0.0.1 with its socket
 * in `<data dir>/run`, `mariadb-admin shutdown` to stop, and restores into a staging database
 * whose tables one RENAME TABLE statement swaps into the application database.
 *
 * Credentials: root has the service's generated password (MARIADB_ROOT_PASSWORD) over TCP
 * and the socket; the engine's own OS user logs in over the socket through unix_socket, so
 * the stop command and restores need no password on a command line or in a file. The init
 * file applied at every start holds only the password's mysql_native_password hash.
 *
 * MariaDB refuses to run as root: an engine running as root runs the server programs as the
 * `mysql` system user (which Debian's mariadb-server package creates) through setpriv.
 */
export class MariaDbEngine implements DatabaseEngine {
  readonly name = "mariadb" as const;
  readonly label = "MariaDB";
  readonly hasServer = true;
  readonly serverUser = "mysql";
  readonly bindsThroughFiles = false;

  detectTools(env: Record<string, string>): ToolReport {
    const path = [env.PATH ?? "/usr/local/bin:/usr/bin:/bin", ...SBIN_DIRS].join(":");
    return findTools(TOOLS, { ...env, PATH: path });
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
        "MariaDB refuses to run as root and this host has no mysql user for the engine to run it as: install the Debian package mariadb-server (which creates it) or run the engine as an unprivileged user",
      );
    }
    return user;
  }

  credentials(serviceName: string, given: Record<string, string>) {
    const database = given.MARIADB_DATABASE ?? defaultDatabase(serviceName);
    const why = !DATABASE_NAME.test(database)
      ? "must be 1 to 64 letters, digits and _"
      : SYSTEM_DATABASES.has(database.toLowerCase())
        ? "names one of the server's own schemas"
        : database.startsWith(STAGING_PREFIX) || database.startsWith(REPLACED_PREFIX)
          ? `must not start with ${STAGING_PREFIX} or ${REPLACED_PREFIX}, which restores use`
          : null;
    if (why) {
      throw new InputError([
        { loc: ["body", "env", "MARIADB_DATABASE"], msg: `MARIADB_DATABASE ${why}`, type: "value_error", input: database },
      ]);
    }
    // 24 random bytes, URL-safe: no character that needs escaping in DATABASE_URL.
    const password = given.MARIADB_ROOT_PASSWORD ?? randomBytes(24).toString("base64url");
    return { secrets: { MARIADB_ROOT_PASSWORD: password }, env: { MARIADB_DATABASE: database } };
  }

  connection(instance: DatabaseInstance): ConnectionDetails {
    const { password, database } = settingsOf(instance);
    const url = `mysql://root:${encodeURIComponent(password)}@${instance.host}:${instance.port ?? ""}/${database}`;
    return { url, host: instance.host, port: instance.port, database, user: "root", path: null, password };
  }

  bindings(instance: DatabaseInstance, prefix: string): Record<string, string> {
    const { password, database } = settingsOf(instance);
    const port = String(instance.port ?? "");
    const { url } = this.connection(instance);
    // The same keys as the template's unmanaged bindings (src/engine/services/env.ts), plus the
    // database and the variables the mariadb/mysql clients read themselves.
    return {
      DATABASE_URL: url,
      [`${prefix}_URL`]: url,
      [`${prefix}_USER`]: "root",
      [`${prefix}_PASSWORD`]: password,
      [`${prefix}_DATABASE`]: database,
      MYSQL_HOST: instance.host,
      MYSQL_TCP_PORT: port,
      MYSQL_PWD: password,
    };
  }

  async initialize(instance: DatabaseInstance, context: ToolContext): Promise<void> {
    const tools = this.tools(instance.env);
    const runAs = this.runAs();
    const data = datadir(instance);
    const run = runDir(instance);
    const socket = mariadbSocket(instance);
    mkdirSync(instance.dataDir, { recursive: true, mode: 0o750 });
    for (const dir of [run, join(run, "files"), ...(socket.startsWith(run) ? [] : [join(socket, "..")])]) {
      mkdirSync(dir, { recursive: true, mode: 0o750 });
    }
    if (runAs) {
      for (const dir of [instance.dataDir, run, join(run, "files"), join(socket, "..")]) chownSync(dir, runAs.uid, runAs.gid);
      const blocked = firstUnreachable(data, runAs) ?? firstUnreachable(socket, runAs);
      if (blocked) {
        throw new Error(
          `MariaDB refuses to run as root, so the engine runs it as the user ${runAs.user}, who may not enter ${blocked}: choose a data dir ${runAs.user} can reach (the default as root, /var/lib/engine, is one), run the engine as an unprivileged user, or let ${runAs.user} search ${blocked} (e.g. chgrp ${runAs.user} ${blocked} && chmod g+x ${blocked})`,
        );
      }
    }
    if (!existsSync(join(data, "mysql"))) {
      rmSync(data, { recursive: true, force: true });
      mkdirSync(data, { mode: 0o750 });
      if (runAs) chownSync(data, runAs.uid, runAs.gid);
      context.log(`initializing a MariaDB data directory in ${data}`);
      const install = await runTool(
        asUser(runAs, [
          tools["mariadb-install-db"] as string,
          "--no-defaults",
          `--datadir=${data}`,
          "--auth-root-authentication-method=socket",
          `--auth-root-socket-user=${engineUser()}`,
          "--skip-test-db",
        ]),
        { env: instance.env, cwd: instance.dataDir, signal: context.signal },
      );
      if (install.exitCode !== 0) {
        rmSync(data, { recursive: true, force: true });
        throw new Error(`mariadb-install-db failed (exit ${install.exitCode ?? install.signal}): ${lastLines(install.output)}`);
      }
    }
    // Applied at every start, before the server accepts connections: the password of root (a
    // redeploy with another MARIADB_ROOT_PASSWORD takes effect), the engine's socket account and
    // the application database. Only the password's hash is written.
    const file = join(run, "init.sql");
    writeFileSync(file, initSql(instance), { mode: 0o600 });
    if (runAs) chownSync(file, runAs.uid, runAs.gid);
  }

  startCommand(instance: DatabaseInstance): string[] {
    const tools = this.tools(instance.env);
    const run = runDir(instance);
    return asUser(this.runAs(), [
      tools.mariadbd as string,
      "--no-defaults",
      `--datadir=${datadir(instance)}`,
      `--bind-address=${instance.host}`,
      `--port=${instance.port}`,
      `--socket=${mariadbSocket(instance)}`,
      `--pid-file=${join(run, "mariadbd.pid")}`,
      `--init-file=${join(run, "init.sql")}`,
      // Accounts match 127.0.0.1 and localhost (the socket) only, whatever /etc/hosts says.
      "--skip-name-resolve",
      "--character-set-server=utf8mb4",
      "--collation-server=utf8mb4_general_ci",
      // SELECT ... INTO OUTFILE and LOAD DATA INFILE reach one empty directory, never the host.
      `--secure-file-priv=${join(run, "files")}`,
      "--local-infile=0",
      "--max-allowed-packet=1G",
    ]);
  }

  /** connect opens one connection with the service's credentials over TCP, as bound services connect. */
  private connect(instance: DatabaseInstance): SQL {
    const { password } = settingsOf(instance);
    return new SQL({
      adapter: "mysql",
      hostname: instance.host,
      port: instance.port ?? 3306,
      username: "root",
      password,
      max: 1,
      connectionTimeout: 5,
      idleTimeout: 5,
    });
  }

  /** admin opens one connection as the engine's own account over the socket (unix_socket: no password). */
  private admin(instance: DatabaseInstance): SQL {
    return new SQL({ adapter: "mysql", socket: mariadbSocket(instance), username: engineUser(), max: 1, connectionTimeout: 5 });
  }

  async ready(instance: DatabaseInstance): Promise<ReadyResult> {
    const client = this.connect(instance);
    try {
      await client`SELECT 1`;
      return { ready: true, detail: "accepts connections" };
    } catch (error) {
      const message = (error as Error).message;
      if (/Access denied/.test(message)) {
        return { ready: false, detail: `refuses the service's credentials (${message})` };
      }
      return { ready: false, detail: message };
    } finally {
      await client.close().catch(() => undefined);
    }
  }

  async afterReady(instance: DatabaseInstance, context: ToolContext): Promise<void> {
    const admin = this.admin(instance);
    try {
      // A restore cut short by a stop or a crash leaves its staging database and user: no restore runs while the server starts.
      const stale = (await admin`SELECT SCHEMA_NAME AS name FROM information_schema.SCHEMATA
        WHERE SCHEMA_NAME LIKE ${`${STAGING_PREFIX.replaceAll("_", "\\_")}%`} OR SCHEMA_NAME LIKE ${`${REPLACED_PREFIX.replaceAll("_", "\\_")}%`}`) as {
        name: string;
      }[];
      for (const { name } of stale) {
        await admin.unsafe("SET SESSION foreign_key_checks = 0");
        await admin.unsafe(`DROP DATABASE IF EXISTS ${quoteIdent(name)}`);
        context.log(`dropped ${name}, left by an interrupted restore`);
      }
      const users =
        (await admin`SELECT User AS name FROM mysql.global_priv WHERE User LIKE ${`${STAGING_PREFIX.replaceAll("_", "\\_")}%`}`) as {
          name: string;
        }[];
      for (const { name } of users) await admin.unsafe(`DROP USER IF EXISTS ${quoteString(name)}@'localhost'`);
    } finally {
      await admin.close().catch(() => undefined);
    }
  }

  stopCommand(instance: DatabaseInstance): string[] | null {
    const tools = this.tools(instance.env);
    return [tools["mariadb-admin"] as string, "--no-defaults", `--socket=${mariadbSocket(instance)}`, `--user=${engineUser()}`, "shutdown"];
  }

  sniff(sample: DumpSample): DumpFormat | null {
    return sniffFormat("mariadb", sample);
  }

  async restore(job: RestoreJob): Promise<RestoreOutcome> {
    const { instance, sample, format } = job;
    const tools = this.tools(instance.env);
    assertRestorableSql(sample);
    const { database } = settingsOf(instance);
    const admin = this.admin(instance);
    const staging = stagingName(STAGING_PREFIX);
    // The dump runs as a user that may change only the staging database: whatever it says, the target is not touched.
    const loader = { user: staging, password: randomBytes(24).toString("base64url") };
    let created = false;
    try {
      await admin.unsafe(`CREATE DATABASE ${quoteIdent(staging)} CHARACTER SET utf8mb4`);
      created = true;
      await admin.unsafe(`CREATE USER ${quoteString(loader.user)}@'localhost' IDENTIFIED BY ${quoteString(loader.password)}`);
      // In GRANT, _ is a wildcard: escape it so that the grant covers the staging database only.
      await admin.unsafe(
        `GRANT ALL PRIVILEGES ON ${quoteIdent(staging.replaceAll("_", "\\_"))}.* TO ${quoteString(loader.user)}@'localhost'`,
      );
      // SET USER (MariaDB 10.5.2+) lets the dump's views, triggers and routines keep their DEFINER
      // clauses; older servers have no such privilege, and a DEFINER other than the loader then fails.
      await admin.unsafe(`GRANT SET USER ON *.* TO ${quoteString(loader.user)}@'localhost'`).catch((error: Error) => {
        job.log(`this server cannot grant SET USER (${error.message}): DEFINER clauses naming other users will fail`);
      });
      job.log(`restoring ${format.description} into a staging database, ${staging}`);
      if (job.signal.aborted) throw job.signal.reason;
      await loadDump(tools.mariadb as string, instance, staging, loader, job);
      job.progress({ bytesRead: sample.totalBytes, totalBytes: sample.totalBytes });
      if (job.signal.aborted) throw job.signal.reason;
      // The commit point: from here the swap runs to its end whatever the timeout says.
      await dropUser(admin, loader.user);
      const moved = await swapIn(admin, database, staging, job);
      job.log(`swapped the restored objects into ${database}: ${moved}`);
      return {
        bytes: sample.totalBytes,
        detail: `restored into the staging database ${staging}, its tables moved into ${database} by one RENAME TABLE`,
      };
    } finally {
      await dropUser(admin, loader.user).catch(() => undefined);
      if (created) {
        await dropStaging(admin, staging).catch((error: Error) => job.log(`could not drop ${staging}: ${error.message}`));
      }
      await admin.close().catch(() => undefined);
    }
  }
}

/** initSql is the init file's content: root's password (as its hash), the engine's socket account and the application database. */
function initSql(instance: DatabaseInstance): string {
  const { password, database } = settingsOf(instance);
  const hash = quoteString(nativePasswordHash(password));
  const osUser = engineUser();
  const lines = [
    "-- Written by the engine before every start (mariadbd --init-file); edits are overwritten.",
    // root over the socket: the OS user root without a password (unix_socket), anyone else with it.
    `ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING ${hash};`,
    // root over TCP (with --skip-name-resolve, 127.0.0.1 connections match only this account).
    `CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED VIA mysql_native_password USING ${hash};`,
    `ALTER USER 'root'@'127.0.0.1' IDENTIFIED VIA mysql_native_password USING ${hash};`,
    "GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;",
  ];
  if (osUser !== "root") {
    lines.push(
      `CREATE USER IF NOT EXISTS ${quoteString(osUser)}@'localhost' IDENTIFIED VIA unix_socket;`,
      `GRANT ALL PRIVILEGES ON *.* TO ${quoteString(osUser)}@'localhost' WITH GRANT OPTION;`,
    );
  }
  lines.push(`CREATE DATABASE IF NOT EXISTS ${quoteIdent(database)};`, "");
  return lines.join("\n");
}

/**
 * assertRestorableSql refuses dumps that would leave the staging database: those made with
 * --databases or --all-databases (they CREATE and USE their own databases).
 */
function assertRestorableSql(sample: DumpSample): void {
  const text = new TextDecoder().decode(sample.head);
  if (/^CREATE DATABASE /im.test(text) || /^USE [`\w]/im.test(text)) {
    throw new InputError([
      {
        loc: ["body", "dump"],
        msg: "the dump cannot be restored into one database: it creates or switches to its own databases (made with --databases or --all-databases); dump one database (mariadb-dump <database>)",
        type: "dump_unsupported",
        input: sample.name,
      },
    ]);
  }
}

/** loadDump runs the dump through the mariadb client into the staging database, stopping at the first error. */
async function loadDump(
  mariadb: string,
  instance: DatabaseInstance,
  staging: string,
  loader: { user: string; password: string },
  job: RestoreJob,
): Promise<void> {
  const { sample } = job;
  const input = sample.gzip ? null : openSync(sample.path, "r");
  let timer: ReturnType<typeof setInterval> | null = null;
  let logged = 0;
  try {
    const progress = new FileProgress(sample.path, sample.totalBytes);
    const run = await runTool(
      [
        mariadb,
        "--no-defaults",
        `--socket=${mariadbSocket(instance)}`,
        `--user=${loader.user}`,
        `--database=${staging}`,
        // Client commands (\! system, source, ...) in the dump are errors, not run; binary data passes as it is.
        "--binary-mode",
        "--local-infile=0",
        "--max-allowed-packet=1G",
        "--default-character-set=utf8mb4",
        "--batch",
      ],
      {
        // The password goes in the environment, which only the engine's user can read, never in argv.
        env: { ...instance.env, MYSQL_PWD: loader.password },
        signal: job.signal,
        stdin: input ?? "pipe",
        onLine: (line) => {
          if (logged++ < TOOL_LOG_LINES) job.log(`mariadb: ${line}`);
        },
        onSpawn: async (proc) => {
          if (input !== null) {
            timer = setInterval(() => job.progress(progress.sample([proc.pid])), PROGRESS_INTERVAL_MS);
            return;
          }
          await feedFile(sample.path, proc.stdin as never, {
            gzip: true,
            signal: job.signal,
            onRead: (bytes) => job.progress({ bytesRead: bytes, totalBytes: sample.totalBytes }),
          });
        },
      },
    );
    if (run.exitCode !== 0) throw new Error(`mariadb failed (exit ${run.exitCode ?? run.signal}): ${lastLines(run.output)}`);
  } finally {
    if (timer) clearInterval(timer);
    if (input !== null) closeSync(input);
  }
}

async function dropUser(admin: SQL, user: string): Promise<void> {
  await admin.unsafe(`DROP USER IF EXISTS ${quoteString(user)}@'localhost'`);
}

/** dropStaging ends the sessions still working in the staging database (a killed client's query runs on), then drops it. */
async function dropStaging(admin: SQL, staging: string): Promise<void> {
  const sessions = (await admin`SELECT ID AS id FROM information_schema.PROCESSLIST
    WHERE (DB = ${staging} OR USER = ${staging}) AND ID <> CONNECTION_ID()`) as { id: number }[];
  for (const { id } of sessions) await admin.unsafe(`KILL CONNECTION ${Number(id)}`).catch(() => undefined);
  await admin.unsafe("SET SESSION foreign_key_checks = 0");
  await admin.unsafe(`DROP DATABASE IF EXISTS ${quoteIdent(staging)}`);
}

/** SchemaObject is a view, trigger, routine or event, with what it takes to create it again. */
interface SchemaObject {
  kind: "VIEW" | "TRIGGER" | "PROCEDURE" | "FUNCTION" | "EVENT";
  name: string;
  /** create is the CREATE statement; for views, with the schema's qualifier replaced by a placeholder. */
  create: string;
  sqlMode: string;
  timeZone: string | null;
}

/** SchemaContents is what a database holds, as the swap moves it: tables by RENAME TABLE, the rest by their definitions. */
interface SchemaContents {
  tables: string[];
  views: SchemaObject[];
  triggers: SchemaObject[];
  routines: SchemaObject[];
  events: SchemaObject[];
}

/** SCHEMA_PLACEHOLDER stands for the schema's qualifier in a view's definition, which SHOW CREATE VIEW writes out. */
const SCHEMA_PLACEHOLDER = "\u0000schema\u0000";

/** describeSchema reads a database's tables and the definitions of its other objects. */
async function describeSchema(admin: SQL, schema: string): Promise<SchemaContents> {
  const rows = async <T>(query: Promise<unknown>) => (await query) as T[];
  const tables = await rows<{ name: string; type: string }>(
    admin`SELECT TABLE_NAME AS name, TABLE_TYPE AS type FROM information_schema.TABLES WHERE TABLE_SCHEMA = ${schema} ORDER BY TABLE_NAME`,
  );
  const qualifier = `${quoteIdent(schema)}.`;
  const views: SchemaObject[] = [];
  for (const view of tables.filter((table) => table.type === "VIEW")) {
    const [row] = await rows<Record<string, string>>(admin.unsafe(`SHOW CREATE VIEW ${quoteIdent(schema)}.${quoteIdent(view.name)}`));
    const create = String(row?.["Create View"] ?? "").replaceAll(qualifier, SCHEMA_PLACEHOLDER);
    views.push({ kind: "VIEW", name: view.name, create, sqlMode: "", timeZone: null });
  }
  const triggers: SchemaObject[] = [];
  const triggerNames = await rows<{ name: string }>(
    admin`SELECT TRIGGER_NAME AS name FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = ${schema}
      ORDER BY EVENT_OBJECT_TABLE, ACTION_TIMING, EVENT_MANIPULATION, ACTION_ORDER`,
  );
  for (const { name } of triggerNames) {
    const [row] = await rows<Record<string, string>>(admin.unsafe(`SHOW CREATE TRIGGER ${quoteIdent(schema)}.${quoteIdent(name)}`));
    triggers.push({
      kind: "TRIGGER",
      name,
      create: String(row?.["SQL Original Statement"] ?? ""),
      sqlMode: String(row?.sql_mode ?? ""),
      timeZone: null,
    });
  }
  const routines: SchemaObject[] = [];
  const routineNames = await rows<{ name: string; type: string }>(
    admin`SELECT ROUTINE_NAME AS name, ROUTINE_TYPE AS type FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = ${schema} ORDER BY ROUTINE_TYPE, ROUTINE_NAME`,
  );
  for (const { name, type } of routineNames) {
    if (type !== "PROCEDURE" && type !== "FUNCTION") {
      throw new Error(`the database holds a ${type} (${name}), which a restore cannot move between databases`);
    }
    const kind = type as "PROCEDURE" | "FUNCTION";
    const [row] = await rows<Record<string, string>>(admin.unsafe(`SHOW CREATE ${kind} ${quoteIdent(schema)}.${quoteIdent(name)}`));
    const create = row?.[kind === "PROCEDURE" ? "Create Procedure" : "Create Function"];
    if (!create) throw new Error(`cannot read the definition of the ${kind.toLowerCase()} ${name}`);
    routines.push({ kind, name, create: String(create), sqlMode: String(row?.sql_mode ?? ""), timeZone: null });
  }
  const events: SchemaObject[] = [];
  const eventNames = await rows<{ name: string }>(
    admin`SELECT EVENT_NAME AS name FROM information_schema.EVENTS WHERE EVENT_SCHEMA = ${schema} ORDER BY EVENT_NAME`,
  );
  for (const { name } of eventNames) {
    const [row] = await rows<Record<string, string>>(admin.unsafe(`SHOW CREATE EVENT ${quoteIdent(schema)}.${quoteIdent(name)}`));
    events.push({
      kind: "EVENT",
      name,
      create: String(row?.["Create Event"] ?? ""),
      sqlMode: String(row?.sql_mode ?? ""),
      timeZone: row?.time_zone ? String(row.time_zone) : null,
    });
  }
  return { tables: tables.filter((table) => table.type !== "VIEW").map((table) => table.name), views, triggers, routines, events };
}

/** createObjects creates objects in `schema`, in order; views that depend on views not made yet are tried again after the others. */
async function createObjects(admin: SQL, schema: string, objects: SchemaObject[]): Promise<void> {
  await admin.unsafe(`USE ${quoteIdent(schema)}`);
  const [{ mode, zone } = { mode: "", zone: "SYSTEM" }] = (await admin`SELECT @@SESSION.sql_mode AS mode, @@SESSION.time_zone AS zone`) as {
    mode: string;
    zone: string;
  }[];
  let pending = objects;
  try {
    while (pending.length > 0) {
      const failed: { object: SchemaObject; error: Error }[] = [];
      for (const object of pending) {
        try {
          if (object.kind !== "VIEW") await admin.unsafe(`SET SESSION sql_mode = ${quoteString(object.sqlMode)}`);
          if (object.timeZone) await admin.unsafe(`SET SESSION time_zone = ${quoteString(object.timeZone)}`);
          await admin.unsafe(object.create.replaceAll(SCHEMA_PLACEHOLDER, `${quoteIdent(schema)}.`));
        } catch (error) {
          if (object.kind !== "VIEW")
            throw new Error(`creating the ${object.kind.toLowerCase()} ${object.name}: ${(error as Error).message}`);
          failed.push({ object, error: error as Error });
        }
      }
      if (failed.length === pending.length) {
        const first = failed[0] as { object: SchemaObject; error: Error };
        throw new Error(`creating the view ${first.object.name}: ${first.error.message}`);
      }
      pending = failed.map((entry) => entry.object);
    }
  } finally {
    await admin.unsafe(`SET SESSION sql_mode = ${quoteString(mode)}`).catch(() => undefined);
    await admin.unsafe(`SET SESSION time_zone = ${quoteString(zone)}`).catch(() => undefined);
  }
}

/** dropObjects drops objects from `schema`, ignoring those already gone. */
async function dropObjects(admin: SQL, schema: string, objects: SchemaObject[]): Promise<void> {
  for (const object of objects) {
    await admin.unsafe(`DROP ${object.kind} IF EXISTS ${quoteIdent(schema)}.${quoteIdent(object.name)}`);
  }
}

/** renameAll moves tables between databases in one RENAME TABLE statement, which MariaDB applies atomically. */
async function renameAll(admin: SQL, moves: [from: string, to: string, table: string][]): Promise<void> {
  if (moves.length === 0) return;
  const pairs = moves.map(([from, to, table]) => `${quoteIdent(from)}.${quoteIdent(table)} TO ${quoteIdent(to)}.${quoteIdent(table)}`);
  await admin.unsafe(`RENAME TABLE ${pairs.join(", ")}`);
}

/**
 * swapIn replaces the contents of `target` with those of `staging`. Tables move in one RENAME
 * TABLE statement (the target's old tables into a new database, the restored ones into the
 * target), which MariaDB applies atomically: a client sees all the old tables or all the new.
 * Triggers block a move between databases and views cannot move at all, so both are dropped
 * just before the statement and created again just after it, with routines and events: for
 * those few statements a client may see the tables without them. If any step fails, the
 * target gets its old tables and objects back.
 */
async function swapIn(admin: SQL, target: string, staging: string, job: RestoreJob): Promise<string> {
  await admin.unsafe(`CREATE DATABASE IF NOT EXISTS ${quoteIdent(target)}`);
  const incoming = await describeSchema(admin, staging);
  const outgoing = await describeSchema(admin, target);
  const replaced = stagingName(REPLACED_PREFIX);
  await admin.unsafe(`CREATE DATABASE ${quoteIdent(replaced)}`);
  const oldToReplaced = outgoing.tables.map((table): [string, string, string] => [target, replaced, table]);
  const newToTarget = incoming.tables.map((table): [string, string, string] => [staging, target, table]);
  const oldObjects = [...outgoing.views, ...outgoing.triggers, ...outgoing.routines, ...outgoing.events];
  const newObjects = [...incoming.views, ...incoming.triggers, ...incoming.routines, ...incoming.events];
  await dropObjects(admin, staging, incoming.triggers);
  await dropObjects(admin, target, [...outgoing.triggers, ...outgoing.views]);
  try {
    await renameAll(admin, [...oldToReplaced, ...newToTarget]);
  } catch (error) {
    await createObjects(admin, target, [...outgoing.views, ...outgoing.triggers]).catch((again: Error) =>
      job.log(`could not recreate the old views and triggers of ${target}: ${again.message}`),
    );
    throw error;
  }
  try {
    await dropObjects(admin, target, [...outgoing.routines, ...outgoing.events]);
    await createObjects(admin, target, newObjects);
  } catch (error) {
    // Put the old tables and objects back: the restore did not happen.
    job.log(`the swap failed after the tables moved (${(error as Error).message}); moving the old tables back into ${target}`);
    await dropObjects(admin, target, newObjects);
    await renameAll(admin, [
      ...newToTarget.map(([, , table]): [string, string, string] => [target, staging, table]),
      ...oldToReplaced.map(([, , table]): [string, string, string] => [replaced, target, table]),
    ]);
    await createObjects(admin, target, oldObjects);
    await dropStaging(admin, replaced).catch(() => undefined);
    throw error;
  }
  // The old tables are now only disk space in engine_replaced_*, which afterReady drops if this does not.
  await dropStaging(admin, replaced).catch((error: Error) => job.log(`could not drop ${replaced}: ${error.message}`));
  const counts = (name: string, list: unknown[]) => (list.length > 0 ? [`${list.length} ${name}`] : []);
  return (
    [
      ...counts("tables", incoming.tables),
      ...counts("views", incoming.views),
      ...counts("triggers", incoming.triggers),
      ...counts("routines", incoming.routines),
      ...counts("events", incoming.events),
    ].join(", ") || "nothing (the dump was empty)"
  );
}
