import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync, readlinkSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import type { ServiceRecord } from "../../../src/contract/engine";
import { DatabaseEngines, isDatabaseEngineName, lookupUser } from "../../../src/engine/databases";
import { serviceUserName } from "../../../src/engine/users";
import { collectOutput, eventually, REPO_ROOT, reapWorkloads, removeServiceUsers, spawnEngine, tempDir } from "../../helpers";
import { suiteWhen } from "../databases/helpers";

/**
 * The engine as `npm start` runs it (`bun cli/engine.ts serve`: no --data-dir, no ENGINE_DATA_DIR,
 * no ENGINE_SHIM), as root, on a machine where /var/lib/engine does not exist yet: every database
 * template must reach `running` with the engine's own layout, nothing loosened by the test.
 *
 * The host's /var/lib is left alone: the engine runs in a private mount namespace whose /var/lib
 * is an empty tmpfs with the mode /var/lib has everywhere (0755), so the engine itself creates
 * /var/lib/engine. HOME is a fresh directory, as on a new machine (an old-default data dir in the
 * real root's home would otherwise be kept, by design). The only other settings are documented
 * ones that keep it off the host's ports and network: ENGINE_PORT, ENGINE_HTTPS_PORT and
 * ENGINE_HTTP_PORT 0, ENGINE_MDNS=off. The CLI runs inside the same namespace with no
 * --data-dir either, so it proves `engine services ...` finds the daemon in /var/lib/engine.
 */

const SYSTEM_DATA_DIR = "/var/lib/engine";
const asRoot = process.getuid?.() === 0;
const unshare = Bun.which("unshare");
const nsenter = Bun.which("nsenter");

/** DATABASE_TEMPLATES are the bundled templates whose service is a database the engine manages. */
const DATABASE_TEMPLATES = readdirSync(join(REPO_ROOT, "templates"))
  .filter((file) => file.endsWith(".json"))
  .map(
    (file) => JSON.parse(readFileSync(join(REPO_ROOT, "templates", file), "utf8")) as { id: string; deploy_defaults: { engine?: string } },
  )
  .filter((template) => template.deploy_defaults.engine !== undefined)
  .map((template) => ({ id: template.id, engine: template.deploy_defaults.engine as string }));

/** The servers that refuse root run as these users (the Debian packages create them); the others as the service's own (eng-<name>). */
const RUNS_AS: Record<string, string> = { postgres: "postgres", mariadb: "mysql" };

const ready = asRoot && unshare !== null && nsenter !== null;
if (!ready) process.stderr.write("note: the root-defaults tests need root, unshare and nsenter; skipped\n");

/** NamespacedEngine is `bun cli/engine.ts serve` running as root in a private mount namespace whose /var/lib is empty. */
interface NamespacedEngine {
  pid: number;
  output(): string;
  /** view is `path` inside the namespace, as seen from outside it. */
  view(path: string): string;
  /** cli runs `engine <args> --json` inside the namespace, with no --data-dir. */
  cli<T>(...args: string[]): Promise<T>;
  /** stop ends the daemon and every process left in its namespace (workloads and shims outlive the daemon). */
  stop(): Promise<void>;
}

