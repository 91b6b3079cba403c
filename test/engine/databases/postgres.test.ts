import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { rmSync, writeFileSync } from "node:fs";
import { SQL } from "bun";
import type { ServiceRecord } from "../../../src/contract/engine";
import { lookupUser } from "../../../src/engine/databases";
import { eventually } from "../../helpers";
import {
  asRoot,
  type DatabaseTestEngine,
  expectClosedDataDirRefused,
  expectConnection,
  lastDump,
  libpqEnv,
  postgresTools,
  processUids,
  referenceAvailable,
  referenceUrl,
  restore,
  run,
  startDatabaseEngine,
  suiteWhen,
} from "./helpers";

const toolsOk = postgresTools();
const referenceOk = toolsOk && (await referenceAvailable());
const suite = suiteWhen(referenceOk, "ENGINE_REQUIRE_POSTGRES", "PostgreSQL (its programs and the reference server on 127.0.0.1:5432)");

/** REFERENCE_DB is this test process's own database on the reference server, dropped at the end. */
const REFERENCE_DB = `engine_restore_ref_${process.pid}`;
const PASSWORD = "test-password-1";

/** LEFTOVERS finds staging and replaced databases a restore should never leave behind (the spare, engine_spare, is kept on purpose). */
const LEFTOVERS = "SELECT datname FROM pg_database WHERE datname LIKE 'engine\\_restore\\_%' OR datname LIKE 'engine\\_replaced\\_%'";

/** CHECKSUMS is what the tests compare between the reference and a restored database. */
const CHECKSUMS = `
  SELECT
    (SELECT count(*) FROM items)::int AS items,
    (SELECT count(*) FROM tags)::int AS tags,
    (SELECT md5(string_agg(i::text, ',' ORDER BY id)) FROM items i) AS items_md5,
    (SELECT md5(string_agg(t::text, ',' ORDER BY id)) FROM tags t) AS tags_md5,
    (SELECT count(*) FROM expensive)::int AS view_rows`;

async function query<T>(url: string, text: string): Promise<T[]> {
  const client = new SQL({ url, max: 1, connectionTimeout: 5 });
  try {
    return (await client.unsafe(text)) as T[];
  } finally {
    await client.close();
  }
}

let db: DatabaseTestEngine;
let scratch: string;
let reference: Record<string, unknown>;
const dumps: Record<string, string> = {};

/** serviceUrl is the URL of a database of the engine-managed service, with the password the tests deployed it with. */
function serviceUrl(record: ServiceRecord, database = "postgres"): string {
  return `postgresql://postgres:${PASSWORD}@127.0.0.1:${record.port}/${database}`;
}

async function checksums(record: ServiceRecord): Promise<Record<string, unknown>> {
  const [row] = await query<Record<string, unknown>>(serviceUrl(record), CHECKSUMS);
  return row ?? {};
}

