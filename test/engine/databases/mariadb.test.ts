import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chownSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { SQL } from "bun";
import type { ServiceRecord } from "../../../src/contract/engine";
import { lookupUser, MariaDbEngine, osUserName } from "../../../src/engine/databases";
import { eventually, freePort } from "../../helpers";
import {
  asRoot,
  type DatabaseTestEngine,
  expectClosedDataDirRefused,
  expectConnection,
  freshTempPath,
  lastDump,
  processUids,
  restore,
  run,
  startDatabaseEngine,
  suiteWhen,
} from "./helpers";

const engineAdapter = new MariaDbEngine();
const tools = engineAdapter.detectTools({ PATH: process.env.PATH ?? "" });
const toolsOk = tools.missing.length === 0 && Bun.which("mariadb-dump") !== null;
const suite = suiteWhen(toolsOk, "ENGINE_REQUIRE_MARIADB", "MariaDB (Debian packages mariadb-server, mariadb-client)");

const PASSWORD = "test-password-1";
const PATH_ENV = { PATH: `${process.env.PATH ?? "/usr/bin:/bin"}:/usr/sbin` };

/** ReferenceServer is a MariaDB server the test starts itself, where reference data is made and dumped. */
interface ReferenceServer {
  socket: string;
  pid: number;
  stop(): Promise<void>;
}

/** asServerUser runs argv as mysql when the tests run as root (MariaDB refuses root), as the engine does. */
function asServerUser(argv: string[]): string[] {
  if (process.getuid?.() !== 0) return argv;
  const mysql = lookupUser("mysql");
  if (!mysql) throw new Error("running as root needs the mysql user (Debian package mariadb-server)");
  return ["setpriv", `--reuid=${mysql.uid}`, `--regid=${mysql.gid}`, "--clear-groups", "--", ...argv];
}

/** startReference initializes and starts a MariaDB server in `dir`; the test's OS user logs in over its socket (unix_socket). */
async function startReference(dir: string): Promise<ReferenceServer> {
  const mysql = process.getuid?.() === 0 ? lookupUser("mysql") : null;
  mkdirSync(join(dir, "data"), { recursive: true });
  if (mysql) for (const path of [dir, join(dir, "data")]) chownSync(path, mysql.uid, mysql.gid);
  run(
    asServerUser([
      "mariadb-install-db",
      "--no-defaults",
      `--datadir=${dir}/data`,
      "--auth-root-authentication-method=socket",
      `--auth-root-socket-user=${osUserName()}`,
      "--skip-test-db",
    ]),
    PATH_ENV,
  );
  const socket = join(dir, "ref.sock");
  const proc = Bun.spawn(
    asServerUser([
      (Bun.which("mariadbd", PATH_ENV) ?? "/usr/sbin/mariadbd") as string,
      "--no-defaults",
      `--datadir=${dir}/data`,
      "--bind-address=127.0.0.1",
      `--port=${await freePort()}`,
      `--socket=${socket}`,
      `--pid-file=${dir}/ref.pid`,
      "--character-set-server=utf8mb4",
      "--collation-server=utf8mb4_general_ci",
    ]),
    { env: PATH_ENV, stdout: "ignore", stderr: "pipe" },
  );
  await eventually(
    () => Bun.spawnSync(["mariadb-admin", "--no-defaults", `--socket=${socket}`, `--user=${osUserName()}`, "ping"]).exitCode === 0,
    {
      timeoutMs: 60_000,
      intervalMs: 100,
    },
  );
  return {
    socket,
    pid: proc.pid,
    async stop() {
      Bun.spawnSync(["mariadb-admin", "--no-defaults", `--socket=${socket}`, `--user=${osUserName()}`, "shutdown"]);
      const killer = setTimeout(() => proc.kill("SIGKILL"), 30_000);
      await proc.exited;
      clearTimeout(killer);
    },
  };
}

