import { existsSync } from "node:fs";
import { firstUnreachableBy } from "../../users";
import type { PrestartHook } from "./types";

/**
 * workdirHook refuses a working directory that is not there, and one chosen in the deploy that
 * the run's user could not enter by itself: the shim enters it as root before it drops to the
 * user, so a `cwd` under a closed directory would hand the workload what is inside.
 */
export const workdirHook: PrestartHook = {
  name: "workdir",
  run(launch) {
    const { cwd, user } = launch;
    // The data dir, where most runs work, is there: the directories hook has just made sure of it.
    if (cwd !== launch.dataDir && !existsSync(cwd)) throw new Error(`the working directory ${cwd} does not exist`);
    const closed = user && launch.spec.cwd !== null && cwd === launch.spec.cwd ? firstUnreachableBy(cwd, user) : null;
    if (closed) throw new Error(`the working directory ${cwd} is not reachable by the user ${user?.name}: it may not enter ${closed}`);
  },
};
