/**
 * bench/cloud.ts: the console's linking paths on SQLite and PostgreSQL, in this process
 * (client and server share it, as in bench/api.ts):
 *
 *  - device poll requests/s on the `slow_down` path, with the database statements made
 *    during it (the contract says none), next to the same route on its full lookup path
 *    (a first poll of a real pending request: limits, cadence, one SELECT, the constant-time
 *    compare, 202) measured in the same run;
 *  - link-code claim latency p50/p99 over N sequential claims, next to GET /api/health
 *    (the same HTTP round trip with no database) as the floor;
 *  - the 100-way concurrent approval race of one user code by one account: nodes created
 *    (must be 1) and the answers.
 *
 * Usage: bun bench/cloud.ts [--polls 20000] [--claims 300] [--concurrency 32]
 * PostgreSQL is ENGINE_TEST_POSTGRES_URL (default postgres://postgres@127.0.0.1:5432/test);
 * when it does not answer, its half is skipped and says so.
 */
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { SQL } from "bun";
import { resolveCloudConfig } from "../src/cloud/config";
import type { Dialect } from "../src/cloud/db";
import { type RunningCloud, startCloud } from "../src/cloud/server";
import { createLogger } from "../src/lib/logger";
import { fmt, numericArg, printRows } from "./lib";

const polls = numericArg("--polls", 20_000);
const claims = numericArg("--claims", 300);
const concurrency = numericArg("--concurrency", 32);
/** PHASE_DEADLINE_MS bounds each measured phase in time as well as in count. */
const PHASE_DEADLINE_MS = 30_000;
/** POLLS_PER_CODE stays under the per-code poll bucket (20): 1 warm-up + the rest on slow_down. */
const POLLS_PER_CODE = 16;
/**
 * PER_SOURCE stays under the per-address buckets (poll 60, device 10, claim 10) with a margin:
 * concurrent charges of one database bucket can read their clocks out of order, which costs
 * a fraction of a token (DatabaseBuckets' refill does not clamp a negative elapsed time).
 */
const PER_SOURCE = { poll: 50, device: 8, claim: 8 } as const;
const POSTGRES_URL = process.env.ENGINE_TEST_POSTGRES_URL ?? "postgres://postgres@127.0.0.1:5432/test";

let sourceCounter = 0;
/** newSource returns a fresh client address (X-Forwarded-For is trusted here), so requests spread over buckets. */
function newSource(): string {
  sourceCounter += 1;
  return `10.${(sourceCounter >> 16) & 255}.${(sourceCounter >> 8) & 255}.${sourceCounter & 255}`;
}

function percentile(sorted: number[], p: number): number {
  return sorted.length === 0 ? Number.NaN : (sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? Number.NaN);
}

/** drive runs `fn(i)` for i < total over `workers` loops, bounded by the phase deadline, and times each call. */
async function drive(total: number, workers: number, fn: (i: number) => Promise<void>) {
  const latencies: number[] = [];
  let next = 0;
  const deadline = performance.now() + PHASE_DEADLINE_MS;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: workers }, async () => {
      while (next < total && performance.now() < deadline) {
        const i = next++;
        const t0 = performance.now();
        await fn(i);
        latencies.push(performance.now() - t0);
      }
    }),
  );
  const elapsed = performance.now() - started;
  latencies.sort((a, b) => a - b);
  return {
    count: latencies.length,
    rps: (latencies.length / elapsed) * 1000,
    p50: percentile(latencies, 50),
    p99: percentile(latencies, 99),
  };
}