suite("PostgreSQL database services", () => {
  let pg: ServiceRecord;

  beforeAll(async () => {
    db = await startDatabaseEngine();
    scratch = db.root;
    // Reference data: two tables with a foreign key, an index, a view, NULLs, unicode and numerics.
    await query(REFERENCE_URL_ADMIN(), `DROP DATABASE IF EXISTS ${REFERENCE_DB}`);
    await query(REFERENCE_URL_ADMIN(), `CREATE DATABASE ${REFERENCE_DB}`);
    await query(
      referenceUrl(REFERENCE_DB),
      `CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, price numeric(10,2), note text, created timestamptz NOT NULL);
       INSERT INTO items SELECT g, 'item ' || g || ' ✓', (g % 1000) / 7.0, CASE WHEN g % 5 = 0 THEN NULL ELSE md5(g::text) END,
         timestamptz '2026-01-01 00:00:00+00' + g * interval '1 minute' FROM generate_series(1, 20000) g;
       CREATE TABLE tags (id serial PRIMARY KEY, item_id int NOT NULL REFERENCES items(id), tag text NOT NULL);
       INSERT INTO tags (item_id, tag) SELECT (g % 20000) + 1, 'tag' || (g % 37) FROM generate_series(1, 5000) g;
       CREATE INDEX tags_by_item ON tags(item_id);
       CREATE VIEW expensive AS SELECT * FROM items WHERE price > 100;`,
    );
    [reference] = (await query<Record<string, unknown>>(referenceUrl(REFERENCE_DB), CHECKSUMS)) as [Record<string, unknown>];
    const env = libpqEnv(REFERENCE_DB);
    dumps.custom = `${scratch}/ref.dump`;
    dumps.plain = `${scratch}/ref.sql`;
    dumps.directory = `${scratch}/ref.dir`;
    dumps.tar = `${scratch}/ref.tar`;
    run(["pg_dump", "-Fc", "-f", dumps.custom], env);
    run(["pg_dump", "-Fp", "-f", dumps.plain], env);
    run(["pg_dump", "-Fd", "-f", dumps.directory], env);
    run(["pg_dump", "-Ft", "-f", dumps.tar], env);
    run(["sh", "-c", `gzip -c '${dumps.plain}' > '${scratch}/ref.sql.gz'`]);
    dumps.plainGz = `${scratch}/ref.sql.gz`;
    // A restore that takes a while: pg_dump's header, one table, then a pause.
    dumps.slow = `${scratch}/slow.sql`;
    writeFileSync(
      dumps.slow,
      "--\n-- PostgreSQL database dump\n--\n\nCREATE TABLE slow (id int);\nINSERT INTO slow VALUES (1);\nSELECT pg_sleep(4);\n",
    );
    dumps.failing = `${scratch}/failing.sql`;
    writeFileSync(
      dumps.failing,
      "--\n-- PostgreSQL database dump\n--\n\nCREATE TABLE half (id int);\nINSERT INTO half VALUES (1);\nINSERT INTO no_such_table VALUES (1);\n",
    );
    const { status, body } = await db.api.deploy({ name: "pg", template_id: "postgres", secrets: { POSTGRES_PASSWORD: PASSWORD } });
    if (status !== 201) throw new Error(`deploy: ${status} ${JSON.stringify(body)}`);
    pg = await db.api.waitFor("pg", "running", () => true, 60_000);
  }, 120_000);

  afterAll(async () => {
    await db?.close(["pg", "pg-gen", "pg-forced"]);
    if (referenceOk) await query(REFERENCE_URL_ADMIN(), `DROP DATABASE IF EXISTS ${REFERENCE_DB}`).catch(() => undefined);
  }, 60_000);

  test("a template deploy gets a free port, a generated password kept as a secret, and is running only once it accepts connections", async () => {
    const { status, body } = await db.api.deploy({ name: "pg-gen", template_id: "postgres" });
    expect(status).toBe(201);
    expect(body.kind).toBe("database");
    expect(body.port).not.toBe(5432);
    expect(body.port).toBeGreaterThan(0);
    expect(body.secret_keys).toEqual(["POSTGRES_PASSWORD"]);
    expect(JSON.stringify(body)).not.toContain("POSTGRES_PASSWORD=");
    expect(body.env).toEqual({ POSTGRES_USER: "postgres", POSTGRES_DB: "postgres" });
    const running = await db.api.waitFor("pg-gen", "running", () => true, 60_000);
    // Its record and Diagnosis name the user the server runs as: postgres under a root engine (the adapter switches to it).
    const serverUser = asRoot ? lookupUser("postgres") : null;
    expect(running.user).toBe(serverUser?.user ?? null);
    expect((await db.api.diagnose("pg-gen")).user).toBe(serverUser?.user ?? null);
    if (serverUser) expect(processUids(running.pid as number)[0]).toBe(serverUser.uid);
    // running means it answers a query: a bound job reads the credentials from its bindings and asks.
    await db.api.deployed({
      name: "pg-client",
      kind: "batch",
      command: `psql -XAtc "SELECT 'answer=' || (6 * 7)" && echo "url=$DATABASE_URL" | sed 's/:[^:@]*@/:***@/'`,
      bindings: ["pg-gen"],
      restart: { policy: "never" },
    });
    await db.api.waitFor("pg-client", "completed", () => true, 30_000);
    const diagnosis = await db.api.diagnose("pg-client");
    const lines = diagnosis.logs.map((line) => line.line);
    expect(lines).toContain("answer=42");
    expect(lines).toContain(`url=postgresql://postgres:***@127.0.0.1:${running.port}/postgres`);
    expect(diagnosis.injected_env_keys).toEqual(expect.arrayContaining(["DATABASE_URL", "PGPASSWORD", "PG_GEN_DATABASE"]));
    // The password never leaves through the API.
    const everything = JSON.stringify([await db.api.get("pg-gen"), await db.api.diagnose("pg-gen"), diagnosis]);
    expect(everything).not.toMatch(/PGPASSWORD=|POSTGRES_PASSWORD":/);
    await db.engine.call("DELETE", "/api/services/pg-client");
  }, 90_000);

  test("the connection is shown with its password masked; an admin reveals it (logged), and it connects", async () => {
    const revealed = await expectConnection(db, "pg", PASSWORD);
    expect(revealed).toMatchObject({
      engine: "postgres",
      host: "127.0.0.1",
      port: pg.port,
      database: "postgres",
      user: "postgres",
      path: null,
    });
    expect(revealed.url).toBe(serviceUrl(pg));
    expect(await query(revealed.url, "SELECT 6 * 7 AS answer")).toEqual([{ answer: 42 }]);
  }, 30_000);

  test.each([
    ["custom", "postgres-custom"],
    ["plain", "postgres-sql"],
    ["plainGz", "postgres-sql"],
    ["directory", "postgres-directory"],
    ["tar", "postgres-tar"],
  ])(
    "a pg_dump %s dump restores through the API with the reference's rows and checksums",
    async (kind, format) => {
      const dump = dumps[kind] as string;
      const { status, body } = await restore(db.engine, "pg", dump);
      expect(status).toBe(200);
      expect(body).toMatchObject({ service_name: "pg", dump, engine: "postgres" });
      expect(body.duration_s as number).toBeGreaterThan(0);
      expect(await checksums(pg)).toEqual(reference);
      const last = await lastDump(db.api, "pg");
      expect(last).toMatchObject({ dump, format, engine: "postgres", result: "ok" });
      expect(last?.bytes).toBe(last?.total_bytes);
      expect(last?.duration_s).toBe(body.duration_s);
      // No staging database is left behind.
      const leftovers = await query(serviceUrl(pg), LEFTOVERS);
      expect(leftovers).toEqual([]);
    },
    60_000,
  );

  test("progress and the outcome are in the service's log", async () => {
    const logs = await db.engine.json<{ line: string; stream: string }[]>("GET", "/api/services/pg/logs?tail=400");
    const engineLines = logs.body.filter((line) => line.stream === "engine").map((line) => line.line);
    expect(engineLines.some((line) => /^restore: read \d+ of \d+ bytes \(100%\)$/.test(line))).toBe(true);
    expect(engineLines.some((line) => line.startsWith("restore: done in "))).toBe(true);
  });

  test("a restore past timeout_s is stopped, answers 504 and leaves the database as it was", async () => {
    const before = await checksums(pg);
    const started = Date.now();
    const { status, body } = await restore(db.engine, "pg", dumps.slow as string, 1);
    expect(status).toBe(504);
    expect(body.error?.code).toBe("restore_timed_out");
    expect(Date.now() - started).toBeLessThan(4000);
    expect(await checksums(pg)).toEqual(before);
    const tables = await query(serviceUrl(pg), "SELECT 1 FROM pg_tables WHERE tablename = 'slow'");
    expect(tables).toEqual([]);
    const leftovers = await query(serviceUrl(pg), LEFTOVERS);
    expect(leftovers).toEqual([]);
    expect(await lastDump(db.api, "pg")).toMatchObject({ result: "timeout", format: "postgres-sql" });
  }, 30_000);

  test("a second restore into the same database while one runs gets 409", async () => {
    const first = restore(db.engine, "pg", dumps.slow as string, 30);
    await eventually(async () => (await lastDump(db.api, "pg"))?.result === "running", { timeoutMs: 5000 });
    const second = await restore(db.engine, "pg", dumps.custom as string);
    expect(second.status).toBe(409);
    expect(second.body.error?.code).toBe("restore_in_progress");
    expect((await first).status).toBe(200);
    // The slow dump held only its one table: the restore replaced the database with it.
    expect(await query(serviceUrl(pg), "SELECT count(*)::int AS n FROM slow")).toEqual([{ n: 1 }]);
    expect((await restore(db.engine, "pg", dumps.custom as string)).status).toBe(200);
    expect(await checksums(pg)).toEqual(reference);
  }, 60_000);

  test.each([
    ["random bytes", "garbage.bin", new Uint8Array(4096).map((_, i) => (i * 131 + 7) % 256), "dump_unrecognized", /binary data/],
    ["text that is not SQL", "notes.txt", "hello, this is not a dump\n", "dump_unrecognized", /text that is not a recognised dump/],
    ["an empty file", "empty.sql", "", "dump_unrecognized", /empty file/],
  ])(
    "an unrecognised dump (%s) is a 422 that names what was detected, and changes nothing",
    async (_label, name, content, type, detected) => {
      const path = `${scratch}/${name}`;
      writeFileSync(path, content);
      const { status, body } = await restore(db.engine, "pg", path);
      expect(status).toBe(422);
      expect(body.detail?.[0]?.type).toBe(type);
      expect(String(body.detail?.[0]?.ctx.detected)).toMatch(detected);
      expect(await checksums(pg)).toEqual(reference);
    },
  );

  test("a corrupt archive and a failing SQL dump are 422 and leave the database as it was", async () => {
    const truncated = `${scratch}/truncated.dump`;
    const whole = await Bun.file(dumps.custom as string).arrayBuffer();
    writeFileSync(truncated, new Uint8Array(whole).subarray(0, Math.floor(whole.byteLength / 2)));
    for (const dump of [truncated, dumps.failing as string]) {
      const { status, body } = await restore(db.engine, "pg", dump);
      expect(status).toBe(422);
      expect(body.detail?.[0]?.type).toBe("restore_failed");
      expect(await checksums(pg)).toEqual(reference);
      expect(await lastDump(db.api, "pg")).toMatchObject({ result: "failed", dump });
    }
    const leftovers = await query(serviceUrl(pg), LEFTOVERS);
    expect(leftovers).toEqual([]);
  }, 30_000);

  test("a plain dump's shell escape (\\!) never runs as the engine's user: psql runs as the server's", async () => {
    const marker = `/tmp/engine-psql-escape-${process.pid}-${Date.now()}`;
    const dump = `${scratch}/escape.sql`;
    writeFileSync(dump, `--\n-- PostgreSQL database dump\n--\n\nCREATE TABLE escape_probe (id int);\n\\! id -u > ${marker}\n`);
    try {
      const { status } = await restore(db.engine, "pg", dump);
      expect(status).toBe(200);
      // The escape ran (a dump may do what its SQL may), but not as the engine's user when that is root.
      const uid = (await Bun.file(marker).text()).trim();
      if (process.getuid?.() === 0) expect(uid).not.toBe("0");
      else expect(uid).toBe(String(process.getuid?.()));
    } finally {
      rmSync(marker, { force: true });
    }
    // Put the reference data back for the tests that follow.
    expect((await restore(db.engine, "pg", dumps.custom as string)).status).toBe(200);
  }, 30_000);

  test("errors: unknown database 404, not a database 409, another engine's dump 409, unreadable dump 422", async () => {
    expect((await restore(db.engine, "nothing-here", dumps.custom as string)).status).toBe(404);
    await db.api.deployed({ name: "web", command: "exec sleep 300" });
    const notDb = await restore(db.engine, "web", dumps.custom as string);
    expect(notDb.status).toBe(409);
    expect(notDb.body.error?.code).toBe("not_a_database");
    expect(notDb.body.error?.message).toBe("web is a service, not a database: nothing to restore into");
    const noConnection = await db.engine.json<{ error: { code: string; message: string } }>("GET", "/api/services/web/connection");
    expect(noConnection.status).toBe(409);
    expect(noConnection.body.error).toMatchObject({
      code: "not_a_database",
      message: "web is a service, not a database: it has no connection details",
    });
    expect((await db.api.get("web")).connection).toBeNull();
    await db.engine.call("DELETE", "/api/services/web");
    const rdb = `${scratch}/dump.rdb`;
    writeFileSync(rdb, "REDIS0011\xfa\x09redis-ver\x057.0.0\xff");
    const wrong = await restore(db.engine, "pg", rdb);
    expect(wrong.status).toBe(409);
    expect(wrong.body.error?.code).toBe("dump_engine_mismatch");
    expect(wrong.body.error?.message).toContain("Redis RDB");
    const sqliteFile = `${scratch}/other.sqlite3`;
    writeFileSync(sqliteFile, `SQLite format 3\0${"\0".repeat(100)}`);
    expect((await restore(db.engine, "pg", sqliteFile)).body.error?.code).toBe("dump_engine_mismatch");
    const missing = await restore(db.engine, "pg", `${scratch}/no-such.dump`);
    expect(missing.status).toBe(422);
    expect(missing.body.detail?.[0]).toMatchObject({ type: "dump_unreadable", ctx: { detected: "no such file" } });
    const relative = await restore(db.engine, "pg", "ref.dump");
    expect(relative.status).toBe(422);
    const http = await restore(db.engine, "pg", "http://127.0.0.1:1/ref.dump");
    expect(http.status).toBe(422);
    expect(await checksums(pg)).toEqual(reference);
  }, 30_000);

  test("a file:// URL is a path", async () => {
    const { status } = await restore(db.engine, "pg", `file://${dumps.custom}`);
    expect(status).toBe(200);
    expect(await checksums(pg)).toEqual(reference);
  }, 30_000);

  test("stop is pg_ctl stop -m fast with no SIGKILL; data survives a restart", async () => {
    const stopped = await db.api.control("pg", "stop");
    expect(stopped.status).toBe(200);
    const diagnosis = await db.api.diagnose("pg");
    expect(diagnosis.last_run).toMatchObject({ stop_method: "pg_ctl stop -m fast", forced_kill: false, signal: null, exit_code: 0 });
    expect(diagnosis.logs.map((line) => line.line).join("\n")).toContain("database system is shut down");
    expect((await db.api.control("pg", "start")).status).toBe(200);
    pg = await db.api.waitFor("pg", "running", () => true, 60_000);
    expect(await checksums(pg)).toEqual(reference);
  }, 90_000);

  test("a stop that passes stop_timeout_s ends in SIGKILL, and Diagnosis says so", async () => {
    await db.api.deployed({ name: "pg-forced", template_id: "postgres", stop_timeout_s: 0 });
    await db.api.waitFor("pg-forced", "running", () => true, 60_000);
    expect((await db.api.control("pg-forced", "stop")).status).toBe(200);
    const diagnosis = await db.api.diagnose("pg-forced");
    expect(diagnosis.last_run).toMatchObject({ stop_method: "pg_ctl stop -m fast", forced_kill: true, signal: "SIGKILL" });
    expect(diagnosis.logs.map((line) => line.line).join("\n")).toContain(
      "did not end the process within 0 s (stop_timeout_s): sent SIGKILL",
    );
    // It comes back (crash recovery) and is running again once it accepts connections.
    expect((await db.api.control("pg-forced", "start")).status).toBe(200);
    await db.api.waitFor("pg-forced", "running", () => true, 60_000);
  }, 120_000);
});

/** REFERENCE_URL_ADMIN is the reference server's own database, from which test databases are made and dropped. */
function REFERENCE_URL_ADMIN(): string {
  return referenceUrl(
    new URL(process.env.ENGINE_TEST_POSTGRES_URL ?? "postgres://postgres@127.0.0.1:5432/test").pathname.slice(1) || "test",
  );
}

(referenceOk && asRoot ? describe : describe.skip)("PostgreSQL under a root engine whose data dir the postgres user cannot enter", () => {
  test("start-up warns, the start fails with the directory and the fix, and nothing above the data dir is loosened", async () => {
    await expectClosedDataDirRefused("postgres", { engine: "postgres" }, ["chmod g+x"]);
  }, 60_000);
});
