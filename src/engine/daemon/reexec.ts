import { FFIType, ptr } from "bun:ffi";
import { readFileSync, writeSync } from "node:fs";
import { allocatorSettled, keepFreedPages } from "../../lib/allocator";
import { openLibc, reapNoHang } from "../../lib/libc";

function cStrings(values: string[]): { pointers: BigUint64Array; keep: Buffer[] } {
  const keep = values.map((value) => Buffer.from(`${value}\0`, "utf8"));
  const pointers = new BigUint64Array(keep.length + 1);
  keep.forEach((buffer, index) => {
    pointers[index] = BigInt(ptr(buffer));
  });
  pointers[keep.length] = 0n;
  return { pointers, keep };
}

/** commandLine is this process's argv, as the kernel has it (/proc/self/cmdline). */
export function commandLine(): string[] {
  const argv = readFileSync("/proc/self/cmdline", "utf8").split("\0");
  if (argv.at(-1) === "") argv.pop();
  return argv;
}

/** SAME_IMAGE is the executable a restart runs again: this process's own, even if its file was replaced since. */
export const SAME_IMAGE = "/proc/self/exe";

/**
 * reexecSelf replaces this process with a fresh copy of itself through execve(2): the
 * executable `path` (this process's own image by default; an upgrade names the new binary's
 * path), the same argv (/proc/self/cmdline), the given environment, the same working
 * directory, and the same pid — so npm, a shell or systemd (Type=simple) that started the
 * daemon keeps watching the right process. It returns only if execve failed. Callers close
 * listeners and databases first; descriptors opened with O_CLOEXEC close on exec.
 */
export function reexecSelf(env: Record<string, string | undefined> = process.env, path: string = SAME_IMAGE): Error {
  try {
    const argv = commandLine();
    const envp = Object.entries(env)
      .filter((entry): entry is [string, string] => entry[1] !== undefined)
      .map(([key, value]) => `${key}=${value}`);
    const libc = openLibc({ execve: { args: [FFIType.cstring, FFIType.ptr, FFIType.ptr], returns: FFIType.i32 } });
    if (!libc) return new Error("execve is not available: the C library cannot be loaded here");
    const file = Buffer.from(`${path}\0`);
    const args = cStrings(argv);
    const environment = cStrings(envp);
    libc.execve(ptr(file), ptr(args.pointers), ptr(environment.pointers));
    // Reaching this line means execve failed; the buffers above stayed alive until here.
    return new Error(`execve(${path}) failed (kept ${args.keep.length} args, ${environment.keep.length} env)`);
  } catch (error) {
    return error as Error;
  }
}

/**
 * startWithAllocatorSettings starts this process again, with the same argv and pid, when it
 * started without the allocator's setting (keepFreedPages): mimalloc reads it only at a
 * process's start (decision 526). A daemon's restarts and upgrades pass it on in their
 * environment, so only the first start pays for the second one (~30 ms from source, ~110 ms
 * for the compiled binary, which parses its whole bundle first). Where execve fails, it
 * returns, and the process goes on with the allocator's defaults.
 */
export function startWithAllocatorSettings(env: Record<string, string | undefined> = process.env): void {
  if (allocatorSettled(env)) return;
  const error = reexecSelf(keepFreedPages(env));
  try {
    writeSync(2, `engine: runs with the allocator's defaults: ${error.message}\n`);
  } catch {
    // no stderr: the daemon runs all the same
  }
}

/** awaiting are the pids reapWhenGone waits for now: a later restart in place passes them on. */
const awaiting = new Set<number>();

/** pidsAwaitingReap are the children of this pid, from before its execve, that have not ended yet. */
export function pidsAwaitingReap(): number[] {
  return [...awaiting];
}

/**
 * reapWhenGone waits (polling) for a child this process did not spawn
 * through Bun to exit, and reaps it so that it leaves no zombie: the stand-in of a restart is
 * the child of the daemon's pid from before its execve, which the new image knows nothing of,
 * and so is a shim launcher, which holds its runs until the last has ended, however long that
 * is (decision 508). It looks every 50 ms at first, then less often, up to once a second.
 */
export async function reapWhenGone(pid: number): Promise<void> {
  awaiting.add(pid);
  try {
    for (let interval = 50; ; interval = Math.min(interval * 2, 1000)) {
      // WNOHANG: the pid once it has exited, 0 while it runs, -1 when it is not a child (gone).
      const reaped = reapNoHang(pid);
      if (reaped !== 0) return;
      await Bun.sleep(interval);
    }
  } finally {
    awaiting.delete(pid);
  }
}
