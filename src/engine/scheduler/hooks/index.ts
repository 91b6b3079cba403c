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
 * - user next (it may create an OS user and chown the data dir: slow, and it needs the data dir);
 *   workdir then checks the directory against that user; database last, since initdb runs as
 *   the server's user, is the slowest step, and is aborted by a stop.
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
import type { PrepareHook, PrestartHook } from "./types";
import { userHook } from "./user";
import { workdirHook } from "./workdir";

export type { EnvParts, HookHost, Launch, ManagedDatabase, PrepareHook, PrestartHook } from "./types";
export { userEnv } from "./user";

/** PREPARE_HOOKS run, in order and synchronously, before the run is recorded. */
export const PREPARE_HOOKS: readonly PrepareHook[] = [bindingsHook, secretsHook, gpuHook, environmentHook];

/** PRESTART_HOOKS run, in order, once the run is on record and before its process is spawned. */
export const PRESTART_HOOKS: readonly PrestartHook[] = [directoriesHook, userHook, workdirHook, databaseHook, commandHook];
