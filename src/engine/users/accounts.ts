import { readFileSync } from "node:fs";
import { AppError } from "../../lib/errors";

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
/** useradd exits 10 when another process holds the passwd lock: it is worth a retry. */
const LOCK_BUSY_EXIT = 10;

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

/** getent asks NSS (LDAP, sssd, ...) for what the local files do not have; "" when it has nothing. */
function getent(database: "passwd" | "group", key: string): string {
  const getentPath = Bun.which("getent");
  if (!getentPath) return "";
  const result = Bun.spawnSync([getentPath, database, key], { stdout: "pipe", stderr: "ignore" });
  return result.exitCode === 0 ? result.stdout.toString() : "";
}

/** findPasswd looks a user up by name or numeric uid: /etc/passwd first (no process), then NSS. */
function findPasswd(nameOrUid: string): PasswdEntry | null {
  const numeric = /^\d+$/.test(nameOrUid);
  const match = (entry: PasswdEntry) => (numeric ? entry.uid === Number(nameOrUid) : entry.name === nameOrUid);
  return parsePasswd(readText("/etc/passwd")).find(match) ?? parsePasswd(getent("passwd", nameOrUid)).find(match) ?? null;
}

/** groupIds returns the gids of the named groups that exist on this host. */
function groupIds(names: string[]): number[] {
  const ids: number[] = [];
  const text = readText("/etc/group");
  for (const name of names) {
    const line = text.split("\n").find((l) => l.startsWith(`${name}:`)) ?? getent("group", name).trim();
    const gid = line.split(":")[2];
    if (gid && /^\d+$/.test(gid)) ids.push(Number(gid));
  }
  return ids;
}

/** memberGroups returns the supplementary groups /etc/group lists `user` in (what initgroups(3) would set, for local files). */
function memberGroups(user: string): number[] {
  const ids: number[] = [];
  for (const line of readText("/etc/group").split("\n")) {
    const [, , gid, members] = line.split(":");
    if (gid && /^\d+$/.test(gid) && (members ?? "").split(",").includes(user)) ids.push(Number(gid));
  }
  return ids;
}

/**
 * ServiceUsers makes and finds the users workloads run as. A root engine runs each service as
 * a system user of its own (as systemd's DynamicUser= and Nomad's exec driver do), made on
 * first launch with `useradd --system`, no login shell, and the service's data dir as home.
 */
export class ServiceUsers {
  private gpuGroupIds: number[] | null = null;

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
   * ensureServiceUser returns the service's own user, making it when it does not exist. A
   * recorded uid (from the service's row) is asked for again when the user must be remade,
   * so files the old user owned stay its own. A user of that name the engine did not make (its
   * comment differs) is never taken over: that is an error.
   */
  async ensureServiceUser(serviceName: string, home: string, recorded: RecordedUser | null): Promise<WorkloadUser> {
    const name = serviceUserName(serviceName);
    for (let attempt = 0; ; attempt++) {
      const entry = findPasswd(name);
      if (entry) {
        if (!entry.comment.startsWith(SERVICE_USER_COMMENT)) {
          throw new AppError(
            "internal",
            `the host already has a user ${name} that the engine did not create (its comment is ${JSON.stringify(entry.comment)}): rename the service or that user`,
          );
        }
        return { name, uid: entry.uid, gid: entry.gid, groups: this.gpuGroups(), home };
      }
      const useradd = Bun.which("useradd") ?? "/usr/sbin/useradd";
      const uidFree = recorded !== null && recorded.name === name && findPasswd(String(recorded.uid)) === null;
      const argv = [
        useradd,
        "--system",
        "--user-group",
        "--no-create-home",
        "--home-dir",
        home,
        "--shell",
        Bun.which("nologin") ?? "/usr/sbin/nologin",
        "--comment",
        `${SERVICE_USER_COMMENT} ${serviceName}`,
        ...(uidFree ? ["--uid", String(recorded.uid)] : []),
        name,
      ];
      let proc: ReturnType<typeof Bun.spawn<"ignore", "ignore", "pipe">>;
      try {
        proc = Bun.spawn(argv, { stdin: "ignore", stdout: "ignore", stderr: "pipe" });
      } catch (error) {
        throw new AppError("internal", `cannot run useradd to make the service's user ${name}: ${(error as Error).message}`);
      }
      const [stderr, code] = await Promise.all([new Response(proc.stderr).text(), proc.exited]);
      if (code === 0) continue; // read it back, with the ids useradd chose
      // Another useradd holds the lock, or made the same user a moment ago: look again.
      if ((code === LOCK_BUSY_EXIT || code === 9) && attempt < 20) {
        await Bun.sleep(50 + attempt * 25);
        continue;
      }
      throw new AppError("internal", `useradd could not make the service's user ${name} (exit ${code}): ${stderr.trim().slice(0, 300)}`);
    }
  }
}
