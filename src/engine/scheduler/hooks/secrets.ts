import type { PrepareHook } from "./types";

/**
 * secretsHook opens the version's sealed secrets into the run's environment. A managed
 * database's server gets none: its adapter initialized it with them, and a server has no
 * use for its own password in its environment.
 */
export const secretsHook: PrepareHook = {
  name: "secrets",
  run(launch, host) {
    if (!launch.database) launch.parts.secrets = host.openSecrets(launch.version);
  },
};
