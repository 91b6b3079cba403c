import { randomBytes } from "node:crypto";
import {
  closeSync,
  constants,
  copyFileSync,
  existsSync,
  linkSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
  renameSync,
  rmSync,
  writeSync,
} from "node:fs";
import { basename, join } from "node:path";
import { RedisClient } from "bun";
import { randomId } from "../../lib/crypto";
import { InputError } from "../../lib/validation";
import { feedFile } from "./feed";
import { sniffFormat } from "./formats";
import {
  assertTools,
  asUser,
  findTools,
  giveTo,
  lastLines,
  mkdirOwned,
  openOwned,
  type RunAs,
  runTool,
  type ToolSpec,
  writeOwned,
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
  { tool: "redis-server", debianPackage: "redis-server" },
  { tool: "redis-cli", debianPackage: "redis-tools" },
  { tool: "redis-check-rdb", debianPackage: "redis-tools" },
  { tool: "sh", debianPackage: "dash" },
];

/** The files the server keeps in the service's data dir (names fixed in redis.conf, so that restores know them). */
const CONFIG_FILE = "redis.conf";
const AUTH_FILE = "redis-cli.auth";
const RDB_FILE = "dump.rdb";
const AOF_DIR = "appendonlydir";
const AOF_NAME = "appendonly.aof";
/** AOF_BASE is the first base file of Redis 7's multi-part AOF; an RDB is a valid base (the RDB preamble). */
const AOF_BASE = `${AOF_NAME}.1.base.rdb`;
const AOF_MANIFEST = `${AOF_NAME}.manifest`;
/** DATA_FILES are what a restore replaces: everything Redis loads data from. */
const DATA_FILES = [RDB_FILE, AOF_DIR];
/** JOURNAL records a restore between moving the old files aside and the new data's verification. */
const JOURNAL = ".restore-journal.json";
/** PREVIOUS_DIR is the name of the directory a restore moves the old data files into (in the data dir). */
const PREVIOUS_DIR = /^\.restore-previous-[a-z0-9]+$/;

/**
 * OWNED_OPTIONS are the settings the engine writes in redis.conf: EXTRA_ARGS may not change
 * them, since bindings, the stop command and restores depend on them.
 */
const OWNED_OPTIONS = new Set([
  "bind",
  "port",
  "dir",
  "requirepass",
  "daemonize",
  "dbfilename",
  "appenddirname",
  "appendfilename",
  "include",
  "aclfile",
  "user",
  "unixsocket",
  "tls-port",
  "enable-protected-configs",
  "enable-debug-command",
  "enable-module-command",
]);

/** READY_TIMEOUT_MS bounds one readiness check: a server loading a small dataset answers nothing until it is done. */
const READY_TIMEOUT_MS = 3000;

function passwordOf(instance: DatabaseInstance): string {
  return instance.credentials.REDIS_PASSWORD ?? "";
}

/** extraArgs splits EXTRA_ARGS (e.g. `--maxmemory 4gb --maxmemory-policy allkeys-lru`) into redis-server arguments. */
function extraArgs(value: string | undefined): string[] {
  return (value ?? "").split(/\s+/).filter(Boolean);
}

/** quoteConfig writes a value as a double-quoted redis.conf string, escaping all but plain characters as \xHH. */
function quoteConfig(value: string): string {
  let out = "";
  for (const byte of Buffer.from(value, "utf8")) {
    const char = String.fromCharCode(byte);
    out += /[A-Za-z0-9_./@:+=-]/.test(char) ? char : `\\x${byte.toString(16).padStart(2, "0")}`;
  }
  return `"${out}"`;
}

/** redisUrl is the URL bound services get: the password as the default user's, database 0. */
function redisUrl(instance: DatabaseInstance): string {
  return `redis://:${encodeURIComponent(passwordOf(instance))}@${instance.host}:${instance.port ?? ""}/0`;
}

/** serverMajorVersion reads `redis-server --version` (`Redis server v=7.0.15 ...`); null when it does not say. */
function serverMajorVersion(redisServer: string, env: Record<string, string>): { major: number; version: string } | null {
  const result = Bun.spawnSync([redisServer, "--version"], { env, stdout: "pipe", stderr: "pipe" });
  const match = /v=(\d+)\.(\d+)\.(\d+)/.exec(result.stdout.toString());
  return match ? { major: Number(match[1]), version: `${match[1]}.${match[2]}.${match[3]}` } : null;
}

