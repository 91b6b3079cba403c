import { Database as SQLite } from "bun:sqlite";
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SQL } from "bun";
import { collectOutput, eventually, REPO_ROOT, runCli, stopGently } from "../../helpers";
import { mountTmpfs, type Tmpfs } from "../../tmpfs";
import { POSTGRES_URL, postgresAvailable } from "../helpers";

/** CLOUD_ENTRY runs the console's CLI from source, as `npm run cloud` does. */
const CLOUD_ENTRY = [process.execPath, join(REPO_ROOT, "cli", "cloud.ts")];

/** SpawnedCloud is `engine-cloud serve` as a real process, so a crash is a crash. */
interface SpawnedCloud {
  proc: ReturnType<typeof Bun.spawn>;
  url: string;
  output(): string;
  stop(): Promise<void>;
}

async function spawnCloud(dataDir: string, env: Record<string, string>): Promise<SpawnedCloud> {
  const proc = Bun.spawn([...CLOUD_ENTRY, "serve", "--data-dir", dataDir, "--port", "0", "--log-level", "info"], {
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: process.env.HOME ?? "/tmp", ...env },
    stdout: "pipe",
    stderr: "pipe",
  });
  const textOf = collectOutput(proc);
  const url = await eventually(
    () => {
      if (proc.exitCode !== null) throw new Error(`engine-cloud exited with ${proc.exitCode}: ${textOf()}`);
      return /"msg":"engine-cloud listening"/.test(textOf()) ? (/"url":"(http:\/\/[^"]+)"/.exec(textOf())?.[1] ?? "") : "";
    },
    { timeoutMs: 20000 },
  );
  return {
    proc,
    url,
    output: textOf,
    async stop() {
      await stopGently(proc);
    },
  };
}

// biome-ignore lint/suspicious/noExplicitAny: a test reads whichever fields it asserts on.
type Answer = { status: number; body: any; headers: Headers };

async function api(
  cloud: SpawnedCloud,
  method: string,
  path: string,
  options: { body?: unknown; token?: string; headers?: Record<string, string> } = {},
): Promise<Answer> {
  const headers: Record<string, string> = { ...options.headers };
  if (options.token) headers.authorization = `Bearer ${options.token}`;
  if (options.body !== undefined) headers["content-type"] = "application/json";
  const response = await fetch(`${cloud.url}${path}`, {
    method,
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
  });
  const text = await response.text();
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    // not JSON: the assertions below say so
  }
  return { status: response.status, body, headers: response.headers };
}

let sources = 0;
/** requestDevice asks for a device link from a fresh address (the console trusts the test's loopback as a proxy). */
function requestDevice(cloud: SpawnedCloud, hostname: string): Promise<Answer> {
  sources += 1;
  return api(cloud, "POST", "/api/link/device", {
    body: { hostname, os: "linux", version: "0.7.0" },
    headers: { "x-forwarded-for": `198.51.${sources >> 8}.${sources & 255}` },
  });
}

/**
 * fullDiskScenario is the story on one database: fill the disk under a running
 * console; writes answer 503 disk_full with Retry-After and store nothing; reads go on; ready
 * says `database_writable: false`; the process stays up; free the disk and writes work again
 * with no restart. It answers how many device requests were stored.
 */
async function fullDiskScenario(cloud: SpawnedCloud, disk: Tmpfs, token: string): Promise<number> {
  const before = await requestDevice(cloud, "before-box");
  expect(before.status).toBe(201);
  expect((await api(cloud, "GET", "/api/ready")).body).toMatchObject({ ready: true, database: true, database_writable: true });

  disk.fill();
  // SQLite refuses the first commit. PostgreSQL stores rows while its tables' last pages have
  // room and refuses the first insert that must extend a file: write until that one.
  let stored = 1;
  let refused = await requestDevice(cloud, "full-box");
  while (refused.status === 201 && stored < 100) {
    stored += 1;
    refused = await requestDevice(cloud, "full-box");
  }
  for (const answer of [refused, await requestDevice(cloud, "full-box"), await requestDevice(cloud, "full-box")]) {
    expect(answer.status).toBe(503);
    expect(answer.headers.get("content-type")).toContain("application/json");
    expect(answer.headers.get("retry-after")).toBe("30");
    expect(answer.body.error).toMatchObject({ code: "disk_full", request_id: expect.any(String) });
  }
  // Reads go on: the session, and a lookup of the request made before (its rate limit included).
  const session = await api(cloud, "GET", "/api/auth/session", { token });
  expect(session.status).toBe(200);
  const lookup = await api(cloud, "POST", "/api/nodes/device-approvals/lookup", { token, body: { user_code: before.body.user_code } });
  expect(lookup.status).toBe(200);
  expect(lookup.body.reported.hostname).toBe("before-box");
  // An approval creates a node: refused the same way, and the request stays pending.
  const approve = await api(cloud, "POST", "/api/nodes/device-approvals/approve", { token, body: { user_code: before.body.user_code } });
  expect(approve.status).toBe(503);
  expect(approve.body.error.code).toBe("disk_full");

  const ready = await api(cloud, "GET", "/api/ready");
  expect(ready.status).toBe(200);
  expect(ready.body).toMatchObject({ ready: true, database: true, database_writable: false });
  for (const value of Object.values(ready.body)) expect(["boolean", "number", "string"]).toContain(typeof value);
  // Health touches nothing and the process is still here after every failed write and log line.
  expect((await api(cloud, "GET", "/api/health")).status).toBe(200);
  expect(cloud.proc.exitCode).toBeNull();

  disk.free();
  await eventually(async () => (await api(cloud, "GET", "/api/ready")).body.database_writable === true, { timeoutMs: 10000 });
  const after = await requestDevice(cloud, "after-box");
  expect(after.status).toBe(201);
  const approved = await api(cloud, "POST", "/api/nodes/device-approvals/approve", { token, body: { user_code: before.body.user_code } });
  expect(approved.status).toBe(200);
  expect(cloud.proc.exitCode).toBeNull();
  return stored + 1;
}

