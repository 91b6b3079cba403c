import type { PrepareHook } from "./types";

/**
 * directoriesHook makes the service's data dir (its user's, with the mode its kind needs). The
 * engine's own `services/<id>/{logs,runs/<run>}` are the shim's to make (0700, the run's 0750):
 * off the daemon's event loop, where each mkdir cost 25-200 us on a busy disk.
 */
export const directoriesHook: PrepareHook = {
  name: "directories",
  run(launch, host) {
    host.ensureDir(launch.dataDir, host.dataDirMode(launch.spec));
  },
};
