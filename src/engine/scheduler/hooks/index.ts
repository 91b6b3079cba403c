/**
 * Package hooks is a launch as an ordered list of small steps, the way Nomad's task runner
 * launches a task through its prestart hooks. The runner (../runner.ts) builds a Launch, runs
 * PREPARE_HOOKS, records the run, runs PRESTART_HOOKS and hands the launch to the supervisor.
 *
 * The order, and why:
 * - bindings, secrets, gpu fill the environment's parts; environment assembles them in their
 *   precedence (a secret beats a binding of the same name, the GPU variables beat both).
 * - The run is recorded between the two lists: its row keeps the env's keys, and a daemon that
 *   dies from here on finds the run and recovers it from its directory, never starting a
 *   second copy. That is why the prepare hooks are synchronous and the slow ones come after.
 * - directories first of these: every later step, and the workload, writes there. It waits on
 *   the disk, so it runs off the event loop; a full disk fails the launch as ENOSPC, and the
 *   exit plan queues the service again (pending, "the disk is full"), never failed.
 * - user beside it (it may create an OS user, whose account files wait on the disk too): the
 *   two waits overlap, and the user hook waits for the data dir only to give it to the user
 *   (ServiceFiles.ensureAsync joins the directory hook's mkdir under way). Workdir then checks
 *   the directory against that user; database last, since initdb runs as the server's user, is
 *   the slowest step, and is aborted by a stop.
 * - command last: the argv is final once the database hook gave an adapter's; a plain command
 *   string runs without the shell from here.
 */
import { bindingsHook } from "./bindings";
import { commandHook } from "./command";
import { databaseHook } from "./database";
import { directoriesHook } from "./directories";
import { environmentHook } from "./environment";
import { gpuHook } from "./gpu";
import { secretsHook } from "./secrets";
import type { HookHost, Launch, PrepareHook, PrestartHook } from "./types";
import { userHook } from "./user";
import { workdirHook } from "./workdir";

export type { EnvParts, HookHost, Launch, ManagedDatabase, PrepareHook, PrestartHook } from "./types";
export { userEnv } from "./user";

/** PREPARE_HOOKS run, in order and synchronously, before the run is recorded. */
export const PREPARE_HOOKS: readonly PrepareHook[] = [bindingsHook, secretsHook, gpuHook, environmentHook];

/**
 * PRESTART_HOOKS run once the run is on record and before its process is spawned: stage after
 * stage, the hooks of one stage together (runPrestart).
 */
export const PRESTART_HOOKS: readonly (readonly PrestartHook[])[] = [
  [directoriesHook, userHook],
  [workdirHook],
  [databaseHook],
  [commandHook],
];

/**
 * runPrestart runs the prestart stages in order. A stage's hooks run together, and the stage
 * ends once all of them have: a failure is thrown only then (the first hook's in the stage's
 * order), so no hook of a failed launch is still at work when the launch is settled.
 */
export async function runPrestart(
  launch: Launch,
  host: HookHost,
  stages: readonly (readonly PrestartHook[])[] = PRESTART_HOOKS,
): Promise<void> {
  for (const stage of stages) {
    if (stage.length === 1) {
      await stage[0]?.run(launch, host);
      continue;
    }
    const results = await Promise.allSettled(stage.map(async (hook) => hook.run(launch, host)));
    const failed = results.find((result): result is PromiseRejectedResult => result.status === "rejected");
    if (failed) throw failed.reason;
  }
}
