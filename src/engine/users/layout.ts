import { chmodSync, closeSync, constants, existsSync, lstatSync, mkdirSync, openSync, readdirSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { libc } from "./libc";

/**
 * ENGINE_ENTRIES are what the engine keeps at the top of its data dir besides data/ and
 * services/; ENGINE_PREFIXES catch the files beside them (engine.db-wal, engine.log.1, a
 * secret's temporary file). Only these are touched: the data dir is not assumed to hold
 * nothing else.
 */
const ENGINE_ENTRIES = new Set(["admin.token", "secret.key", "shim.sock", "pki", "link", "bin", "tmp", "templates", "proxy"]);
const ENGINE_PREFIXES = ["engine.", "admin.token.", "secret.key."];

/** TRAVERSE is search without read: a workload may pass through to its own directory, never list or read. */
const TRAVERSE = 0o711;
const PRIVATE_DIR = 0o700;

/** ModeChange is one chmod the engine made to its data dir: the path, its mode before and after. */
export interface ModeChange {
  path: string;
  was: number;
  now: number;
}

/** tightened says whether a change took permissions away: the mode before had a bit the mode after lacks. */
export function tightened(change: ModeChange): boolean {
  return (change.was & ~change.now & 0o7777) !== 0;
}

/** describeModeChange writes a change as `path 0644 -> 0600`, for a log line. */
export function describeModeChange(change: ModeChange): string {
  const octal = (mode: number) => `0${(mode & 0o7777).toString(8).padStart(3, "0")}`;
  return `${change.path} ${octal(change.was)} -> ${octal(change.now)}`;
}

/**
 * secureDataDir gives the data dir the modes that keep the engine's state from workloads, also
 * when an older engine made it (an upgrade in place). With `switching` (a root engine whose
 * workloads run as other users) the layout is:
 *
 *   <data-dir>            0711 root   traversable, not listable
 *   data/                 0711 root   workloads reach data/<name>
 *   data/<name>           0700 the service's user (set at launch); a SQLite database's 2770, its
 *                         group given to the services bound to it (decision 290)
 *   data/.builds/         0711 root   build checkouts: a checkout is its run's cwd
 *   data/.builds/<id>     0700 the service's user (set at build)
 *   services/             0700 root   the shim's logs and exit records, build logs: the workload
 *                                     cannot touch them
 *   the engine's own      group and other bits cleared: admin.token, secret.key, engine.db and
 *                         its -wal/-shm, engine.sock, shim.sock, engine.log, pki/, link/, bin/,
 *                         tmp/, templates/, proxy/ (ENGINE_ENTRIES)
 *
 * It makes data/ and services/ where they are missing; spreadServiceTrees then marks them as
 * tops of directory hierarchies where the file system has that flag (ext2/3/4).
 *
 * Without `switching` the workloads are the engine's own user and nothing needs traversal: the
 * same entries are private and the data dir stays 0700. What it changed shows in
 * modeChangesSince (other modules close their own entries too: the store, the shim's bin/).
 */
export function secureDataDir(dataDir: string, switching: boolean): void {
  const traverse = switching ? TRAVERSE : PRIVATE_DIR;
  // A directory others may write (a shared one such as /tmp) is never changed, its entries aside
  // (prepareDataDir in the daemon follows the same rule).
  const shared = (lstatSync(dataDir).mode & 0o7022) !== 0;
  const set = (path: string, mode: number) => {
    const stat = lstatSync(path, { throwIfNoEntry: false });
    if (!stat || stat.isSymbolicLink() || (stat.mode & 0o7777) === mode) return;
    chmodSync(path, mode);
  };
  const privatize = (path: string) => {
    const stat = lstatSync(path, { throwIfNoEntry: false });
    if (!stat || stat.isSymbolicLink() || (stat.mode & 0o077) === 0) return;
    set(path, stat.mode & 0o7700);
  };
  if (!shared) set(dataDir, traverse);
  const data = join(dataDir, "data");
  // services/ holds the shim's logs and exit records and the build logs: the engine's alone.
  const services = join(dataDir, "services");
  // Both are made here, before any launch, so that spreadServiceTrees can mark them.
  if (!existsSync(data)) mkdirSync(data, { mode: traverse });
  if (!existsSync(services)) mkdirSync(services, { mode: PRIVATE_DIR });
  set(data, traverse);
  for (const entry of readdirSync(dataDir)) {
    if (ENGINE_ENTRIES.has(entry) || ENGINE_PREFIXES.some((prefix) => entry.startsWith(prefix))) privatize(join(dataDir, entry));
  }
  set(services, PRIVATE_DIR);
  set(join(data, ".builds"), traverse);
}

/** FS_TOPDIR_FL is chattr's `T`: the top of a directory hierarchy, for ext2/3/4's Orlov allocator. */
const FS_TOPDIR_FL = 0x00020000;

/**
 * spreadServiceTrees marks data/ and services/ (secureDataDir made them) as tops of directory
 * hierarchies (chattr +T), so that ext4 places each service's own directories
 * (`services/<id>`, `data/<name>`) in a block group of their own choosing, as it does home
 * directories, instead of beside their parent's. Every file and directory a run makes then
 * lands in a group the last deletions did not crowd: ext4 without a journal checks each inode a
 * create could take against the deletions of the last seconds to minutes, so creates beside
 * many deleted services' trees cost the launcher ~0.3 ms each (decisions 473, 520). Other file
 * systems have no such flag: nothing is marked there, and nothing fails. Answers the
 * directories marked.
 */
export function spreadServiceTrees(dataDir: string): string[] {
  const lib = libc();
  if (!lib) return [];
  const marked: string[] = [];
  for (const dir of [join(dataDir, "data"), join(dataDir, "services")]) {
    let fd: number | undefined;
    try {
      fd = openSync(dir, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
      if (lib.addInodeFlags(fd, FS_TOPDIR_FL)) marked.push(dir);
    } catch {
      // not there, or not a directory of ours: left as it is, only where its children go changes
    } finally {
      if (fd !== undefined) closeSync(fd);
    }
  }
  return marked;
}

/** governedPaths are the paths whose modes secureDataDir sets, where they exist. */
function governedPaths(dataDir: string): string[] {
  const paths = [dataDir, join(dataDir, "data"), join(dataDir, "data", ".builds"), join(dataDir, "services")];
  for (const entry of readdirSync(dataDir)) {
    if (ENGINE_ENTRIES.has(entry) || ENGINE_PREFIXES.some((prefix) => entry.startsWith(prefix))) paths.push(join(dataDir, entry));
  }
  return paths;
}

/**
 * dataDirModes reads the modes of what the engine keeps at the top of its data dir (the
 * entries secureDataDir governs), before a start changes any: modeChangesSince compares.
 */
export function dataDirModes(dataDir: string): Map<string, number> {
  const modes = new Map<string, number>();
  for (const path of governedPaths(dataDir)) {
    const stat = lstatSync(path, { throwIfNoEntry: false });
    if (stat && !stat.isSymbolicLink()) modes.set(path, stat.mode & 0o7777);
  }
  return modes;
}

/** modeChangesSince lists the paths of `before` whose mode is no longer what it was. */
export function modeChangesSince(before: Map<string, number>): ModeChange[] {
  const changes: ModeChange[] = [];
  for (const [path, was] of before) {
    const stat = lstatSync(path, { throwIfNoEntry: false });
    if (stat && !stat.isSymbolicLink() && (stat.mode & 0o7777) !== was) changes.push({ path, was, now: stat.mode & 0o7777 });
  }
  return changes;
}

/** firstClosedParent returns the first directory above `path` that others may not search, or null. */
export function firstClosedParent(path: string): string | null {
  const chain: string[] = [];
  for (let dir = dirname(path); ; dir = dirname(dir)) {
    chain.unshift(dir);
    if (dir === dirname(dir)) break;
  }
  for (const dir of chain) {
    const stat = lstatSync(dir, { throwIfNoEntry: false });
    if (!stat || (stat.mode & 0o001) === 0) return dir;
  }
  return null;
}

/**
 * firstUnreachableBy returns the first directory of `path` (itself included) that `user` may
 * not search, or null when it can enter `path`. The engine enters a run's working directory as
 * root before the drop, so a directory the user could not reach by itself is refused here,
 * else a `cwd` under a closed directory (`/root/x`) would hand the workload what is inside.
 */
export function firstUnreachableBy(path: string, user: { uid: number; gid: number; groups: number[] }): string | null {
  if (user.uid === 0) return null;
  const chain: string[] = [];
  for (let dir = path; ; dir = dirname(dir)) {
    chain.unshift(dir);
    if (dir === dirname(dir)) break;
  }
  for (const dir of chain) {
    const stat = statSync(dir, { throwIfNoEntry: false });
    if (!stat) return dir;
    const bit = stat.uid === user.uid ? 0o100 : stat.gid === user.gid || user.groups.includes(stat.gid) ? 0o010 : 0o001;
    if ((stat.mode & bit) === 0) return dir;
  }
  return null;
}
