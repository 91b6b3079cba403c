import { afterAll, describe, expect, test } from "bun:test";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { DatabaseEngines, describeUnrecognised, PostgresEngine, readDumpSample } from "../../../src/engine/databases";
import { tempDir } from "../../helpers";

const engines = new DatabaseEngines();

function tarHeader(name: string): Uint8Array {
  const block = new Uint8Array(512);
  block.set(new TextEncoder().encode(name), 0);
  block.set(new TextEncoder().encode("ustar\0"), 257);
  return block;
}

describe("dump format sniffing", () => {
  const dir = tempDir("engine-formats-");
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const write = (name: string, content: string | Uint8Array) => {
    const path = join(dir, name);
    writeFileSync(path, content);
    return path;
  };

  test.each([
    ["pg_dump -Fc", "a.dump", `PGDMP\x01\x0e\x00\x04\x08\x01${"x".repeat(64)}`, "postgres", "postgres-custom", "certain"],
    ["pg_dump -Ft", "a.tar", tarHeader("toc.dat"), "postgres", "postgres-tar", "certain"],
    [
      "pg_dump plain",
      "a.sql",
      "--\n-- PostgreSQL database dump\n--\n\nSET statement_timeout = 0;\n",
      "postgres",
      "postgres-sql",
      "certain",
    ],
    [
      "mysqldump",
      "m.sql",
      "-- MySQL dump 10.13  Distrib 8.0.36\n--\n/*!40101 SET @OLD_CHARACTER_SET_CLIENT=@@CHARACTER_SET_CLIENT */;\n",
      "mariadb",
      "mysql-sql",
      "certain",
    ],
    ["mariadb-dump", "m2.sql", "-- MariaDB dump 10.19  Distrib 10.11.6-MariaDB\n", "mariadb", "mysql-sql", "certain"],
    ["Redis RDB", "dump.rdb", "REDIS0011\xfa\x09redis-ver\x057.2.4", "redis", "redis-rdb", "certain"],
    ["SQLite file", "x.sqlite3", `SQLite format 3\0${"\0".repeat(84)}`, "sqlite", "sqlite-db", "certain"],
    [
      "sqlite3 .dump",
      "x.sql",
      "PRAGMA foreign_keys=OFF;\nBEGIN TRANSACTION;\nCREATE TABLE t(a);\nCOMMIT;\n",
      "sqlite",
      "sqlite-sql",
      "certain",
    ],
  ])("%s is recognised", (_label, name, content, engine, format, confidence) => {
    const sample = readDumpSample(write(name, content));
    const [first] = engines.sniff(sample);
    expect(first).toMatchObject({ engine, format, confidence, gzip: false });
  });

  test("gzip is seen through: a compressed plain dump is the plain dump, flagged gzip", () => {
    const sample = readDumpSample(write("a.sql.gz", gzipSync("--\n-- PostgreSQL database dump\n--\n")));
    expect(engines.sniff(sample)[0]).toMatchObject({ engine: "postgres", format: "postgres-sql", gzip: true });
    const mysql = readDumpSample(write("m.sql.gz", gzipSync("-- MySQL dump 10.13\n")));
    expect(engines.sniff(mysql)[0]).toMatchObject({ engine: "mariadb", format: "mysql-sql", gzip: true });
  });

  test("a pg_dump directory is recognised by its toc.dat", () => {
    const dumpDir = join(dir, "pgdir");
    mkdirSync(dumpDir);
    writeFileSync(join(dumpDir, "toc.dat"), "PGDMP");
    writeFileSync(join(dumpDir, "3001.dat.gz"), "x".repeat(100));
    const sample = readDumpSample(dumpDir);
    expect(sample.totalBytes).toBe(105);
    expect(engines.sniff(sample)[0]).toMatchObject({ engine: "postgres", format: "postgres-directory" });
  });

  test("SQL without a tool's header is a likely match for every SQL engine, never for Redis", () => {
    const sample = readDumpSample(write("plain.sql", "CREATE TABLE t (id int);\nINSERT INTO t VALUES (1);\n"));
    const matches = engines.sniff(sample);
    expect(matches.map((m) => m.engine).sort()).toEqual(["mariadb", "postgres", "sqlite"]);
    expect(matches.every((m) => m.confidence === "likely" && m.format === "sql")).toBe(true);
  });

  test.each([
    ["an empty file", "", /^an empty file$/],
    ["prose", "Dear diary,\nnothing to restore here.\n", /^text that is not a recognised dump \(first line: "Dear diary,"\)$/],
    ["binary", new Uint8Array([0xde, 0xad, 0xbe, 0xef, 0, 1]), /^binary data of no known dump format \(first bytes: de ad be ef 00 01\)$/],
    ["compressed prose", gzipSync("just words\n"), /^gzip-compressed text that is not a recognised dump/],
  ])("%s is unrecognised, and described", (_label, content, description) => {
    const sample = readDumpSample(write(`u-${Math.random()}`, content));
    expect(engines.sniff(sample)).toEqual([]);
    expect(describeUnrecognised(sample)).toMatch(description);
  });

  test("engines without an adapter still recognise their dumps (to answer 409, not 422)", () => {
    const onlyPostgres = new DatabaseEngines({ postgres: () => new PostgresEngine() });
    expect(onlyPostgres.available("postgres")).toBe(true);
    expect(onlyPostgres.available("redis")).toBe(false);
    expect(() => onlyPostgres.get("redis")).toThrow(/no redis adapter/);
    const rdb = readDumpSample(write("only.rdb", "REDIS0011\xfa"));
    expect(onlyPostgres.sniff(rdb)[0]).toMatchObject({ engine: "redis", format: "redis-rdb" });
  });
});