/** socketClient connects to the reference server over its socket as the test's OS user. */
function socketClient(socket: string, database?: string): SQL {
  return new SQL({ adapter: "mysql", socket, username: osUserName(), database, max: 1, connectionTimeout: 5 });
}

/** serviceClient connects to the engine-managed server over TCP with the credentials the test deployed it with. */
function serviceClient(record: ServiceRecord, database = "shop"): SQL {
  return new SQL({
    adapter: "mysql",
    hostname: "127.0.0.1",
    port: record.port ?? 0,
    username: "root",
    password: PASSWORD,
    database,
    max: 1,
  });
}

async function query<T = Record<string, unknown>>(client: SQL, text: string): Promise<T[]> {
  try {
    return (await client.unsafe(text)) as T[];
  } finally {
    await client.close();
  }
}

/** checksums are what the tests compare between the reference and a restored database: counts, CHECKSUM TABLE, objects. */
async function checksums(client: SQL): Promise<Record<string, unknown>> {
  try {
    const [counts] = (await client.unsafe(`SELECT
      (SELECT count(*) FROM items) AS items, (SELECT count(*) FROM tags) AS tags,
      (SELECT count(*) FROM expensive) AS expensive, (SELECT n FROM expensive_count) AS expensive_count`)) as Record<string, unknown>[];
    const sums = (await client.unsafe("CHECKSUM TABLE items, tags, audit")) as { Checksum: unknown }[];
    const objects = (await client.unsafe(`SELECT concat(kind, ':', name) AS object FROM (
        SELECT 'table' AS kind, TABLE_NAME AS name FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()
        UNION ALL SELECT 'trigger', TRIGGER_NAME FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE()
        UNION ALL SELECT lower(ROUTINE_TYPE), ROUTINE_NAME FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE()
        UNION ALL SELECT 'fk', CONSTRAINT_NAME FROM information_schema.REFERENTIAL_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = DATABASE()
      ) o ORDER BY object`)) as { object: string }[];
    const [price] = (await client.unsafe("SELECT item_price(7) AS price")) as { price: unknown }[];
    return {
      ...counts,
      checksums: sums.map((row) => String(row.Checksum)),
      objects: objects.map((row) => row.object),
      price: String(price?.price),
    };
  } finally {
    await client.close();
  }
}

/** leftovers lists the databases and users a restore makes, which must be gone after it. */
async function leftovers(record: ServiceRecord): Promise<string[]> {
  const rows = await query<{ name: string }>(
    serviceClient(record, "mysql"),
    `SELECT SCHEMA_NAME AS name FROM information_schema.SCHEMATA WHERE SCHEMA_NAME LIKE 'engine\\_%'
     UNION ALL SELECT User FROM mysql.global_priv WHERE User LIKE 'engine\\_%'`,
  );
  return rows.map((row) => row.name);
}

const REFERENCE_SQL = `
  CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(100) NOT NULL, price DECIMAL(10,2), note TEXT, created DATETIME NOT NULL) ENGINE=InnoDB;
  INSERT INTO items SELECT seq, CONCAT('item ', seq, ' ✓'), (seq % 1000) / 7, IF(seq % 5 = 0, NULL, MD5(seq)), '2026-01-01' + INTERVAL seq MINUTE
    FROM seq_1_to_20000;
  CREATE TABLE tags (id INT AUTO_INCREMENT PRIMARY KEY, item_id INT NOT NULL, tag VARCHAR(20) NOT NULL,
    CONSTRAINT tags_item FOREIGN KEY (item_id) REFERENCES items(id), KEY tags_by_item (item_id)) ENGINE=InnoDB;
  CREATE TABLE audit (tag_id INT NOT NULL) ENGINE=InnoDB;
  CREATE TRIGGER tags_audit AFTER INSERT ON tags FOR EACH ROW INSERT INTO audit VALUES (NEW.id);
  INSERT INTO tags (item_id, tag) SELECT (seq % 20000) + 1, CONCAT('tag', seq % 37) FROM seq_1_to_5000;
  CREATE VIEW expensive AS SELECT * FROM items WHERE price > 100;
  CREATE VIEW expensive_count AS SELECT count(*) AS n FROM expensive;
  CREATE FUNCTION item_price(wanted INT) RETURNS DECIMAL(10,2) READS SQL DATA RETURN (SELECT price FROM items WHERE id = wanted);
`;