/** Journal is what JOURNAL holds: the process that is restoring, where the old files go, and which of them there were. */
interface Journal {
  pid: number;
  previous: string;
  existed: string[];
}

/**
 * RedisEngine runs a Redis server per database service from a redis.conf the engine writes in
 * the data dir before every start: 127.0.0.1 and the service's port only, a generated
 * `requirepass`, the append-only file on (Redis 7's multi-part AOF in `appendonlydir`), and
 * SIGTERM meaning `SHUTDOWN SAVE`. It stops with `redis-cli SHUTDOWN SAVE`.
 *
 * Restores replace the data files while the server is stopped: the RDB is checked whole with
 * redis-check-rdb first (a corrupt or too new file changes nothing); then the server stops
 * cleanly, its files move aside, the RDB becomes both the AOF's base file (with a manifest
 * naming only it) and dump.rdb, and the server starts and must load as many keys as the check
 * counted. With appendonly on, Redis loads the AOF and ignores dump.rdb, which is why the RDB
 * is placed as the AOF base rather than as dump.rdb alone. On failure or timeout the old files
 * come back and the server starts on them.
 */
export class RedisEngine implements DatabaseEngine {
  readonly name = "redis" as const;
  readonly label = "Redis";
  readonly hasServer = true;
  /** serverUser is null: a root engine runs this engine's process as the service's own user (instance.owner). */
  readonly serverUser = null;
  readonly bindsThroughFiles = false;

  detectTools(env: Record<string, string>): ToolReport {
    return findTools(TOOLS, env);
  }

  private tools(env: Record<string, string>): Record<string, string> {
    return assertTools(this.label, this.detectTools(env));
  }

  credentials(_serviceName: string, given: Record<string, string>) {
    const owned = extraArgs(given.EXTRA_ARGS)
      .filter((word) => word.startsWith("--"))
      .map((word) => word.slice(2).toLowerCase())
      .filter((option) => OWNED_OPTIONS.has(option));
    if (owned.length > 0) {
      throw new InputError([
        {
          loc: ["body", "env", "EXTRA_ARGS"],
          msg: `EXTRA_ARGS may not set ${owned.map((option) => `--${option}`).join(", ")}: the engine sets ${owned.length === 1 ? "it" : "them"} for a managed Redis`,
          type: "value_error",
          // Not echoed: the refused options are often `--requirepass <password>` (decision 147).
          input: null,
        },
      ]);
    }
    // 24 random bytes, URL-safe: no character that needs escaping in REDIS_URL.
    const password = given.REDIS_PASSWORD || randomBytes(24).toString("base64url");
    return { secrets: { REDIS_PASSWORD: password }, env: {} };
  }

  connection(instance: DatabaseInstance): ConnectionDetails {
    // Redis has one password, the default user's; the URL names database 0.
    return {
      url: redisUrl(instance),
      host: instance.host,
      port: instance.port,
      database: "0",
      user: null,
      path: null,
      password: passwordOf(instance),
    };
  }

  bindings(instance: DatabaseInstance, prefix: string): Record<string, string> {
    // The keys of the template's unmanaged bindings (src/engine/services/env.ts), now always with a password.
    const url = redisUrl(instance);
    return { REDIS_URL: url, [`${prefix}_URL`]: url, [`${prefix}_PASSWORD`]: passwordOf(instance) };
  }

  async initialize(instance: DatabaseInstance, context: ToolContext): Promise<void> {
    const tools = this.tools(instance.env);
    const version = serverMajorVersion(tools["redis-server"] as string, instance.env);
    if (!version || version.major < 7) {
      throw new Error(
        `the engine manages Redis 7.0 or later (multi-part AOF, shutdown-on-sigterm); this host's redis-server is ${version?.version ?? "of an unknown version"}`,
      );
    }
    mkdirSync(instance.dataDir, { recursive: true, mode: 0o750 });
    const owner = instance.owner ?? null;
    recoverInterruptedRestore(instance.dataDir, context);
    const config = [
      "# Written by the engine before every start; set EXTRA_ARGS on the service instead of editing it.",
      `bind ${instance.host}`,
      `port ${instance.port}`,
      `dir ${quoteConfig(instance.dataDir)}`,
      "daemonize no",
      "protected-mode yes",
      'logfile ""',
      `requirepass ${quoteConfig(passwordOf(instance))}`,
      "appendonly yes",
      `appenddirname ${AOF_DIR}`,
      `appendfilename ${AOF_NAME}`,
      `dbfilename ${RDB_FILE}`,
      // A signal from the supervisor (the fallback when the stop command fails) stops as SHUTDOWN SAVE does.
      "shutdown-on-sigterm save",
      "shutdown-on-sigint save",
      // Whoever holds the password (every service bound to it) may not move where the server
      // writes (CONFIG SET dir / dbfilename / logfile: files written as the server's user),
      // nor run DEBUG or load a module (code in the server). Redis 7's defaults, written out
      // so that a changed default or an included file cannot turn them on; EXTRA_ARGS may not.
      "enable-protected-configs no",
      "enable-debug-command no",
      "enable-module-command no",
      "",
    ].join("\n");
    // The server runs as the service's own user under a root engine (owner): its files are that user's.
    writeOwned(join(instance.dataDir, CONFIG_FILE), config, owner, 0o600);
    // redis-cli reads its password from REDISCLI_AUTH; the stop command sets it from this file, never from argv.
    writeOwned(join(instance.dataDir, AUTH_FILE), passwordOf(instance), owner, 0o600);
  }

