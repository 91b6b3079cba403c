import { FFIType, ptr } from "bun:ffi";
import { openLibc } from "../../lib/libc";

/**
 * Libc is the few C library calls the engine makes in-process: an advisory fcntl lock (the
 * lock lckpwdf(3) takes, without its blocking wait) and NSS lookups (getpwnam(3) and friends:
 * LDAP, sssd, systemd's dynamic users), each of which used to cost a process, and the inode
 * flags chattr(1) sets (layout.ts's spreadServiceTrees).
 */
export interface Libc {
  /** tryWriteLock takes a whole-file write lock on an open fd without waiting; false when another process holds it. */
  tryWriteLock(fd: number): boolean;
  /** userExists says whether NSS knows a user by name or uid. */
  userExists(nameOrUid: string | number): boolean;
  /** groupExists says whether NSS knows a group by name or gid. */
  groupExists(nameOrGid: string | number): boolean;
  /**
   * addInodeFlags sets inode flags (chattr's, FS_*_FL) on an open file, keeping those it has;
   * false where its file system has no such flags or refuses them (tmpfs, XFS, btrfs).
   */
  addInodeFlags(fd: number, flags: number): boolean;
}

// Linux's generic values (x86_64 and aarch64 alike): F_SETLK, F_WRLCK, SEEK_SET, and struct flock
// { short l_type; short l_whence; off_t l_start; off_t l_len; pid_t l_pid; }, 32 bytes on 64-bit.
const F_SETLK = 6;
const F_WRLCK = 1;
const FLOCK_SIZE = 32;
// FS_IOC_GETFLAGS and FS_IOC_SETFLAGS (_IOR/_IOW('f', 1/2, long) on 64-bit; the kernel reads an int).
const FS_IOC_GETFLAGS = 0x80086601;
const FS_IOC_SETFLAGS = 0x40086602;

let loaded: Libc | null | undefined;

/** libc returns the calls, or null where the C library cannot be loaded (musl, not 64-bit Linux): callers fall back to tools. */
export function libc(): Libc | null {
  if (loaded !== undefined) return loaded;
  loaded = null;
  // The structures below are laid out as on 64-bit Linux.
  if (process.arch !== "x64" && process.arch !== "arm64") return null;
  const symbols = openLibc({
    fcntl: { args: [FFIType.i32, FFIType.i32, FFIType.ptr], returns: FFIType.i32 },
    getpwnam: { args: [FFIType.cstring], returns: FFIType.ptr },
    getpwuid: { args: [FFIType.u32], returns: FFIType.ptr },
    getgrnam: { args: [FFIType.cstring], returns: FFIType.ptr },
    getgrgid: { args: [FFIType.u32], returns: FFIType.ptr },
    ioctl: { args: [FFIType.i32, FFIType.u64, FFIType.ptr], returns: FFIType.i32 },
  });
  if (!symbols) return null;
  const cstring = (text: string) => ptr(Buffer.from(`${text}\0`, "utf8"));
  loaded = {
    tryWriteLock(fd) {
      const flock = new Uint8Array(FLOCK_SIZE);
      new DataView(flock.buffer).setInt16(0, F_WRLCK, true); // l_whence, l_start, l_len 0: SEEK_SET, the whole file
      return symbols.fcntl(fd, F_SETLK, ptr(flock)) === 0;
    },
    userExists(key) {
      return (typeof key === "number" ? symbols.getpwuid(key) : symbols.getpwnam(cstring(key))) !== null;
    },
    groupExists(key) {
      return (typeof key === "number" ? symbols.getgrgid(key) : symbols.getgrnam(cstring(key))) !== null;
    },
    addInodeFlags(fd, flags) {
      const value = new Int32Array(2); // room for a long, as the request's size says
      if (symbols.ioctl(fd, FS_IOC_GETFLAGS, ptr(value)) !== 0) return false;
      if (((value[0] ?? 0) & flags) === flags) return true;
      value[0] = (value[0] ?? 0) | flags;
      return symbols.ioctl(fd, FS_IOC_SETFLAGS, ptr(value)) === 0;
    },
  };
  return loaded;
}
