import { rmSync } from "node:fs";

/**
 * Directories a test process shares between its test files (a compiled build) and removes once
 * the whole run is over, by test/preload.ts: `bun test` fires no `exit` or `beforeExit` event,
 * so a removal hung on one never ran, and each run left its builds (250 MB) in the temp dir.
 */
const dirs = new Set<string>();

/** removeAfterRun marks `dir` for removal at the end of the run, and answers it. */
export function removeAfterRun(dir: string): string {
  dirs.add(dir);
  return dir;
}

/** removeRunDirs removes the marked directories (what cannot be removed is left). */
export function removeRunDirs(): void {
  for (const dir of dirs) {
    try {
      rmSync(dir, { recursive: true, force: true });
    } catch {
      // busy or gone: left as it is
    }
  }
  dirs.clear();
}