  startCommand(instance: DatabaseInstance): string[] {
    const tools = this.tools(instance.env);
    return [tools["redis-server"] as string, join(instance.dataDir, CONFIG_FILE), ...extraArgs(instance.env.EXTRA_ARGS)];
  }

  async ready(instance: DatabaseInstance): Promise<ReadyResult> {
    return withClient(instance, async (client) => {
      const pong = await client.send("PING", []);
      return pong === "PONG" ? { ready: true, detail: "answers PING" } : { ready: false, detail: `PING answered ${String(pong)}` };
    }).catch((error: Error) => {
      const message = error.message;
      if (/^LOADING/.test(message)) return { ready: false, detail: "loading the dataset into memory" };
      if (/WRONGPASS|NOAUTH/.test(message)) return { ready: false, detail: `refuses the service's password (${message})` };
      return { ready: false, detail: message };
    });
  }

  stopCommand(instance: DatabaseInstance): string[] | null {
    const tools = this.tools(instance.env);
    // sh sets REDISCLI_AUTH from the 0600 file and execs redis-cli: the password is on no command line.
    // It runs as the server's user: the file is in that user's dir, and root reads nothing there.
    return asUser(instance.owner ?? null, [
      tools.sh as string,
      "-c",
      'REDISCLI_AUTH=$(cat -- "$0") exec "$@"',
      join(instance.dataDir, AUTH_FILE),
      tools["redis-cli"] as string,
      "-h",
      instance.host,
      "-p",
      String(instance.port),
      "SHUTDOWN",
      "SAVE",
    ]);
  }

  sniff(sample: DumpSample): DumpFormat | null {
    return sniffFormat("redis", sample);
  }

  async restore(job: RestoreJob): Promise<RestoreOutcome> {
    const { instance, sample } = job;
    const tools = this.tools(instance.env);
    const dir = instance.dataDir;
    const owner = instance.owner ?? null;
    const id = randomId("r").slice(2, 14);
    const staging = join(dir, `.restore-${id}.rdb`);
    const previous = join(dir, `.restore-previous-${id}`);
    let stopped = false;
    let journal: Journal | null = null;
    try {
      // 1. A copy in the data dir (decompressed): what is checked is what is placed.
      job.log(`copying the RDB into ${dir}`);
      await copyDump(sample, staging, owner, job);
      const header = rdbHeader(staging);
      if (!header) throw new Error("the file does not start with an RDB header (REDIS and a 4-digit version)");
      // 2. The whole file, checksum included, as this host's Redis reads it: a corrupt or newer file stops here.
      const check = await checkRdb(tools["redis-check-rdb"] as string, staging, owner, job);
      job.log(`redis-check-rdb: RDB version ${header.version}, ${check.keys} keys (${check.expires} with a TTL), checksum OK`);
      if (job.signal.aborted) throw job.signal.reason;
      // 3. Stop cleanly (SHUTDOWN SAVE: the old data is complete on disk), move it aside, place the new file.
      job.log("stopping the server to replace its data files");
      await job.server.stop();
      stopped = true;
      if (job.signal.aborted) throw job.signal.reason;
      journal = { pid: process.pid, previous, existed: DATA_FILES.filter((name) => existsSync(join(dir, name))) };
      mkdirOwned(previous, owner, 0o700);
      writeOwned(join(dir, JOURNAL), JSON.stringify(journal), owner, 0o600);
      for (const name of journal.existed) renameSync(join(dir, name), join(previous, name));
      placeRdb(dir, staging, owner);
      // 4. Start on the new files; the server must hold the keys the check counted (less those that expired meanwhile).
      job.log("starting the server on the restored data");
      await job.server.start();
      const loaded = await countKeys(instance);
      if (loaded > check.keys || loaded < check.keys - check.expires) {
        throw new Error(`the server loaded ${loaded} keys, but the RDB holds ${check.keys}`);
      }
      if (job.signal.aborted) throw job.signal.reason;
      // The commit point: the journal goes first, so that a crash from here on keeps the new data.
      rmSync(join(dir, JOURNAL), { force: true });
      rmSync(previous, { recursive: true, force: true });
      job.progress({ bytesRead: sample.totalBytes, totalBytes: sample.totalBytes });
      return {
        bytes: sample.totalBytes,
        detail: `checked with redis-check-rdb, placed as the AOF base and dump.rdb while the server was stopped, ${loaded} keys loaded`,
      };
    } catch (error) {
      if (stopped) await this.rollBack(job, dir, journal);
      throw error;
    } finally {
      rmSync(staging, { force: true });
    }
  }