async function startBenchCloud(dialect: Dialect): Promise<{ cloud: RunningCloud; close(): Promise<void> } | null> {
  const dataDir = mkdtempSync(join(tmpdir(), "engine-cloud-bench-"));
  let databaseUrl = `sqlite://${dataDir}/cloud.db`;
  let dropSchema = async () => {};
  if (dialect === "postgres") {
    const schema = `cloud_bench_${process.pid}_${randomBytes(4).toString("hex")}`;
    const admin = new SQL({ url: POSTGRES_URL, max: 1, connectionTimeout: 3 });
    try {
      await admin.unsafe(`CREATE SCHEMA ${schema}`);
    } catch {
      rmSync(dataDir, { recursive: true, force: true });
      return null;
    } finally {
      await admin.close().catch(() => {});
    }
    databaseUrl = `${POSTGRES_URL}${POSTGRES_URL.includes("?") ? "&" : "?"}options=${encodeURIComponent(`-c search_path=${schema}`)}`;
    dropSchema = async () => {
      const again = new SQL({ url: POSTGRES_URL, max: 1 });
      await again.unsafe(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      await again.close();
    };
  }
  // Role `api`: the worker's sweep would add statements of its own to the count.
  const config = resolveCloudConfig(
    { dataDir, port: 0, databaseUrl, role: "api", logLevel: "warn", logToStdout: false, trustedProxies: "127.0.0.1" },
    {},
  );
  const cloud = await startCloud(config, { log: createLogger({ level: "warn", dataDir, stdout: false, fileName: "cloud.log" }).log });
  return {
    cloud,
    async close() {
      await cloud.stop();
      await dropSchema();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

async function benchDialect(dialect: Dialect): Promise<void> {
  const started = await startBenchCloud(dialect);
  if (!started) {
    console.log(`\n[${dialect}] skipped: PostgreSQL does not answer at ${POSTGRES_URL}`);
    return;
  }
  const { cloud, close } = started;
  const { deps } = cloud;
  const stats = deps.db.stats;
  const post = async (path: string, body: unknown, source: string, token?: string) => {
    const headers: Record<string, string> = { "content-type": "application/json", "x-forwarded-for": source };
    if (token) headers.authorization = `Bearer ${token}`;
    const response = await fetch(`${cloud.url}${path}`, { method: "POST", headers, body: JSON.stringify(body) });
    const text = await response.text();
    return { status: response.status, body: text ? JSON.parse(text) : null };
  };
  const tally = (counts: Map<string, number>, key: string) => counts.set(key, (counts.get(key) ?? 0) + 1);
  const show = (counts: Map<string, number>) => [...counts].map(([k, v]) => `${k}×${v}`).join(" ");
  try {
    // ---- poll: the full lookup path (anchor). First polls of real pending requests.
    const realCount = Math.min(2000, Math.max(200, Math.floor(polls / 10)));
    const real: string[] = [];
    let deviceSource = newSource();
    await drive(realCount, concurrency, async (i) => {
      if (i % PER_SOURCE.device === 0) deviceSource = newSource();
      const answer = await post("/api/link/device", { hostname: `bench-${i}`, os: "linux", version: "bench" }, deviceSource);
      if (answer.status !== 201) throw new Error(`device request answered ${answer.status}`);
      real.push(answer.body.device_code);
    });
    let pollSource = newSource();
    const fullStatuses = new Map<string, number>();
    const fullBefore = stats.statements;
    const full = await drive(real.length, concurrency, async (i) => {
      if (i % PER_SOURCE.poll === 0) pollSource = newSource();
      tally(fullStatuses, String((await post("/api/link/device/poll", { device_code: real[i] }, pollSource)).status));
    });
    const fullStatements = stats.statements - fullBefore;

    // ---- poll: the slow_down path. Invented codes, each polled once to arm the cadence, then again and again.
    const codeCount = Math.ceil(polls / (POLLS_PER_CODE - 1));
    const invented = Array.from(
      { length: codeCount },
      () => `dev_${randomBytes(8).toString("hex")}.${randomBytes(32).toString("base64url")}`,
    );
    await drive(codeCount, concurrency, async (i) => {
      if (i % PER_SOURCE.poll === 0) pollSource = newSource();
      await post("/api/link/device/poll", { device_code: invented[i] }, pollSource);
    });
    const slowStatuses = new Map<string, number>();
    const slowBefore = stats.statements;
    const slow = await drive(polls, concurrency, async (i) => {
      if (i % PER_SOURCE.poll === 0) pollSource = newSource();
      const answer = await post("/api/link/device/poll", { device_code: invented[i % codeCount] }, pollSource);
      tally(slowStatuses, `${answer.status} ${answer.body?.error?.code ?? ""}`.trim());
    });
    const slowStatements = stats.statements - slowBefore;

    printRows(
      `[${dialect}] POST /api/link/device/poll, ${concurrency} concurrent, client in this process`,
      ["path", "requests", "req/s", "p50 ms", "p99 ms", "db statements", "per request", "ratio", "answers"],
      [
        [
          "full lookup (anchor)",
          full.count,
          fmt(full.rps, 0),
          fmt(full.p50),
          fmt(full.p99),
          fullStatements,
          fmt(fullStatements / full.count),
          "1.00",
          show(fullStatuses),
        ],
        [
          "slow_down",
          slow.count,
          fmt(slow.rps, 0),
          fmt(slow.p50),
          fmt(slow.p99),
          slowStatements,
          fmt(slowStatements / slow.count),
          fmt(slow.rps / full.rps),
          show(slowStatuses),
        ],
      ],
    );
    if (slowStatements !== 0) console.log(`!! the slow_down path made ${slowStatements} database statements; the contract says none`);

    // ---- claim latency: N sequential claims of fresh codes, next to GET /api/health.
    const account = await deps.accounts.add(`bench-${dialect}@example.com`, { nodeLimit: 1_000_000 });
    const { token } = await deps.sessions.mint(account.id, "minted");
    const codes: string[] = [];
    for (let i = 0; i < claims; i++) codes.push((await post("/api/link/codes", {}, "10.255.0.1", token)).body.code);
    const health = await drive(claims, 1, async () => {
      await (await fetch(`${cloud.url}/api/health`)).arrayBuffer();
    });
    let claimSource = newSource();
    const claimStatuses = new Map<string, number>();
    const claimed = await drive(codes.length, 1, async (i) => {
      if (i % PER_SOURCE.claim === 0) claimSource = newSource();
      tally(
        claimStatuses,
        String((await post("/api/link/claim", { code: codes[i], hostname: `claim-${i}`, os: "linux" }, claimSource)).status),
      );
    });
    printRows(
      `[${dialect}] sequential latency, ${claims} requests each`,
      ["route", "requests", "p50 ms", "p99 ms", "p50 ratio", "answers"],
      [
        ["GET /api/health (floor)", health.count, fmt(health.p50), fmt(health.p99), "1.00", "200"],
        ["POST /api/link/claim", claimed.count, fmt(claimed.p50), fmt(claimed.p99), fmt(claimed.p50 / health.p50), show(claimStatuses)],
      ],
    );

    // ---- the 100-way approval race: one user code, one account, a session each (so each passes its own limit).
    const racer = await deps.accounts.add(`race-${dialect}@example.com`);
    const tokens = await Promise.all(Array.from({ length: 100 }, async () => (await deps.sessions.mint(racer.id, "minted")).token));
    const device = await post("/api/link/device", { hostname: "contested", os: "linux", version: "bench" }, newSource());
    const raceStatuses = new Map<string, number>();
    const raceStart = performance.now();
    const answers = await Promise.all(
      tokens.map((t) => post("/api/nodes/device-approvals/approve", { user_code: device.body.user_code }, newSource(), t)),
    );
    const raceMs = performance.now() - raceStart;
    for (const answer of answers) tally(raceStatuses, `${answer.status} ${answer.body?.error?.code ?? ""}`.trim());
    const nodes = (await deps.nodes.list(racer.id)).length;
    printRows(
      `[${dialect}] 100 concurrent approvals of one user code`,
      ["nodes created", "expected", "wall ms", "answers"],
      [[nodes, 1, fmt(raceMs, 0), show(raceStatuses)]],
    );
    if (nodes !== 1) console.log(`!! the race created ${nodes} nodes`);
  } finally {
    await close();
  }
}

for (const dialect of ["sqlite", "postgres"] as Dialect[]) await benchDialect(dialect);
