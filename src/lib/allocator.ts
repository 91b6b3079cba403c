/**
 * Bun's allocator (mimalloc) reads its settings from the environment once, when the process
 * starts. By default it hands pages it has freed back to the kernel 10 ms later, and a process
 * that allocates again soon after faults them in afresh: on a VM, where a fresh page costs up to
 * 12 µs, a daemon settling a flood of batch jobs and a proxy relaying thousands of requests a
 * second both paid for it (docs/decisions.md 431, 526).
 */

/** PURGE_DELAY_VAR is mimalloc's setting of how long freed pages wait before they go back to the kernel (ms; -1: never). */
export const PURGE_DELAY_VAR = "MIMALLOC_PURGE_DELAY";

/**
 * keepFreedPages is `env` with the allocator told to keep the pages it frees
 * (`MIMALLOC_PURGE_DELAY=-1`), unless the operator set that variable: what the daemon and its
 * proxy processes start with. The cost is a process that keeps its peak of freed memory: a
 * proxy process 53.8 against 48.6 MB after a burst of 256 TLS connections, the daemon 131
 * against 120 MB after three floods of 300 batch jobs.
 */
export function keepFreedPages<T extends Record<string, string | undefined>>(env: T): T & { [PURGE_DELAY_VAR]: string } {
  return { ...env, [PURGE_DELAY_VAR]: env[PURGE_DELAY_VAR] ?? "-1" };
}

/** allocatorSettled says whether this process started with the allocator's setting chosen (by keepFreedPages or the operator). */
export function allocatorSettled(env: Record<string, string | undefined>): boolean {
  return env[PURGE_DELAY_VAR] !== undefined;
}
