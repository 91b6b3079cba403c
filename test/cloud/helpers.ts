import { describe } from "bun:test";
import { rmSync } from "node:fs";
import { SQL } from "bun";
import type { AccountChanges } from "../../src/cloud/accounts";
import { type CloudConfigInput, resolveCloudConfig } from "../../src/cloud/config";
import type { Dialect } from "../../src/cloud/db";
import { type CloudOptions, type RunningCloud, startCloud } from "../../src/cloud/server";
import { createLogger } from "../../src/lib/logger";
import { tempDir } from "../helpers";
import { removeAfterRun } from "../run-dirs";

/** POSTGRES_URL is the test PostgreSQL (trust auth, database `test`); ENGINE_TEST_POSTGRES_URL overrides it. */
export const POSTGRES_URL = process.env.ENGINE_TEST_POSTGRES_URL ?? "postgres://postgres@127.0.0.1:5432/test";

let postgresReachable: boolean | undefined;
/** postgresAvailable says once per test process whether the test PostgreSQL answers. */
export async function postgresAvailable(): Promise<boolean> {
  if (postgresReachable !== undefined) return postgresReachable;
  const client = new SQL({ url: POSTGRES_URL, max: 1, connectionTimeout: 3 });
  try {
    await client`SELECT 1`;
    postgresReachable = true;
  } catch {
    postgresReachable = false;
  } finally {
    await client.close().catch(() => {});
  }
  return postgresReachable;
}

/**
 * DIALECTS are the databases every cloud suite runs against. PostgreSQL is required where
 * ENGINE_REQUIRE_POSTGRES=1 (CI starts it); elsewhere an unreachable one skips its half of
 * each suite and says so, rather than failing a laptop without PostgreSQL.
 */
export const DIALECTS: Dialect[] = ["sqlite", "postgres"];
const postgresOk = await postgresAvailable();
if (!postgresOk) {
  if (process.env.ENGINE_REQUIRE_POSTGRES === "1") throw new Error(`PostgreSQL is required but does not answer at ${POSTGRES_URL}`);
  process.stderr.write(`note: PostgreSQL does not answer at ${POSTGRES_URL}; the PostgreSQL half of the cloud tests is skipped\n`);
}

/** describeEachDialect runs a suite once on SQLite and once on PostgreSQL. */
export function describeEachDialect(name: string, suite: (dialect: Dialect) => void): void {
  for (const dialect of DIALECTS) {
    const run = dialect === "postgres" && !postgresOk ? describe.skip : describe;
    run(`${name} [${dialect}]`, () => suite(dialect));
  }
}

/** TestCloud is a console started for one test file: its URL, modules, and helpers to sign in. */
export interface TestCloud extends RunningCloud {
  dataDir: string;
  dialect: Dialect;
  /** databaseUrl reaches this cloud's own database (its own schema on PostgreSQL). */
  databaseUrl: string;
  /** signIn creates an account (if new) with the given settings and returns a bearer session token. */
  signIn(email: string, changes?: AccountChanges): Promise<{ token: string; accountId: string }>;
  /** api sends a JSON request and returns the status and parsed body (typed loosely: tests read any field). */
  api(
    method: string,
    path: string,
    options?: { body?: unknown; token?: string; headers?: Record<string, string> },
    // biome-ignore lint/suspicious/noExplicitAny: a test reads whichever fields it asserts on.
  ): Promise<{ status: number; body: any; headers: Headers }>;
  close(): Promise<void>;
}

/**
 * startTestCloud starts a console on port 0 in a temp dir with a fresh database: a SQLite
 * file, or a PostgreSQL schema of its own (dropped on close), so test files never share rows.
 */
export async function startTestCloud(dialect: Dialect, input: CloudConfigInput = {}, options: CloudOptions = {}): Promise<TestCloud> {
  const dataDir = removeAfterRun(tempDir("engine-cloud-test-"));
  let databaseUrl = `sqlite://${dataDir}/cloud.db`;
  let dropSchema: (() => Promise<void>) | undefined;
  if (dialect === "postgres") {
    const schema = `cloud_test_${process.pid}_${Math.random().toString(36).slice(2, 10)}`;
    const admin = new SQL({ url: POSTGRES_URL, max: 1 });
    await admin.unsafe(`CREATE SCHEMA ${schema}`);
    await admin.close();
    databaseUrl = `${POSTGRES_URL}${POSTGRES_URL.includes("?") ? "&" : "?"}options=${encodeURIComponent(`-c search_path=${schema}`)}`;
    dropSchema = async () => {
      const again = new SQL({ url: POSTGRES_URL, max: 1 });
      await again.unsafe(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      await again.close();
    };
  }
  const config = resolveCloudConfig({ dataDir, port: 0, databaseUrl, logLevel: "warn", logToStdout: false, ...input }, {});
  let cloud: RunningCloud;
  try {
    cloud = await startCloud(config, {
      log: options.log ?? createLogger({ level: "warn", dataDir, stdout: false, fileName: "cloud.log" }).log,
      ...options,
    });
  } catch (error) {
    await dropSchema?.();
    throw error;
  }
  const api: TestCloud["api"] = async (method, path, opts = {}) => {
    const headers: Record<string, string> = { ...opts.headers };
    if (opts.token) headers.authorization = `Bearer ${opts.token}`;
    if (opts.body !== undefined) headers["content-type"] = "application/json";
    const response = await fetch(`${cloud.url}${path}`, {
      method,
      headers,
      body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
      redirect: "manual",
    });
    const text = await response.text();
    let body: unknown = text;
    try {
      body = text ? JSON.parse(text) : null;
    } catch {
      // not JSON: keep the text
    }
    return { status: response.status, body, headers: response.headers };
  };
  return {
    ...cloud,
    dataDir,
    dialect,
    databaseUrl,
    api,
    async signIn(email, changes = {}) {
      const account = (await cloud.deps.accounts.byEmail(email)) ?? (await cloud.deps.accounts.add(email, changes));
      if (Object.keys(changes).length > 0) await cloud.deps.accounts.set(account.id, changes);
      const { token } = await cloud.deps.sessions.mint(account.id, "minted");
      return { token, accountId: account.id };
    },
    async close() {
      await cloud.stop();
      await dropSchema?.();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}
