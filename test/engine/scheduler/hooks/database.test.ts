import { afterAll, expect, test } from "bun:test";
import { existsSync, mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { SqliteEngine, sqliteFile } from "../../../../src/engine/databases";
import { databaseHook } from "../../../../src/engine/scheduler/hooks/database";
import { tempDir } from "../../../helpers";
import { hostOf, launchOf } from "./launch";

const root = tempDir();
afterAll(() => rmSync(root, { recursive: true, force: true }));

function sqliteLaunch(signal = new AbortController().signal) {
  const dataDir = join(root, "data", "app");
  mkdirSync(dataDir, { recursive: true });
  const instance = {
    serviceId: "svc_app",
    serviceName: "app",
    dataDir,
    host: "127.0.0.1",
    port: null,
    credentials: {},
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin" },
  };
  const statuses: string[] = [];
  const launch = launchOf(
    root,
    { database: { engine: "sqlite" } },
    { database: { adapter: new SqliteEngine(), instance }, signal, status: (message) => statuses.push(message) },
  );
  return { launch, instance, statuses };
}

test("not a database: the launch is left as it is", async () => {
  const launch = launchOf(root);
  await databaseHook.run(launch, hostOf(root));
  expect(launch.argv).toEqual(["true"]);
});

test("a SQLite database is initialized (its output in the service's log) and runs its adapter's command", async () => {
  const { launch, instance, statuses } = sqliteLaunch();
  const logged: string[] = [];
  await databaseHook.run(launch, hostOf(root, { appendLog: (_, line) => logged.push(line) }));
  expect(statuses).toEqual(["preparing the SQLite data dir"]);
  expect(existsSync(sqliteFile(instance))).toBe(true);
  expect(logged).toEqual([`created an empty SQLite database, ${sqliteFile(instance)}`]);
  expect(launch.argv.at(-1)).toBe("infinity");
});

test("a stop during the initialization fails the launch", async () => {
  const stop = new AbortController();
  stop.abort();
  const { launch } = sqliteLaunch(stop.signal);
  expect(databaseHook.run(launch, hostOf(root))).rejects.toThrow("the service was stopped while its database was being initialized");
});
