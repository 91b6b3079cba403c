import type { Database } from "bun:sqlite";
import { statfsSync, unlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Ready } from "../../contract/engine";
import type { SinkState } from "../../lib/logger";

/** PROBE_BYTES is what the writability probe writes: one page, as a small real write needs. */
const PROBE_BYTES = 4096;

/**
 * checkReady answers GET /api/ready: the database takes a query, the data dir takes a small
 * write (a full disk says no here, issue 13), how much room is left, and whether every log
 * sink writes. It touches only the engine's own data dir; health touches nothing.
 */
export function checkReady(options: { dataDir: string; db: Database; logSinks: () => SinkState[] }): Ready {
  let database = false;
  try {
    database = options.db.query("SELECT 1 AS one").get() !== null;
  } catch {
    // closed or broken: not ready
  }
  let writable = false;
  const probe = join(options.dataDir, ".ready-probe");
  try {
    writeFileSync(probe, Buffer.alloc(PROBE_BYTES), { mode: 0o600 });
    writable = true;
  } catch {
    // ENOSPC, EDQUOT, EROFS...: not writable
  } finally {
    try {
      unlinkSync(probe);
    } catch {
      // never created
    }
  }
  let free = 0;
  try {
    const stats = statfsSync(options.dataDir);
    free = Number(stats.bavail) * Number(stats.bsize);
  } catch {
    // unknown: 0
  }
  return {
    ready: database && writable,
    database,
    data_dir_writable: writable,
    data_dir_free_bytes: free,
    log_writable: options.logSinks().every((sink) => !sink.failing),
  };
}