/** expectNothingHalfCreated checks that the refused writes left nothing: one audit row per stored request, the approval's node. */
function expectNothingHalfCreated(rows: { requests: number; audited: number; approved: number; nodes: number }, stored: number) {
  expect(rows).toEqual({ requests: stored, audited: stored, approved: 1, nodes: 1 });
}

describe("a full disk under the console [sqlite]", () => {
  let disk: Tmpfs;
  let cloud: SpawnedCloud | undefined;
  beforeAll(() => {
    disk = mountTmpfs("8m");
  });
  afterAll(async () => {
    await cloud?.stop();
    disk?.unmount();
  });

  test("503 disk_full with Retry-After and nothing stored, reads go on, ready says so, and it all resumes without a restart", async () => {
    const dataDir = join(disk.dir, "cloud");
    const minted = await runCli(["sessions", "mint", "--create", "--email", "full@example.com", "--data-dir", dataDir], {}, CLOUD_ENTRY);
    expect(minted.code).toBe(0);
    const token = minted.stdout.trim().split("\n").at(-1) as string;
    cloud = await spawnCloud(dataDir, { ENGINE_CLOUD_TRUSTED_PROXIES: "127.0.0.1" });
    const stored = await fullDiskScenario(cloud, disk, token);
    await cloud.stop();

    const db = new SQLite(join(dataDir, "cloud.db"), { readonly: true });
    try {
      expect(db.query("PRAGMA integrity_check").get()).toEqual({ integrity_check: "ok" });
      const count = (sql: string) => (db.query(sql).get() as { n: number }).n;
      expectNothingHalfCreated(
        {
          requests: count("SELECT count(*) AS n FROM device_requests"),
          audited: count("SELECT count(*) AS n FROM audit WHERE action = 'device_link.requested'"),
          approved: count("SELECT count(*) AS n FROM device_requests WHERE state = 'approved'"),
          nodes: count("SELECT count(*) AS n FROM nodes"),
        },
        stored,
      );
    } finally {
      db.close();
    }
  }, 60000);
});

const postgresOk = await postgresAvailable();

describe.skipIf(!postgresOk)("a full disk under the console [postgres]", () => {
  // The console's tables live in a tablespace on the small disk (default_tablespace), so
  // PostgreSQL itself meets ENOSPC extending them and answers SQLSTATE 53100; its WAL stays
  // on the server's own disk (a full WAL disk stops the server: database_unavailable).
  const suffix = `${process.pid}_${Math.random().toString(36).slice(2, 8)}`;
  const schema = `cloud_disk_${suffix}`;
  const tablespace = `cloud_disk_${suffix}`;
  let disk: Tmpfs | undefined;
  let cloud: SpawnedCloud | undefined;
  let dataDir: string;
  let admin: SQL;
  beforeAll(async () => {
    disk = mountTmpfs("8m");
    // The server writes the tablespace as its own user.
    execFileSync("chown", ["postgres:postgres", disk.dir]);
    dataDir = mkdtempSync(join(tmpdir(), "engine-cloud-pg-"));
    admin = new SQL({ url: POSTGRES_URL, max: 1 });
    await admin.unsafe(`CREATE TABLESPACE ${tablespace} LOCATION '${disk.dir}'`);
    await admin.unsafe(`CREATE SCHEMA ${schema}`);
  });
  afterAll(async () => {
    await cloud?.stop();
    disk?.free();
    await admin.unsafe(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    await admin.unsafe(`DROP TABLESPACE IF EXISTS ${tablespace}`);
    await admin.close();
    disk?.unmount();
    rmSync(dataDir, { recursive: true, force: true });
  });

  test("503 disk_full with Retry-After and nothing stored, reads go on, ready says so, and it all resumes without a restart", async () => {
    const settings = `-c search_path=${schema} -c default_tablespace=${tablespace}`;
    const databaseUrl = `${POSTGRES_URL}${POSTGRES_URL.includes("?") ? "&" : "?"}options=${encodeURIComponent(settings)}`;
    const minted = await runCli(
      ["sessions", "mint", "--create", "--email", "full@example.com", "--data-dir", dataDir, "--database-url", databaseUrl],
      {},
      CLOUD_ENTRY,
    );
    expect(minted.code).toBe(0);
    const token = minted.stdout.trim().split("\n").at(-1) as string;
    cloud = await spawnCloud(dataDir, { ENGINE_CLOUD_TRUSTED_PROXIES: "127.0.0.1", DATABASE_URL: databaseUrl });
    const stored = await fullDiskScenario(cloud as SpawnedCloud, disk as Tmpfs, token);
    const count = async (sql: string) => Number((await admin.unsafe(sql.replaceAll("$schema", schema)))[0].n);
    expectNothingHalfCreated(
      {
        requests: await count("SELECT count(*) AS n FROM $schema.device_requests"),
        audited: await count("SELECT count(*) AS n FROM $schema.audit WHERE action = 'device_link.requested'"),
        approved: await count("SELECT count(*) AS n FROM $schema.device_requests WHERE state = 'approved'"),
        nodes: await count("SELECT count(*) AS n FROM $schema.nodes"),
      },
      stored,
    );
  }, 120000);
});
