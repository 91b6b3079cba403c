import type { DatabaseEngine, DatabaseInstance } from "../../databases";
import type { BoundService } from "../../services/env";
import type { ServiceSpec } from "../../services/spec";
import type { GpuHold, ServiceRow, VersionRow } from "../../services/store";
import type { WorkloadUser } from "../../users";

/** ManagedDatabase is a managed database service's adapter and the instance it works on. */
export interface ManagedDatabase {
  adapter: DatabaseEngine;
  instance: DatabaseInstance;
}

/**
 * EnvParts are the run's environment by source, merged by assembleRunEnv in its precedence
 * (engine < bindings < env < secrets < gpu, over the daemon's passed-through variables).
 */
export interface EnvParts {
  engine: Record<string, string>;
  bindings: Record<string, string>;
  secrets: Record<string, string>;
  gpu: Record<string, string>;
}

/**
 * Launch is one launch of one service as its hooks see it: the rows it launches from, the run
 * it makes, and what the hooks fill in (the environment, the command, the user) before the
 * runner hands it to the supervisor.
 */
export interface Launch {
  service: ServiceRow;
  version: VersionRow;
  spec: ServiceSpec;
  runId: string;
  runDir: string;
  /** dataDir is the service's own directory, `<data-dir>/data/<name>`. */
  dataDir: string;
  /** cwd is where the run starts: its build's checkout, the deploy's cwd, or the data dir. */
  cwd: string;
  hold: GpuHold | null;
  database: ManagedDatabase | null;
  /** parts are filled by the prepare hooks; env is assembled from them (environmentHook) before the prestart hooks. */
  parts: EnvParts;
  env: Record<string, string>;
  /** injectedKeys are the names env holds (no values), for the run's row; envSource names its sources, for Diagnosis. */
  injectedKeys: string[];
  envSource: string;
  argv: string[];
  user: WorkloadUser | null;
  /** signal aborts the launch's setup (a database's initialization) when the service is stopped or deleted meanwhile. */
  signal: AbortSignal;
  /** status shows how the launch is going in the service's status_message. */
  status(message: string): void;
}

/** HookHost is what the hooks read from the rest of the engine; ServiceManager provides it. */
export interface HookHost {
  /** baseEnv is the daemon's environment, of which workloads inherit PATH, HOME, LANG and a few others. */
  baseEnv: Record<string, string | undefined>;
  /** serviceDataDir is a service's own directory, `<data-dir>/data/<name>`; serviceDir the engine's, `<data-dir>/services/<id>`. */
  serviceDataDir(name: string): string;
  serviceDir(serviceId: string): string;
  /** ensureDir makes a directory with its mode (once per daemon), off the event loop; its parent must exist. */
  ensureDir(dir: string, mode?: number): Promise<void>;
  /** dataDirMode is the mode of a service's data dir (0700, or 2770 for a database bound through its files). */
  dataDirMode(spec: ServiceSpec): number;
  findService(name: string): ServiceRow | null;
  /** boundService is what a service bound to another may know of it (its port, env, secrets, database bindings). */
  boundService(service: ServiceRow): BoundService;
  openSecrets(version: VersionRow): Record<string, string>;
  /** workloadUser is who the service's code runs as (null: the engine's own user), its data dir given to that user. */
  workloadUser(serviceId: string): Promise<WorkloadUser | null>;
  /** fileBindingGroups are the groups of the SQLite databases `spec` binds to, which the run joins. */
  fileBindingGroups(spec: ServiceSpec): number[];
  appendLog(serviceId: string, line: string): void;
}

/**
 * PrepareHook is one step of a launch before its run is recorded: synchronous, so that nothing
 * (a stop, another placement pass) comes between the placement and the run's record.
 */
export interface PrepareHook {
  name: string;
  run(launch: Launch, host: HookHost): void;
}

/**
 * PrestartHook is one step of a launch once its run is on record, as Nomad's task runner has its prestart hooks: it reads
 * the launch and the host and adds to the launch (env parts, env, argv, user). A hook that
 * throws fails the launch: the run ends with ESETUP (ENOSPC on a full disk) before it started.
 */
export interface PrestartHook {
  name: string;
  run(launch: Launch, host: HookHost): void | Promise<void>;
}