  /** rollBack stops the server if it runs on new files, puts the old files back and starts it on them. */
  private async rollBack(job: RestoreJob, dir: string, journal: Journal | null): Promise<void> {
    try {
      if (journal) {
        await job.server.stop();
        restorePrevious(dir, journal);
        job.log("put the previous data files back");
      }
      await job.server.start();
      job.log("the server runs on its previous data");
    } catch (error) {
      job.log(`could not bring the server back on its previous data: ${(error as Error).message}`);
    }
  }
}

/** withClient runs `use` with a client authenticated as the service, bounded by READY_TIMEOUT_MS. */
async function withClient<T>(instance: DatabaseInstance, use: (client: RedisClient) => Promise<T>): Promise<T> {
  const client = new RedisClient(redisUrl(instance), {
    autoReconnect: false,
    enableOfflineQueue: true,
    connectionTimeout: READY_TIMEOUT_MS,
    maxRetries: 0,
  });
  let timer: ReturnType<typeof setTimeout> | null = null;
  try {
    return await Promise.race([
      use(client),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`no answer within ${READY_TIMEOUT_MS} ms`)), READY_TIMEOUT_MS);
      }),
    ]);
  } finally {
    if (timer) clearTimeout(timer);
    client.close();
  }
}

/** countKeys sums the keys of every database from INFO keyspace (`db0:keys=5,expires=1,...`). */
async function countKeys(instance: DatabaseInstance): Promise<number> {
  const info = String(await withClient(instance, (client) => client.send("INFO", ["keyspace"])));
  let total = 0;
  for (const match of info.matchAll(/^db\d+:keys=(\d+)/gm)) total += Number(match[1]);
  return total;
}

/** rdbHeader reads a file's RDB magic and version; null when it has none. */
function rdbHeader(path: string): { version: number } | null {
  const fd = openSync(path, "r");
  try {
    const head = Buffer.alloc(9);
    const read = readSync(fd, head, 0, 9, 0);
    const text = head.subarray(0, read).toString("latin1");
    const match = /^REDIS(\d{4})$/.exec(text);
    return match ? { version: Number(match[1]) } : null;
  } finally {
    closeSync(fd);
  }
}

/** copyDump copies (gunzipping if need be) the dump into a new file `to` of `owner`'s, reporting the dump's bytes read; a timeout stops it. */
async function copyDump(sample: DumpSample, to: string, owner: RunAs | null, job: RestoreJob): Promise<void> {
  const out = openOwned(to, owner, 0o600, true);
  try {
    await feedFile(
      sample.path,
      { write: (chunk) => writeSync(out, chunk), flush: () => 0, end: () => 0 },
      { gzip: sample.gzip, signal: job.signal, onRead: (bytes) => job.progress({ bytesRead: bytes, totalBytes: sample.totalBytes }) },
    );
  } finally {
    closeSync(out);
  }
  if (job.signal.aborted) throw job.signal.reason;
}

/**
 * checkRdb runs redis-check-rdb over the whole file and returns the keys it read; it throws with
 * the tool's complaint. It runs as the server's user, who owns the file and the dir it is in.
 */
