/**
 * The provider interface: what the console asks of whatever runs hosted machines ("boxes").
 *
 * Every operation is keyed by the box id (the allocation's id) and is idempotent, so the
 * provisioner can repeat any of them after a crash, a timeout or a retry without creating
 * a second box or losing one (Daytona's desired-vs-actual model): `create` of a box that
 * exists is done, `start` of a running box is done, `stop` of a stopped or unknown box is
 * done, `destroy` of an unknown box is done, and `backup` with a backup id already taken
 * answers the one taken. `status` asks the provider itself (the process table for the local
 * provider), never the console's database, so the provisioner can compare what it wants
 * with what is.
 */

/** BoxState is what the provider finds: no box, a box with no engine running, one starting, one answering. */
export type BoxState = "absent" | "stopped" | "starting" | "running";

/** BoxStatus is one observation of a box at the provider. */
export interface BoxStatus {
  state: BoxState;
  /** version is the engine release the box runs (or will run when started); null when absent. */
  version: string | null;
  /** pids are the box engine's processes the provider found (the local provider: one). */
  pids: number[];
}

/** BoxSpec is what a new box is made from: an engine release and a template version. */
export interface BoxSpec {
  version: string;
  templateVersion: string;
}

/** BackupInfo describes a finished backup at the provider. */
export interface BackupInfo {
  id: string;
  sizeBytes: number;
  takenAt: number;
}

/** BoxEndpoint is how the console host reaches a box's engine API: a unix socket (admin) or a URL. */
export interface BoxEndpoint {
  unix?: string;
  url: string;
}

/** DestroyResult says whether a box is gone (`done`) or the provider still owes part of the delete (`pending`). */
export type DestroyResult = "done" | "pending";

/** BoxProvider runs boxes. Implementations: `local` (engine processes on this host), `scripted` (faults, for tests). */
export interface BoxProvider {
  readonly name: string;
  /** releases are the engine versions this provider can run a box on, oldest first. */
  releases(): string[];
  /** create makes the box (stopped); an existing box is left as it is. */
  create(id: string, spec: BoxSpec): Promise<void>;
  /** start runs the box's engine and resolves once it answers; a running box is done. An absent box is `box_absent`. */
  start(id: string): Promise<void>;
  /** stop ends the box's engine and its workloads, keeping its data (sleep); a stopped or absent box is done. */
  stop(id: string): Promise<void>;
  /** status observes the box at the provider. */
  status(id: string): Promise<BoxStatus>;
  /** update moves a stopped box to another release; `box_running` while it runs, `version_unknown` for a release not offered. */
  update(id: string, version: string): Promise<void>;
  /** backup takes a consistent backup of the box (running or not) under `backupId`; a backup id already taken answers it again. */
  backup(id: string, backupId: string): Promise<BackupInfo>;
  /** restore makes box `id` (stopped) from a backup of box `sourceId`; an existing box `id` is left as it is. */
  restore(sourceId: string, backupId: string, id: string, spec: BoxSpec): Promise<void>;
  /** forgetBackup removes a backup's files; an unknown one is done. */
  forgetBackup(sourceId: string, backupId: string): Promise<void>;
  /** destroy removes the box and everything it runs; an unknown box is `done`. */
  destroy(id: string): Promise<DestroyResult>;
  /** endpoint says how the console host reaches the box's engine API. */
  endpoint(id: string): BoxEndpoint;
}
