import { bindingVariables } from "../../services/env";
import type { PrepareHook } from "./types";

/**
 * bindingsHook gives the run the variables of the services it is bound to (`DB_HOST`,
 * `DB_PORT`, a database's URL and credentials). The placement pass launched it only once
 * every bound service was ready; one deleted meanwhile gives nothing.
 */
export const bindingsHook: PrepareHook = {
  name: "bindings",
  run(launch, host) {
    for (const name of launch.spec.bindings) {
      const bound = host.findService(name);
      if (bound) Object.assign(launch.parts.bindings, bindingVariables(host.boundService(bound)));
    }
  },
};
