import type { DatabaseConnection, RevealedConnection } from "../../contract/engine";
import { type Clock, iso } from "../../lib/clock";
import { AppError } from "../../lib/errors";
import type { Logger } from "../../lib/logger";
import type { Principal } from "../auth";
import {
  type DatabaseEngine,
  DatabaseEngines,
  type DatabaseInstance,
  freeTcpPort,
  type LastDump,
  RestoreCoordinator,
  type RestoreTarget,
  type RunAs,
  type ServerControl,
} from "../databases";
import { assembleRunEnv } from "./env";
import type { ServiceFiles } from "./files";
import type { ServiceSecrets } from "./secrets";
import type { ServiceSpec } from "./spec";
import type { ServiceRow, ServiceStore, VersionRow } from "./store";

/** PASSWORD_MASK stands for a secret in connection details shown without --reveal. */
const PASSWORD_MASK = "****";

export interface ManagedDatabasesOptions {
  store: ServiceStore;
  files: ServiceFiles;
  secrets: ServiceSecrets;
  clock: Clock;
  log: Logger;
  /** env is the daemon's environment, of which the database tools inherit the pass-through variables. */
  env: Record<string, string | undefined>;
  /** engines are the database adapters (default: every adapter this engine has). */
  engines?: DatabaseEngines;
  /** switchUsers: a root engine runs a Redis or SQLite service as the service's own user. */
  switchUsers: boolean;
  /** scratchDir holds downloaded dumps while they are restored. */
  scratchDir: string;
  trustedCas?: () => string[];
  /** server stops and starts a service's process for a restore that replaces its files: the coordinator's to do. */
  server: (serviceId: string) => ServerControl;
  onRestoreEnded?: (service: string, dump: LastDump) => void;
}

/**
 * ManagedDatabases is what the services module knows of the databases it manages (services
 * with `database.engine`): which adapter serves a spec, a deploy's credentials, port and
 * command, an instance's connection details (masked for a record, revealed to an admin), the
 * bindings' variables, and restores (RestoreCoordinator). The adapters themselves are
 * src/engine/databases.
 */
export class ManagedDatabases {
  /** restores restores dumps into the database services (POST /api/databases/{name}/restore). */
  readonly restores: RestoreCoordinator;
  private readonly engines: DatabaseEngines;

  constructor(private readonly o: ManagedDatabasesOptions) {
    this.engines = o.engines ?? new DatabaseEngines();
    this.restores = new RestoreCoordinator({
      engines: this.engines,
      host: {
        target: (name) => this.restoreTarget(name),
        log: (serviceId, line) => o.files.appendLog(serviceId, line),
        recordDump: (serviceId, dump) => {
          o.store.setLastDump(serviceId, dump, iso(o.clock.now()));
          const name = dump.result === "running" ? undefined : o.store.getService(serviceId)?.name;
          if (name) o.onRestoreEnded?.(name, dump);
        },
        server: o.server,
      },
      clock: o.clock,
      log: o.log,
      scratchDir: o.scratchDir,
      trustedCas: o.trustedCas,
    });
  }

  /** adapterOf is the adapter that manages a spec's database; null for other services and engines without an adapter. */
  adapterOf(spec: ServiceSpec): DatabaseEngine | null {
    const engine = spec.database?.engine;
    return engine && this.engines.available(engine) ? this.engines.get(engine) : null;
  }

  /** serverUserOf is the user a managed database's adapter runs its server as by itself (`postgres`, `mysql`); null for every other service. */
  serverUserOf(spec: ServiceSpec): string | null {
    return this.adapterOf(spec)?.serverUser ?? null;
  }

  /** bindsThroughFiles says whether `spec` is a managed database its bound services use through its files (SQLite). */
  bindsThroughFiles(spec: ServiceSpec): boolean {
    return this.adapterOf(spec)?.bindsThroughFiles ?? false;
  }

  /** of returns a managed database's adapter and instance; null for other services and engines without an adapter. */
  of(service: ServiceRow): { adapter: DatabaseEngine; instance: DatabaseInstance } | null {
    const version = this.o.store.currentVersion(service);
    const adapter = this.adapterOf(version.spec);
    return adapter ? { adapter, instance: this.instance(service, version) } : null;
  }

  /**
   * masked is a managed database's connection details with every secret shown as `****`: it
   * is built from the plain settings alone, so no secret is opened to make it.
   */
  masked(service: ServiceRow, spec: ServiceSpec): DatabaseConnection | null {
    const adapter = this.adapterOf(spec);
    if (!adapter || !spec.database) return null;
    const masked = Object.fromEntries(spec.secret_keys.map((key) => [key, PASSWORD_MASK]));
    const { password: _password, ...details } = adapter.connection({
      serviceId: service.id,
      serviceName: service.name,
      dataDir: this.o.files.dataDir(service.name),
      host: "127.0.0.1",
      port: spec.port,
      credentials: { ...spec.env, ...masked },
      env: {},
    });
    return { engine: spec.database.engine, ...details };
  }

