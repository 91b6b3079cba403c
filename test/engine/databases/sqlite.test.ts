import { Database } from "bun:sqlite";
import { afterAll, beforeAll, expect, test } from "bun:test";
import { chmodSync, copyFileSync, existsSync, lstatSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { ServiceRecord } from "../../../src/contract/engine";
import { SqliteEngine, sqliteFile } from "../../../src/engine/databases";
import { LocalCa, pkiDirectory } from "../../../src/engine/tls";
import { serviceUserName } from "../../../src/engine/users";
import { eventually, workloadPath } from "../../helpers";
import {
  asRoot,
  type DatabaseTestEngine,
  expectConnection,
  lastDump,
  notOwnedBy,
  processUids,
  restore,
  run,
  serviceUid,
  startDatabaseEngine,
  suiteWhen,
} from "./helpers";

const toolsOk = new SqliteEngine().detectTools({ PATH: process.env.PATH ?? "" }).missing.length === 0;
const suite = suiteWhen(toolsOk, "ENGINE_REQUIRE_SQLITE", "the sqlite3 program (Debian package sqlite3)");

const CHECKSUMS = `
  SELECT
    (SELECT count(*) FROM notes) AS notes,
    (SELECT count(*) FROM authors) AS authors,
    (SELECT hex(sha3_agg) FROM (SELECT group_concat(id || '|' || author_id || '|' || ifnull(body, '∅') || '|' || score, ',') AS sha3_agg FROM (SELECT * FROM notes ORDER BY id))) AS notes_digest,
    (SELECT group_concat(name, ',') FROM (SELECT name FROM authors ORDER BY id)) AS authors_list`;

function checksumsOf(path: string): Record<string, unknown> {
  const db = new Database(path, { readonly: true });
  try {
    const row = db.query<Record<string, unknown>, []>(CHECKSUMS).get() ?? {};
    // The digest column is long: compare its hash.
    return { ...row, notes_digest: new Bun.CryptoHasher("sha256").update(String(row.notes_digest)).digest("hex") };
  } finally {
    db.close();
  }
}

/**
 * CLIENT_PY is what a service bound to a SQLite database does with it: opens the file whose
 * path the binding gave it (SHARED_PATH; TARGET once unbound), counts the reference's notes if
 * the database has them, writes a row through a rollback journal, switches to WAL and writes
 * another, and reports the modes and groups of the -wal and -shm SQLite made. One line:
 * `ok ...`, or `open <errno>` when it may not open the file.
 */
const CLIENT_PY = `
import errno, os, sqlite3, sys
via = "binding" if os.environ.get("SHARED_PATH") else "env"
path = os.environ.get("SHARED_PATH") or os.environ["TARGET"]
try:
    os.close(os.open(path, os.O_RDWR))
except OSError as e:
    print(f"open {errno.errorcode.get(e.errno, e.errno)} via={via}", flush=True)
    sys.exit(3)
db = sqlite3.connect(path, timeout=10)
tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
notes = db.execute("SELECT count(*) FROM notes").fetchone()[0] if "notes" in tables else 0
db.execute("CREATE TABLE IF NOT EXISTS visits (id INTEGER PRIMARY KEY, how TEXT)")
db.execute("INSERT INTO visits (how) VALUES ('rollback journal')")
db.commit()
mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
db.execute("INSERT INTO visits (how) VALUES ('wal')")
db.commit()
files = " ".join(f"{s}={oct(os.stat(path + s).st_mode & 0o7777)}:{os.stat(path + s).st_gid}" for s in ("-wal", "-shm"))
visits = db.execute("SELECT count(*) FROM visits").fetchone()[0]
db.close()
print(f"ok via={via} journal={mode} notes={notes} visits={visits} {files}", flush=True)
`;

/** python3 is a system Python every service user may run (a pyenv shim under /root is not one); null when the host has none. */
const python3 = Bun.which("python3", { PATH: "/usr/local/bin:/usr/bin:/bin" });

/** groupsOf reads a process's supplementary groups from /proc/<pid>/status. */
function groupsOf(pid: number): number[] {
  const line = readFileSync(`/proc/${pid}/status`, "utf8")
    .split("\n")
    .find((l) => l.startsWith("Groups:"));
  return (line ?? "").slice(7).trim().split(/\s+/).filter(Boolean).map(Number);
}

let db: DatabaseTestEngine;
let scratch: string;
let reference: Record<string, unknown>;
const dumps: Record<string, string> = {};

suite("SQLite database services", () => {
  let file: string;

  beforeAll(async () => {
    db = await startDatabaseEngine();
    scratch = db.root;
    // The reference: a database made with the sqlite3 program's own SQL, then dumped with .dump.
    const refPath = join(scratch, "reference.sqlite3");
    run([
      "sqlite3",
      refPath,
      `CREATE TABLE authors (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
       CREATE TABLE notes (id INTEGER PRIMARY KEY, author_id INTEGER NOT NULL REFERENCES authors(id), body TEXT, score REAL);
       CREATE INDEX notes_by_author ON notes(author_id);
       WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50) INSERT INTO authors SELECT i, 'author ' || i || ' ✓' FROM n;
       WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000)
         INSERT INTO notes SELECT i, (i % 50) + 1, CASE WHEN i % 7 = 0 THEN NULL ELSE 'note ' || hex(randomblob(8)) END, i / 3.0 FROM n;`,
    ]);
    reference = checksumsOf(refPath);
    dumps.file = refPath;
    dumps.sql = join(scratch, "reference.sql");
    writeFileSync(dumps.sql, run(["sqlite3", refPath, ".dump"]));
    dumps.sqlGz = join(scratch, "reference.sql.gz");
    run(["sh", "-c", `gzip -c '${dumps.sql}' > '${dumps.sqlGz}'`]);
    // A dump that takes a while: .dump's header, a table, then seconds of counting.
    dumps.slow = join(scratch, "slow.sql");
    writeFileSync(
      dumps.slow,
      "PRAGMA foreign_keys=OFF;\nBEGIN TRANSACTION;\nCREATE TABLE slow (id INTEGER);\n" +
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 400000000) SELECT count(*) FROM c;\nCOMMIT;\n",
    );
    await db.api.deployed({ name: "notes", engine: "sqlite" });
    await db.api.waitFor("notes", "running", () => true, 30_000);
    file = join(db.engine.dataDir, "data", "notes", "database.sqlite3");
  }, 60_000);

  afterAll(async () => {
    await db?.close(["notes", "shared"]);
  }, 30_000);

  test("a SQLite service is a file in its data dir, running once it opens, with bindings to its path", async () => {
    const record = await db.api.get("notes");
    expect(record).toMatchObject({ kind: "database", port: null, secret_keys: [] });
    expect(existsSync(file)).toBe(true);
    expect(file).toBe(sqliteFile({ dataDir: join(db.engine.dataDir, "data", "notes") } as never));
    // SQLite has no server and no port: its log says where it is ready, not a host:port.
    const own = await eventually(async () => {
      const lines = (await db.api.diagnose("notes")).logs.map((line) => line.line);
      return lines.includes(`SQLite ready at ${file}`) ? lines : null;
    });
    expect(own.join("\n")).not.toContain("accepts connections");
    await db.api.deployed({
      name: "notes-client",
      kind: "batch",
      command: `echo "path=$NOTES_PATH url=$DATABASE_URL"`,
      bindings: ["notes"],
      restart: { policy: "never" },
    });
    await db.api.waitFor("notes-client", "completed", () => true, 30_000);
    const lines = (await db.api.diagnose("notes-client")).logs.map((line) => line.line);
    expect(lines).toContain(`path=${file} url=sqlite:///${file}`);
    await db.engine.call("DELETE", "/api/services/notes-client");
  }, 60_000);

  test("the connection is the file: nothing to mask, an admin's reveal is the same URL (and logged)", async () => {
    const revealed = await expectConnection(db, "notes", null);
    expect(revealed).toEqual({
      engine: "sqlite",
      url: `sqlite:///${file}`,
      host: null,
      port: null,
      database: null,
      user: null,
      path: file,
      password: null,
    });
    expect((await db.api.get("notes")).connection?.url).toBe(`sqlite:///${file}`);
  }, 30_000);

  test("a patch of a database keeps its engine, data and connection, and restarts it on the new version", async () => {
    const before = await db.api.get("notes");
    const patched = await db.engine.json<ServiceRecord>("PATCH", "/api/services/notes", { body: { memory_mb: 256, priority: 3 } });
    expect(patched.status).toBe(200);
    expect(patched.body).toMatchObject({ kind: "database", version: before.version + 1, memory_mb: 256, priority: 3 });
    expect(patched.body.connection).toEqual(before.connection);
    expect(patched.body.command).toEqual(before.command);
    await db.api.waitFor("notes", "running", (record) => record.pid !== null && record.pid !== before.pid, 30_000);
    // A database's command is its adapter's: a patch may not give one.
    const refused = await db.engine.json<{ detail: { loc: string[] }[] }>("PATCH", "/api/services/notes", { body: { command: "true" } });
    expect(refused.status).toBe(422);
    expect(refused.body.detail[0]?.loc).toEqual(["body", "command"]);
  }, 30_000);

  test.each([
    ["database file", "file", "sqlite-db"],
    ["sqlite3 .dump", "sql", "sqlite-sql"],
    ["gzip-compressed .dump", "sqlGz", "sqlite-sql"],
  ])(
    "a %s restores through the API with the reference's rows and checksums",
    async (_label, kind, format) => {
      const dump = dumps[kind] as string;
      const { status, body } = await restore(db.engine, "notes", dump);
      expect(status).toBe(200);
      expect(body).toMatchObject({ service_name: "notes", dump, engine: "sqlite" });
      expect(checksumsOf(file)).toEqual(reference);
      expect(await lastDump(db.api, "notes")).toMatchObject({ dump, format, engine: "sqlite", result: "ok" });
      // Nothing of the restore is left beside the database.
      const leftovers = [...new Bun.Glob(".restore-*").scanSync({ cwd: join(db.engine.dataDir, "data", "notes"), dot: true })];
      expect(leftovers).toEqual([]);
      // The restored file is the service's user's, as root runs it (the engine made it as root).
      if (asRoot) expect(notOwnedBy(join(db.engine.dataDir, "data", "notes"), serviceUid("notes") ?? { uid: -1, gid: -1 })).toEqual([]);
    },
    30_000,
  );

  test("an https:// dump is downloaded (here from a loopback server with the engine's local CA) and restored", async () => {
    const leaf = new LocalCa({ dir: pkiDirectory(db.engine.dataDir) }).issueLeaf(["localhost"]);
    const body = readFileSync(dumps.file as string);
    const server = Bun.serve({
      hostname: "127.0.0.1",
      port: 0,
      tls: { cert: leaf.certPem, key: leaf.keyPem },
      fetch: (request) =>
        new URL(request.url).pathname === "/backups/notes.sqlite3" ? new Response(body) : new Response("no", { status: 404 }),
    });
    try {
      const url = `https://localhost:${server.port}/backups/notes.sqlite3`;
      const { status } = await restore(db.engine, "notes", url);
      expect(status).toBe(200);
      expect(checksumsOf(file)).toEqual(reference);
      expect(await lastDump(db.api, "notes")).toMatchObject({ dump: url, format: "sqlite-db", result: "ok", bytes: body.length });
      const missing = await restore(db.engine, "notes", `https://localhost:${server.port}/nothing`);
      expect(missing.status).toBe(422);
      expect(missing.body.detail?.[0]?.type).toBe("dump_unreadable");
    } finally {
      server.stop(true);
    }
    expect([...new Bun.Glob("**/download-*").scanSync({ cwd: db.engine.dataDir, dot: true })]).toEqual([]);
  }, 30_000);

  test("a restore past timeout_s is stopped, answers 504 and leaves the file as it was", async () => {
    const before = readFileSync(file);
    const { status, body } = await restore(db.engine, "notes", dumps.slow as string, 1);
    expect(status).toBe(504);
    expect(body.error?.code).toBe("restore_timed_out");
    expect(readFileSync(file).equals(before)).toBe(true);
    expect(checksumsOf(file)).toEqual(reference);
    expect(await lastDump(db.api, "notes")).toMatchObject({ result: "timeout" });
  }, 30_000);

  test("a concurrent restore into the same database gets 409", async () => {
    const first = restore(db.engine, "notes", dumps.slow as string, 2);
    await eventually(async () => (await lastDump(db.api, "notes"))?.result === "running", { timeoutMs: 5000 });
    const second = await restore(db.engine, "notes", dumps.file as string);
    expect(second.status).toBe(409);
    expect(second.body.error?.code).toBe("restore_in_progress");
    expect((await first).status).toBe(504);
    expect(checksumsOf(file)).toEqual(reference);
  }, 30_000);

  test("a corrupt database file and a failing .dump are 422 and change nothing", async () => {
    const corrupt = join(scratch, "corrupt.sqlite3");
    const whole = readFileSync(dumps.file as string);
    const damaged = Buffer.from(whole);
    // Keep the header, wreck the pages after the first.
    for (let offset = 4096; offset < damaged.length; offset += 97) damaged[offset] = (damaged[offset] ?? 0) ^ 0x5a;
    writeFileSync(corrupt, damaged);
    const failing = join(scratch, "failing.sql");
    writeFileSync(
      failing,
      "PRAGMA foreign_keys=OFF;\nBEGIN TRANSACTION;\nCREATE TABLE a (id INTEGER);\nINSERT INTO nowhere VALUES (1);\nCOMMIT;\n",
    );
    const before = statSync(file).mtimeMs;
    for (const dump of [corrupt, failing]) {
      const { status, body } = await restore(db.engine, "notes", dump);
      expect(status).toBe(422);
      expect(body.detail?.[0]?.type).toBe("restore_failed");
      expect(checksumsOf(file)).toEqual(reference);
      expect(await lastDump(db.api, "notes")).toMatchObject({ result: "failed", dump });
    }
    expect(statSync(file).mtimeMs).toBe(before);
  }, 30_000);

  test("a PostgreSQL archive into a SQLite database is 409; unrecognised bytes are 422", async () => {
    const pgdump = join(scratch, "other.dump");
    writeFileSync(pgdump, `PGDMP\x01\x0e\x00${"\0".repeat(64)}`);
    const wrong = await restore(db.engine, "notes", pgdump);
    expect(wrong.status).toBe(409);
    expect(wrong.body.error?.code).toBe("dump_engine_mismatch");
    const junk = join(scratch, "junk.bin");
    writeFileSync(junk, new Uint8Array([0, 1, 2, 3, 250, 251, 252]));
    const unknown = await restore(db.engine, "notes", junk);
    expect(unknown.status).toBe(422);
    expect(unknown.body.detail?.[0]).toMatchObject({ type: "dump_unrecognized" });
    expect(String(unknown.body.detail?.[0]?.ctx.detected)).toContain("first bytes: 00 01 02 03");
    expect(checksumsOf(file)).toEqual(reference);
  });

  test("a copy of the database file restores too (the bytes compare equal)", async () => {
    const copy = join(scratch, "copy.sqlite3");
    copyFileSync(dumps.file as string, copy);
    expect((await restore(db.engine, "notes", copy)).status).toBe(200);
    expect(readFileSync(file).equals(readFileSync(copy))).toBe(true);
  });

  (asRoot ? test : test.skip)(
    "as root it runs as the service's own user, which owns the data dir and the file, and opens it as that user",
    async () => {
      const owner = serviceUid("notes");
      if (!owner) throw new Error(`the host has no user ${serviceUserName("notes")}`);
      const dir = join(db.engine.dataDir, "data", "notes");
      let record = await db.api.get("notes");
      expect(processUids(record.pid as number)).toEqual([owner.uid, owner.uid, owner.uid, owner.uid]);
      expect(record.user).toBe(serviceUserName("notes"));
      expect((await db.api.diagnose("notes")).user).toBe(serviceUserName("notes"));
      // The database's group may enter (services bound to it get that group, decision 290); others may not.
      expect(statSync(dir).mode & 0o7777).toBe(0o2770);
      expect(statSync(file).mode & 0o7777).toBe(0o660);
      // A WAL database: whoever opens it (the readiness check, as root) makes its -wal and -shm, which must be the user's.
      const wal = join(scratch, "wal.sqlite3");
      copyFileSync(dumps.file as string, wal);
      run(["sqlite3", wal, "PRAGMA journal_mode=WAL;"]);
      expect((await restore(db.engine, "notes", wal)).status).toBe(200);
      expect((await db.api.control("notes", "restart")).status).toBe(200);
      record = await db.api.waitFor("notes", "running", (r) => r.pid !== null && r.pid !== record.pid, 30_000);
      expect(existsSync(`${file}-shm`)).toBe(true);
      expect(notOwnedBy(dir, owner)).toEqual([]);

      // An older engine's service: the dir 0750, the file 0640 and root's. Its next start gives them to the user, with the group's modes.
      await db.api.control("notes", "stop");
      run(["chown", "-R", "-P", "0:0", dir]);
      chmodSync(dir, 0o750);
      for (const suffix of ["", "-shm"]) chmodSync(`${file}${suffix}`, 0o640);
      expect((await db.api.control("notes", "start")).status).toBe(200);
      await db.api.waitFor("notes", "running", (r) => r.pid !== null, 30_000);
      expect(statSync(dir).mode & 0o7777).toBe(0o2770);
      for (const suffix of ["", "-shm"]) expect(statSync(`${file}${suffix}`).mode & 0o7777).toBe(0o660);
      expect(notOwnedBy(dir, owner)).toEqual([]);
      expect(checksumsOf(file)).toEqual(reference);
    },
    60_000,
  );
  (asRoot && python3 ? test : test.skip)(
    "as root a service bound to it reads and writes the file, in WAL mode too; an unbound one gets EACCES; an unbinding takes it away",
    async () => {
      await db.api.deployed({ name: "shared", engine: "sqlite" });
      await db.api.waitFor("shared", "running", () => true, 30_000);
      const owner = serviceUid("shared");
      if (!owner) throw new Error(`the host has no user ${serviceUserName("shared")}`);
      const dir = join(db.engine.dataDir, "data", "shared");
      const sharedFile = join(dir, "database.sqlite3");
      writeFileSync(join(scratch, "client.py"), CLIENT_PY);
      const script = workloadPath(join(scratch, "client.py"));
      // Under a umask of 077: SQLite gives its -wal and -shm the database file's mode itself.
      const command = `umask 077; ${python3} ${script}; exec sleep 300`;
      const logLines = async (name: string, prefix: string) =>
        (await db.engine.json<{ line: string }[]>("GET", `/api/services/${name}/logs?tail=200`)).body
          .map((line) => line.line)
          .filter((line) => line.startsWith(prefix));
      /** nthLine waits for the nth line of `name`'s log that starts with `prefix`: one per run. */
      const nthLine = (name: string, prefix: string, nth: number) =>
        eventually(async () => (await logLines(name, prefix))[nth - 1], { timeoutMs: 30_000 });
      const clientLine = (via: string, notes: number, visits: number) =>
        `ok via=${via} journal=wal notes=${notes} visits=${visits} -wal=0o660:${owner.gid} -shm=0o660:${owner.gid}`;
      /**
       * expectGroupModes checks every entry of the database's dir (links not followed): the
       * file and the -wal and -shm a reader as root may leave, 0660 and the database's group.
       */
      const expectGroupModes = () => {
        const entries = readdirSync(dir).map((name) => {
          const stat = lstatSync(join(dir, name));
          return `${name} 0${(stat.mode & 0o7777).toString(8)} ${stat.gid === owner.gid ? "db-group" : stat.gid}`;
        });
        expect(entries).toContain("database.sqlite3 0660 db-group");
        expect(entries.filter((entry) => !/^database\.sqlite3(-wal|-shm)? 0660 db-group$/.test(entry))).toEqual([]);
      };

      // Bound: the run has the database's group and uses the file through the path it was given.
      await db.api.deployed({ name: "writer", command, bindings: ["shared"], env: { TARGET: sharedFile } });
      let writer = await db.api.waitFor("writer", "running", (r) => r.pid !== null, 30_000);
      expect(await nthLine("writer", "ok ", 1)).toBe(clientLine("binding", 0, 2));
      expect(groupsOf(writer.pid as number)).toContain(owner.gid);
      expect(groupsOf(writer.pid as number)).not.toContain(0);
      const written = new Database(sharedFile, { readonly: true });
      expect(written.query<{ how: string }, []>("SELECT how FROM visits ORDER BY id").all()).toEqual([
        { how: "rollback journal" },
        { how: "wal" },
      ]);
      written.close();
      expect(statSync(dir).mode & 0o7777).toBe(0o2770);
      expectGroupModes();

      // Unbound: not the database's group, so not even into its dir.
      await db.api.deployed({ name: "outsider", command, env: { TARGET: sharedFile } });
      const outsider = await db.api.waitFor("outsider", "running", (r) => r.pid !== null, 30_000);
      expect(await nthLine("outsider", "open ", 1)).toBe("open EACCES via=env");
      expect(groupsOf(outsider.pid as number)).not.toContain(owner.gid);

      // The database's own restores (a .dump through sqlite3 as its user, a file copied) still
      // work over the WAL database the bound service left, and their file keeps the group's mode.
      for (const dump of [dumps.sql, dumps.file] as string[]) {
        const restored = await restore(db.engine, "shared", dump);
        expect(restored.status).toBe(200);
        expect(checksumsOf(sharedFile)).toEqual(reference);
        expectGroupModes();
        expect(notOwnedBy(join(dir, "database.sqlite3"), owner)).toEqual([]);
      }
      expect((await db.api.control("writer", "restart")).status).toBe(200);
      writer = await db.api.waitFor("writer", "running", (r) => r.pid !== null && r.pid !== writer.pid, 30_000);
      expect(await nthLine("writer", "ok ", 2)).toBe(clientLine("binding", 20000, 2));

      // A patch that removes the binding: the next launch has neither the group nor the file.
      const patched = await db.engine.json("PATCH", "/api/services/writer", { body: { bindings: [] } });
      expect(patched.status).toBe(200);
      writer = await db.api.waitFor("writer", "running", (r) => r.pid !== null && r.pid !== writer.pid, 30_000);
      expect(await nthLine("writer", "open ", 1)).toBe("open EACCES via=env");
      expect(groupsOf(writer.pid as number)).not.toContain(owner.gid);

      // A redeploy gives the binding back, and another takes it away again.
      for (const [bindings, prefix, expected] of [
        // The rows of the writer's second run are still there: it adds two more.
        [["shared"], "ok ", clientLine("binding", 20000, 4)],
        [[], "open ", "open EACCES via=env"],
      ] as const) {
        const count = (await logLines("writer", prefix)).length;
        expect((await db.api.deploy({ name: "writer", command, bindings, env: { TARGET: sharedFile } })).status).toBe(201);
        await db.api.waitFor("writer", "running", (r) => r.pid !== null && r.pid !== writer.pid, 30_000);
        writer = await db.api.get("writer");
        expect(await nthLine("writer", prefix, count + 1)).toBe(expected);
        expect(groupsOf(writer.pid as number).includes(owner.gid)).toBe(bindings.length > 0);
      }
      for (const name of ["writer", "outsider"]) expect((await db.engine.call("DELETE", `/api/services/${name}`)).status).toBe(200);
    },
    120_000,
  );
});
