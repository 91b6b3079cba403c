import { dlopen, type FFIFunction, FFIType, type Library } from "bun:ffi";

/**
 * The engine makes a few C library calls in-process through bun:ffi, where Bun has no API of
 * its own: the account files' lock and NSS lookups (engine/users/libc.ts), socket options of
 * the listeners a restart hands over (sockets.ts), a proxy process's CPU (affinity.ts), the
 * execve of a restart in place and the reaping of the children from before it. They all load
 * the C library here, the one way: each caller names the calls it needs (bun:ffi compiles
 * a trampoline per call, on first use), and gets null where there is no glibc to load.
 */

/** openLibc loads `symbols` from the C library; null where it cannot (not Linux, or no glibc: musl's has another name). */
export function openLibc<Fns extends Record<string, FFIFunction>>(symbols: Fns): Library<Fns>["symbols"] | null {
  if (process.platform !== "linux") return null;
  try {
    return dlopen("libc.so.6", symbols).symbols;
  } catch {
    return null;
  }
}

const WNOHANG = 1;
let waitpid: ((pid: number, status: null, options: number) => number) | null | undefined;

/**
 * reapNoHang collects the exit status of the child `pid` if it has ended, without waiting
 * (waitpid(2) with WNOHANG): for a child this process started before it re-executed itself,
 * which the new image's Bun knows nothing of, so that none stays a zombie. It answers as
 * waitpid does: the pid once the child has ended (reaped now), 0 while it runs, and -1 when it
 * is not a child of this process (or was reaped already) or the C library cannot be loaded.
 */
export function reapNoHang(pid: number): number {
  if (waitpid === undefined) {
    const symbols = openLibc({ waitpid: { args: [FFIType.i32, FFIType.ptr, FFIType.i32], returns: FFIType.i32 } });
    waitpid = symbols ? (symbols.waitpid as unknown as typeof waitpid) : null;
  }
  return waitpid ? waitpid(pid, null, WNOHANG) : -1;
}
