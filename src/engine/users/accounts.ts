import { lstatSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { AppError } from "../../lib/errors";
import { processIds } from "../../lib/procfs";
import { libc } from "./libc";
import { AccountFiles, type AddResult, accountText, grewFrom, removeAccounts, type SystemAccount } from "./passwd";

/**
 * WorkloadUser is the identity a workload (and its builds and exec probes) runs as: the
 * shim's child calls setgroups(groups), setgid(gid), setuid(uid) just before exec.
 */
export interface WorkloadUser {
  name: string;
  uid: number;
  gid: number;
  /** groups are the supplementary groups: `video` and `render` (GPU device nodes) for service users. */
  groups: number[];
  home: string;
}

/** RecordedUser is what a service's store row keeps of the user it runs as, so a relaunch needs no lookup. */
export interface RecordedUser {
  name: string;
  uid: number;
  gid: number;
}

/** SERVICE_USER_PREFIX marks the system users the engine makes, one per service. */
export const SERVICE_USER_PREFIX = "eng-";
/** SERVICE_USER_COMMENT is the GECOS field of those users: a user with another comment is never taken over. */
export const SERVICE_USER_COMMENT = "engine service";
/** GPU_GROUPS own the GPU device nodes on common distributions (/dev/dri/renderD*, some /dev/nvidia*). */
const GPU_GROUPS = ["video", "render"];
/** Linux user names are at most 32 bytes (useradd's limit, utmp's ut_user). */
const NAME_MAX = 32;
/** useradd and groupadd exit 10 when another process holds the passwd lock: it is worth a retry. */
const LOCK_BUSY_EXIT = 10;
/** ... 4 when the uid or gid asked for is taken, and 9 when the name is. */
const ID_TAKEN_EXIT = 4;
const NAME_TAKEN_EXIT = 9;

/**
 * WORKLOAD_ID_RANGE is where the engine numbers its service users and their groups: the range
 * systemd reserves for dynamic service users (61184-65519, systemd's UIDS-GIDS.md), which
 * distributions keep free of their own users and of regular logins. Every id is checked
 * against /etc/passwd, /etc/group and NSS before it is used.
 */
export const WORKLOAD_ID_RANGE = { min: 61184, max: 65519 } as const;

/** canSwitchUsers says whether this process may run workloads as other users: only root may. */
export function canSwitchUsers(): boolean {
  return process.geteuid?.() === 0;
}

/**
 * serviceUserName is the system user of a service: `eng-<name>`, or, for names too long for
 * 32 bytes, a 19-character head and 8 hex digits of the name's SHA-256, so that two long names
 * with one head still differ. Service names are [a-z0-9-], so the result is a valid user name.
 */
export function serviceUserName(serviceName: string): string {
  const plain = `${SERVICE_USER_PREFIX}${serviceName}`;
  if (plain.length <= NAME_MAX) return plain;
  const hash = new Bun.CryptoHasher("sha256").update(serviceName).digest("hex").slice(0, 8);
  const head = serviceName.slice(0, NAME_MAX - SERVICE_USER_PREFIX.length - 9).replace(/-+$/, "");
  return `${SERVICE_USER_PREFIX}${head}-${hash}`;
}

interface PasswdEntry {
  name: string;
  uid: number;
  gid: number;
  comment: string;
  home: string;
}

function parsePasswd(text: string): PasswdEntry[] {
  const entries: PasswdEntry[] = [];
  for (const line of text.split("\n")) {
    const [name, , uid, gid, comment, home] = line.split(":");
    if (!name || uid === undefined || gid === undefined || !/^\d+$/.test(uid) || !/^\d+$/.test(gid)) continue;
    entries.push({ name, uid: Number(uid), gid: Number(gid), comment: comment ?? "", home: home ?? "/" });
  }
  return entries;
}

function readText(path: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return "";
  }
}

/**
 * Local is what /etc/passwd and /etc/group hold, parsed once per change of the files (their
 * inode, size and mtime): a new service's user is looked up several times, and with hundreds of
 * services each lookup used to parse both files again. A change that only added lines (a new
 * user's, the usual one) is read by parsing those lines alone.
 */
