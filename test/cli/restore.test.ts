import { Database } from "bun:sqlite";
import { afterAll, beforeAll, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { dumpArgument } from "../../cli/commands/restore";
import { SqliteEngine } from "../../src/engine/databases";
import { suiteWhen } from "../engine/databases/helpers";
import { runCli, startTestEngine, type TestEngine, tempDir } from "../helpers";

const toolsOk = new SqliteEngine().detectTools({ PATH: process.env.PATH ?? "" }).missing.length === 0;
const suite = suiteWhen(toolsOk, "ENGINE_REQUIRE_SQLITE", "the sqlite3 program (Debian package sqlite3)");

let engine: TestEngine;
let scratch: string;
const cli = (...args: string[]) => runCli(["--data-dir", engine.dataDir, ...args]);

suite("engine restore", () => {
  beforeAll(async () => {
    engine = await startTestEngine();
    scratch = tempDir("engine-cli-restore-");
  });
  afterAll(async () => {
    await engine.call("POST", "/api/services/notes/stop");
    await engine.close();
    rmSync(scratch, { recursive: true, force: true });
  });

  test("restores a dump into a database deployed with --engine, printing JSON lines with --json", async () => {
    const deployed = await cli("services", "deploy", "notes", "--engine", "sqlite");
    expect(deployed.code).toBe(0);
    const dump = join(scratch, "notes.sqlite3");
    const source = new Database(dump, { create: true });
    source.exec("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)");
    source.exec(
      "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000) INSERT INTO notes SELECT i, 'note ' || i FROM n",
    );
    source.close();
    for (let i = 0; i < 200; i++) {
      const status = (await engine.json<{ status: string }>("GET", "/api/services/notes")).body.status;
      if (status === "running") break;
      await Bun.sleep(25);
    }
    const restored = await cli("--json", "restore", "notes", dump, "--timeout", "60");
    expect(restored.code).toBe(0);
    const events = restored.stdout
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as Record<string, unknown>);
    const size = Bun.file(dump).size;
    expect(events).toContainEqual({ event: "progress", bytes_read: size, total_bytes: size });
    expect(events.at(-1)).toMatchObject({ event: "restored", service_name: "notes", dump, engine: "sqlite" });
    const human = await cli("restore", "notes", dump);
    expect(human.code).toBe(0);
    expect(human.stdout).toMatch(new RegExp(`^restored ${dump} into notes \\(sqlite\\) in [0-9.]+ s$`, "m"));
    const copy = new Database(join(engine.dataDir, "data", "notes", "database.sqlite3"), { readonly: true });
    expect(copy.query("SELECT count(*) AS n FROM notes").get()).toEqual({ n: 5000 });
    copy.close();
  }, 60_000);

  test("a failed restore exits 1 with the engine's reason; --json ends with a failed event", async () => {
    const missing = await cli("restore", "notes", join(scratch, "no-such.sqlite3"));
    expect(missing.code).toBe(1);
    expect(missing.stderr).toContain("no such file");
    const json = await cli("--json", "restore", "nothing-here", join(scratch, "notes.sqlite3"));
    expect(json.code).toBe(1);
    expect(JSON.parse(json.stdout.trim().split("\n").at(-1) ?? "{}")).toMatchObject({ event: "failed", code: "database_not_found" });
    expect((await cli("restore", "notes", "x", "--timeout", "0")).code).toBe(1);
  }, 30_000);

  test("a relative path that exists is made absolute; URLs pass as they are", () => {
    expect(dumpArgument("notes.sqlite3", scratch)).toBe(join(scratch, "notes.sqlite3"));
    expect(dumpArgument("https://example.com/x.dump", scratch)).toBe("https://example.com/x.dump");
    expect(dumpArgument("missing.dump", scratch)).toBe("missing.dump");
  });
});
