#!/usr/bin/env bun
/**
 * The `engine` binary's entry. It loads what a process needs and nothing more. `engine __proxy`
 * is a proxy process (the way the compiled binary starts one when it cannot write the proxy's
 * own bundle, src/engine/proxy/processes.ts), which needs the proxy's two dozen modules, not
 * the daemon, the API, the console client and their libraries. A bundle evaluates every static
 * import at start, so each side is a dynamic import: a proxy process that loaded the whole CLI
 * held a 27 MB heap and 122 MB resident, and every garbage collection scanned it while
 * requests waited (docs/decisions.md 484).
 */
export {};

if (import.meta.main && process.argv[2] === "__proxy") {
  const { runProxyProcess } = await import("../src/engine/proxy/main");
  runProxyProcess();
} else if (import.meta.main) {
  // The daemon's allocator keeps the pages it frees, a setting read when the process starts: a
  // daemon started without it starts itself again, once, with it, as the same pid (decision 526).
  if (process.argv.includes("serve")) (await import("../src/engine/daemon/reexec")).startWithAllocatorSettings();
  const { main } = await import("./program");
  const code = await main(process.argv);
  // `serve` keeps running on its own; every other command ends here.
  if (code !== 0 || !process.argv.includes("serve")) process.exit(code);
}
