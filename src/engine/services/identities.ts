import { readdirSync, rmdirSync, statSync } from "node:fs";
import { chmod, chown } from "node:fs/promises";
import type { Logger } from "../../lib/logger";
import { InputError } from "../../lib/validation";
import { type RecordedUser, removeServiceUsersOf, type ServiceUsers, serviceUserName, type WorkloadUser } from "../users";
import type { ManagedDatabases } from "./databases";
import type { ServiceFiles } from "./files";
import type { ServiceSpec } from "./spec";
import type { ServiceRow, ServiceStore } from "./store";

export interface WorkloadIdentitiesOptions {
  store: ServiceStore;
  files: ServiceFiles;
  databases: ManagedDatabases;
  log: Logger;
  /** users makes and finds the OS users workloads run as. */
  users: ServiceUsers;
  /** switchUsers runs each workload as a user of its own: only a root engine can. */
  switchUsers: boolean;
  /** dataDir is the engine's data dir, whose services' users a delete may remove. */
  dataDir: string;
}

/**
 * WorkloadIdentities owns who a service's code runs as under a root engine (decision 117):
 * the admin's choice (`user`), the database server's own user (PostgreSQL, MariaDB), or the
 * service's own user, made at its first launch (decision 512) and recorded in its row
 * (`run_as`), removed with the service when its data dir is left empty (decision 465). An
 * unprivileged engine runs every workload as itself, and this answers null throughout.
 */
export class WorkloadIdentities {
  /**
   * warmed are the identities warm() rebuilt before a successor's switch, keyed by the row
   * they were rebuilt from: forAdoption finds one only for that same row (rows are frozen and
   * replaced when changed), and rebuilds it otherwise (decision 535).
   */
  private readonly warmed = new WeakMap<ServiceRow, WorkloadUser | null>();

  constructor(private readonly o: WorkloadIdentitiesOptions) {}

  get switching(): boolean {
    return this.o.switchUsers;
  }

  /**
   * nameOf is the user a service's workload runs (or will run) as, for its record and
   * Diagnosis: the admin's choice, PostgreSQL's and MariaDB's own user, or the service's own;
   * null: the engine's own (an unprivileged engine).
   */
  nameOf(service: ServiceRow, spec: ServiceSpec): string | null {
    if (!this.o.switchUsers) return spec.user ?? null;
    return spec.user ?? this.o.databases.serverUserOf(spec) ?? serviceUserName(service.name);
  }

  /** startedAsRoot says whether a running service was started as root by an older engine, which ran Redis and SQLite services (and every service before decision 117) so. */
  startedAsRoot(service: ServiceRow): boolean {
    return this.o.switchUsers && !service.run_as && this.o.databases.serverUserOf(this.o.store.currentVersion(service).spec) === null;
  }

  /** recorded rebuilds the identity of a run started by an earlier daemon from the service's row. */
  recorded(service: ServiceRow): WorkloadUser | null {
    if (!this.o.switchUsers || !service.run_as) return null;
    const { spec } = this.o.store.currentVersion(service);
    const chosen = spec.user ? this.o.users.resolve(spec.user) : null;
    const groups = spec.user ? (chosen?.groups ?? []) : this.o.users.gpuGroups();
    const home = spec.user ? (chosen?.home ?? "/") : this.o.files.dataDir(service.name);
    return { ...service.run_as, groups: [...new Set([...groups, ...this.fileBindingGroups(spec)])], home };
  }

  /**
   * warm works out a running service's identity, groups and home (/etc/group, NSS) before a
   * successor's switch: the first adoption spent 1.5-5.6 ms there while requests waited.
   */
  warm(service: ServiceRow): void {
    try {
      this.warmed.set(service, this.recorded(service));
    } catch {
      // the adoption meets the same fault and reports it
    }
  }

  /** forAdoption is the identity of a run being adopted: the one warm() rebuilt from this same row, else rebuilt now. */
  forAdoption(service: ServiceRow): WorkloadUser | null {
    return this.warmed.has(service) ? (this.warmed.get(service) ?? null) : this.recorded(service);
  }

  /**
   * fileBindingGroups are the groups of the databases `spec` binds to that bound services use
   * through their files (SQLite): each one's own group, which a root engine opens its data dir
   * and files to (decision 290). Read at every launch from the version being launched: a
   * binding removed by a patch or a redeploy takes the group away at the next launch. A
   * database that has not run yet has no user, and so no group to give.
   */
  fileBindingGroups(spec: ServiceSpec): number[] {
    if (!this.o.switchUsers) return [];
    const groups: number[] = [];
    for (const name of spec.bindings) {
      const bound = this.o.store.findService(name);
      if (!bound?.run_as || !this.o.databases.bindsThroughFiles(this.o.store.currentVersion(bound).spec)) continue;
      groups.push(bound.run_as.gid);
    }
    return groups;
  }

  /**
   * dataDirMode is the mode of a service's data dir: its user's alone (0700), but under a root
   * engine 2770 for a database its bound services use through its files (decision 290): the
   * group may make the journals SQLite writes beside the database, and setgid keeps what
   * either user makes there in the database's group.
   */
  dataDirMode(spec: ServiceSpec): number {
    return this.o.switchUsers && this.o.databases.bindsThroughFiles(spec) ? 0o2770 : 0o700;
  }

