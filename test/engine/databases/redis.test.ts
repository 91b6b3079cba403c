import { Database } from "bun:sqlite";
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { RedisClient } from "bun";
import type { ServiceRecord } from "../../../src/contract/engine";
import { RedisEngine } from "../../../src/engine/databases";
import { serviceUserName } from "../../../src/engine/users";
import { eventually, freePort, startTestEngine, tempDir } from "../../helpers";
import { ServiceClient } from "../services/harness";
import {
  asRoot,
  type DatabaseTestEngine,
  expectConnection,
  freshTempPath,
  lastDump,
  notOwnedBy,
  processUids,
  restore,
  run,
  serviceUid,
  startDatabaseEngine,
  suiteWhen,
} from "./helpers";

const adapter = new RedisEngine();
const toolsOk = adapter.detectTools({ PATH: process.env.PATH ?? "" }).missing.length === 0;
const suite = suiteWhen(toolsOk, "ENGINE_REQUIRE_REDIS", "Redis (Debian packages redis-server, redis-tools)");

const PASSWORD = "test-password-1";
const REFERENCE_PASSWORD = "reference-password";

/** ReferenceServer is a Redis server the test starts itself, where reference data is made and saved. */
interface ReferenceServer {
  port: number;
  stop(): Promise<void>;
}

async function startReference(dir: string): Promise<ReferenceServer> {
  mkdirSync(dir, { recursive: true });
  const port = await freePort();
  const proc = Bun.spawn(
    [
      "redis-server",
      "--bind",
      "127.0.0.1",
      "--port",
      String(port),
      "--dir",
      dir,
      "--save",
      "",
      "--appendonly",
      "no",
      "--requirepass",
      REFERENCE_PASSWORD,
    ],
    { stdout: "ignore", stderr: "ignore" },
  );
  await eventually(
    async () => (await withRedis(`redis://:${REFERENCE_PASSWORD}@127.0.0.1:${port}/0`, (c) => c.send("PING", []))) === "PONG",
    {
      timeoutMs: 20_000,
      intervalMs: 50,
    },
  );
  return {
    port,
    async stop() {
      Bun.spawnSync(["redis-cli", "-p", String(port), "SHUTDOWN", "NOSAVE"], {
        env: { ...process.env, REDISCLI_AUTH: REFERENCE_PASSWORD },
      });
      const killer = setTimeout(() => proc.kill("SIGKILL"), 20_000);
      await proc.exited;
      clearTimeout(killer);
    },
  };
}

async function withRedis<T>(url: string, use: (client: RedisClient) => Promise<T>): Promise<T> {
  const client = new RedisClient(url, { autoReconnect: false, connectionTimeout: 5000 });
  try {
    return await use(client);
  } finally {
    client.close();
  }
}

function serviceUrl(record: ServiceRecord, password = PASSWORD): string {
  return `redis://:${password}@127.0.0.1:${record.port}/0`;
}

/** snapshot reads every key of every database with its type, value and whether it has a TTL, and digests them. */
async function snapshot(url: string): Promise<{ keys: number; digest: string }> {
  return withRedis(url, async (client) => {
    const info = String(await client.send("INFO", ["keyspace"]));
    const dbs = [...info.matchAll(/^db(\d+):/gm)].map((match) => match[1] as string);
    const entries: string[] = [];
    for (const dbIndex of dbs) {
      await client.send("SELECT", [dbIndex]);
      let cursor = "0";
      const keys: string[] = [];
      do {
        const [next, batch] = (await client.send("SCAN", [cursor, "COUNT", "1000"])) as [string, string[]];
        cursor = String(next);
        keys.push(...batch);
      } while (cursor !== "0");
      for (const key of keys.sort()) {
        const type = String(await client.send("TYPE", [key]));
        const value =
          type === "string"
            ? await client.send("GET", [key])
            : type === "hash"
              ? Object.entries((await client.send("HGETALL", [key])) as Record<string, string>).sort()
              : type === "list"
                ? await client.send("LRANGE", [key, "0", "-1"])
                : type === "set"
                  ? ((await client.send("SMEMBERS", [key])) as string[]).sort()
                  : type === "zset"
                    ? await client.send("ZRANGE", [key, "0", "-1", "WITHSCORES"])
                    : await client.send("XRANGE", [key, "-", "+"]);
        const ttl = Number(await client.send("TTL", [key]));
        entries.push(JSON.stringify([dbIndex, key, type, value, ttl > 0]));
      }
    }
    return { keys: entries.length, digest: new Bun.CryptoHasher("sha256").update(entries.join("\n")).digest("hex") };
  });
}