async function startNamespacedEngine(home: string): Promise<NamespacedEngine> {
  const env = { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: home };
  const script = `mount -t tmpfs -o mode=0755,size=1g tmpfs /var/lib && exec "$0" cli/engine.ts serve`;
  const proc = Bun.spawn([unshare as string, "--mount", "--propagation", "private", "sh", "-c", script, process.execPath], {
    cwd: REPO_ROOT,
    env: { ...env, ENGINE_PORT: "0", ENGINE_HTTPS_PORT: "0", ENGINE_HTTP_PORT: "0", ENGINE_MDNS: "off" },
    stdout: "pipe",
    stderr: "pipe",
  });
  const outputOf = collectOutput(proc);
  const namespace = await eventually(() => {
    try {
      const link = readlinkSync(`/proc/${proc.pid}/ns/mnt`);
      return link === readlinkSync("/proc/self/ns/mnt") ? null : link;
    } catch {
      return null;
    }
  });
  const engine: NamespacedEngine = {
    pid: proc.pid,
    output: outputOf,
    view: (path) => `/proc/${proc.pid}/root${path}`,
    async cli<T>(...args: string[]): Promise<T> {
      const argv = [nsenter as string, `--mount=/proc/${proc.pid}/ns/mnt`, "--", process.execPath, join(REPO_ROOT, "cli", "engine.ts")];
      const child = Bun.spawn([...argv, ...args, "--json"], { cwd: REPO_ROOT, env, stdout: "pipe", stderr: "pipe" });
      const [stdout, stderr, code] = await Promise.all([
        new Response(child.stdout).text(),
        new Response(child.stderr).text(),
        child.exited,
      ]);
      if (code !== 0) throw new Error(`engine ${args.join(" ")} exited ${code}: ${stderr}${stdout}`);
      return JSON.parse(stdout) as T;
    },
    async stop() {
      if (proc.exitCode === null) {
        proc.kill("SIGTERM");
        await Promise.race([proc.exited, Bun.sleep(15_000)]);
      }
      for (const pid of readdirSync("/proc").filter((name) => /^\d+$/.test(name))) {
        try {
          if (readlinkSync(`/proc/${pid}/ns/mnt`) === namespace) process.kill(Number(pid), "SIGKILL");
        } catch {
          // gone, or not ours to read
        }
      }
    },
  };
  try {
    await eventually(
      () => {
        if (proc.exitCode !== null) throw new Error(`engine exited with ${proc.exitCode}: ${outputOf()}`);
        return outputOf().includes('"msg":"listening"');
      },
      { timeoutMs: 60_000, intervalMs: 100 },
    );
  } catch (error) {
    await engine.stop();
    throw error;
  }
  return engine;
}

/** REQUIRED_BY is the variable that, set to 1 (as CI does), turns an engine's missing programs into a failure instead of a skip. */
const REQUIRED_BY: Record<string, string> = {
  postgres: "ENGINE_REQUIRE_POSTGRES",
  mariadb: "ENGINE_REQUIRE_MARIADB",
  redis: "ENGINE_REQUIRE_REDIS",
  sqlite: "ENGINE_REQUIRE_SQLITE",
};
const databases = new DatabaseEngines();
const missingEngine = [...DATABASE_TEMPLATES.map((template) => template.engine), "sqlite"].find(
  (name) => isDatabaseEngineName(name) && databases.get(name).detectTools({ PATH: process.env.PATH ?? "" }).missing.length > 0,
);
const databaseSuite = !ready
  ? describe.skip
  : missingEngine
    ? suiteWhen(false, REQUIRED_BY[missingEngine] ?? "ENGINE_REQUIRE_ALL", `the ${missingEngine} server's programs`)
    : describe;

