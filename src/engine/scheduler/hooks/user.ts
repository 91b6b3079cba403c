import type { WorkloadUser } from "../../users";
import type { PrestartHook } from "./types";

/** userEnv is HOME, USER and LOGNAME of the user a workload runs as (the daemon's own would name root). */
export function userEnv(user: WorkloadUser | null): Record<string, string> {
  return user ? { HOME: user.home, USER: user.name, LOGNAME: user.name } : {};
}

/**
 * userHook decides who the run is: the service's workload user (made on first use, its data
 * dir given to it), joined to the groups of the SQLite databases this version binds to (a
 * binding removed takes the group away at the next launch). That user's HOME, USER and
 * LOGNAME replace the daemon's, unless the deploy's env sets them.
 */
export const userHook: PrestartHook = {
  name: "user",
  async run(launch, host) {
    const user = await host.workloadUser(launch.service.id);
    launch.user = user ? { ...user, groups: [...new Set([...user.groups, ...host.fileBindingGroups(launch.spec)])] } : null;
    for (const [key, value] of Object.entries(userEnv(launch.user))) if (!(key in launch.spec.env)) launch.env[key] = value;
  },
};