interface Local {
  passwdText: string;
  groupText: string;
  passwd: PasswdEntry[];
  users: Map<string, PasswdEntry>;
  groups: Map<string, number>;
  ids: Set<number>;
}
let local: Local | null = null;

function localAccounts(): Local {
  // The texts come from passwd.ts's cache: read again only when a file changed, and not at all
  // after this process's own write of them.
  const passwdText = accountText("/etc/passwd");
  const groupText = accountText("/etc/group");
  if (local && local.passwdText === passwdText && local.groupText === groupText) return local;
  if (local && grewFrom(local.passwdText, passwdText) && grewFrom(local.groupText, groupText)) {
    addLocal(local, passwdText.slice(local.passwdText.length), groupText.slice(local.groupText.length));
    Object.assign(local, { passwdText, groupText });
    return local;
  }
  local = { passwdText, groupText, passwd: [], users: new Map(), groups: new Map(), ids: new Set() };
  addLocal(local, passwdText, groupText);
  return local;
}

/** addLocal adds the entries of passwd and group lines to what `into` holds. */
function addLocal(into: Local, passwdLines: string, groupLines: string): void {
  for (const entry of parsePasswd(passwdLines)) {
    into.passwd.push(entry);
    into.users.set(entry.name, entry);
    into.ids.add(entry.uid).add(entry.gid);
  }
  for (const line of groupLines.split("\n")) {
    const [name, , gid] = line.split(":");
    if (!name || !gid || !/^\d+$/.test(gid)) continue;
    into.groups.set(name, Number(gid));
    into.ids.add(Number(gid));
  }
}

/**
 * getent asks NSS (LDAP, sssd, ...) for what the local files do not have; "" when it has nothing.
 * Where the C library is loaded, whether NSS knows the key at all is asked in-process first: the
 * answer is almost always no, and a process for it cost milliseconds on every new service.
 */
function getent(database: "passwd" | "group", key: string): string {
  if (!nssBeyondFiles(database)) return "";
  const lib = libc();
  if (lib) {
    const id = /^\d+$/.test(key) ? Number(key) : key;
    if (!(database === "passwd" ? lib.userExists(id) : lib.groupExists(id))) return "";
  }
  const getentPath = Bun.which("getent");
  if (!getentPath) return "";
  const result = Bun.spawnSync([getentPath, database, key], { stdout: "pipe", stderr: "ignore" });
  return result.exitCode === 0 ? result.stdout.toString() : "";
}

/** USERDB_DIRS are where systemd's userdb finds its users besides NSS's files: drop-ins and varlink services (homed, dynamic users). */
const USERDB_DIRS = [
  "/run/systemd/userdb",
  "/run/systemd/dynamic-uid",
  "/etc/userdb",
  "/run/userdb",
  "/run/host/userdb",
  "/usr/lib/userdb",
  "/usr/local/lib/userdb",
];
/** NSS_RECHECK_MS is how long the answer of nssBeyondFiles stands: a systemd unit with DynamicUser= may start meanwhile. */
const NSS_RECHECK_MS = 5000;
let nssAnswer: { at: number; passwd: boolean; group: boolean } | null = null;

/**
 * nssBeyondFiles says whether NSS may know users or groups that /etc/passwd and /etc/group do
 * not, so that asking it is worth a call (decision 458): see nssAsks. A miss through
 * nss-systemd cost ~50 us of failed opens, four per new service user.
 */
function nssBeyondFiles(database: "passwd" | "group"): boolean {
  const now = Date.now();
  if (!nssAnswer || now - nssAnswer.at > NSS_RECHECK_MS) {
    const conf = readText("/etc/nsswitch.conf");
    const userdb = USERDB_DIRS.some((dir) => {
      try {
        return readdirSync(dir).length > 0;
      } catch {
        return false;
      }
    });
    nssAnswer = { at: now, passwd: nssAsks(conf, "passwd", userdb), group: nssAsks(conf, "group", userdb) };
  }
  return nssAnswer[database];
}

/**
 * nssAsks says whether a database's NSS sources (nsswitch.conf's line; glibc's default `files`
 * when there is none) reach beyond the local files: false for `files` alone, or with `systemd`
 * while systemd's userdb has nothing to offer (`userdb`: no varlink service, no dynamic user, no
 * drop-in; its module then answers only root and nobody, outside the engine's range). Any other
 * source (ldap, sss, winbind, compat's NIS) is asked.
 */
