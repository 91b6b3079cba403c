import { Database as Sqlite } from "bun:sqlite";
import {
  chmodSync,
  copyFileSync,
  existsSync,
  lchownSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  renameSync,
  rmSync,
  type Stats,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { dirname, join } from "node:path";
import { readProcessStat } from "../../../engine/supervisor";
import { removeServiceUsersOf } from "../../../engine/users";
import { AppError } from "../../../lib/errors";
import type { Logger } from "../../../lib/logger";
import { processIds } from "../../../lib/procfs";
import type { BackupInfo, BoxEndpoint, BoxProvider, BoxSpec, BoxState, BoxStatus, DestroyResult } from "./provider";

/** BOX_ID is the shape of a box id: it names a directory, so nothing else is accepted. */
const BOX_ID = /^[a-z0-9][a-z0-9_-]{0,63}$/;
/** SOCKET_PATH_MAX is the longest unix socket path Linux takes (sun_path is 108 bytes with its NUL). */
const SOCKET_PATH_MAX = 107;
/** STOP_GRACE_MS is how long an engine or a workload gets after SIGTERM before SIGKILL. */
const STOP_GRACE_MS = 10_000;

/** LocalProviderOptions configure the local provider: where boxes and backups live, and which engine each release runs. */
export interface LocalProviderOptions {
  /** root holds one directory per box: `<root>/<id>/{box.json,data/,engine.out}`. */
  root: string;
  /** backupsRoot holds `<backupsRoot>/<box id>/<backup id>/{engine.db,data/,done.json}`. */
  backupsRoot: string;
  /** releases maps each engine version a box may run to the command that runs that engine. */
  releases: Record<string, string[]>;
  /** env is added to each box engine's environment (PATH and HOME come from the console's). */
  env?: Record<string, string>;
  /** startTimeoutMs bounds how long `start` waits for a box's engine to answer. */
  startTimeoutMs?: number;
  log: Logger;
}

interface BoxFile {
  id: string;
  version: string;
  template_version: string;
  created_at: number;
}

/** compareVersions orders dotted versions numerically part by part (0.10.0 after 0.9.1); other text compares as text. */
export function compareVersions(a: string, b: string): number {
  const pa = a.split(/[.+-]/);
  const pb = b.split(/[.+-]/);
  for (let i = 0; i < Math.max(pa.length, pb.length); i++) {
    const x = pa[i] ?? "0";
    const y = pb[i] ?? "0";
    if (/^\d+$/.test(x) && /^\d+$/.test(y)) {
      if (Number(x) !== Number(y)) return Number(x) - Number(y);
    } else if (x !== y) return x < y ? -1 : 1;
  }
  return 0;
}

/**
 * LocalProvider runs each box as a real `engine serve` on this host: its own data dir
 * (`<root>/<id>/data`), a loopback port the engine picks, and its unix socket, through which
 * the console reaches it (the console proxies `/boxes/<id>/…` to that socket: docs/decisions.md
 * 301). The engine is started in a session of its own and outlives the console, as the engine's
 * own workloads outlive the engine: a restarted console (or provisioner) finds its boxes again
 * by the process table, where a box is the process whose arguments are `serve --data-dir
 * <its data dir>`. So a box is never started twice, and `status` reads the process table and
 * the socket, never the console's database.
 *
 * Sleep (`stop`) ends the engine first (so it restarts nothing), then every workload it left
 * running (their pids are in `services/*\/runs/*\/pids`), freeing the box's memory, CPU and
 * GPUs; the data stays. A later `start` runs the engine again, which finds its workloads gone
 * and starts them under their restart policies, as after a reboot.
 */
export class LocalProvider implements BoxProvider {
  readonly name = "local";
  readonly #options: LocalProviderOptions;
  /** #queues serializes operations on one box within this process (a late, timed-out call never overlaps the next). */
  readonly #queues = new Map<string, Promise<unknown>>();

  constructor(options: LocalProviderOptions) {
    this.#options = options;
    if (Object.keys(options.releases).length === 0)
      throw new AppError("config_invalid", "the local box provider needs at least one release");
  }

  releases(): string[] {
    return Object.keys(this.#options.releases).sort(compareVersions);
  }

  /** boxDir is where one box lives; the id is checked first, since it names a directory. */
  boxDir(id: string): string {
    if (!BOX_ID.test(id)) throw new AppError("invalid_request", `not a box id: ${JSON.stringify(id)}`);
    return join(this.#options.root, id);
  }

  /** dataDir is the box engine's data dir. */
  dataDir(id: string): string {
    return join(this.boxDir(id), "data");
  }

  endpoint(id: string): BoxEndpoint {
    return { unix: join(this.dataDir(id), "engine.sock"), url: "http://box" };
  }

  /**
   * #dirMode is a box directory's mode: 0700, or 0711 (traverse only, no listing) when the
   * console runs as root, because a root box engine runs each service as a user of its own
   * (eng-<name>), who must pass through every directory above the service's data dir.
   */
  #dirMode(): number {
    return process.getuid?.() === 0 ? 0o711 : 0o700;
  }

  /**
   * #prepareRoot makes the boxes' directory; as root it and the console's data dir above it
   * are made traversable (0711, as a root engine makes its own data dir: docs/decisions.md
   * 128 and 306): nothing in them can be listed, and every file in them keeps its own mode.
   */
  #prepareRoot(): void {
    const root = this.#options.root;
    mkdirSync(root, { recursive: true, mode: this.#dirMode() });
    if (process.getuid?.() !== 0) return;
    for (const dir of [root, dirname(root)]) {
      const mode = statSync(dir).mode & 0o777;
      if ((mode & 0o011) !== 0o011) chmodSync(dir, mode | 0o011);
    }
  }

  #serial<T>(id: string, fn: () => Promise<T>): Promise<T> {
    const previous = this.#queues.get(id) ?? Promise.resolve();
    const next = previous.then(fn, fn);
    const settled = next.catch(() => undefined);
    this.#queues.set(id, settled);
    void settled.then(() => {
      if (this.#queues.get(id) === settled) this.#queues.delete(id);
    });
    return next;
  }

  #readBox(id: string): BoxFile | null {
    try {
      return JSON.parse(readFileSync(join(this.boxDir(id), "box.json"), "utf8")) as BoxFile;
    } catch {
      return null;
    }
  }

  #writeBox(id: string, box: BoxFile): void {
    const file = join(this.boxDir(id), "box.json");
    writeFileSync(`${file}.tmp`, `${JSON.stringify(box, null, 2)}\n`, { mode: 0o600 });
    renameSync(`${file}.tmp`, file);
  }

  /**
   * enginePids finds the box's engine in the process table: the processes whose arguments hold
   * `serve` and `--data-dir <the box's data dir>`. Zombies do not count.
   */
  enginePids(id: string): number[] {
    const dataDir = this.dataDir(id);
    const found: { pid: number; ppid: number }[] = [];
    for (const entry of processIds()) {
      let argv: string[];
      try {
        argv = readFileSync(`/proc/${entry}/cmdline`, "utf8").split("\0");
      } catch {
        continue;
      }
      const at = argv.indexOf("--data-dir");
      if (at < 0 || argv[at + 1] !== dataDir || !argv.includes("serve")) continue;
      const stat = readProcessStat(entry);
      if (!stat || stat.state === "Z") continue;
      found.push({ pid: entry, ppid: stat.ppid });
    }
    // A spawn of the engine is, until its exec, a copy of it: its command line, its child. It
    // is not a second engine (a status taken at that instant counted it as one).
    const pids = new Set(found.map((process) => process.pid));
    return found.filter((process) => !pids.has(process.ppid)).map((process) => process.pid);
  }

  async #answers(id: string): Promise<boolean> {
    const socket = this.endpoint(id).unix as string;
    if (!existsSync(socket)) return false;
    try {
      const response = await fetch("http://box/api/health", { unix: socket, signal: AbortSignal.timeout(2000) } as RequestInit);
      await response.arrayBuffer();
      return response.ok;
    } catch {
      return false;
    }
  }

  async status(id: string): Promise<BoxStatus> {
    const box = existsSync(this.boxDir(id)) ? this.#readBox(id) : null;
    if (!box) return { state: "absent", version: null, pids: [] };
    const pids = this.enginePids(id);
    let state: BoxState = "stopped";
    if (pids.length > 0) state = (await this.#answers(id)) ? "running" : "starting";
    return { state, version: box.version, pids };
  }

  create(id: string, spec: BoxSpec): Promise<void> {
    return this.#serial(id, async () => {
      if (this.#readBox(id)) return;
      if (!this.#options.releases[spec.version]) throw new AppError("version_unknown", `no engine release ${spec.version} on this host`);
      const socket = this.endpoint(id).unix as string;
      if (Buffer.byteLength(socket) > SOCKET_PATH_MAX) {
        throw new AppError(
          "config_invalid",
          `the box socket path ${socket} is longer than ${SOCKET_PATH_MAX} bytes: use a shorter data dir`,
        );
      }
      this.#prepareRoot();
      // Made under a temporary name and renamed: a crash leaves either no box or a whole one.
      const dir = this.boxDir(id);
      const partial = `${dir}.partial`;
      rmSync(partial, { recursive: true, force: true });
      mkdirSync(partial, { mode: this.#dirMode() });
      const box: BoxFile = { id, version: spec.version, template_version: spec.templateVersion, created_at: Date.now() };
      writeFileSync(join(partial, "box.json"), `${JSON.stringify(box, null, 2)}\n`, { mode: 0o600 });
      renameSync(partial, dir);
    });
  }

  start(id: string): Promise<void> {
    return this.#serial(id, async () => {
      const box = this.#readBox(id);
      if (!box) throw new AppError("box_absent", `box ${id} does not exist at the provider`);
      const command = this.#options.releases[box.version];
      if (!command) throw new AppError("version_unknown", `box ${id} runs ${box.version}, which this host no longer has`);
      let spawned: Bun.Subprocess | null = null;
      if (this.enginePids(id).length === 0) {
        const dir = this.boxDir(id);
        const out = Bun.file(join(dir, "engine.out"));
        const proc = Bun.spawn([...command, "serve", "--data-dir", this.dataDir(id), "--port", "0", "--no-proxy"], {
          cwd: dir,
          env: {
            PATH: process.env.PATH ?? "/usr/local/bin:/usr/bin:/bin",
            HOME: process.env.HOME ?? "/root",
            LANG: process.env.LANG ?? "C.UTF-8",
            ENGINE_MDNS: "off",
            ENGINE_PROXY: "off",
            ...this.#options.env,
          },
          stdin: "ignore",
          stdout: out,
          stderr: out,
          // Its own session: the box outlives the console, and a signal to the console's group never reaches it.
          detached: true,
        });
        proc.unref();
        spawned = proc;
        this.#options.log.info({ box: id, box_pid: proc.pid, version: box.version }, "box engine started");
      }
      const deadline = Date.now() + (this.#options.startTimeoutMs ?? 60_000);
      while (!(await this.#answers(id))) {
        // Just after the spawn, /proc may still show the process before its exec: watch the spawned one itself.
        const exited = spawned ? spawned.exitCode !== null || spawned.signalCode !== null : this.enginePids(id).length === 0;
        if (exited) {
          throw new AppError("box_start_failed", `box ${id}'s engine exited while starting: ${this.#tail(id)}`);
        }
        if (Date.now() > deadline) throw new AppError("box_start_failed", `box ${id}'s engine did not answer in time`);
        await Bun.sleep(50);
      }
    });
  }

  #tail(id: string): string {
    try {
      const text = readFileSync(join(this.boxDir(id), "engine.out"), "utf8");
      return text.slice(-600).replace(/\s+/g, " ").trim();
    } catch {
      return "(no output)";
    }
  }

  stop(id: string): Promise<void> {
    return this.#serial(id, () => this.#stopNow(id));
  }

  async #stopNow(id: string): Promise<void> {
    if (!existsSync(this.boxDir(id))) return;
    for (const pid of this.enginePids(id)) signal(pid, "SIGTERM");
    await waitGone(() => this.enginePids(id), STOP_GRACE_MS);
    for (const pid of this.enginePids(id)) signal(pid, "SIGKILL");
    await waitGone(() => this.enginePids(id), STOP_GRACE_MS);
    // The engine hands its workloads over on stop (so a restarted engine adopts them); a
    // sleeping box must free what they hold, so they are ended here, group first.
    const workloads = this.#workloadPids(id);
    for (const { child } of workloads) {
      signal(-child, "SIGTERM");
      signal(child, "SIGTERM");
    }
    await waitGone(() => workloads.map((w) => w.child).filter(alive), STOP_GRACE_MS);
    for (const { child, shim } of workloads) {
      signal(-child, "SIGKILL");
      signal(child, "SIGKILL");
      signal(shim, "SIGKILL");
    }
    await waitGone(() => workloads.flatMap((w) => [w.child, w.shim]).filter(alive), STOP_GRACE_MS);
    // A shim the engine spawned but had not yet recorded when it stopped has no pid file: any
    // process still naming a path in the box's data dir is the box's, and is ended too.
    const strays = this.#strayPids(id);
    for (const pid of strays) signal(pid, "SIGKILL");
    await waitGone(() => strays.filter(alive), STOP_GRACE_MS);
  }

  /** #strayPids lists processes whose arguments name a path inside the box's data dir. */
  #strayPids(id: string): number[] {
    const prefix = `${this.dataDir(id)}/`;
    const found: number[] = [];
    for (const entry of processIds()) {
      if (entry === process.pid) continue;
      try {
        const argv = readFileSync(`/proc/${entry}/cmdline`, "utf8").split("\0");
        if (argv.some((arg) => arg.startsWith(prefix))) found.push(entry);
      } catch {
        // gone while read
      }
    }
    return found.filter(alive);
  }

  /** #workloadPids reads the shim and workload pids of every run the box's engine recorded. */
  #workloadPids(id: string): { shim: number; child: number }[] {
    const dataDir = this.dataDir(id);
    const found: { shim: number; child: number }[] = [];
    if (!existsSync(join(dataDir, "services"))) return found;
    for (const file of new Bun.Glob("services/*/runs/*/pids").scanSync({ cwd: dataDir })) {
      try {
        const [shim, child] = readFileSync(join(dataDir, file), "utf8").trim().split(" ").map(Number);
        if (shim && child && (alive(shim) || alive(child))) found.push({ shim, child });
      } catch {
        // a run being written: nothing to end yet
      }
    }
    return found;
  }

  update(id: string, version: string): Promise<void> {
    return this.#serial(id, async () => {
      const box = this.#readBox(id);
      if (!box) throw new AppError("box_absent", `box ${id} does not exist at the provider`);
      if (!this.#options.releases[version]) throw new AppError("version_unknown", `no engine release ${version} on this host`);
      if (box.version === version) return;
      if (this.enginePids(id).length > 0) throw new AppError("box_running", `box ${id} must be stopped to update it`);
      this.#writeBox(id, { ...box, version });
    });
  }

  backup(id: string, backupId: string): Promise<BackupInfo> {
    return this.#serial(id, async () => {
      if (!BOX_ID.test(backupId)) throw new AppError("invalid_request", `not a backup id: ${JSON.stringify(backupId)}`);
      const dest = join(this.#options.backupsRoot, id, backupId);
      const doneFile = join(dest, "done.json");
      if (existsSync(doneFile)) return JSON.parse(readFileSync(doneFile, "utf8")) as BackupInfo;
      const dataDir = this.dataDir(id);
      if (!existsSync(dataDir)) throw new AppError("box_absent", `box ${id} has no data to back up`);
      const partial = `${dest}.partial`;
      rmSync(partial, { recursive: true, force: true });
      mkdirSync(partial, { recursive: true, mode: 0o700 });
      // The engine's state: an online, consistent copy (VACUUM INTO reads one snapshot while
      // the engine keeps writing in WAL mode), never a copy of a file being written.
      const dbFile = join(dataDir, "engine.db");
      if (existsSync(dbFile)) {
        const db = new Sqlite(dbFile, { readonly: true });
        try {
          db.exec(`VACUUM INTO '${join(partial, "engine.db").replaceAll("'", "''")}'`);
        } finally {
          db.close();
        }
      }
      // The rest of the data dir: the services' data, certificates, keys, logs; not the live
      // database files, sockets, the shim (rebuilt by the engine) or run pids (a restored box
      // must never adopt the original box's processes).
      copyTree(dataDir, join(partial, "data"), (relative, stat) => {
        if (relative === "engine.db" || relative === "engine.db-wal" || relative === "engine.db-shm") return false;
        if (relative === "bin" || stat.isSocket() || stat.isFIFO()) return false;
        return !/^services\/[^/]+\/runs\/[^/]+\/pids$/.test(relative);
      });
      const info: BackupInfo = { id: backupId, sizeBytes: treeSize(partial), takenAt: Date.now() };
      writeFileSync(join(partial, "done.json"), `${JSON.stringify(info)}\n`, { mode: 0o600 });
      rmSync(dest, { recursive: true, force: true });
      renameSync(partial, dest);
      return info;
    });
  }

  restore(sourceId: string, backupId: string, id: string, spec: BoxSpec): Promise<void> {
    return this.#serial(id, async () => {
      if (this.#readBox(id)) return;
      const source = join(this.#options.backupsRoot, sourceId, backupId);
      if (!BOX_ID.test(sourceId) || !BOX_ID.test(backupId) || !existsSync(join(source, "done.json"))) {
        throw new AppError("not_found", `no finished backup ${backupId} of box ${sourceId}`);
      }
      if (!this.#options.releases[spec.version]) throw new AppError("version_unknown", `no engine release ${spec.version} on this host`);
      this.#prepareRoot();
      const dir = this.boxDir(id);
      const partial = `${dir}.partial`;
      rmSync(partial, { recursive: true, force: true });
      mkdirSync(partial, { mode: this.#dirMode() });
      copyTree(join(source, "data"), join(partial, "data"), () => true);
      if (existsSync(join(source, "engine.db"))) copyFileSync(join(source, "engine.db"), join(partial, "data", "engine.db"));
      const box: BoxFile = { id, version: spec.version, template_version: spec.templateVersion, created_at: Date.now() };
      writeFileSync(join(partial, "box.json"), `${JSON.stringify(box, null, 2)}\n`, { mode: 0o600 });
      renameSync(partial, dir);
    });
  }

  forgetBackup(sourceId: string, backupId: string): Promise<void> {
    if (!BOX_ID.test(sourceId) || !BOX_ID.test(backupId)) return Promise.resolve();
    rmSync(join(this.#options.backupsRoot, sourceId, backupId), { recursive: true, force: true });
    return Promise.resolve();
  }

  destroy(id: string): Promise<DestroyResult> {
    return this.#serial(id, async () => {
      const dir = this.boxDir(id);
      if (!existsSync(dir)) return "done";
      await this.#stopNow(id);
      if (this.enginePids(id).length > 0) return "pending";
      // The users a root box engine made for its services go with the box (a user still running stays).
      removeServiceUsersOf(this.dataDir(id));
      rmSync(dir, { recursive: true, force: true });
      rmSync(`${dir}.partial`, { recursive: true, force: true });
      return existsSync(dir) ? "pending" : "done";
    });
  }
}

function signal(pid: number, name: NodeJS.Signals): void {
  if (pid === 0) return;
  try {
    process.kill(pid, name);
  } catch {
    // gone already
  }
}

function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return !/\) Z /.test(stat);
  } catch {
    return false;
  }
}

