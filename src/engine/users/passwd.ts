import {
  closeSync,
  existsSync,
  fchmodSync,
  fchownSync,
  fstatSync,
  fsync,
  fsyncSync,
  linkSync,
  lstatSync,
  openSync,
  readFileSync,
  renameSync,
  statSync,
  unlinkSync,
  writeSync,
} from "node:fs";
import { rename } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { libc } from "./libc";

const fsyncAsync = promisify(fsync);

/** fileKey names one version of a file: its inode, size and mtime ("-" when it cannot be read). */
export function fileKey(path: string): string {
  try {
    return keyOf(statSync(path));
  } catch {
    return "-";
  }
}

function keyOf(stat: { ino: number; size: number; mtimeMs: number }): string {
  return `${stat.ino}:${stat.size}:${stat.mtimeMs}`;
}

/**
 * accountTexts are the texts of the world-readable account files (passwd, group) as last read
 * or written by this process, each with the key of the file it came from. A new service's user
 * is looked up, checked and written in turn, and each step read the whole of both files again:
 * with thousands of services, most of a new user's cost. The shadow files are not kept.
 */
const accountTexts = new Map<string, { key: string; text: string }>();

/** accountText is a passwd- or group-format file's text ("" when it cannot be read), read again only when its key changed. */
export function accountText(path: string): string {
  const key = fileKey(path);
  const known = accountTexts.get(path);
  if (known?.key === key) return known.text;
  let text = "";
  try {
    text = readFileSync(path, "utf8");
  } catch {
    // missing or unreadable: no entries
  }
  // The key was taken before the read: a file replaced in between is read again next time.
  if (key !== "-") accountTexts.set(path, { key, text });
  return text;
}

/** SystemAccount is one service user and, unless its group exists already, its group of the same number. */
export interface SystemAccount {
  name: string;
  uid: number;
  gid: number;
  /** makeGroup adds the group `name` with `gid`; false when a group of that name exists (its gid is `gid`). */
  makeGroup: boolean;
  comment: string;
  home: string;
  shell: string;
}

/**
 * AddResult: `added`; `taken` when the name or an id is in the files by now (another process was
 * first: look again, choose again); `busy` when another process holds the lock (try again in a
 * moment); `unsupported` when these files cannot be written here (use groupadd and useradd).
 */
export type AddResult = "added" | "taken" | "busy" | "unsupported";

/** FIELD_SAFE is what a field may hold: no separator, no line break. */
const FIELD_SAFE = /^[^:\n\r]*$/;

/**
 * AccountFiles adds system accounts to /etc/passwd, /etc/shadow, /etc/group and /etc/gshadow
 * from the daemon's own process, as systemd-sysusers does, where groupadd and useradd cost two
 * processes, a dozen file rewrites and 30-40 ms per new service (decision 450). It takes the
 * locks those tools take, so it never interleaves with them: the fcntl lock on .pwd.lock
 * (lckpwdf(3): useradd, passwd, vipw and systemd take it first) and shadow-utils' own
 * `<file>.lock` (a link to a file holding the owner's pid, a dead owner's taken over). Each file
 * is written whole beside itself (`<file>+`, with the original's owner and mode), synced and
 * renamed over: a reader sees the old file or the new one, and a crash leaves the old one. The
 * group goes first, so the user's gid never names a group that is not there yet. The syncs and
 * renames of an add run off the event loop, under the locks: a caller in this process must not
 * start another add or a removal before it settles (ServiceUsers keeps one write at a time), as
 * the locks cannot keep this process from itself.
 */
export class AccountFiles {
  constructor(private readonly etc = "/etc") {}