  /**
   * ensure returns who a service's code (its run, build and exec probes) runs as: null (the
   * engine's own user) when the engine cannot switch users or the database's adapter runs its
   * server as a user of its own (PostgreSQL, MariaDB); the admin's choice; or the service's
   * own user, made on first use, a Redis or SQLite service's included. The service's data dir
   * is given to that user (0700), and the row records it.
   */
  async ensure(serviceId: string): Promise<WorkloadUser | null> {
    const { store, files, log } = this.o;
    const service = store.getService(serviceId);
    if (!service || !this.o.switchUsers) return null;
    const { spec } = store.currentVersion(service);
    if (this.o.databases.serverUserOf(spec)) return null;
    const dataDir = files.dataDir(service.name);
    const dataDirMode = this.dataDirMode(spec);
    let user: WorkloadUser;
    if (spec.user) {
      const chosen = this.o.users.resolve(spec.user);
      if (!chosen) throw new Error(`the user ${spec.user} chosen for this service no longer exists on this host`);
      user = chosen;
    } else {
      user = await this.o.users.ensureServiceUser(service.name, dataDir, service.run_as);
    }
    await files.ensureAsync(dataDir, dataDirMode);
    // A stat and a listing read what the kernel has cached: done here, they add no wait to a restart.
    const owner = statSync(dataDir);
    if (owner.uid !== user.uid || owner.gid !== user.gid) {
      // First run as this user (an upgraded engine's services ran as root, or an admin changed
      // `user`): what is inside becomes the user's too, else it could not change its own files.
      // `chown -R` does not follow symbolic links (-P), so no link leads it out of the dir. A dir
      // just made (a new service's, the usual case) is empty: one chown of it is all, without a process.
      const empty = readdirSync(dataDir).length === 0;
      if (empty) await chown(dataDir, user.uid, user.gid);
      else {
        const chownAll = Bun.spawn(["chown", "-R", "-P", `${user.uid}:${user.gid}`, dataDir], { stdout: "ignore", stderr: "pipe" });
        const [stderr, code] = await Promise.all([new Response(chownAll.stderr).text(), chownAll.exited]);
        if (code !== 0) throw new Error(`could not give the data dir ${dataDir} to ${user.name}: ${stderr.trim().slice(0, 300)}`);
      }
      // An older engine made a database's dir 0750: the user's own is 0700, or a SQLite
      // database's 2770 (ensure sets it once per daemon; chown cleared the setgid bit). A
      // dir with the mode already, and no set-id bit for chown to clear, needs no chmod.
      if ((owner.mode & 0o7777) !== dataDirMode || (dataDirMode & 0o7000) !== 0) await chmod(dataDir, dataDirMode);
      // A new service's empty dir is no news (a line a batch job); files that changed owner are.
      if (!empty) log.info({ service: service.name, user: user.name, data_dir: dataDir }, "gave the service's data dir to its user");
    }
    // On record before the workload starts: a successor adopting it, and a delete removing
    // the user, read it from the row. The launches of one pass share the commit.
    const recorded: RecordedUser = { name: user.name, uid: user.uid, gid: user.gid };
    if (JSON.stringify(store.getService(serviceId)?.run_as) !== JSON.stringify(recorded)) {
      await store.writeSoon(() => {
        const current = store.getService(serviceId);
        if (current) store.updateService({ ...current, run_as: recorded });
      });
    }
    return user;
  }

  /**
   * checkChosen resolves the admin's `user` to a user name, or answers 422: the host has no
   * such user, or the engine is not root and can run workloads only as itself.
   */
  checkChosen(wanted: string): string {
    const user = this.o.users.resolve(wanted);
    const problem = !user
      ? `this host has no user ${wanted}`
      : !this.o.switchUsers && user.uid !== process.geteuid?.()
        ? `the engine runs unprivileged (uid ${process.geteuid?.()}) and can run workloads only as itself, not as ${user.name}`
        : null;
    if (problem || !user) throw new InputError([{ loc: ["body", "user"], msg: problem ?? "", type: "value_error", input: wanted }]);
    return user.name;
  }

  /** idle resolves once no write of the account files (a new service user's) is in flight or due. */
  idle(): Promise<void> {
    return this.o.users.idle();
  }

  /**
   * release removes a deleted service's own user when its data dir is empty (decision 465):
   * nothing is kept that the user owns, and each batch job under a new name would otherwise
   * leave a user behind for ever (the ids run out after 4,336 names, and each new user costs a
   * rewrite of the account files, which grow with them). A data dir with anything in it stays, and its user
   * with it (decision 118); so does a user a process still runs as, or one the admin chose.
   * The caller runs it without an await after the row is gone, so no launch of a new service of
   * that name can find the user in between. Answers the user's name when it was removed.
   */
  release(service: ServiceRow): string | null {
    if (!this.o.switchUsers || service.run_as?.name !== serviceUserName(service.name)) return null;
    const dataDir = this.o.files.dataDir(service.name);
    try {
      rmdirSync(dataDir);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") return null; // not empty: kept, with its owner
    }
    this.o.files.forget(dataDir);
    return removeServiceUsersOf(this.o.dataDir, { only: [service.name] }).length > 0 ? service.run_as.name : null;
  }
}