databaseSuite("the engine as npm start runs it, as root", () => {
  let home: string;
  let engine: NamespacedEngine;
  /** view is the engine's /var/lib/engine seen from outside its mount namespace. */
  let view: string;
  const cli = <T>(...args: string[]) => engine.cli<T>(...args);

  beforeAll(async () => {
    home = tempDir("engine-root-home-");
    engine = await startNamespacedEngine(home);
    view = engine.view(SYSTEM_DATA_DIR);
  }, 90_000);

  afterAll(async () => {
    if (engine) {
      // Stop the databases cleanly, then end what is left of them (reapWorkloads also removes their cgroups).
      for (const { id } of DATABASE_TEMPLATES) await cli("services", "stop", `db-${id}`).catch(() => undefined);
      await cli("services", "stop", "db-sqlite").catch(() => undefined);
      if (existsSync(view)) reapWorkloads(view);
      await engine.stop();
      // Their users' homes are the namespace's /var/lib/engine/data/<name>, which reapWorkloads(view) does not match.
      removeServiceUsers(SYSTEM_DATA_DIR, [...DATABASE_TEMPLATES.map(({ id }) => `db-${id}`), "db-sqlite"]);
    }
    rmSync(home, { recursive: true, force: true });
  }, 60_000);

  test("it uses /var/lib/engine, which it created 0711 with data/ 0711, and the CLI finds it with no --data-dir", async () => {
    expect(engine.output()).toContain(`"data_dir":"${SYSTEM_DATA_DIR}"`);
    expect(engine.output()).not.toContain("may not enter");
    expect(statSync(view).mode & 0o777).toBe(0o711);
    expect(statSync(join(view, "data")).mode & 0o777).toBe(0o711);
    expect(statSync(join(view, "engine.sock")).mode & 0o777).toBe(0o600);
    expect(await cli<ServiceRecord[]>("services", "list")).toEqual([]);
  });

  test("every database template reaches running, each server as its own user", async () => {
    expect(DATABASE_TEMPLATES.map((template) => template.id)).toEqual(expect.arrayContaining(["mariadb", "postgres", "redis"]));
    for (const { id } of DATABASE_TEMPLATES) await cli("services", "deploy", `db-${id}`, "--template", id);
    // SQLite has no template (its database is a file), but it is a database service too.
    await cli("services", "deploy", "db-sqlite", "--engine", "sqlite");
    const names = [...DATABASE_TEMPLATES.map(({ id }) => `db-${id}`), "db-sqlite"];
    // Until every one is running, or one has failed (a database that cannot start fails; it never hangs).
    const list = await eventually(
      async () => {
        const services = await cli<ServiceRecord[]>("services", "list");
        const settled =
          services.some((service) => service.status === "failed") ||
          names.every((name) => services.find((service) => service.name === name)?.status === "running");
        return settled ? services : null;
      },
      { timeoutMs: 240_000, intervalMs: 500 },
    );
    const statuses = Object.fromEntries(list.map((service) => [service.name, service.status]));
    if (Object.values(statuses).some((status) => status !== "running")) {
      const diagnoses = await Promise.all(names.map((name) => cli<{ error?: unknown }>("diagnose", name).then((d) => [name, d.error])));
      process.stderr.write(`${JSON.stringify(diagnoses)}\n`);
    }
    expect(statuses).toEqual(Object.fromEntries(names.map((name) => [name, "running"])));
    for (const [name, engine] of [...DATABASE_TEMPLATES.map(({ id, engine }) => [`db-${id}`, engine]), ["db-sqlite", "sqlite"]]) {
      const owner = RUNS_AS[engine as string] ?? serviceUserName(name as string);
      const dir = statSync(join(view, "data", name as string));
      expect(dir.uid).toBe(lookupUser(owner)?.uid ?? -1);
      expect(dir.mode & 0o007).toBe(0);
      expect(list.find((service) => service.name === name)?.user).toBe(owner);
    }
  }, 300_000);

  test("apart from data/, nothing in the data dir is anyone's but root's, nor open to others", () => {
    const loose = readdirSync(view)
      .filter((name) => name !== "data")
      .map((name) => ({ name, stat: statSync(join(view, name)) }))
      .filter(({ stat }) => stat.uid !== 0 || (stat.mode & 0o007) !== 0)
      .map(({ name, stat }) => `${name} uid ${stat.uid} mode ${(stat.mode & 0o777).toString(8)}`);
    expect(loose).toEqual([]);
  });
});

(ready ? describe : describe.skip)("an older root install in root's XDG data dir", () => {
  test("is kept, with a warning naming the move, and the CLI finds it too", async () => {
    const home = tempDir("engine-root-home-");
    const legacy = join(home, ".local", "share", "engine");
    // The older install: an engine that ran with that dir (the default for root before /var/lib/engine).
    const older = await spawnEngine(legacy);
    await older.stop();
    const token = readFileSync(join(legacy, "admin.token"), "utf8");
    const engine = await startNamespacedEngine(home);
    try {
      expect(engine.output()).toContain(`"data_dir":"${legacy}"`);
      expect(engine.output()).toContain(`mv ${legacy} /var/lib/engine`);
      // Its data dir is under a 0700 home: the start-up says database services cannot start there.
      if (lookupUser("postgres")) expect(engine.output()).toContain(`postgres may not enter ${home}`);
      expect(await engine.cli<unknown[]>("services", "list")).toEqual([]);
      expect(existsSync(engine.view(SYSTEM_DATA_DIR))).toBe(false);
      expect(readFileSync(join(legacy, "admin.token"), "utf8")).toBe(token);
    } finally {
      await engine.stop();
      rmSync(home, { recursive: true, force: true });
    }
  }, 120_000);
});
