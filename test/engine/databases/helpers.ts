import { describe, expect } from "bun:test";
import { randomBytes } from "node:crypto";
import { lstatSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SQL } from "bun";
import type { DatabaseConnection, Diagnosis, RevealedConnection, ServiceRecord } from "../../../src/contract/engine";
import { PostgresEngine } from "../../../src/engine/databases";
import { serviceUserName } from "../../../src/engine/users";
import { createToken, eventually, startTestEngine, type TestEngine, tempDir } from "../../helpers";
import { ServiceClient } from "../services/harness";

/** REFERENCE_URL is the machine's PostgreSQL (trust auth), where reference data is made and dumped. */
/**
 * suiteWhen returns `describe` when an engine's programs are here, else `describe.skip` with a
 * note naming what is missing; where `requireVar` is set to 1 (CI installs every engine) a
 * missing engine fails the run instead of skipping it.
 */
export function suiteWhen(available: boolean, requireVar: string, missing: string): typeof describe | typeof describe.skip {
  if (available) return describe;
  if (process.env[requireVar] === "1") throw new Error(`${missing} is required here (${requireVar}=1)`);
  process.stderr.write(`note: ${missing} is missing; these database tests are skipped\n`);
  return describe.skip;
}

export const REFERENCE_URL = process.env.ENGINE_TEST_POSTGRES_URL ?? "postgres://postgres@127.0.0.1:5432/test";

/** postgresTools says whether this host has the PostgreSQL server and client programs. */
export function postgresTools(): boolean {
  return new PostgresEngine().detectTools({ PATH: process.env.PATH ?? "" }).missing.length === 0;
}

/** referenceAvailable says whether the reference PostgreSQL answers. */
export async function referenceAvailable(): Promise<boolean> {
  const client = new SQL({ url: REFERENCE_URL, max: 1, connectionTimeout: 3 });
  try {
    await client`SELECT 1`;
    return true;
  } catch {
    return false;
  } finally {
    await client.close().catch(() => undefined);
  }
}

/** referenceUrl is the URL of a database on the reference server. */
export function referenceUrl(database: string): string {
  const url = new URL(REFERENCE_URL);
  url.pathname = `/${database}`;
  return url.toString();
}

/** libpqEnv is the environment pg_dump and psql need to reach a database on the reference server. */
export function libpqEnv(database: string): Record<string, string> {
  const url = new URL(REFERENCE_URL);
  return {
    PATH: process.env.PATH ?? "/usr/bin:/bin",
    PGHOST: url.hostname,
    PGPORT: url.port || "5432",
    PGUSER: decodeURIComponent(url.username || "postgres"),
    ...(url.password ? { PGPASSWORD: decodeURIComponent(url.password) } : {}),
    PGDATABASE: database,
  };
}

/** run runs a program to completion and fails with its output unless it exits 0. */
export function run(argv: string[], env: Record<string, string> = { PATH: process.env.PATH ?? "/usr/bin:/bin" }): string {
  const result = Bun.spawnSync(argv, { env, stdout: "pipe", stderr: "pipe" });
  if (result.exitCode !== 0) throw new Error(`${argv.join(" ")} failed (${result.exitCode}): ${result.stderr.toString()}`);
  return result.stdout.toString();
}

/** DatabaseTestEngine is a test engine in its own data dir, with a scratch dir for the test's files. */
export interface DatabaseTestEngine {
  engine: TestEngine;
  api: ServiceClient;
  /** root is the test's scratch dir (dumps, reference servers' files): private to root, like a home. */
  root: string;
  close(services: string[]): Promise<void>;
}

/**
 * startDatabaseEngine starts a test engine whose data dir it leaves to the engine to create, at
 * a fresh path in the temp dir: reachable by everyone as /var/lib is, nothing pre-made or
 * loosened. So when the tests run as root, PostgreSQL and MariaDB (run as postgres and mysql)
 * reach their data through the engine's own layout (docs/decisions.md 128).
 */