async function waitGone(pids: () => number[], withinMs: number): Promise<void> {
  const deadline = Date.now() + withinMs;
  while (pids().length > 0 && Date.now() < deadline) await Bun.sleep(25);
}

/**
 * copyTree copies a directory tree with modes and, as root, owners (a root engine's services
 * own their data dirs), keeping symlinks as links; `keep` filters by path relative to `from`.
 */
export function copyTree(from: string, to: string, keep: (relative: string, stat: Stats) => boolean): void {
  const root = process.getuid?.() === 0;
  const walk = (relative: string) => {
    const source = relative ? join(from, relative) : from;
    const target = relative ? join(to, relative) : to;
    // A running box's data dir changes while it is copied: an entry that went between its
    // directory's listing and its copy (a log rotated, a pruned run, a file renamed into place)
    // is left out, as rsync leaves out a file that vanished. The copy's own root must be there.
    const unlessGone = <T>(step: () => T): T | undefined => {
      try {
        return step();
      } catch (error) {
        if (relative !== "" && (error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
        throw error;
      }
    };
    const stat = unlessGone(() => lstatSync(source));
    if (stat === undefined || (relative && !keep(relative, stat))) return;
    if (stat.isDirectory()) {
      mkdirSync(target, { recursive: true, mode: 0o700 });
      for (const entry of unlessGone(() => readdirSync(source)) ?? []) walk(relative ? join(relative, entry) : entry);
      chmodSync(target, stat.mode & 0o7777);
    } else if (stat.isSymbolicLink()) {
      const copied = unlessGone(() => {
        symlinkSync(readlinkSync(source), target);
        return true;
      });
      if (!copied) return;
    } else if (stat.isFile()) {
      const copied = unlessGone(() => {
        copyFileSync(source, target);
        return true;
      });
      if (!copied) return;
      chmodSync(target, stat.mode & 0o7777);
    } else return;
    if (root) {
      try {
        lchownSync(target, stat.uid, stat.gid);
      } catch {
        // an owner this host lacks: the copy stays root's
      }
    }
  };
  walk("");
}

function treeSize(dir: string): number {
  let total = 0;
  const walk = (path: string) => {
    const stat = lstatSync(path);
    if (stat.isDirectory()) for (const entry of readdirSync(path)) walk(join(path, entry));
    else if (stat.isFile()) total += stat.size;
  };
  walk(dir);
  return total;
}
