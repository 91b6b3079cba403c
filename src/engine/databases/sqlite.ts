import { Database } from "bun:sqlite";
import { closeSync, existsSync, lstatSync, openSync, readSync, renameSync, rmSync, writeSync } from "node:fs";
import { join } from "node:path";
import { randomId } from "../../lib/crypto";
import { feedFile } from "./feed";
import { sniffFormat } from "./formats";
import {
  assertTools,
  asUser,
  FileProgress,
  findTools,
  lastLines,
  openOwned,
  type RunAs,
  runTool,
  setFileMode,
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
  { tool: "sqlite3", debianPackage: "sqlite3" },
  { tool: "sleep", debianPackage: "coreutils" },
];

/** DATABASE_FILE is the database's file name inside the service's data dir. */
export const SQLITE_DATABASE_FILE = "database.sqlite3";
/** COMPANION_SUFFIXES name the files SQLite keeps beside a database: its WAL, the WAL's index, its rollback journal. */
const COMPANION_SUFFIXES = ["-wal", "-shm", "-journal"];
/**
 * SHARED_FILE_MODE is the mode of the database and its companions under a root engine: its
 * user's and its group's, which the services bound to it get at launch (decision 290). SQLite
 * gives the companions it creates the database file's mode itself, whatever the umask.
 */
const SHARED_FILE_MODE = 0o660;
/** PRIVATE_FILE_MODE is the file's mode where the engine runs everything as itself (nothing to share). */
const PRIVATE_FILE_MODE = 0o640;
/** STAGING_MODE keeps a restore's unfinished file from the bound services until it replaces the database. */
const STAGING_MODE = 0o600;
const COPY_CHUNK = 1024 * 1024;
const PROGRESS_INTERVAL_MS = 250;

/** sqliteFile is the path of a SQLite database service's file. */
export function sqliteFile(instance: DatabaseInstance): string {
  return join(instance.dataDir, SQLITE_DATABASE_FILE);
}

/**
 * SqliteEngine manages a SQLite database file as a database service. SQLite has no server:
 * the service's process is a placeholder (`sleep infinity`) that gives the file the same
 * lifecycle as the other engines (start, stop, bindings that wait for it), and readiness
 * opens the file and reads its schema. Restores build a new file beside the old one and
 * rename it over the old one only once it is complete and passes an integrity check.
 *
 * Under a root engine the file is the service's own user's (instance.owner), as its data dir
 * is: the engine creates it and a restore's new file for that user, and the SQL restore's
 * sqlite3 runs as that user. (SQLite itself, run as root, gives the `-wal`, `-shm` and journal
 * files it makes the database file's owner, so the readiness check may open it as root.)
 * Services bound to it open the file themselves, as users of their own: the data dir is its
 * group's (2770, set by the manager) and the file and its companions 0660, so the database
 * service's group, which the manager gives each bound service at launch, reads and writes
 * them (decision 290). Root opens nothing there through a link: bound services may rename
 * and replace what is in the dir.
 */
export class SqliteEngine implements DatabaseEngine {
  readonly name = "sqlite" as const;
  readonly label = "SQLite";
  readonly hasServer = false;
  /** serverUser is null: a root engine runs this engine's process as the service's own user (instance.owner). */
  readonly serverUser = null;
  readonly bindsThroughFiles = true;

  detectTools(env: Record<string, string>): ToolReport {
    return findTools(TOOLS, env);
  }

  credentials(): { secrets: Record<string, string>; env: Record<string, string> } {
    // A file on the workstation has no credentials: file permissions guard it.
    return { secrets: {}, env: {} };
  }

  connection(instance: DatabaseInstance): ConnectionDetails {
    const path = sqliteFile(instance);
    // sqlite:////abs/path is the SQLAlchemy / dj-database-url form of an absolute path.
    return { url: `sqlite:///${path}`, host: null, port: null, database: null, user: null, path, password: null };
  }

  bindings(instance: DatabaseInstance, prefix: string): Record<string, string> {
    const { url, path } = this.connection(instance) as { url: string; path: string };
    return { DATABASE_URL: url, [`${prefix}_URL`]: url, [`${prefix}_PATH`]: path };
  }