/** fill writes the reference data: every type, TTLs, binary-safe and unicode values, two databases. */
async function fill(client: RedisClient): Promise<void> {
  const writes: Promise<unknown>[] = [];
  for (let i = 0; i < 2000; i++) writes.push(client.send("SET", [`str:${i}`, `value ${i} ✓ ${"x".repeat(i % 50)}`]));
  for (let i = 0; i < 100; i++) writes.push(client.send("HSET", ["hash:1", `field${i}`, String(i * 7)]));
  for (let i = 0; i < 500; i++) writes.push(client.send("RPUSH", ["list:1", `item ${i}`]));
  for (let i = 0; i < 300; i++) writes.push(client.send("SADD", ["set:1", `member ${i}`]));
  for (let i = 0; i < 300; i++) writes.push(client.send("ZADD", ["zset:1", String(i / 3), `player ${i}`]));
  for (let i = 0; i < 50; i++) writes.push(client.send("XADD", ["stream:1", `${1700000000000 + i}-0`, "n", String(i)]));
  for (let i = 0; i < 10; i++) writes.push(client.send("SET", [`ttl:${i}`, "expires later", "EX", "100000"]));
  await Promise.all(writes);
  await client.send("SELECT", ["1"]);
  await Promise.all(Array.from({ length: 100 }, (_, i) => client.send("SET", [`other:${i}`, String(i)])));
  await client.send("SELECT", ["0"]);
}

let db: DatabaseTestEngine;
let scratch: string;
let reference: ReferenceServer | null = null;
let referenceSnapshot: { keys: number; digest: string };
const dumps: Record<string, string> = {};

function rdbOf(port: number, path: string): string {
  run(["redis-cli", "-p", String(port), "--rdb", path], { PATH: process.env.PATH ?? "/usr/bin:/bin", REDISCLI_AUTH: REFERENCE_PASSWORD });
  return path;
}