let db: DatabaseTestEngine;
let scratch: string;
let reference: ReferenceServer | null = null;
let referenceDir: string | undefined;
let referenceChecksums: Record<string, unknown>;
const dumps: Record<string, string> = {};

suite("MariaDB database services", () => {
  let shop: ServiceRecord;

  beforeAll(async () => {
    db = await startDatabaseEngine();
    scratch = db.root;
    // The reference server runs as mysql when the tests are root: it gets a path mysql can reach, made by startReference.
    referenceDir = freshTempPath("engine-mariadb-ref-");
    reference = await startReference(referenceDir);
    await query(socketClient(reference.socket), "CREATE DATABASE ref");
    const client = socketClient(reference.socket, "ref");
    try {
      for (const statement of REFERENCE_SQL.split(";\n")
        .map((s) => s.trim())
        .filter(Boolean))
        await client.unsafe(statement);
    } finally {
      await client.close();
    }
    referenceChecksums = await checksums(socketClient(reference.socket, "ref"));
    const dumpArgs = ["mariadb-dump", "--no-defaults", `--socket=${reference.socket}`, `--user=${osUserName()}`];
    dumps.plain = join(scratch, "ref.sql");
    writeFileSync(dumps.plain, run([...dumpArgs, "--single-transaction", "--routines", "--events", "--triggers", "ref"]));
    dumps.gzip = join(scratch, "ref.sql.gz");
    writeFileSync(dumps.gzip, gzipSync(readFileSync(dumps.plain)));
    dumps.databases = join(scratch, "ref-databases.sql");
    writeFileSync(dumps.databases, run([...dumpArgs, "--databases", "ref"]));
    const header = "-- MariaDB dump 10.19  Distrib 10.11.19-MariaDB, for debian-linux-gnu (x86_64)\n--\n";
    // A restore that takes a while: a dump's header, one table, then a pause.
    dumps.slow = join(scratch, "slow.sql");
    writeFileSync(dumps.slow, `${header}CREATE TABLE slow (id INT);\nINSERT INTO slow VALUES (1);\nSELECT SLEEP(5);\n`);
    dumps.failing = join(scratch, "failing.sql");
    writeFileSync(
      dumps.failing,
      `${header}CREATE TABLE half (id INT);\nINSERT INTO half VALUES (1);\nINSERT INTO no_such_table VALUES (1);\n`,
    );
    // A dump that reaches past the staging database into the target itself.
    dumps.escaping = join(scratch, "escaping.sql");
    writeFileSync(dumps.escaping, `${header}CREATE TABLE harmless (id INT);\nDROP TABLE shop.items;\n`);
    const { status, body } = await db.api.deploy({ name: "shop", template_id: "mariadb", secrets: { MARIADB_ROOT_PASSWORD: PASSWORD } });
    if (status !== 201) throw new Error(`deploy: ${status} ${JSON.stringify(body)}`);
    shop = await db.api.waitFor("shop", "running", () => true, 90_000);
  }, 180_000);

  afterAll(async () => {
    await reference?.stop();
    if (referenceDir) rmSync(referenceDir, { recursive: true, force: true });
    await db?.close(["shop", "mdb-gen", "mdb-forced"]);
  }, 90_000);

  test("the connection is shown with its password masked; an admin reveals it (logged), and it connects", async () => {
    const revealed = await expectConnection(db, "shop", PASSWORD);
    expect(revealed).toMatchObject({ engine: "mariadb", host: "127.0.0.1", port: shop.port, database: "shop", user: "root", path: null });
    expect(revealed.url).toBe(`mysql://root:${encodeURIComponent(PASSWORD)}@127.0.0.1:${shop.port}/shop`);
    const client = new SQL({ url: revealed.url, adapter: "mysql", max: 1, connectionTimeout: 5 });
    expect(await query(client, "SELECT 6 * 7 AS answer")).toEqual([{ answer: 42 }]);
  }, 30_000);

  test("a template deploy gets a free port, a generated root password kept as a secret, and is running only once it answers a query", async () => {
    const { status, body } = await db.api.deploy({ name: "mdb-gen", template_id: "mariadb" });
    expect(status).toBe(201);
    expect(body.kind).toBe("database");
    expect(body.port).not.toBe(3306);
    expect(body.port).toBeGreaterThan(0);
    expect(body.secret_keys).toEqual(["MARIADB_ROOT_PASSWORD"]);
    expect(body.env).toEqual({ MARIADB_DATABASE: "mdb_gen" });
    const running = await db.api.waitFor("mdb-gen", "running", () => true, 90_000);
    // Its record and Diagnosis name the user the server runs as: mysql under a root engine (the adapter switches to it).
    const serverUser = asRoot ? lookupUser("mysql") : null;
    expect(running.user).toBe(serverUser?.user ?? null);
    expect((await db.api.diagnose("mdb-gen")).user).toBe(serverUser?.user ?? null);
    if (serverUser) expect(processUids(running.pid as number)[0]).toBe(serverUser.uid);
    // A bound job reads the credentials from its bindings (MYSQL_HOST, MYSQL_TCP_PORT, MYSQL_PWD) and asks.
    await db.api.deployed({
      name: "mdb-client",
      kind: "batch",
      command: `mariadb --no-defaults -u "$MDB_GEN_USER" -D "$MDB_GEN_DATABASE" -NBe "SELECT CONCAT('answer=', 6 * 7, ' db=', DATABASE())" && echo "url=$DATABASE_URL" | sed 's/:[^:@]*@/:***@/'`,
      bindings: ["mdb-gen"],
      restart: { policy: "never" },
    });
    await db.api.waitFor("mdb-client", "completed", () => true, 30_000);
    const diagnosis = await db.api.diagnose("mdb-client");
    const lines = diagnosis.logs.map((line) => line.line);
    expect(lines).toContain("answer=42 db=mdb_gen");
    expect(lines).toContain(`url=mysql://root:***@127.0.0.1:${running.port}/mdb_gen`);
    expect(diagnosis.injected_env_keys).toEqual(expect.arrayContaining(["DATABASE_URL", "MYSQL_PWD", "MDB_GEN_PASSWORD"]));
    // The password never leaves through the API, and the init file holds only its hash.
    const everything = JSON.stringify([await db.api.get("mdb-gen"), await db.api.diagnose("mdb-gen"), diagnosis]);
    expect(everything).not.toMatch(/MYSQL_PWD=|MARIADB_ROOT_PASSWORD":/);
    const init = readFileSync(join(db.engine.dataDir, "data", "mdb-gen", "run", "init.sql"), "utf8");
    expect(init).toMatch(/USING '\*[0-9A-F]{40}'/);
    await db.engine.call("DELETE", "/api/services/mdb-client");
  }, 120_000);

  test.each([
    ["plain", "mysql-sql"],
    ["gzip", "mysql-sql"],
  ])(
    "a mariadb-dump %s dump restores through the API with the reference's rows, checksums, views, trigger and routine",
    async (kind, format) => {
      // Something the restore must replace: a table the dump does not have.
      await query(serviceClient(shop), "CREATE TABLE IF NOT EXISTS stale (id INT)");
      const dump = dumps[kind] as string;
      const { status, body } = await restore(db.engine, "shop", dump);
      expect(status).toBe(200);
      expect(body).toMatchObject({ service_name: "shop", dump, engine: "mariadb" });
      expect(body.duration_s as number).toBeGreaterThan(0);
      expect(await checksums(serviceClient(shop))).toEqual(referenceChecksums);
      const last = await lastDump(db.api, "shop");
      expect(last).toMatchObject({ dump, format, engine: "mariadb", result: "ok" });
      expect(last?.bytes).toBe(last?.total_bytes);
      expect(await leftovers(shop)).toEqual([]);
      // The trigger moved with its table: it fires in the restored database.
      const client = serviceClient(shop);
      try {
        await client.unsafe("INSERT INTO tags (item_id, tag) VALUES (1, 'new')");
        expect(await client.unsafe("SELECT count(*) AS n FROM audit")).toEqual([{ n: 5001 }]);
        await client.unsafe("DELETE FROM audit WHERE tag_id > 5000");
        await client.unsafe("DELETE FROM tags WHERE id > 5000");
      } finally {
        await client.close();
      }
    },
    90_000,
  );

  test("progress and the outcome are in the service's log", async () => {
    const logs = await db.engine.json<{ line: string; stream: string }[]>("GET", "/api/services/shop/logs?tail=400");
    const engineLines = logs.body.filter((line) => line.stream === "engine").map((line) => line.line);
    expect(engineLines.some((line) => /^restore: read \d+ of \d+ bytes \(100%\)$/.test(line))).toBe(true);
    expect(engineLines.some((line) => line.startsWith("restore: done in "))).toBe(true);
  });

  test("a restore past timeout_s is stopped, answers 504 and leaves the database as it was", async () => {
    const before = await checksums(serviceClient(shop));
    const { status, body } = await restore(db.engine, "shop", dumps.slow as string, 1);
    expect(status).toBe(504);
    expect(body.error?.code).toBe("restore_timed_out");
    expect(await checksums(serviceClient(shop))).toEqual(before);
    expect(await query(serviceClient(shop), "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_NAME = 'slow'")).toEqual([]);
    // The staging database's session (still in SLEEP) was ended and the database dropped.
    expect(await leftovers(shop)).toEqual([]);
    expect(await lastDump(db.api, "shop")).toMatchObject({ result: "timeout", format: "mysql-sql" });
  }, 60_000);

  test("a second restore into the same database while one runs gets 409", async () => {
    const first = restore(db.engine, "shop", dumps.slow as string, 60);
    await eventually(async () => (await lastDump(db.api, "shop"))?.result === "running", { timeoutMs: 10_000 });
    const second = await restore(db.engine, "shop", dumps.plain as string);
    expect(second.status).toBe(409);
    expect(second.body.error?.code).toBe("restore_in_progress");
    expect((await first).status).toBe(200);
    // The slow dump held only its one table: the restore replaced the database's tables with it.
    expect(
      await query(serviceClient(shop), "SELECT TABLE_NAME AS name FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'shop'"),
    ).toEqual([{ name: "slow" }]);
    expect((await restore(db.engine, "shop", dumps.plain as string)).status).toBe(200);
    expect(await checksums(serviceClient(shop))).toEqual(referenceChecksums);
  }, 90_000);

  test.each([
    ["a failing SQL dump", "failing", "restore_failed", /no_such_table/],
    ["a dump that reaches into the target database", "escaping", "restore_failed", /denied/],
    ["a dump of several databases (--databases)", "databases", "dump_unsupported", /--databases/],
  ])(
    "%s is a 422 and leaves the database as it was",
    async (_label, kind, type, message) => {
      const dump = dumps[kind] as string;
      const { status, body } = await restore(db.engine, "shop", dump);
      expect(status).toBe(422);
      expect(body.detail?.[0]?.type).toBe(type);
      expect(body.detail?.[0]?.msg).toMatch(message);
      expect(await checksums(serviceClient(shop))).toEqual(referenceChecksums);
      expect(await lastDump(db.api, "shop")).toMatchObject({ result: "failed", dump });
      expect(await leftovers(shop)).toEqual([]);
    },
    60_000,
  );

  test("a truncated gzip dump is a 422 and changes nothing", async () => {
    const truncated = join(scratch, "truncated.sql.gz");
    const whole = readFileSync(dumps.gzip as string);
    writeFileSync(truncated, whole.subarray(0, Math.floor(whole.length / 2)));
    const { status, body } = await restore(db.engine, "shop", truncated);
    expect(status).toBe(422);
    expect(body.detail?.[0]?.type).toBe("restore_failed");
    expect(await checksums(serviceClient(shop))).toEqual(referenceChecksums);
    expect(await leftovers(shop)).toEqual([]);
  }, 60_000);

  test("another engine's dump is a 409 that names it", async () => {
    const rdb = join(scratch, "dump.rdb");
    writeFileSync(rdb, "REDIS0010\xfa\x09redis-ver\x057.0.0\xff");
    const wrong = await restore(db.engine, "shop", rdb);
    expect(wrong.status).toBe(409);
    expect(wrong.body.error?.code).toBe("dump_engine_mismatch");
    expect(wrong.body.error?.message).toContain("Redis RDB");
    const pg = join(scratch, "pg.sql");
    writeFileSync(pg, "--\n-- PostgreSQL database dump\n--\n\nSET statement_timeout = 0;\n");
    expect((await restore(db.engine, "shop", pg)).body.error?.code).toBe("dump_engine_mismatch");
    expect(await checksums(serviceClient(shop))).toEqual(referenceChecksums);
  }, 30_000);

  test("stop is mariadb-admin shutdown with no SIGKILL; data survives a restart", async () => {
    const stopped = await db.api.control("shop", "stop");
    expect(stopped.status).toBe(200);
    const diagnosis = await db.api.diagnose("shop");
    expect(diagnosis.last_run).toMatchObject({ stop_method: "mariadb-admin shutdown", forced_kill: false, signal: null, exit_code: 0 });
    expect(diagnosis.logs.map((line) => line.line).join("\n")).toContain("Shutdown complete");
    expect((await db.api.control("shop", "start")).status).toBe(200);
    shop = await db.api.waitFor("shop", "running", () => true, 90_000);
    expect(await checksums(serviceClient(shop))).toEqual(referenceChecksums);
  }, 120_000);

  test("a stop that passes stop_timeout_s ends in SIGKILL, and Diagnosis says so", async () => {
    await db.api.deployed({ name: "mdb-forced", template_id: "mariadb", stop_timeout_s: 0 });
    await db.api.waitFor("mdb-forced", "running", () => true, 90_000);
    expect((await db.api.control("mdb-forced", "stop")).status).toBe(200);
    const diagnosis = await db.api.diagnose("mdb-forced");
    expect(diagnosis.last_run).toMatchObject({ stop_method: "mariadb-admin shutdown", forced_kill: true, signal: "SIGKILL" });
    // It comes back (crash recovery) and is running again once it answers a query.
    expect((await db.api.control("mdb-forced", "start")).status).toBe(200);
    await db.api.waitFor("mdb-forced", "running", () => true, 90_000);
  }, 180_000);

  test("MARIADB_DATABASE must be a plain name and not a system schema", async () => {
    for (const name of ["bad-name", "mysql", "engine_restore_x"]) {
      const { status, body } = await db.api.deploy({ name: "mdb-bad", template_id: "mariadb", env: { MARIADB_DATABASE: name } });
      expect(status).toBe(422);
      expect(JSON.stringify(body)).toContain("MARIADB_DATABASE");
    }
  });
});

(toolsOk && process.getuid?.() === 0 && lookupUser("mysql") ? describe : describe.skip)(
  "MariaDB under a root engine whose data dir the mysql user cannot enter",
  () => {
    test("start-up warns, the start fails with the directory and the fix, and nothing above the data dir is loosened", async () => {
      await expectClosedDataDirRefused("mysql", { template_id: "mariadb" }, ["mysql, who may not enter"]);
    }, 60_000);
  },
);