  async initialize(instance: DatabaseInstance, context: ToolContext): Promise<void> {
    assertTools(this.label, this.detectTools(instance.env));
    const file = sqliteFile(instance);
    const shared = Boolean(instance.owner);
    if (!existsSync(file)) {
      // An empty file is an empty database: SQLite writes its header at the first write.
      closeSync(openOwned(file, instance.owner, shared ? SHARED_FILE_MODE : PRIVATE_FILE_MODE, true));
      context.log(`created an empty SQLite database, ${file}`);
    }
    // Set at every start (the mode at creation passed through the umask), so an older engine's
    // 0640 file and companions, or a file an admin copied in, open to the bound services too.
    if (shared) for (const suffix of ["", ...COMPANION_SUFFIXES]) setFileMode(`${file}${suffix}`, SHARED_FILE_MODE);
  }

  location(instance: DatabaseInstance): string {
    return sqliteFile(instance);
  }

  startCommand(instance: DatabaseInstance): string[] {
    const tools = assertTools(this.label, this.detectTools(instance.env));
    return [tools.sleep as string, "infinity"];
  }

  async ready(instance: DatabaseInstance): Promise<ReadyResult> {
    // SQLite follows a link at the database's name (not at its companions'): bound services
    // may put one there, and root opens only the database's own file.
    if (!isRegularFile(sqliteFile(instance))) return { ready: false, detail: "the database file is missing or not a regular file" };
    try {
      const db = new Database(sqliteFile(instance), { readonly: true });
      try {
        db.query("SELECT count(*) FROM sqlite_master").get();
      } finally {
        db.close();
      }
      return { ready: true, detail: "the database file opens" };
    } catch (error) {
      return { ready: false, detail: `the database file does not open: ${(error as Error).message}` };
    }
  }

  stopCommand(): string[] | null {
    return null;
  }

  sniff(sample: DumpSample): DumpFormat | null {
    return sniffFormat("sqlite", sample);
  }

  async restore(job: RestoreJob): Promise<RestoreOutcome> {
    const { instance, sample, format } = job;
    const tools = assertTools(this.label, this.detectTools(instance.env));
    const target = sqliteFile(instance);
    const staging = join(instance.dataDir, `.restore-${randomId("r").slice(2)}.sqlite3`);
    const owner = instance.owner ?? null;
    // Under a root engine the new file is the owner's alone until it is complete and checked,
    // then the group's too, as the database it replaces is (decision 290).
    const createMode = owner ? STAGING_MODE : PRIVATE_FILE_MODE;
    try {
      if (format.format === "sqlite-db" && !sample.gzip) {
        await copyWithProgress(sample.path, staging, owner, createMode, job);
      } else if (format.format === "sqlite-db") {
        const out = openOwned(staging, owner, createMode, true);
        try {
          await feedFile(sample.path, fdSink(out), {
            gzip: true,
            signal: job.signal,
            onRead: (bytes) => job.progress({ bytesRead: bytes, totalBytes: sample.totalBytes }),
          });
        } finally {
          closeSync(out);
        }
      } else {
        // sqlite3 would create the file with its umask's mode: it gets one made already, empty.
        if (owner) closeSync(openOwned(staging, owner, createMode, true));
        await loadSql(tools.sqlite3 as string, staging, owner, job);
      }
      if (job.signal.aborted) throw job.signal.reason;
      const problem = integrityProblem(staging);
      if (problem) throw new Error(`the restored database fails its integrity check: ${problem}`);
      if (job.signal.aborted) throw job.signal.reason;
      if (owner) setFileMode(staging, SHARED_FILE_MODE);
      swapFile(target, staging);
      job.log(`replaced ${target} with the restored database`);
      job.progress({ bytesRead: sample.totalBytes, totalBytes: sample.totalBytes });
      return { bytes: sample.totalBytes, detail: "restored into a new file, renamed over the database once complete and checked" };
    } finally {
      for (const suffix of ["", "-journal", "-wal", "-shm"]) rmSync(`${staging}${suffix}`, { force: true });
    }
  }
}