suite("Redis database services", () => {
  let cache: ServiceRecord;

  beforeAll(async () => {
    db = await startDatabaseEngine();
    scratch = db.root;
    reference = await startReference(join(scratch, "reference"));
    const referenceUrl = `redis://:${REFERENCE_PASSWORD}@127.0.0.1:${reference.port}/0`;
    await withRedis(referenceUrl, fill);
    referenceSnapshot = await snapshot(referenceUrl);
    dumps.rdb = rdbOf(reference.port, join(scratch, "ref.rdb"));
    dumps.gzip = join(scratch, "ref.rdb.gz");
    writeFileSync(dumps.gzip, gzipSync(readFileSync(dumps.rdb)));
    // A larger snapshot for the timeout: the reference and 10000 more keys in database 2.
    await withRedis(referenceUrl, async (client) => {
      await client.send("SELECT", ["2"]);
      await Promise.all(Array.from({ length: 10_000 }, (_, i) => client.send("SET", [`bulk:${i}`, String(i)])));
    });
    dumps.big = rdbOf(reference.port, join(scratch, "big.rdb"));
    const { status, body } = await db.api.deploy({ name: "cache", template_id: "redis", secrets: { REDIS_PASSWORD: PASSWORD } });
    if (status !== 201) throw new Error(`deploy: ${status} ${JSON.stringify(body)}`);
    cache = await db.api.waitFor("cache", "running", () => true, 60_000);
    await withRedis(serviceUrl(cache), (client) => client.send("SET", ["before", "restore"]));
  }, 120_000);

  afterAll(async () => {
    await reference?.stop();
    await db?.close(["cache", "cache-gen", "cache-slow"]);
  }, 60_000);

  test("the connection is shown with its password masked; an admin reveals it (logged), and it connects", async () => {
    const revealed = await expectConnection(db, "cache", PASSWORD);
    expect(revealed).toMatchObject({ engine: "redis", host: "127.0.0.1", port: cache.port, database: "0", user: null, path: null });
    expect(revealed.url).toBe(serviceUrl(cache));
    expect(await withRedis(revealed.url, (client) => client.send("PING", []))).toBe("PONG");
  }, 30_000);

  (asRoot ? test : test.skip)(
    "as root the server runs as the service's own user, which owns its data dir (0700) and every file in it",
    async () => {
      const owner = serviceUid("cache");
      if (!owner) throw new Error(`the host has no user ${serviceUserName("cache")}`);
      const record = await db.api.get("cache");
      expect(processUids(record.pid as number)).toEqual([owner.uid, owner.uid, owner.uid, owner.uid]);
      expect(record.user).toBe(serviceUserName("cache"));
      expect((await db.api.diagnose("cache")).user).toBe(serviceUserName("cache"));
      const dir = join(db.engine.dataDir, "data", "cache");
      expect(statSync(dir).mode & 0o777).toBe(0o700);
      expect(notOwnedBy(dir, owner)).toEqual([]);
    },
  );

  test("a client with the password may not move where the server writes, nor run DEBUG or MODULE", async () => {
    const dir = join(db.engine.dataDir, "data", "cache");
    await withRedis(serviceUrl(cache), async (client) => {
      const refusals: [string, string[], RegExp][] = [
        ["CONFIG", ["SET", "dir", "/tmp"], /protected config/],
        ["CONFIG", ["SET", "dbfilename", "elsewhere.rdb"], /protected config/],
        ["DEBUG", ["SLEEP", "0"], /DEBUG command not allowed/],
        ["MODULE", ["LOAD", join(dir, "module.so")], /MODULE command not allowed/],
      ];
      for (const [command, args, refusal] of refusals) await expect(client.send(command, args)).rejects.toThrow(refusal);
      expect(JSON.stringify(await client.send("CONFIG", ["GET", "dir"]))).toContain(JSON.stringify(dir));
    });
  });

  test("a template deploy gets a free port, a generated requirepass kept as a secret, and is running only once it answers PING", async () => {
    const { status, body } = await db.api.deploy({ name: "cache-gen", template_id: "redis" });
    expect(status).toBe(201);
    expect(body.kind).toBe("database");
    expect(body.port).not.toBe(6379);
    expect(body.port).toBeGreaterThan(0);
    expect(body.secret_keys).toEqual(["REDIS_PASSWORD"]);
    const running = await db.api.waitFor("cache-gen", "running", () => true, 60_000);
    // A bound job reaches it with REDIS_URL alone; without the password it is refused.
    await db.api.deployed({
      name: "cache-client",
      kind: "batch",
      // (redis-cli 7.0's -u takes the empty user of redis://:password@ for a user name, so it gets the password alone.)
      command: `echo "answer=$(REDISCLI_AUTH="$CACHE_GEN_PASSWORD" redis-cli -h "$CACHE_GEN_HOST" -p "$CACHE_GEN_PORT" INCRBY answer 42)" && echo "anonymous=$(redis-cli -h "$CACHE_GEN_HOST" -p "$CACHE_GEN_PORT" PING 2>&1 | cut -c1-6)" && echo "url=$REDIS_URL" | sed 's/:[^:@]*@/:***@/'`,
      bindings: ["cache-gen"],
      restart: { policy: "never" },
    });
    await db.api.waitFor("cache-client", "completed", () => true, 30_000);
    const diagnosis = await db.api.diagnose("cache-client");
    const lines = diagnosis.logs.map((line) => line.line);
    expect(lines).toContain("answer=42");
    expect(lines).toContain("anonymous=NOAUTH");
    expect(lines).toContain(`url=redis://:***@127.0.0.1:${running.port}/0`);
    expect(diagnosis.injected_env_keys).toEqual(expect.arrayContaining(["REDIS_URL", "CACHE_GEN_URL", "CACHE_GEN_PASSWORD"]));
    const everything = JSON.stringify([await db.api.get("cache-gen"), await db.api.diagnose("cache-gen"), diagnosis]);
    expect(everything).not.toMatch(/REDIS_PASSWORD":|REDIS_URL=redis:\/\/:[^*]/);
    await db.engine.call("DELETE", "/api/services/cache-client");
  }, 90_000);

  test.each([
    ["rdb", "redis-rdb"],
    ["gzip", "redis-rdb"],
  ])(
    "a redis-cli --rdb snapshot (%s) restores through the API with the reference's keys and values",
    async (kind, format) => {
      const dump = dumps[kind] as string;
      const { status, body } = await restore(db.engine, "cache", dump);
      expect(status).toBe(200);
      expect(body).toMatchObject({ service_name: "cache", dump, engine: "redis" });
      expect(await snapshot(serviceUrl(cache))).toEqual(referenceSnapshot);
      const last = await lastDump(db.api, "cache");
      expect(last).toMatchObject({ dump, format, engine: "redis", result: "ok" });
      expect(last?.bytes).toBe(last?.total_bytes);
      expect(String(last?.message)).toContain(`${referenceSnapshot.keys} keys loaded`);
      cache = await db.api.get("cache");
      // Nothing of the restore is left in the data dir; the AOF holds the restored data.
      const dir = join(db.engine.dataDir, "data", "cache");
      expect(readdirSync(dir).filter((name) => name.startsWith(".restore"))).toEqual([]);
      expect(readFileSync(join(dir, "appendonlydir", "appendonly.aof.manifest"), "utf8")).toContain("type b");
      // What the restore placed is the server's user's, as root runs it (the engine wrote it as root).
      if (asRoot) expect(notOwnedBy(dir, serviceUid("cache") ?? { uid: -1, gid: -1 })).toEqual([]);
    },
    60_000,
  );

  test("progress and the outcome are in the service's log", async () => {
    const logs = await db.engine.json<{ line: string; stream: string }[]>("GET", "/api/services/cache/logs?tail=400");
    const engineLines = logs.body.filter((line) => line.stream === "engine").map((line) => line.line);
    expect(engineLines.some((line) => /^restore: read \d+ of \d+ bytes \(100%\)$/.test(line))).toBe(true);
    expect(engineLines.some((line) => line.startsWith("restore: done in "))).toBe(true);
  });

  test("stop is redis-cli SHUTDOWN SAVE with no SIGKILL; restored and later writes survive a restart through the AOF", async () => {
    await withRedis(serviceUrl(cache), (client) => client.send("SET", ["after", "restore"]));
    const stopped = await db.api.control("cache", "stop");
    expect(stopped.status).toBe(200);
    const diagnosis = await db.api.diagnose("cache");
    expect(diagnosis.last_run).toMatchObject({ forced_kill: false, signal: null, exit_code: 0 });
    expect(String(diagnosis.last_run?.stop_method)).toMatch(/^redis-cli -h 127\.0\.0\.1 -p \d+ SHUTDOWN SAVE$/);
    expect(diagnosis.logs.map((line) => line.line).join("\n")).toContain("Saving the final RDB snapshot before exiting");
    expect((await db.api.control("cache", "start")).status).toBe(200);
    cache = await db.api.waitFor("cache", "running", () => true, 60_000);
    expect(await withRedis(serviceUrl(cache), (client) => client.send("GET", ["after"]))).toBe("restore");
    await withRedis(serviceUrl(cache), (client) => client.send("DEL", ["after"]));
    expect(await snapshot(serviceUrl(cache))).toEqual(referenceSnapshot);
  }, 90_000);

  test.each([
    [
      "a corrupt RDB (a flipped byte: the checksum fails)",
      "corrupt.rdb",
      (whole: Buffer) => {
        const copy = Buffer.from(whole);
        const middle = Math.floor(copy.length / 2);
        copy[middle] = (copy[middle] ?? 0) ^ 0xff;
        return copy;
      },
    ],
    ["a truncated RDB", "truncated.rdb", (whole: Buffer) => whole.subarray(0, Math.floor(whole.length / 2))],
    [
      "an RDB of a version this Redis cannot read",
      "future.rdb",
      (whole: Buffer) => Buffer.concat([Buffer.from("REDIS0099"), whole.subarray(9)]),
    ],
  ])(
    "%s is a 422 and the server is neither stopped nor changed",
    async (_label, name, damage) => {
      await withRedis(serviceUrl(cache), (client) => client.send("SET", ["marker", name]));
      const before = await snapshot(serviceUrl(cache));
      const pid = (await db.api.get("cache")).pid;
      const path = join(scratch, name);
      writeFileSync(path, damage(readFileSync(dumps.rdb as string)));
      const { status, body } = await restore(db.engine, "cache", path);
      expect(status).toBe(422);
      expect(body.detail?.[0]?.type).toBe("restore_failed");
      expect(body.detail?.[0]?.msg).toContain("redis-check-rdb refuses the file");
      expect((await db.api.get("cache")).pid).toBe(pid);
      expect(await snapshot(serviceUrl(cache))).toEqual(before);
      await withRedis(serviceUrl(cache), (client) => client.send("DEL", ["marker"]));
    },
    30_000,
  );

  test("a restore past timeout_s (the server still loading the new data) answers 504 and the old data comes back", async () => {
    // key-load-delay slows loading (microseconds per key), so the timeout lands while the server loads the new file.
    await db.api.deployed({
      name: "cache-slow",
      template_id: "redis",
      secrets: { REDIS_PASSWORD: PASSWORD },
      env: { EXTRA_ARGS: "--key-load-delay 300" },
    });
    let slow = await db.api.waitFor("cache-slow", "running", () => true, 60_000);
    await withRedis(serviceUrl(slow), (client) =>
      Promise.all([client.send("SET", ["old", "data"]), client.send("RPUSH", ["old:list", "a", "b"])]),
    );
    const before = await snapshot(serviceUrl(slow));
    const { status, body } = await restore(db.engine, "cache-slow", dumps.big as string, 1);
    expect(status).toBe(504);
    expect(body.error?.code).toBe("restore_timed_out");
    slow = await db.api.waitFor("cache-slow", "running", () => true, 60_000);
    expect(await snapshot(serviceUrl(slow))).toEqual(before);
    expect(await lastDump(db.api, "cache-slow")).toMatchObject({ result: "timeout", format: "redis-rdb" });
    const logs = (await db.api.diagnose("cache-slow")).logs.map((line) => line.line);
    expect(logs).toContain("put the previous data files back");
    const dir = join(db.engine.dataDir, "data", "cache-slow");
    expect(readdirSync(dir).filter((name) => name.startsWith(".restore"))).toEqual([]);
    if (asRoot) expect(notOwnedBy(dir, serviceUid("cache-slow") ?? { uid: -1, gid: -1 })).toEqual([]);
  }, 120_000);

  test("another engine's dump is a 409 that names it", async () => {
    const mysql = join(scratch, "m.sql");
    writeFileSync(mysql, "-- MariaDB dump 10.19  Distrib 10.11.19-MariaDB\n--\n/*!40101 SET NAMES utf8mb4 */;\n");
    const wrong = await restore(db.engine, "cache", mysql);
    expect(wrong.status).toBe(409);
    expect(wrong.body.error?.code).toBe("dump_engine_mismatch");
    expect(wrong.body.error?.message).toContain("MySQL/MariaDB");
    const sql = join(scratch, "plain.sql");
    writeFileSync(sql, "CREATE TABLE t (id int);\n");
    const plain = await restore(db.engine, "cache", sql);
    expect(plain.status).toBe(422);
    expect(plain.body.detail?.[0]?.type).toBe("dump_unrecognized");
    expect(await snapshot(serviceUrl(cache))).toEqual(referenceSnapshot);
  }, 30_000);

  test("EXTRA_ARGS may not override what the engine sets in redis.conf", async () => {
    const { status, body } = await db.api.deploy({
      name: "cache-bad",
      template_id: "redis",
      env: { EXTRA_ARGS: "--maxmemory 1gb --dir /tmp" },
    });
    expect(status).toBe(422);
    expect(JSON.stringify(body)).toContain("--dir");
    // The refusal names the option, never the password that came with it.
    const secret = await db.api.deploy({ name: "cache-bad", template_id: "redis", env: { EXTRA_ARGS: "--requirepass hunter2-extra" } });
    expect(secret.status).toBe(422);
    expect(JSON.stringify(secret.body)).toContain("--requirepass");
    expect(JSON.stringify(secret.body)).not.toContain("hunter2");
    // Nor turn CONFIG SET dir, DEBUG or MODULE LOAD back on.
    for (const option of ["--enable-protected-configs yes", "--enable-debug-command local", "--enable-module-command yes"]) {
      const enabled = await db.api.deploy({ name: "cache-bad", template_id: "redis", env: { EXTRA_ARGS: option } });
      expect(enabled.status).toBe(422);
      expect(JSON.stringify(enabled.body)).toContain(option.split(" ")[0] as string);
    }
  });
});

describe.if(toolsOk && asRoot)("a Redis service an older engine ran as root", () => {
  test("its first start as its own user gives it the data dir and every file in it, and keeps its data", async () => {
    const dataDir = freshTempPath("engine-db-upgrade-");
    const name = "legacy-redis";
    const dir = join(dataDir, "data", name);
    try {
      let engine = await startTestEngine({ dataDir });
      let api = new ServiceClient(engine);
      await api.deployed({ name, template_id: "redis", secrets: { REDIS_PASSWORD: PASSWORD } });
      let record = await api.waitFor(name, "running", () => true, 60_000);
      await withRedis(serviceUrl(record), (client) => client.send("SET", ["kept", "across the upgrade"]));
      await api.control(name, "stop");
      // Closing removes the service's user too: a host the older engine ran on never had it.
      await engine.close();
      // What the older engine left: the dir 0750 and everything in it root's, no user on record.
      run(["chown", "-R", "-P", "0:0", dir]);
      chmodSync(dir, 0o750);
      const store = new Database(join(dataDir, "engine.db"));
      store.query("UPDATE services SET run_as = NULL WHERE name = ?").run(name);
      store.close();
      expect(serviceUid(name)).toBeNull();

      engine = await startTestEngine({ dataDir });
      api = new ServiceClient(engine);
      try {
        expect((await api.control(name, "start")).status).toBe(200);
        record = await api.waitFor(name, "running", (r) => r.pid !== null, 60_000);
        const owner = serviceUid(name);
        if (!owner) throw new Error(`the engine made no user ${serviceUserName(name)}`);
        expect(processUids(record.pid as number)).toEqual([owner.uid, owner.uid, owner.uid, owner.uid]);
        expect(statSync(dir).mode & 0o777).toBe(0o700);
        expect(notOwnedBy(dir, owner)).toEqual([]);
        expect(record.user).toBe(serviceUserName(name));
        expect(await withRedis(serviceUrl(record), (client) => client.send("GET", ["kept"]))).toBe("across the upgrade");
        // The server writes as its user: a SAVE lands in its own dir.
        expect(await withRedis(serviceUrl(record), (client) => client.send("SAVE", []))).toBe("OK");
        await api.control(name, "stop");
      } finally {
        await engine.close();
      }
    } finally {
      rmSync(dataDir, { recursive: true, force: true });
    }
  }, 120_000);
});

describe.if(toolsOk)("Redis restore recovery", () => {
  test("a journal left by another process (the engine died mid-restore) puts the previous data files back before the next start", async () => {
    const dir = tempDir("engine-redis-recover-");
    try {
      writeFileSync(join(dir, "dump.rdb"), "new");
      mkdirSync(join(dir, "appendonlydir"));
      writeFileSync(join(dir, "appendonlydir", "appendonly.aof.1.base.rdb"), "new");
      const previous = join(dir, ".restore-previous-abc");
      mkdirSync(join(previous, "appendonlydir"), { recursive: true });
      writeFileSync(join(previous, "dump.rdb"), "old");
      writeFileSync(join(previous, "appendonlydir", "appendonly.aof.1.base.rdb"), "old");
      writeFileSync(join(dir, ".restore-journal.json"), JSON.stringify({ pid: -1, previous, existed: ["dump.rdb", "appendonlydir"] }));
      writeFileSync(join(dir, ".restore-abc.rdb"), "a copy left behind");
      const logged: string[] = [];
      await adapter.initialize(
        {
          serviceId: "svc_x",
          serviceName: "recover",
          dataDir: dir,
          host: "127.0.0.1",
          port: 6390,
          credentials: { REDIS_PASSWORD: "p" },
          env: { PATH: process.env.PATH ?? "" },
        },
        { log: (line) => logged.push(line), signal: new AbortController().signal },
      );
      expect(readFileSync(join(dir, "dump.rdb"), "utf8")).toBe("old");
      expect(readFileSync(join(dir, "appendonlydir", "appendonly.aof.1.base.rdb"), "utf8")).toBe("old");
      expect(readdirSync(dir).filter((name) => name.startsWith(".restore"))).toEqual([]);
      expect(logged.join("\n")).toContain("put the previous data files back");
      expect(existsSync(join(dir, "redis.conf"))).toBe(true);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
