import { join } from "node:path";
import type { PrepareHook } from "./types";

/**
 * directoriesHook makes what a run writes to: the service's data dir (its user's, with the
 * mode its kind needs), and `services/<id>/{logs,runs}`, the engine's own. The run's directory
 * itself is the shim's to make.
 */
export const directoriesHook: PrepareHook = {
  name: "directories",
  run(launch, host) {
    host.ensureDir(launch.dataDir, host.dataDirMode(launch.spec));
    const serviceDir = host.serviceDir(launch.service.id);
    host.ensureDir(join(serviceDir, ".."));
    host.ensureDir(serviceDir);
    host.ensureDir(join(serviceDir, "logs"));
    host.ensureDir(join(serviceDir, "runs"));
  },
};