function fdSink(fd: number) {
  return {
    write: (chunk: Uint8Array) => writeSync(fd, chunk),
    flush: () => 0,
    end: () => 0,
  };
}

/** copyWithProgress copies a database file chunk by chunk into a new file of `owner`'s, so that a timeout stops it at once. */
async function copyWithProgress(from: string, to: string, owner: RunAs | null, mode: number, job: RestoreJob): Promise<void> {
  const input = openSync(from, "r");
  const output = openOwned(to, owner, mode, true);
  const buffer = Buffer.alloc(COPY_CHUNK);
  let copied = 0;
  let lastReport = 0;
  try {
    for (;;) {
      if (job.signal.aborted) throw job.signal.reason;
      const read = readSync(input, buffer, 0, COPY_CHUNK, copied);
      if (read === 0) break;
      writeSync(output, buffer, 0, read);
      copied += read;
      if (Date.now() - lastReport >= PROGRESS_INTERVAL_MS) {
        lastReport = Date.now();
        job.progress({ bytesRead: copied, totalBytes: job.sample.totalBytes });
        await Bun.sleep(0); // let the timeout and the API breathe
      }
    }
  } finally {
    closeSync(input);
    closeSync(output);
  }
}

/**
 * loadSql runs the dump through the sqlite3 shell into a new file, stopping at the first error.
 * The shell runs as `owner`, so the file (and its journal) are that user's; it reads the dump
 * from its stdin, which the engine opened, so the dump need not be readable by that user.
 */
async function loadSql(sqlite3: string, staging: string, owner: RunAs | null, job: RestoreJob): Promise<void> {
  const { sample } = job;
  const input = sample.gzip ? null : openSync(sample.path, "r");
  let timer: ReturnType<typeof setInterval> | null = null;
  try {
    const progress = new FileProgress(sample.path, sample.totalBytes);
    let logged = 0;
    // -safe: a dump's dot-commands may not run programs, write files or attach other databases.
    const run = await runTool(asUser(owner, [sqlite3, "-safe", "-bail", staging]), {
      env: job.instance.env,
      signal: job.signal,
      stdin: input ?? "pipe",
      onLine: (line) => {
        if (logged++ < 50) job.log(`sqlite3: ${line}`);
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
    });
    if (run.exitCode !== 0 || /^(Parse error|Runtime error|Error)/m.test(run.output)) {
      throw new Error(`sqlite3 failed (exit ${run.exitCode ?? run.signal}): ${lastLines(run.output)}`);
    }
  } finally {
    if (timer) clearInterval(timer);
    if (input !== null) closeSync(input);
  }
}

/** isRegularFile says whether `path` is a regular file itself, not a link to one. */
function isRegularFile(path: string): boolean {
  return lstatSync(path, { throwIfNoEntry: false })?.isFile() === true;
}

/** integrityProblem opens a database and runs PRAGMA integrity_check; null when it is sound. */
function integrityProblem(path: string): string | null {
  if (!isRegularFile(path)) return "the restored file is missing or not a regular file";
  try {
    const db = new Database(path, { readonly: true });
    try {
      const rows = db.query<{ integrity_check: string }, []>("PRAGMA integrity_check").all();
      const problems = rows.map((row) => row.integrity_check).filter((line) => line !== "ok");
      return problems.length > 0 ? problems.slice(0, 3).join("; ") : null;
    } finally {
      db.close();
    }
  } catch (error) {
    return (error as Error).message;
  }
}

/**
 * swapFile puts the restored file in place. The old file's WAL is checkpointed first (so no
 * committed write of it is lost in a file left behind), and its -wal, -shm and -journal files
 * are removed after the rename: left there, SQLite would apply them to the new file.
 */
function swapFile(target: string, staging: string): void {
  // Only the database's own file: a link there is not followed to another database.
  if (existsSync(`${target}-wal`) && isRegularFile(target)) {
    try {
      const db = new Database(target);
      db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
      db.close();
    } catch {
      // a database that will not open has nothing to keep
    }
  }
  renameSync(staging, target);
  for (const suffix of COMPANION_SUFFIXES) rmSync(`${target}${suffix}`, { force: true });
}
