/**
 * bench/restore.ts: restoring a PostgreSQL dump through the engine against pg_restore run
 * directly, in the same run, on the same server.
 *
 * An engine (in this process, in a temp dir) runs a managed PostgreSQL database service. The
 * bench fills a source database in that cluster with generated rows (bounded: --mb of table
 * data, at most GENERATE_DEADLINE_MS), dumps it once with `pg_dump -Fc -Z0` (uncompressed, so
 * the dump's size is the data's: ~--mb MB), then alternates, for --rounds rounds:
 *
 *   direct  `pg_restore --no-owner --no-privileges --exit-on-error -d <fresh database>`, the
 *           same flags the engine uses, into a database created just before (not timed);
 *   engine  POST /api/databases/bench-pg/restore, timed from the request to the answer: the
 *           format sniffing, claiming the staging database, the same pg_restore, the swap by
 *           rename and the drop of the replaced database are all inside it. The staging
 *           database is the spare the engine made ahead (engine_spare, made at start and after
 *           each restore, ~0.25 s here); the bench waits for it before each timed run, so the
 *           spare's creation never overlaps one.
 *
 * It prints both times, rows/s for each, and the ratio engine/direct (goal ≤ 1.05).
 *
 * Usage: bun bench/restore.ts [--mb 200] [--rounds 3]
 */