export async function startDatabaseEngine(): Promise<DatabaseTestEngine> {
  const root = tempDir("engine-db-");
  const dataDir = freshTempPath("engine-db-data-");
  const engine = await startTestEngine({ dataDir });
  const api = new ServiceClient(engine);
  return {
    engine,
    api,
    root,
    async close(services: string[]) {
      // Stop the databases cleanly (engines hand workloads over on close; reapWorkloads would SIGKILL them).
      for (const name of services) await engine.call("POST", `/api/services/${name}/stop`).catch(() => undefined);
      await engine.close();
      rmSync(root, { recursive: true, force: true });
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** freshTempPath is a path in the temp dir that does not exist yet, for a program to create itself. */
export function freshTempPath(prefix: string): string {
  return join(tmpdir(), `${prefix}${process.pid}-${randomBytes(6).toString("hex")}`);
}

/** restore calls the restore route. */
export async function restore(
  engine: TestEngine,
  name: string,
  dump: string,
  timeoutS = 60,
): Promise<{
  status: number;
  body: Record<string, unknown> & {
    error?: { code: string; message: string };
    detail?: { type: string; msg: string; ctx: Record<string, unknown> }[];
  };
}> {
  return engine.json("POST", `/api/databases/${name}/restore`, { body: { dump, timeout_s: timeoutS } });
}

/** lastDump returns the service's Diagnosis last_dump. */
export async function lastDump(api: ServiceClient, name: string): Promise<Record<string, unknown> | null> {
  const diagnosis: Diagnosis = await api.diagnose(name);
  return diagnosis.last_dump as Record<string, unknown> | null;
}

/**
 * expectClosedDataDirRefused starts a root engine on a data dir under a private (0700)
 * directory, as `/root/engine` would be, deploys a database whose server runs as `dbUser`,
 * and checks what a user meets: a start-up warning naming the directory, a failed start whose
 * message names it and the way out (`fixes`, the default location), and nothing above the
 * data dir loosened.
 */
export async function expectClosedDataDirRefused(dbUser: string, deploy: Record<string, unknown>, fixes: string[]): Promise<void> {
  const home = tempDir("engine-home-");
  const engine = await startTestEngine({ dataDir: join(home, "engine") });
  try {
    const api = new ServiceClient(engine);
    // The log is written asynchronously: wait for the line.
    await eventually(() => readFileSync(join(engine.dataDir, "engine.log"), "utf8").includes(`${dbUser} may not enter ${home}`));
    await api.deployed({ name: "locked", restart: { policy: "never" }, ...deploy });
    await api.waitFor("locked", "failed", () => true, 30_000);
    const message = (await api.diagnose("locked")).error?.message ?? "";
    for (const part of [`may not enter ${home}`, "/var/lib/engine", ...fixes]) expect(message).toContain(part);
    expect(statSync(home).mode & 0o777).toBe(0o700);
  } finally {
    await engine.close();
    rmSync(home, { recursive: true, force: true });
  }
}

/**
 * expectConnection checks a database service's connection details the way every engine must
 * show them (decision 181): the record's `connection` with the password as ****, the admin-only
 * route answering it in full (the same URL but for the password), a submitter and a readonly
 * token refused with 403, and the reveal logged by the daemon and in the service's log with
 * who asked and never the password. It returns the revealed details for the engine's own
 * check that they connect.
 */
export async function expectConnection(db: DatabaseTestEngine, name: string, password: string | null): Promise<RevealedConnection> {
  const record = (await db.engine.json<ServiceRecord>("GET", `/api/services/${name}`)).body;
  const masked = record.connection as DatabaseConnection;
  expect(masked).not.toBeNull();
  if (password !== null) {
    expect(masked.url).toContain(":****@");
    expect(JSON.stringify(record)).not.toContain(password);
  }
  const readonly = await createToken(db.engine, { name: `ro-${name}`, role: "readonly" });
  const submitter = await createToken(db.engine, { name: `sub-${name}`, role: "submitter", scope_services: [name] });
  for (const token of [readonly.secret, submitter.secret]) {
    const refused = await db.engine.json<{ error: { code: string } }>("GET", `/api/services/${name}/connection`, { token });
    expect(refused.status).toBe(403);
    expect(refused.body.error.code).toBe("forbidden");
    // Both may still read the masked form.
    expect((await db.engine.json<ServiceRecord>("GET", `/api/services/${name}`, { token })).body.connection?.url).toBe(masked.url);
  }
  const revealed = await db.engine.json<RevealedConnection>("GET", `/api/services/${name}/connection`);
  expect(revealed.status).toBe(200);
  expect(revealed.body.password).toBe(password);
  const { url, password: _password, ...parts } = revealed.body;
  const { url: maskedUrl, ...maskedParts } = masked;
  expect(parts).toEqual(maskedParts);
  expect(password === null ? url : url.replace(`:${encodeURIComponent(password)}@`, ":****@")).toBe(maskedUrl);
  const serviceLog = await eventually(async () => {
    const logs = await db.engine.json<{ line: string }[]>("GET", `/api/services/${name}/logs?tail=200`);
    return logs.body.some((line) => line.line.startsWith("connection details (password included) revealed to token "))
      ? JSON.stringify(logs.body)
      : null;
  });
  const daemonLog = await eventually(() => {
    const text = readFileSync(join(db.engine.dataDir, "engine.log"), "utf8");
    return text.includes("database connection details revealed") ? text : null;
  });
  if (password !== null) {
    expect(serviceLog).not.toContain(password);
    expect(daemonLog).not.toContain(password);
  }
  return revealed.body;
}

/** asRoot says whether the tests run as root, where the engine runs each service as a user of its own. */
export const asRoot = process.geteuid?.() === 0;

/** serviceUid is the uid and gid of a service's own user (eng-<name>) from /etc/passwd; null when the host has none. */
export function serviceUid(name: string): { uid: number; gid: number } | null {
  const user = serviceUserName(name);
  const fields = readFileSync("/etc/passwd", "utf8")
    .split("\n")
    .find((line) => line.startsWith(`${user}:`))
    ?.split(":");
  return fields ? { uid: Number(fields[2]), gid: Number(fields[3]) } : null;
}

/** processUids reads a process's real, effective, saved and filesystem uids from /proc/<pid>/status. */
export function processUids(pid: number): number[] {
  const line = readFileSync(`/proc/${pid}/status`, "utf8")
    .split("\n")
    .find((l) => l.startsWith("Uid:"));
  return (line ?? "").slice(4).trim().split(/\s+/).map(Number);
}

/** notOwnedBy lists what under `dir` (itself included, links not followed) is not owned by `uid`:`gid`, as "path uid:gid". */
export function notOwnedBy(dir: string, owner: { uid: number; gid: number }): string[] {
  const found: string[] = [];
  const visit = (path: string) => {
    const stat = lstatSync(path);
    if (stat.uid !== owner.uid || stat.gid !== owner.gid) found.push(`${path} ${stat.uid}:${stat.gid}`);
    if (stat.isDirectory()) for (const name of readdirSync(path)) visit(`${path}/${name}`);
  };
  visit(dir);
  return found;
}
