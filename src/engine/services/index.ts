import type {
  Diagnosis,
  GpuInventoryRecord,
  LogLine,
  RevealedConnection,
  ServiceDeploy,
  ServicePatch,
  ServiceRecord,
  ServiceStatsRecord,
} from "../../contract/engine";
import type { Principal } from "../auth";
import type { LogCursor, LogRecord } from "./logs";

export { describeExit } from "../scheduler/exit";
export { followLog, formatCursor, type LogCursor, type LogRecord, parseCursor, parseLogLine, tailLog, tailRecords } from "./logs";
export { type ManagerOptions, ServiceManager } from "./manager";
export { decideAfterExit, defaultRestartPolicy, type RestartPolicy, type RestartState } from "./restart-policy";
export { type ServiceRouteDeps, serviceRoutes } from "./routes";
export { applyPatch, deployOf, normalizeDeploy, type ServiceSpec } from "./spec";
export { type LiveWorkload, ServiceStore } from "./store";

export type ServiceAction = "start" | "stop" | "restart" | "pause" | "resume";

/**
 * ServiceChange is what a change listener is told besides the id: the service's status and
 * port after the change, or null once it is deleted, so that listeners that care about few
 * services (the proxy's routes: those with a port) need not read the whole record of each.
 */
export type ServiceChange = { status: string; port: number | null } | null;
export type ServiceChangeListener = (serviceId: string, change: ServiceChange) => void;

/**
 * ServiceDirectory is what the API asks of the services module; ServiceManager implements it.
 * Handlers stay thin: they validate, check scope, call one of these and answer.
 */
export interface ServiceDirectory {
  deploy(body: ServiceDeploy, principal: Principal): Promise<{ record: ServiceRecord; created: boolean }>;
  /** patch makes a new version from the latest one with some settings changed; `changed` is false when it changed nothing. */
  patch(ident: string, patch: ServicePatch, principal: Principal): Promise<{ record: ServiceRecord; changed: boolean }>;
  /** revealConnection answers a managed database's connection details, password included (admins only), and logs who asked. */
  revealConnection(ident: string, principal: Principal): RevealedConnection;
  list(principal?: Principal): ServiceRecord[];
  get(ident: string): ServiceRecord;
  control(ident: string, action: ServiceAction): Promise<ServiceRecord>;
  remove(ident: string): Promise<void>;
  logs(ident: string, tail: number): LogLine[];
  /** logRecords answers a service's last `tail` log records with their cursors, and the cursor a follow starts from. */
  logRecords(ident: string, tail: number): { records: LogRecord[]; end: LogCursor };
  /** followLogs yields a service's log records after `from`, across rotations, until the signal aborts. */
  followLogs(ident: string, signal: AbortSignal, from: LogCursor): AsyncGenerator<LogRecord>;
  diagnose(ident: string): Diagnosis;
  /** serviceName resolves a name or id to the service's name, for scope checks. */
  serviceName(ident: string): string;
  gpuInventory(): GpuInventoryRecord;
  /** stats measures the live workloads the principal may see (CPU time, resident memory) from /proc. */
  stats(principal?: Principal): ServiceStatsRecord;
  restoreDatabase(
    name: string,
    dump: string,
    timeoutS: number,
  ): Promise<{ service_name: string; dump: string; engine: string; duration_s: number }>;
  /** drain refuses deploys and waits, at most until the deadline, for batch jobs to finish. */
  drain(deadline: number): Promise<void>;
  /** resumeAfterDrain takes deploys again after a restart that did not go through. */
  resumeAfterDrain(): void;
  /** subscribe calls `listener` with a service's id after every change of its record, its deletion included. */
  subscribe(listener: ServiceChangeListener): () => void;
  /** handOver stops in-process work and leaves workloads running for the next daemon. */
  handOver(): void;
}