  /**
   * add writes several accounts under one lock and one rewrite of each file (the costly part,
   * and the same for one account or fifty), each checked against the files and the ones before
   * it: one result per account, in order. The files are synced and renamed off the event loop:
   * fsync waited for the journal, most of a new user's cost to the daemon's loop.
   */
  async add(accounts: SystemAccount[]): Promise<AddResult[]> {
    const all = (result: AddResult) => accounts.map(() => result);
    const lib = libc();
    const files = {
      passwd: join(this.etc, "passwd"),
      shadow: join(this.etc, "shadow"),
      group: join(this.etc, "group"),
      gshadow: join(this.etc, "gshadow"),
    };
    if (accounts.length === 0) return [];
    if (!lib || !existsSync(files.passwd) || !existsSync(files.group)) return all("unsupported");
    for (const path of Object.values(files)) {
      // A link or anything but a plain file is the administrator's arrangement: leave it to the tools.
      if (existsSync(path) && !lstatSync(path).isFile()) return all("unsupported");
    }
    let lockFd: number;
    try {
      lockFd = openSync(join(this.etc, ".pwd.lock"), "w", 0o600);
    } catch {
      return all("unsupported");
    }
    const held: string[] = [];
    try {
      if (!lib.tryWriteLock(lockFd)) return all("busy");
      const taken = takeLockFiles(
        Object.values(files).filter((file) => existsSync(file)),
        held,
      );
      if (taken !== "taken") return all(taken);
      const passwd = accountText(files.passwd);
      const group = accountText(files.group);
      // Each file's names and ids, read once: checking each account against the text again was
      // quadratic in the number of users (one per service name, batch jobs included).
      const users = entriesOf(files.passwd, passwd);
      const groups = entriesOf(files.group, group);
      const lines = { passwd: [] as string[], shadow: [] as string[], group: [] as string[], gshadow: [] as string[] };
      // Locked password ("!"), last changed today in days since the epoch, no ageing: as `useradd --system` writes it.
      const days = Math.floor(Date.now() / 86_400_000);
      const results = accounts.map((account): AddResult => {
        if (![account.name, account.comment, account.home, account.shell].every((field) => FIELD_SAFE.test(field))) return "unsupported";
        // The local files are checked here, under the lock; NSS (LDAP, sssd), which no lock of ours
        // holds still, the caller asked moments before (ServiceUsers.freeId, findPasswd, findGroup).
        if (users.has(account.name, account.uid)) return "taken";
        if (account.makeGroup && groups.has(account.name, account.gid)) return "taken";
        if (account.makeGroup) {
          groups.add(account.name, account.gid);
          lines.group.push(`${account.name}:x:${account.gid}:`);
          lines.gshadow.push(`${account.name}:!::`);
        }
        users.add(account.name, account.uid);
        lines.passwd.push(`${account.name}:x:${account.uid}:${account.gid}:${account.comment}:${account.home}:${account.shell}`);
        lines.shadow.push(`${account.name}:!:${days}::::::`);
        return "added";
      });
      // The groups first: a user's gid never names a group that is not there yet.
      const groupWrites: [string, string][] = [];
      const userWrites: [string, string][] = [];
      // Each file's new lines are joined to its text once: appending them one by one made a
      // flattened copy of the whole file per account.
      if (lines.group.length > 0) {
        groupWrites.push([files.group, appendLines(group, lines.group)]);
        if (existsSync(files.gshadow)) groupWrites.push([files.gshadow, appendLines(readFileSync(files.gshadow, "utf8"), lines.gshadow)]);
      }
      if (lines.passwd.length > 0) {
        userWrites.push([files.passwd, appendLines(passwd, lines.passwd)]);
        if (existsSync(files.shadow)) userWrites.push([files.shadow, appendLines(readFileSync(files.shadow, "utf8"), lines.shadow)]);
      }
      const stages = [groupWrites, userWrites].filter((stage) => stage.length > 0);
      const keys = await replaceAllWith(stages);
      for (const [index, [path, text]] of stages.flat().entries()) {
        if (path === files.passwd || path === files.group) accountTexts.set(path, { key: keys[index] ?? "-", text });
      }
      return results;
    } finally {
      for (const lock of held) unlinkQuietly(lock);
      closeSync(lockFd); // closing the fd releases the fcntl lock
    }
  }
}

/**
 * removeAccounts deletes users and their groups of the same name (userdel's USERGROUPS_ENAB
 * rule) from the four files under the same locks as AccountFiles.add, in one rewrite of each;
 * false when the files cannot be written here or the lock is busy (the caller runs userdel).
 * The caller has made sure no process of these users lives: userdel's own refusal.
 */