import { chmodSync, mkdirSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { SQL } from "bun";
import { PostgresEngine } from "../src/engine/databases";
import { startTestEngine, type TestEngine, tempDir } from "../test/helpers";
import { fmt, numericArg, printRows } from "./lib";

const MB = numericArg("--mb", 200);
const ROUNDS = numericArg("--rounds", 3);
/** ROW_BYTES is about what one generated row takes in the dump (measured: ~87 bytes). */
const ROW_BYTES = 87;
const GENERATE_DEADLINE_MS = 180_000;
const PASSWORD = "bench-password";

const tools = new PostgresEngine().detectTools({ PATH: process.env.PATH ?? "" });
if (tools.missing.length > 0) {
  console.log(`bench/restore.ts: skipped, PostgreSQL tools missing (${tools.missing.map((m) => m.tool).join(", ")})`);
  process.exit(0);
}

const root = tempDir("engine-bench-restore-");
const dataDir = join(root, "engine");
// An engine running as root runs PostgreSQL as the postgres user, which must be able to enter the data dir.
mkdirSync(join(dataDir, "data"), { recursive: true });
for (const dir of [root, dataDir, join(dataDir, "data")]) chmodSync(dir, 0o711);

let engine: TestEngine | null = null;
try {
  engine = await startTestEngine({ dataDir, logLevel: "warn" });
  const deployed = await engine.json<{ port: number }>("POST", "/api/services", {
    body: { name: "bench-pg", engine: "postgres", secrets: { POSTGRES_PASSWORD: PASSWORD }, stop_timeout_s: 60 },
  });
  if (deployed.status !== 201) throw new Error(`deploy: ${deployed.status} ${JSON.stringify(deployed.body)}`);
  const port = deployed.body.port;
  const deadline = Date.now() + 60_000;
  for (;;) {
    const status = (await engine.json<{ status: string; status_message: string }>("GET", "/api/services/bench-pg")).body;
    if (status.status === "running") break;
    if (Date.now() > deadline) throw new Error(`bench-pg did not start: ${status.status} ${status.status_message}`);
    await Bun.sleep(100);
  }
  const url = (database: string) => `postgresql://postgres:${PASSWORD}@127.0.0.1:${port}/${database}`;
  const admin = new SQL({ url: url("template1"), max: 1 });
  const libpq = { PATH: process.env.PATH ?? "", PGHOST: "127.0.0.1", PGPORT: String(port), PGUSER: "postgres", PGPASSWORD: PASSWORD };

  // 1. Generate the source rows, in batches, within the deadline.
  const wantedRows = Math.ceil((MB * 1024 * 1024) / ROW_BYTES);
  await admin.unsafe("CREATE DATABASE bench_src");
  const source = new SQL({ url: url("bench_src"), max: 1 });
  await source.unsafe(
    "CREATE TABLE ledger (id bigint PRIMARY KEY, account int NOT NULL, amount numeric(12,2) NOT NULL, label text NOT NULL, created timestamptz NOT NULL)",
  );
  const generateStart = performance.now();
  const batch = 250_000;
  let rows = 0;
  while (rows < wantedRows && performance.now() - generateStart < GENERATE_DEADLINE_MS) {
    const upto = Math.min(wantedRows, rows + batch);
    await source.unsafe(
      `INSERT INTO ledger SELECT g, (g * 7919) % 100000, ((g * 104729) % 10000000) / 100.0, md5(g::text) || ' ' || (g % 977),
         timestamptz '2026-01-01' + g * interval '1 second' FROM generate_series(${rows + 1}::bigint, ${upto}::bigint) g`,
    );
    rows = upto;
  }
  await source.unsafe("CREATE INDEX ledger_by_account ON ledger(account)");
  await source.close();
  const generateS = (performance.now() - generateStart) / 1000;
  const dump = join(root, "bench.dump");
  const dumped = Bun.spawnSync(["pg_dump", "-Fc", "-Z0", "-d", "bench_src", "-f", dump], { env: libpq, stderr: "pipe" });
  if (dumped.exitCode !== 0) throw new Error(`pg_dump: ${dumped.stderr.toString()}`);
  await admin.unsafe("DROP DATABASE bench_src");
  const dumpBytes = statSync(dump).size;
  console.log(
    `generated ${rows} rows in ${fmt(generateS, 1)} s; dump ${fmt(dumpBytes / 1024 / 1024, 1)} MiB (pg_dump -Fc -Z0)${rows < wantedRows ? " (cut short by the generation deadline)" : ""}`,
  );

  // 2. Alternate direct and engine restores.
  const direct: number[] = [];
  const viaEngine: number[] = [];
  const reported: number[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    const order = round % 2 === 0 ? ["direct", "engine"] : ["engine", "direct"];
    for (const which of order) {
      // The engine makes its next staging database (engine_spare) after each restore and at start: let that finish
      // first, so that no timed run shares the disk with it.
      await waitForSpare(admin);
      if (which === "direct") {
        await admin.unsafe("DROP DATABASE IF EXISTS bench_direct");
        await admin.unsafe("CREATE DATABASE bench_direct TEMPLATE template0 ENCODING 'UTF8'");
        const started = performance.now();
        const restored = Bun.spawnSync(
          ["pg_restore", "--no-owner", "--no-privileges", "--exit-on-error", "--dbname", "bench_direct", dump],
          { env: libpq, stderr: "pipe" },
        );
        direct.push((performance.now() - started) / 1000);
        if (restored.exitCode !== 0) throw new Error(`pg_restore: ${restored.stderr.toString()}`);
        await admin.unsafe("DROP DATABASE bench_direct");
      } else {
        const started = performance.now();
        const answer = await engine.json<{ duration_s: number }>("POST", "/api/databases/bench-pg/restore", {
          body: { dump, timeout_s: 3600 },
        });
        viaEngine.push((performance.now() - started) / 1000);
        if (answer.status !== 200) throw new Error(`engine restore: ${answer.status} ${JSON.stringify(answer.body)}`);
        reported.push(answer.body.duration_s);
      }
    }
  }
  const check = new SQL({ url: url("postgres"), max: 1 });
  const [{ n }] = (await check`SELECT count(*)::bigint AS n FROM ledger`) as [{ n: bigint }];
  await check.close();
  await admin.close();
  if (Number(n) !== rows) throw new Error(`the engine's restore holds ${n} rows, not ${rows}`);

  const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] ?? Number.NaN;
  const directS = median(direct);
  const engineS = median(viaEngine);
  printRows(
    `PostgreSQL restore of a ${fmt(dumpBytes / 1024 / 1024, 1)} MiB custom-format dump (${rows} rows), median of ${ROUNDS}`,
    ["path", "seconds", "rows/s", "MiB/s", "ratio", "all runs (s)"],
    [
      [
        "pg_restore directly",
        fmt(directS),
        fmt(rows / directS, 0),
        fmt(dumpBytes / 1024 / 1024 / directS, 1),
        "1.00",
        direct.map((s) => fmt(s)).join(" "),
      ],
      [
        "engine (POST restore)",
        fmt(engineS),
        fmt(rows / engineS, 0),
        fmt(dumpBytes / 1024 / 1024 / engineS, 1),
        fmt(engineS / directS),
        viaEngine.map((s) => fmt(s)).join(" "),
      ],
    ],
  );
  console.log(`engine-reported duration_s: ${reported.map((s) => fmt(s)).join(" ")}; goal: ratio ≤ 1.05`);
} finally {
  if (engine) {
    await engine.call("POST", "/api/services/bench-pg/stop").catch(() => undefined);
    await engine.close();
  }
  rmSync(root, { recursive: true, force: true });
}

/** waitForSpare waits (at most 30 s) until the engine's spare staging database exists. */
async function waitForSpare(admin: SQL): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    if ((await admin`SELECT 1 FROM pg_database WHERE datname = 'engine_spare'`).length > 0) return;
    await Bun.sleep(50);
  }
  throw new Error("the engine did not prepare its spare staging database within 30 s");
}
