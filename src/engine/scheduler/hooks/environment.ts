import { assembleRunEnv } from "../../services/env";
import type { PrepareHook } from "./types";

/**
 * environmentHook assembles the run's environment from the parts the hooks before it filled,
 * the deploy's env and the daemon's passed-through variables, in assembleRunEnv's precedence.
 * It names the sources for Diagnosis ("engine+bindings:db+env+secrets+gpu") and the keys, never
 * the values, for the run's row.
 */
export const environmentHook: PrepareHook = {
  name: "environment",
  run(launch, host) {
    const { spec, parts } = launch;
    const { env, injectedKeys } = assembleRunEnv({ base: host.baseEnv, env: spec.env, ...parts });
    launch.env = env;
    launch.injectedKeys = injectedKeys;
    launch.envSource = [
      "engine",
      spec.bindings.length ? `bindings:${spec.bindings.join(",")}` : "",
      "env",
      spec.secret_keys.length ? "secrets" : "",
      launch.hold ? "gpu" : "",
    ]
      .filter(Boolean)
      .join("+");
  },
};
