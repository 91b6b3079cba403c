import { appendFileSync, chmodSync, mkdirSync, rmSync, statSync } from "node:fs";
import { chmod, mkdir, stat } from "node:fs/promises";
import { join, sep } from "node:path";
import type { Logger } from "../../lib/logger";

/** BUILDS_DIR is the folder of data/ that holds build checkouts; no service name starts with a dot. */
const BUILDS_DIR = ".builds";

/**
 * ServiceFiles owns where a service's files live under the data dir and the directories the
 * daemon has made there:
 *
 *   services/<id>/             the engine's own (0700): runs, build.log, logs/output.log
 *   data/<name>/               the service's data dir, its user's, kept when the service is deleted
 *   data/.builds/<id>/<version> build checkouts, under data/ since the service's user makes them
 *
 * A directory is made with its mode once per daemon (and again when the mode asked for changes:
 * a name deployed again as another kind of service): a recursive mkdir costs more than a
 * launch's spawn. The data dir's own layout (secureDataDir) is there before any of these.
 */
export class ServiceFiles {
  private readonly made = new Map<string, number>();
  /**
   * making are the ensureAsync calls under way, by directory: a launch's directory hook and its
   * user hook run together (hooks/index.ts), and the second asks for the same data dir while
   * the first's mkdir waits on the disk. It waits for that one instead of a second mkdir (which
   * would find the directory there, and chmod it again).
   */
  private readonly making = new Map<string, { mode: number; done: Promise<void> }>();
  /** umask is the daemon's, read once at start. */
  private readonly umask = process.umask();

  constructor(
    private readonly root: string,
    private readonly log: Logger,
  ) {}

  /** dataDir is a service's own directory, `<data-dir>/data/<name>`, kept when the service is deleted. */
  dataDir(name: string): string {
    return join(this.root, "data", name);
  }

  /** serviceDir is the engine's directory of a service, `<data-dir>/services/<id>`. */
  serviceDir(serviceId: string): string {
    return join(this.root, "services", serviceId);
  }

  logFile(serviceId: string): string {
    return join(this.serviceDir(serviceId), "logs", "output.log");
  }

  buildLog(serviceId: string): string {
    return join(this.serviceDir(serviceId), "build.log");
  }

  /**
   * buildsDir holds a service's build checkouts, `<data-dir>/data/.builds/<id>`: under data/, the
   * one part of the data dir others may traverse, since a checkout is its run's cwd and the
   * service's user makes it. It goes with the service on delete (its data dir stays).
   */
  buildsDir(serviceId: string): string {
    return join(this.root, "data", BUILDS_DIR, serviceId);
  }

  /**
   * ensureBuildsDir makes the folders a build's checkout goes into: data/ and data/.builds, which
   * a root engine lets the services' users traverse (0711), and the service's own folder there.
   */
  ensureBuildsDir(serviceId: string, traversable: boolean): string {
    this.ensureServiceDir(serviceId);
    this.ensure(join(this.root, "data"), traversable ? 0o711 : 0o700);
    this.ensure(join(this.root, "data", BUILDS_DIR), traversable ? 0o711 : 0o700);
    const dir = this.buildsDir(serviceId);
    this.ensure(dir);
    return dir;
  }

  /** ensureServiceDir makes services/ and services/<id>, the engine's own (0700). */
  ensureServiceDir(serviceId: string): void {
    this.ensure(join(this.root, "services"));
    this.ensure(this.serviceDir(serviceId));
  }

  /** appendLog writes one line from the engine (stream `engine`) into a service's log, in the shim's format. */
  appendLog(serviceId: string, line: string): void {
    this.ensureServiceDir(serviceId);
    this.ensure(join(this.serviceDir(serviceId), "logs"));
    const ts = new Date().toISOString().replace("Z", "000000Z");
    try {
      appendFileSync(this.logFile(serviceId), `${ts} engine F ${line.replaceAll("\n", " ")}\n`);
    } catch (error) {
      this.log.warn({ err: (error as Error).message }, "could not write to a service's log");
    }
  }

  /** removeService removes a deleted service's engine directory and build checkouts, and forgets them; its data dir stays. */
  removeService(serviceId: string): void {
    rmSync(this.serviceDir(serviceId), { recursive: true, force: true });
    rmSync(this.buildsDir(serviceId), { recursive: true, force: true });
    const gone = [this.serviceDir(serviceId), this.buildsDir(serviceId)];
    for (const dir of this.made.keys()) {
      if (gone.some((root) => dir === root || dir.startsWith(`${root}${sep}`))) this.made.delete(dir);
    }
  }

  /** forget drops what this daemon knows of `dir` (removed by someone else): the next ensure makes it again. */
  forget(dir: string): void {
    this.made.delete(dir);
  }

  /** ensure makes a directory with its mode. Its parents must exist already, or it walks the path. */
  ensure(dir: string, mode = 0o700): void {
    if (this.made.get(dir) === mode) return;
    // A plain mkdir first: the parents are there almost always, and Bun's recursive one costs
    // about five times as much (it walks the path); ENOENT falls back to it.
    let made = false;
    try {
      mkdirSync(dir, { mode });
      made = true;
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code === "ENOENT") mkdirSync(dir, { recursive: true, mode });
      else if (code !== "EEXIST" || !statSync(dir).isDirectory()) throw error;
    }
    if (this.chmodNeeded(made, mode)) chmodSync(dir, mode);
    this.made.set(dir, mode);
  }

  /** ensureAsync is ensure off the event loop, for a launch's data dir: a new directory waits on the disk's journal. */
  async ensureAsync(dir: string, mode = 0o700): Promise<void> {
    if (this.made.get(dir) === mode) return;
    const underWay = this.making.get(dir);
    if (underWay?.mode === mode) return underWay.done;
    const done = this.makeAsync(dir, mode);
    this.making.set(dir, { mode, done });
    try {
      await done;
    } finally {
      if (this.making.get(dir)?.done === done) this.making.delete(dir);
    }
  }

  private async makeAsync(dir: string, mode: number): Promise<void> {
    let made = false;
    try {
      await mkdir(dir, { mode });
      made = true;
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code === "ENOENT") await mkdir(dir, { recursive: true, mode });
      else if (code !== "EEXIST" || !(await stat(dir)).isDirectory()) throw error;
    }
    if (this.chmodNeeded(made, mode)) await chmod(dir, mode);
    this.made.set(dir, mode);
  }

  /**
   * chmodNeeded says whether a dir needs a chmod after its mkdir: one that was there already
   * (an older engine may have made it with another mode), a set-id bit (mkdir drops it), or
   * bits the umask took. A mode mkdir gave exactly needs none.
   */
  private chmodNeeded(made: boolean, mode: number): boolean {
    return !made || (mode & 0o7000) !== 0 || (mode & this.umask) !== 0;
  }
}