export function nssAsks(conf: string, database: "passwd" | "group", userdb: boolean): boolean {
  let sources = ["files"];
  for (const line of conf.split("\n")) {
    const [head, ...rest] = line.replace(/#.*/, "").trim().split(/\s+/);
    // Actions such as [NOTFOUND=return] are not sources.
    if (head === `${database}:`) sources = rest.filter((word) => word !== "" && !word.startsWith("["));
  }
  return sources.some((source) => source !== "files" && (source !== "systemd" || userdb));
}

/** findPasswd looks a user up by name or numeric uid: /etc/passwd first (no process), then NSS. */
function findPasswd(nameOrUid: string, accounts: Local = localAccounts()): PasswdEntry | null {
  const numeric = /^\d+$/.test(nameOrUid);
  const match = (entry: PasswdEntry) => (numeric ? entry.uid === Number(nameOrUid) : entry.name === nameOrUid);
  const { passwd, users } = accounts;
  const found = numeric ? passwd.find(match) : users.get(nameOrUid);
  return found ?? parsePasswd(getent("passwd", nameOrUid)).find(match) ?? null;
}

/** groupIds returns the gids of the named groups that exist on this host. */
function groupIds(names: string[]): number[] {
  const ids: number[] = [];
  const text = accountText("/etc/group");
  for (const name of names) {
    const line = text.split("\n").find((l) => l.startsWith(`${name}:`)) ?? getent("group", name).trim();
    const gid = line.split(":")[2];
    if (gid && /^\d+$/.test(gid)) ids.push(Number(gid));
  }
  return ids;
}

/** findGroup returns the gid of a group by name, or null when the host has none. */
function findGroup(name: string, accounts: Local = localAccounts()): number | null {
  const found = accounts.groups.get(name);
  if (found !== undefined) return found;
  const gid = getent("group", name).trim().split(":")[2];
  return gid && /^\d+$/.test(gid) ? Number(gid) : null;
}

let nologinPath: string | null = null;

/** nologin is the shell of service users, looked up on PATH once (a lookup walked PATH on every new user). */
function nologin(): string {
  nologinPath ??= Bun.which("nologin") ?? "/usr/sbin/nologin";
  return nologinPath;
}

/** runTool runs useradd or groupadd and answers its exit code and the start of its stderr. */
async function runTool(tool: "useradd" | "groupadd", args: string[]): Promise<{ code: number; stderr: string }> {
  const path = Bun.which(tool) ?? `/usr/sbin/${tool}`;
  let proc: ReturnType<typeof Bun.spawn<"ignore", "ignore", "pipe">>;
  try {
    proc = Bun.spawn([path, ...args], { stdin: "ignore", stdout: "ignore", stderr: "pipe" });
  } catch (error) {
    throw new AppError("internal", `cannot run ${tool} to make a service's user: ${(error as Error).message}`);
  }
  const [stderr, code] = await Promise.all([new Response(proc.stderr).text(), proc.exited]);
  return { code, stderr: stderr.trim().slice(0, 300) };
}

/** memberGroups returns the supplementary groups /etc/group lists `user` in (what initgroups(3) would set, for local files). */
function memberGroups(user: string): number[] {
  const ids: number[] = [];
  for (const line of accountText("/etc/group").split("\n")) {
    const [, , gid, members] = line.split(":");
    if (gid && /^\d+$/.test(gid) && (members ?? "").split(",").includes(user)) ids.push(Number(gid));
  }
  return ids;
}

/**
 * ServiceUsers makes and finds the users workloads run as. A root engine runs each service as
 * a system user of its own (as systemd's DynamicUser= and Nomad's exec driver do), made on
 * first launch: written into the account files in-process (AccountFiles), or with `groupadd`
 * and `useradd --system` where those cannot be written; numbered from WORKLOAD_ID_RANGE, no
 * login shell, and the service's data dir as home.
 */
export class ServiceUsers {
  private gpuGroupIds: number[] | null = null;
  /** queued are the accounts asked for since the last write: written together, one rewrite of each file for all. */
  private queued: { account: SystemAccount; done: (result: AddResult | Error) => void }[] | null = null;
  /** writing is the write of the account files in flight (one at a time); writeDue says one starts on the next turn. */
  private writing: Promise<void> | null = null;
  private writeDue = false;
  /** reserved are the ids of queued accounts: not in the files yet, and not to be handed out twice. */
  private readonly reserved = new Set<number>();
  /** nextFree is where freeId's next search starts: just past the id it found last. */
  private nextFree: number;

  constructor(
    private readonly idRange: { min: number; max: number } = WORKLOAD_ID_RANGE,
    private readonly accountFiles: AccountFiles = new AccountFiles(),
  ) {
    this.nextFree = idRange.min;
  }

  /** idFree says whether an id is neither a user's nor a group's, locally or through NSS. */
  private idFree(id: number, used: ReadonlySet<number>): boolean {
    return !this.reserved.has(id) && !used.has(id) && getent("passwd", String(id)) === "" && getent("group", String(id)) === "";
  }

  /**
   * freeId is the first id from `nextFree` on, round the range, that no user or group has,
   * locally or through NSS. The search starts where the last one ended: from the range's start
   * each time, it stepped over every user made before, a cost that grew with each batch job
   * (1 % of a job's daemon time at 4,000 users). An id freed below the cursor is handed out
   * again once the search comes round.
   */
  private freeId(used: ReadonlySet<number>): number {
    const { min, max } = this.idRange;
    const span = max - min + 1;
    const start = this.nextFree > max || this.nextFree < min ? min : this.nextFree;
    // The cache's set is read as it is (copying it cost O(users) a new user).
    for (let step = 0; step < span; step++) {
      const id = min + ((start - min + step) % span);
      if (this.idFree(id, used)) {
        this.nextFree = id + 1;
        return id;
      }
    }
    throw new AppError(
      "internal",
      `no id is left for a new service user in ${this.idRange.min}-${this.idRange.max}: remove the users of services that are gone (userdel eng-...)`,
    );
  }

  /** gpuGroups are the gids of `video` and `render` where they exist, read once. */
  gpuGroups(): number[] {
    this.gpuGroupIds ??= groupIds(GPU_GROUPS);
    return this.gpuGroupIds;
  }

  /**
   * resolve finds an existing user by name or numeric uid, for the admin-only `user` field;
   * null when the host has no such user. Its supplementary groups are those /etc/group lists
   * it in, as a login would have.
   */
  resolve(nameOrUid: string): WorkloadUser | null {
    const entry = findPasswd(nameOrUid);
    if (!entry) return null;
    return { name: entry.name, uid: entry.uid, gid: entry.gid, groups: memberGroups(entry.name), home: entry.home };
  }

  /**
   * addAccount queues an account for the next write of the account files: on the next turn of
   * the event loop, or when the write in flight has settled. The launches of one scheduling pass,
   * and all that asked while a write was syncing, make their users in one write.
   */
  private addAccount(account: SystemAccount): Promise<AddResult> {
    this.reserved.add(account.uid);
    if (account.makeGroup) this.reserved.add(account.gid);
    return new Promise<AddResult>((resolve, reject) => {
      this.queued ??= [];
      this.queued.push({ account, done: (result) => (result instanceof Error ? reject(result) : resolve(result)) });
      this.nextWrite();
    }).finally(() => {
      this.reserved.delete(account.uid);
      if (account.makeGroup) this.reserved.delete(account.gid);
    });
  }

  /** nextWrite starts the queued accounts' write on the next turn of the loop, unless one is in flight or due. */
  private nextWrite(): void {
    if (this.writing || this.writeDue || !this.queued) return;
    this.writeDue = true;
    setImmediate(() => {
      this.writeDue = false;
      this.writeQueued();
    });
  }

  private writeQueued(): void {
    const queued = this.queued ?? [];
    this.queued = null;
    if (queued.length === 0) return;
    this.writing = this.accountFiles.add(queued.map((entry) => entry.account)).then(
      (results) => {
        for (const [index, entry] of queued.entries()) entry.done(results[index] ?? "busy");
      },
      (error: Error) => {
        for (const entry of queued) entry.done(error);
      },
    );
    void this.writing.finally(() => {
      this.writing = null;
      this.nextWrite();
    });
  }

  /**
   * idle resolves once no write of the account files is in flight or due in this process. A
   * removal (removeServiceUsersOf) waits for it: the write holds the files' locks, which cannot
   * keep this process from itself, so a removal meeting them would take them for another's; and
   * a daemon that stops waits for it, so that no write of its goes on after it (its locks made
   * the next engine's, or a test's clean-up, take the files for busy). A write is due on the
   * next turn of the event loop when accounts were asked for while another was in flight: it
   * is waited for too. Writes start only on a turn of the event loop, so none starts between
   * idle and the caller's next step.
   */
  async idle(): Promise<void> {
    for (;;) {
      if (this.writing) await this.writing;
      // setImmediate runs in order: this turn comes after the one that starts the due write.
      else if (this.writeDue || this.queued) await new Promise<void>((resolve) => setImmediate(resolve));
      else return;
    }
  }

  /**
   * ensureServiceUser returns the service's own user, making it when it does not exist. A
   * recorded uid (from the service's row) is asked for again when the user must be remade,
   * so files the old user owned stay its own. A user of that name the engine did not make (its
   * comment differs) is never taken over: that is an error.
   */
  async ensureServiceUser(serviceName: string, home: string, recorded: RecordedUser | null): Promise<WorkloadUser> {
    const name = serviceUserName(serviceName);
    for (let attempt = 0; ; attempt++) {
      // One look at the files an attempt: each look is a stat of both.
      const accounts = localAccounts();
      const entry = findPasswd(name, accounts);
      if (entry) {
        if (!entry.comment.startsWith(SERVICE_USER_COMMENT)) {
          throw new AppError(
            "internal",
            `the host already has a user ${name} that the engine did not create (its comment is ${JSON.stringify(entry.comment)}): rename the service or that user`,
          );
        }
        return { name, uid: entry.uid, gid: entry.gid, groups: this.gpuGroups(), home };
      }
      // The id comes from the engine's own range, not useradd's system range (100-999 on
      // Debian: it would run out after some 900 services, batch jobs included). The group gets
      // the same number, as systemd's DynamicUser= does; a recorded id is asked for again so
      // files the old user owned stay its own.
      const id =
        recorded !== null && recorded.name === name && this.idFree(recorded.uid, accounts.ids) ? recorded.uid : this.freeId(accounts.ids);
      const existingGroup = findGroup(name, accounts);
      const added = await this.addAccount({
        name,
        uid: id,
        gid: existingGroup ?? id,
        makeGroup: existingGroup === null,
        comment: `${SERVICE_USER_COMMENT} ${serviceName}`,
        home,
        shell: nologin(),
      });
      // Written under the files' locks, as asked: no need to read it back.
      if (added === "added") return { name, uid: id, gid: existingGroup ?? id, groups: this.gpuGroups(), home };
      if (added === "taken" && attempt < 20) continue; // choose again
      if (added === "busy" && attempt < 20) {
        await Bun.sleep(5 + attempt * 10);
        continue;
      }
      if (added !== "unsupported") {
        throw new AppError(
          "internal",
          `could not make the service's user ${name}: the account files stayed ${added} through ${attempt} tries`,
        );
      }
      if (existingGroup === null) {
        const made = await runTool("groupadd", ["--system", "--gid", String(id), name]);
        if (made.code === ID_TAKEN_EXIT && attempt < 20) continue; // another process took the gid: choose again
        if ((made.code === LOCK_BUSY_EXIT || made.code === NAME_TAKEN_EXIT) && attempt < 20) {
          await Bun.sleep(50 + attempt * 25);
          continue;
        }
        if (made.code !== 0) {
          throw new AppError("internal", `groupadd could not make the service's group ${name} (exit ${made.code}): ${made.stderr}`);
        }
      }
      const { code, stderr } = await runTool("useradd", [
        "--system",
        "--no-create-home",
        "--uid",
        String(id),
        "--gid",
        String(existingGroup ?? id),
        "--home-dir",
        home,
        "--shell",
        nologin(),
        "--comment",
        `${SERVICE_USER_COMMENT} ${serviceName}`,
        name,
      ]);
      if (code === 0) continue; // read it back
      // Another useradd holds the lock, made the same user, or took the uid a moment ago: look again.
      if ((code === LOCK_BUSY_EXIT || code === NAME_TAKEN_EXIT || code === ID_TAKEN_EXIT) && attempt < 20) {
        await Bun.sleep(50 + attempt * 25);
        continue;
      }
      throw new AppError("internal", `useradd could not make the service's user ${name} (exit ${code}): ${stderr.trim().slice(0, 300)}`);
    }
  }
}

/**
 * removeServiceUsersOf deletes the system users a root engine made for the services of
 * `dataDir` (the engine's comment, a home under its `data/`), so a data dir thrown away leaves
 * no users behind; `only` limits it to the users of those service names. userdel refuses while
 * a process of the user lives: it is tried again for up to `waitMs`, then the user stays (it is
 * harmless, and reused by a service of that name). What a removed user left in the shared
 * scratch dirs goes with it (removeLeftovers), so a later service given the same id cannot
 * read it. Answers the names removed.
 */
export function removeServiceUsersOf(dataDir: string, options: { only?: readonly string[]; waitMs?: number } = {}): string[] {
  if (process.geteuid?.() !== 0) return [];
  let passwd = "";
  try {
    passwd = readFileSync("/etc/passwd", "utf8");
  } catch {
    return [];
  }
  const homes = `${join(dataDir, "data")}/`;
  const users: { name: string; uid: number }[] = [];
  for (const line of passwd.split("\n")) {
    const [name, , uid, , comment, home] = line.split(":");
    if (!name?.startsWith(SERVICE_USER_PREFIX) || !comment?.startsWith(SERVICE_USER_COMMENT) || !home?.startsWith(homes)) continue;
    if (options.only && !options.only.some((service) => serviceUserName(service) === name)) continue;
    users.push({ name, uid: Number(uid) });
  }
  if (users.length === 0) return [];
  // Users with no process left go in one rewrite of the account files (userdel costs a process
  // and four rewrites each); the others, and all where the files cannot be written, go through
  // userdel, which waits for their processes as before.
  const busy = uidsInUse();
  const idle = users.filter((user) => !busy.has(user.uid));
  const removed = removeAccounts(idle.map((user) => user.name)) ? idle : [];
  for (const user of users.filter((candidate) => !removed.includes(candidate))) {
    const deadline = Date.now() + (options.waitMs ?? 0);
    for (;;) {
      const code = Bun.spawnSync(["userdel", user.name], { stdout: "ignore", stderr: "ignore" }).exitCode;
      if (code === 0) removed.push(user);
      if (code !== 8 || Date.now() >= deadline) break;
      Bun.sleepSync(20);
    }
  }
  removeLeftovers(new Set(removed.map((user) => user.uid)));
  return removed.map((user) => user.name);
}

/** SCRATCH_DIRS are the world-writable dirs a workload may leave files in outside its data dir. */
const SCRATCH_DIRS = ["/tmp", "/var/tmp", "/dev/shm"];

/**
 * removeLeftovers deletes what users just removed own at the top of the shared scratch dirs
 * (/tmp, /var/tmp, /dev/shm), as systemd's RemoveIPC= does for a dynamic user's /dev/shm: their
 * ids are handed out again, and a later service's user must not inherit a job's temp files.
 * Entries are checked with lstat (a link is removed, never followed).
 */
export function removeLeftovers(uids: ReadonlySet<number>, dirs: readonly string[] = SCRATCH_DIRS): void {
  if (uids.size === 0) return;
  for (const dir of dirs) {
    let entries: string[];
    try {
      entries = readdirSync(dir);
    } catch {
      continue;
    }
    for (const entry of entries) {
      const path = join(dir, entry);
      try {
        if (uids.has(lstatSync(path).uid)) rmSync(path, { recursive: true, force: true });
      } catch {
        // gone meanwhile, or not ours to remove
      }
    }
  }
}

/** uidsInUse are the real, effective, saved and filesystem uids of every process, from /proc (zombies included, as userdel counts them). */
function uidsInUse(): Set<number> {
  const uids = new Set<number>();
  for (const pid of processIds()) {
    const match = /^Uid:\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)/m.exec(readText(`/proc/${pid}/status`));
    if (match) for (const uid of match.slice(1)) uids.add(Number(uid));
  }
  return uids;
}