export function removeAccounts(names: readonly string[], etc = "/etc"): boolean {
  if (names.length === 0) return true;
  const files = ["group", "gshadow", "passwd", "shadow"].map((file) => join(etc, file));
  const lib = libc();
  if (!lib || !files.slice(0, 3).every((path) => path.endsWith("gshadow") || existsSync(path))) return false;
  if (files.some((path) => existsSync(path) && !lstatSync(path).isFile())) return false;
  let lockFd: number;
  try {
    lockFd = openSync(join(etc, ".pwd.lock"), "w", 0o600);
  } catch {
    return false;
  }
  const held: string[] = [];
  try {
    if (!lib.tryWriteLock(lockFd)) return false;
    const present = files.filter((path) => existsSync(path));
    if (takeLockFiles(present, held) !== "taken") return false;
    const gone = new Set(names);
    for (const path of present) {
      const text = readFileSync(path, "utf8");
      const kept = text.split("\n").filter((line) => !gone.has(line.split(":")[0] ?? ""));
      const next = kept.join("\n");
      if (next !== text) replaceWith(path, next);
    }
    return true;
  } finally {
    for (const lock of held) unlinkQuietly(lock);
    closeSync(lockFd);
  }
}

/** Entries are the names and ids (third field) of a passwd- or group-format text, and those added since it was read. */
interface Entries {
  has(name: string, id: number): boolean;
  add(name: string, id: number): void;
}

/** Parsed is a file's text as last read, and its names and ids. */
interface Parsed {
  text: string;
  names: Set<string>;
  ids: Set<string>;
}

/**
 * parsedFiles keeps each account file's names and ids between writes. The files grow by a line
 * for each new user (one per batch job's name), so a write parses only the lines added since the
 * last one: parsing the whole file each time made a flood of jobs quadratic in its users.
 */
const parsedFiles = new Map<string, Parsed>();

/** grewFrom says whether `text` is `before` with whole lines added after it: only those need reading. */
export function grewFrom(before: string, text: string): boolean {
  return text.length >= before.length && (before === "" || before.endsWith("\n")) && text.startsWith(before);
}

function entriesOf(path: string, text: string): Entries {
  let parsed = parsedFiles.get(path);
  if (parsed && grewFrom(parsed.text, text)) {
    addEntries(parsed, text.slice(parsed.text.length));
    parsed.text = text;
  } else {
    parsed = { text, names: new Set(), ids: new Set() };
    addEntries(parsed, text);
    parsedFiles.set(path, parsed);
  }
  const { names, ids } = parsed;
  // What add() puts in stays beside the file's own: it is in the file only once the write succeeds.
  const addedNames = new Set<string>();
  const addedIds = new Set<string>();
  return {
    has: (name, id) => names.has(name) || ids.has(String(id)) || addedNames.has(name) || addedIds.has(String(id)),
    add: (name, id) => {
      addedNames.add(name);
      addedIds.add(String(id));
    },
  };
}

function addEntries(parsed: Parsed, text: string): void {
  for (const line of text.split("\n")) {
    const first = line.indexOf(":");
    if (first < 0) continue;
    parsed.names.add(line.slice(0, first));
    const second = line.indexOf(":", first + 1);
    const third = second < 0 ? -1 : line.indexOf(":", second + 1);
    if (second >= 0) parsed.ids.add(line.slice(second + 1, third < 0 ? undefined : third));
  }
}

function appendLines(text: string, lines: string[]): string {
  return `${text}${text === "" || text.endsWith("\n") ? "" : "\n"}${lines.map((line) => `${line}\n`).join("")}`;
}

/** replaceWith writes `path+` with the owner and mode of `path`, syncs it and renames it over `path`. */
function replaceWith(path: string, content: string): void {
  const next = writeBeside(path, content);
  try {
    fsyncSync(next.fd);
  } catch (error) {
    discard(next);
    throw error;
  }
  closeSync(next.fd);
  renameSync(next.path, path);
}

/**
 * replaceAllWith is replaceWith for several files, with the waits off the event loop: every
 * `path+` is written, then all are synced at once (the journal commits them together), then
 * renamed over their files stage by stage: a stage's files together (one trip through the
 * thread pool, not one each: with the event loop busy, each trip back to it cost ~0.75 ms of a
 * new service's launch, decision 512), a stage only once the one before it is in place, so a
 * reader sees the stages change in this order. It answers each file's key, in the stages' order.
 */
