import type { PrestartHook } from "./types";

/**
 * directoriesHook makes the service's data dir (its user's, with the mode its kind needs), off
 * the event loop: a new directory waits for the disk's journal, 1 ms a batch job on a busy
 * disk, and the daemon's loop served nothing meanwhile. The engine's own
 * `services/<id>/{logs,runs/<run>}` are the shim's to make (0700, the run's 0750). A disk too
 * full for it fails the launch as ENOSPC, which queues the service again (exit.ts).
 */
export const directoriesHook: PrestartHook = {
  name: "directories",
  async run(launch, host) {
    await host.ensureDir(launch.dataDir, host.dataDirMode(launch.spec));
  },
};
