import { dlopen, FFIType, ptr } from "bun:ffi";
import { readFileSync } from "node:fs";

function cStrings(values: string[]): { pointers: BigUint64Array; keep: Buffer[] } {
  const keep = values.map((value) => Buffer.from(`${value}\0`, "utf8"));
  const pointers = new BigUint64Array(keep.length + 1);
  keep.forEach((buffer, index) => {
    pointers[index] = BigInt(ptr(buffer));
  });
  pointers[keep.length] = 0n;
  return { pointers, keep };
}

/**
 * reexecSelf replaces this process with a fresh copy of itself through execve(2): the same
 * executable (/proc/self/exe), the same argv (/proc/self/cmdline), the same environment and
 * working directory, and the same pid — so npm, a shell or systemd (Type=simple) that
 * started the daemon keeps watching the right process. It returns only if execve failed.
 * Callers close listeners and databases first; descriptors opened with O_CLOEXEC close on exec.
 */
export function reexecSelf(env: Record<string, string | undefined> = process.env): Error {
  try {
    const argv = readFileSync("/proc/self/cmdline", "utf8").split("\0");
    if (argv.at(-1) === "") argv.pop();
    const envp = Object.entries(env)
      .filter((entry): entry is [string, string] => entry[1] !== undefined)
      .map(([key, value]) => `${key}=${value}`);
    const libc = dlopen("libc.so.6", { execve: { args: [FFIType.cstring, FFIType.ptr, FFIType.ptr], returns: FFIType.i32 } });
    const path = Buffer.from("/proc/self/exe\0");
    const args = cStrings(argv);
    const environment = cStrings(envp);
    libc.symbols.execve(ptr(path), ptr(args.pointers), ptr(environment.pointers));
    // Reaching this line means execve failed; the buffers above stayed alive until here.
    return new Error(`execve(/proc/self/exe) failed (kept ${args.keep.length} args, ${environment.keep.length} env)`);
  } catch (error) {
    return error as Error;
  }
}
