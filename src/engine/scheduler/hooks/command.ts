import { plainCommand } from "../../../lib/shell";
import type { PrestartHook } from "./types";

/**
 * commandHook runs a command string that needs nothing of the shell (lib/shell.ts
 * plainCommand: `exec sleep 600`, `python3 app.py --port 8000`) as the argv the shell would
 * have made of it, without /bin/sh: one exec fewer at every start and restart, and no shell
 * left resident beside a workload started without `exec`. The shell would also have set PWD
 * to its working directory; the run gets it too, unless the deploy's env sets it. The command
 * on record, and what the API shows, stay as deployed.
 */
export const commandHook: PrestartHook = {
  name: "command",
  run(launch) {
    const argv = plainCommand(launch.argv);
    if (!argv) return;
    launch.argv = argv;
    if (!("PWD" in launch.spec.env)) launch.env.PWD = launch.cwd;
  },
};