async function replaceAllWith(stages: readonly (readonly [path: string, content: string][])[]): Promise<string[]> {
  const writes = stages.flat();
  const nexts: Beside[] = [];
  try {
    for (const [path, content] of writes) nexts.push(writeBeside(path, content));
    await Promise.all(nexts.map((next) => fsyncAsync(next.fd)));
  } catch (error) {
    for (const next of nexts) discard(next);
    throw error;
  }
  for (const next of nexts) closeSync(next.fd);
  const renamed = new Set<number>();
  try {
    let index = 0;
    for (const stage of stages) {
      const first = index;
      index += stage.length;
      const results = await Promise.allSettled(
        stage.map(async ([path], offset) => {
          await rename((nexts[first + offset] as Beside).path, path);
          renamed.add(first + offset);
        }),
      );
      const failed = results.find((result): result is PromiseRejectedResult => result.status === "rejected");
      if (failed) throw failed.reason;
    }
  } finally {
    for (const [index, next] of nexts.entries()) if (!renamed.has(index)) unlinkQuietly(next.path);
  }
  return nexts.map((next) => next.key);
}

interface Beside {
  path: string;
  fd: number;
  /** key is the written file's fileKey (a rename keeps its inode, size and mtime). */
  key: string;
}

/** writeBeside writes `path+` with the owner and mode of `path`, not synced yet: its fd stays open. */
function writeBeside(path: string, content: string): Beside {
  const before = statSync(path);
  const next = { path: `${path}+`, fd: openSync(`${path}+`, "w", 0o600), key: "-" };
  try {
    const bytes = Buffer.from(content, "utf8");
    let written = 0;
    while (written < bytes.length) written += writeSync(next.fd, bytes, written);
    // Owner before mode: chown clears set-id bits, and a mode set first could be lost.
    fchownSync(next.fd, before.uid, before.gid);
    fchmodSync(next.fd, before.mode & 0o7777);
    next.key = keyOf(fstatSync(next.fd));
  } catch (error) {
    discard(next);
    throw error;
  }
  return next;
}

/** discard closes and removes a `path+` that will not be renamed over its file. */
function discard(next: Beside): void {
  try {
    closeSync(next.fd);
  } catch {
    // closed already
  }
  unlinkQuietly(next.path);
}

/**
 * takeLockFiles takes shadow-utils' lock of each file, in order: `<file>.lock` holding this pid,
 * a link to a `<file>.<pid>` as commonio_lock makes it; a lock whose owner is gone is removed
 * and taken. One such file is linked to all the locks, then removed (others read a lock's pid,
 * never its name or links): one new inode a write instead of one a file, where each create
 * costs more the more the file system deleted lately (decision 473). Each lock taken goes into
 * `held`, for the caller to remove, also when a later one is busy. Answers "taken" when it holds all.
 */
function takeLockFiles(paths: readonly string[], held: string[]): "taken" | "busy" | "unsupported" {
  const first = paths[0];
  if (first === undefined) return "taken";
  const mine = `${first}.${process.pid}`;
  try {
    const fd = openSync(mine, "w", 0o600);
    writeSync(fd, String(process.pid));
    closeSync(fd);
  } catch {
    return "unsupported";
  }
  try {
    for (const path of paths) {
      const taken = linkLock(mine, `${path}.lock`);
      if (taken !== "taken") return taken;
      held.push(`${path}.lock`);
    }
    return "taken";
  } finally {
    unlinkQuietly(mine);
  }
}

function linkLock(mine: string, lock: string): "taken" | "busy" | "unsupported" {
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      linkSync(mine, lock);
      return "taken";
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") return "unsupported";
    }
    const owner = Number(readQuietly(lock).trim());
    if (Number.isInteger(owner) && owner > 0 && processAlive(owner)) return "busy";
    unlinkQuietly(lock); // its owner died holding it, as shadow-utils' commonio_lock treats it
  }
  return "busy";
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

function readQuietly(path: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return "";
  }
}

function unlinkQuietly(path: string): void {
  try {
    unlinkSync(path);
  } catch {
    // gone already
  }
}