  /**
   * reveal answers a managed database's connection details in full, password included (the
   * route is admin only). The reveal is written to the daemon's log and the service's log,
   * naming who asked; the details themselves never are.
   */
  reveal(service: ServiceRow, principal: Principal): RevealedConnection {
    const version = this.o.store.currentVersion(service);
    const engine = version.spec.database?.engine;
    if (!engine) {
      throw new AppError(
        "not_a_database",
        service.kind === "database"
          ? `${service.name} is a database that runs its own command: the engine manages no connection details for it`
          : `${service.name} is ${kindInWords(service.kind)}, not a database: it has no connection details`,
      );
    }
    const details = this.engines.get(engine).connection(this.instance(service, version));
    const who = principal.kind === "local" ? "the local socket" : `token ${principal.name} (${principal.tokenId})`;
    this.o.log.info({ service: service.name, by: principal.name, token_id: principal.tokenId }, "database connection details revealed");
    this.o.files.appendLog(service.id, `connection details (password included) revealed to ${who}`);
    return { engine, ...details };
  }

  /**
   * prepareSpec completes a managed database's spec at deploy: the adapter must exist and its
   * tools be on the host; credentials are generated where the deploy (or, for a redeploy, the
   * previous version) gave none; a server gets a free port unless one is given.
   */
  async prepareSpec(spec: ServiceSpec, secrets: Record<string, string>, existing: ServiceRow | null): Promise<void> {
    const engine = spec.database?.engine;
    if (!engine) return;
    const adapter = this.engines.get(engine);
    const env = this.toolEnv(spec);
    const report = adapter.detectTools(env);
    if (report.missing.length > 0) {
      const packages = [...new Set(report.missing.map((m) => m.debianPackage))].join(" ");
      throw new AppError(
        "database_tools_missing",
        `${adapter.label} needs ${report.missing.map((m) => m.tool).join(", ")}, not found on this host: install the Debian package ${packages} (apt-get install ${packages})`,
        { missing: report.missing },
      );
    }
    const previous = existing ? this.o.store.latestVersion(existing.id) : null;
    const given = {
      ...(previous ? { ...previous.spec.env, ...this.o.secrets.open(previous) } : {}),
      ...spec.env,
      ...secrets,
    };
    const credentials = adapter.credentials(spec.name, given);
    Object.assign(secrets, credentials.secrets);
    spec.env = { ...spec.env, ...credentials.env };
    for (const key of Object.keys(secrets)) delete spec.env[key];
    spec.secret_keys = Object.keys(secrets).sort();
    if (!adapter.hasServer) spec.port = null;
    else if (spec.port === null) spec.port = previous?.spec.port ?? (await freeTcpPort());
    const instance: DatabaseInstance = {
      serviceId: existing?.id ?? "",
      serviceName: spec.name,
      dataDir: this.o.files.dataDir(spec.name),
      host: "127.0.0.1",
      port: spec.port,
      credentials: { ...spec.env, ...secrets },
      env,
    };
    spec.command = adapter.startCommand(instance);
  }

  private instance(service: ServiceRow, version: VersionRow): DatabaseInstance {
    return {
      serviceId: service.id,
      serviceName: service.name,
      dataDir: this.o.files.dataDir(service.name),
      host: "127.0.0.1",
      port: version.spec.port,
      credentials: { ...version.spec.env, ...this.o.secrets.open(version) },
      env: this.toolEnv(version.spec),
      owner: this.owner(service, version.spec),
    };
  }

  /** toolEnv is the environment database tools run with: the pass-through variables and the deploy's plain env, never secrets. */
  private toolEnv(spec: ServiceSpec): Record<string, string> {
    return assembleRunEnv({ base: this.o.env, engine: {}, bindings: {}, env: spec.env, secrets: {}, gpu: {} }).env;
  }

  /**
   * owner is the service's own user that a root engine runs a Redis or SQLite service as, from
   * its row (recorded at its first launch, see WorkloadIdentities.ensure); null when the engine
   * does not switch users, the adapter runs as its own user, or the service never ran.
   */
  private owner(service: ServiceRow, spec: ServiceSpec): RunAs | null {
    if (!this.o.switchUsers || this.serverUserOf(spec)) return null;
    // The row as it is now: a first launch records its user after the caller read it.
    const runAs = this.o.store.getService(service.id)?.run_as;
    return runAs ? { user: runAs.name, uid: runAs.uid, gid: runAs.gid } : null;
  }

  private restoreTarget(name: string): RestoreTarget {
    const service = this.o.store.findService(name);
    if (!service) throw new AppError("database_not_found", `no database service named ${JSON.stringify(name)}`);
    const version = this.o.store.currentVersion(service);
    const engine = version.spec.database?.engine ?? null;
    return {
      serviceId: service.id,
      serviceName: service.name,
      kind: service.kind,
      engine,
      running: service.status === "running" || service.status === "degraded",
      status: service.status,
      instance: engine ? this.instance(service, version) : null,
    };
  }
}

/** kindInWords names a kind of service with its article: "a service", "a batch job". */
function kindInWords(kind: string): string {
  return kind === "batch" ? "a batch job" : `a ${kind}`;
}