async function checkRdb(tool: string, path: string, owner: RunAs | null, job: RestoreJob): Promise<{ keys: number; expires: number }> {
  const run = await runTool(asUser(owner, [tool, path]), { env: job.instance.env, signal: job.signal });
  const keys = /\[info\] (\d+) keys read/.exec(run.output);
  if (run.exitCode !== 0 || !/RDB looks OK/.test(run.output) || !keys) {
    const complaint = run.output
      .split("\n")
      .filter((line) => !/^\[offset \d+\] (AUX FIELD|Selecting|Checking)/.test(line) && line.trim() !== "")
      .slice(0, 4)
      .join(" | ");
    throw new Error(`redis-check-rdb refuses the file (exit ${run.exitCode ?? run.signal}): ${complaint || lastLines(run.output)}`);
  }
  const expires = /\[info\] (\d+) expires/.exec(run.output);
  return { keys: Number(keys[1]), expires: Number(expires?.[1] ?? 0) };
}

/**
 * placeRdb makes the staged RDB the AOF's only (base) file and dump.rdb: Redis loads it whether
 * appendonly is on or off. What it makes is `owner`'s, as the staged file is.
 */
function placeRdb(dir: string, staging: string, owner: RunAs | null): void {
  const aof = join(dir, AOF_DIR);
  mkdirOwned(aof, owner, 0o750);
  renameSync(staging, join(aof, AOF_BASE));
  writeOwned(join(aof, AOF_MANIFEST), `file ${AOF_BASE} seq 1 type b\n`, owner, 0o640);
  // Redis replaces both files by rename when it rewrites them, so one inode can serve as both.
  try {
    linkSync(join(aof, AOF_BASE), join(dir, RDB_FILE));
  } catch {
    copyFileSync(join(aof, AOF_BASE), join(dir, RDB_FILE), constants.COPYFILE_EXCL);
    giveTo(owner, join(dir, RDB_FILE));
  }
}

/**
 * restorePrevious puts the old data files back: each one moved aside replaces what is there
 * now; a file there was none of before is removed; one not moved yet (an interruption between
 * the moves) is the old one and stays.
 */
function restorePrevious(dir: string, journal: Journal): void {
  for (const name of DATA_FILES) {
    const old = join(journal.previous, name);
    if (existsSync(old)) {
      rmSync(join(dir, name), { recursive: true, force: true });
      renameSync(old, join(dir, name));
    } else if (!journal.existed.includes(name)) {
      rmSync(join(dir, name), { recursive: true, force: true });
    }
  }
  rmSync(journal.previous, { recursive: true, force: true });
  rmSync(join(dir, JOURNAL), { force: true });
}

/**
 * parseJournal reads a journal, or returns null for one that is not a restore's own. The data
 * dir is the server's user's, who could have written it: the directory of old files it names
 * must be a restore's, in the data dir itself, before the engine moves or removes anything.
 */
function parseJournal(dir: string, text: string): Journal | null {
  const value = JSON.parse(text) as Partial<Journal>;
  const previous = typeof value.previous === "string" ? value.previous : "";
  if (!PREVIOUS_DIR.test(basename(previous)) || previous !== join(dir, basename(previous))) return null;
  const stat = lstatSync(previous, { throwIfNoEntry: false });
  if (stat && !stat.isDirectory()) return null;
  const existed = Array.isArray(value.existed) ? value.existed.filter((name) => DATA_FILES.includes(name)) : [];
  return { pid: typeof value.pid === "number" ? value.pid : -1, previous, existed };
}

/**
 * recoverInterruptedRestore runs before every start: a journal left by another process (the
 * engine stopped or crashed mid-restore) means the new files were never verified, so the old
 * ones come back. Copies of dumps a restore left are removed.
 */
function recoverInterruptedRestore(dir: string, context: ToolContext): void {
  const journalPath = join(dir, JOURNAL);
  let journal: Journal | null = null;
  try {
    journal = parseJournal(dir, readFileSync(journalPath, "utf8"));
  } catch {
    journal = null;
  }
  // The restoring process starts the server itself mid-restore: its own journal is not a leftover.
  if (journal && journal.pid === process.pid) return;
  if (journal) {
    restorePrevious(dir, journal);
    context.log("a restore was interrupted before its data was verified: put the previous data files back");
  }
  rmSync(journalPath, { force: true });
  for (const name of readdirSync(dir)) {
    if (/^\.restore-[a-z0-9]+\.rdb$/.test(name)) rmSync(join(dir, name), { force: true });
  }
}
