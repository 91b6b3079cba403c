import { closeSync, openSync, readdirSync, readSync, statSync } from "node:fs";
import { basename, join } from "node:path";
import { gunzipSync } from "node:zlib";
import type { DatabaseEngineName, DumpFormat, DumpSample } from "./types";

/** SAMPLE_BYTES is how much of a dump sniffing reads: enough for any header and the first statements. */
export const SAMPLE_BYTES = 64 * 1024;

const GZIP_MAGIC = [0x1f, 0x8b];
const ascii = (bytes: Uint8Array, from: number, length: number) => new TextDecoder("latin1").decode(bytes.subarray(from, from + length));

function startsWith(bytes: Uint8Array, prefix: string | number[]): boolean {
  const want = typeof prefix === "string" ? [...prefix].map((c) => c.charCodeAt(0)) : prefix;
  if (bytes.length < want.length) return false;
  return want.every((byte, index) => bytes[index] === byte);
}

/** gunzipHead decompresses as much of a gzip stream's start as `compressed` holds. */
function gunzipHead(compressed: Uint8Array): Uint8Array {
  try {
    return gunzipSync(compressed, { finishFlush: 2 /* Z_SYNC_FLUSH: accept a truncated stream */ }).subarray(0, SAMPLE_BYTES);
  } catch {
    return new Uint8Array();
  }
}

/**
 * readDumpSample reads what sniffing needs of a dump on local disk: the first SAMPLE_BYTES
 * (decompressed when gzip), or a directory's entry names, and the size on disk. It throws
 * the file system's error (ENOENT, EACCES) for the caller to report.
 */
export function readDumpSample(path: string, name = basename(path)): DumpSample {
  const stat = statSync(path);
  if (stat.isDirectory()) {
    const entries = readdirSync(path).sort();
    let total = 0;
    for (const entry of entries) {
      try {
        const entryStat = statSync(join(path, entry));
        if (entryStat.isFile()) total += entryStat.size;
      } catch {
        // unreadable entries count for nothing
      }
    }
    return { path, name, isDirectory: true, gzip: false, head: new Uint8Array(), entries, totalBytes: total };
  }
  const fd = openSync(path, "r");
  const buffer = Buffer.alloc(SAMPLE_BYTES);
  let read = 0;
  try {
    read = readSync(fd, buffer, 0, SAMPLE_BYTES, 0);
  } finally {
    closeSync(fd);
  }
  const raw = new Uint8Array(buffer.buffer, buffer.byteOffset, read);
  const gzip = startsWith(raw, GZIP_MAGIC);
  return { path, name, isDirectory: false, gzip, head: gzip ? gunzipHead(raw) : raw, entries: [], totalBytes: stat.size };
}

/** isMostlyText says whether bytes look like text: no NUL, few control characters. */
export function isMostlyText(bytes: Uint8Array): boolean {
  if (bytes.length === 0) return false;
  let control = 0;
  for (const byte of bytes) {
    if (byte === 0) return false;
    if (byte < 0x09 || (byte > 0x0d && byte < 0x20)) control++;
  }
  return control / bytes.length < 0.01;
}

const SQL_STATEMENT =
  /^\s*(--[^\n]*\n\s*|\/\*[\s\S]*?\*\/\s*;?\s*)*(CREATE|INSERT|BEGIN|SET|DROP|ALTER|PRAGMA|START|COPY|SELECT|LOCK|USE|COMMIT)\b/i;

/** looksLikeSql says whether text starts (after comments) with an SQL statement. */
export function looksLikeSql(text: string): boolean {
  return SQL_STATEMENT.test(text);
}

/** Sniffer recognises one engine's dumps. */
type Sniffer = (sample: DumpSample, text: string | null) => Omit<DumpFormat, "engine" | "gzip"> | null;

/**
 * PostgreSQL: pg_dump's custom format starts with `PGDMP`; its directory format is a
 * directory with `toc.dat`; its tar format is a ustar archive whose first member is
 * `toc.dat`; its plain format is SQL text headed `-- PostgreSQL database dump`.
 */
const sniffPostgres: Sniffer = (sample, text) => {
  if (sample.isDirectory) {
    return sample.entries.includes("toc.dat")
      ? { format: "postgres-directory", confidence: "certain", description: "PostgreSQL directory-format dump (toc.dat)" }
      : null;
  }
  const head = sample.head;
  if (startsWith(head, "PGDMP")) {
    const version = head.length >= 8 ? `v${head[5]}.${head[6]}` : "unknown version";
    return { format: "postgres-custom", confidence: "certain", description: `PostgreSQL custom-format archive (PGDMP, ${version})` };
  }
  // ustar: the member name is at offset 0, the "ustar" magic at offset 257.
  if (head.length >= 262 && ascii(head, 257, 5) === "ustar" && ascii(head, 0, 7) === "toc.dat") {
    return { format: "postgres-tar", confidence: "certain", description: "PostgreSQL tar-format archive (toc.dat)" };
  }
  if (text !== null && /^--\s*\n--\s*PostgreSQL database (cluster )?dump/m.test(text.slice(0, 4096))) {
    return { format: "postgres-sql", confidence: "certain", description: "PostgreSQL plain SQL dump (pg_dump)" };
  }
  return null;
};

/** MySQL/MariaDB: mysqldump/mariadb-dump text, headed `-- MySQL dump` / `-- MariaDB dump` or with `/*!40101` version comments. */
const sniffMariadb: Sniffer = (sample, text) => {
  if (sample.isDirectory || text === null) return null;
  const start = text.slice(0, 4096);
  if (/^-- (MySQL|MariaDB) dump/m.test(start) || /\/\*!\d{5} SET /.test(start) || /^\/\*M?!999999\\- enable the sandbox mode/.test(start)) {
    return { format: "mysql-sql", confidence: "certain", description: "MySQL/MariaDB SQL dump (mysqldump / mariadb-dump)" };
  }
  return null;
};

/** Redis: an RDB snapshot starts with `REDIS` and a four-digit version. */
const sniffRedis: Sniffer = (sample) => {
  if (sample.isDirectory) return null;
  if (startsWith(sample.head, "REDIS") && /^\d{4}$/.test(ascii(sample.head, 5, 4))) {
    return { format: "redis-rdb", confidence: "certain", description: `Redis RDB snapshot (version ${ascii(sample.head, 5, 4)})` };
  }
  return null;
};

/** SQLite: a database file starts with `SQLite format 3\0`; `.dump` text starts `PRAGMA foreign_keys=OFF; BEGIN TRANSACTION;`. */
const sniffSqlite: Sniffer = (sample, text) => {
  if (sample.isDirectory) return null;
  if (startsWith(sample.head, "SQLite format 3\0")) {
    return { format: "sqlite-db", confidence: "certain", description: "SQLite 3 database file" };
  }
  if (text !== null && /^PRAGMA foreign_keys=OFF;\s*BEGIN TRANSACTION;/.test(text.trimStart())) {
    return { format: "sqlite-sql", confidence: "certain", description: "SQLite SQL dump (sqlite3 .dump)" };
  }
  return null;
};

const SNIFFERS: Record<DatabaseEngineName, Sniffer> = {
  postgres: sniffPostgres,
  mariadb: sniffMariadb,
  redis: sniffRedis,
  sqlite: sniffSqlite,
};

function sampleText(sample: DumpSample): string | null {
  return !sample.isDirectory && isMostlyText(sample.head) ? new TextDecoder("utf-8").decode(sample.head) : null;
}

/**
 * sniffFormat recognises `engine`'s certain formats and, for engines that take SQL text
 * (all but Redis), generic SQL as a `likely` match. Adapters call it from their sniff().
 */
export function sniffFormat(engine: DatabaseEngineName, sample: DumpSample): DumpFormat | null {
  const text = sampleText(sample);
  const match = SNIFFERS[engine](sample, text);
  if (match) return { ...match, engine, gzip: sample.gzip };
  if (engine !== "redis" && text !== null && looksLikeSql(text)) {
    const certainElsewhere = (Object.keys(SNIFFERS) as DatabaseEngineName[]).some(
      (other) => other !== engine && SNIFFERS[other](sample, text) !== null,
    );
    if (!certainElsewhere) {
      return { engine, format: "sql", confidence: "likely", gzip: sample.gzip, description: "SQL text without a dump tool's header" };
    }
  }
  return null;
}

/**
 * describeUnrecognised says what a dump that no engine recognised looks like, for the 422:
 * "empty file", "gzip-compressed binary data", "text that is not SQL", "binary data starting 0x…".
 */
export function describeUnrecognised(sample: DumpSample): string {
  if (sample.isDirectory) {
    const shown = sample.entries.slice(0, 5).join(", ");
    return sample.entries.length === 0 ? "an empty directory" : `a directory without toc.dat (entries: ${shown})`;
  }
  if (sample.totalBytes === 0) return "an empty file";
  const prefix = sample.gzip ? "gzip-compressed " : "";
  if (sample.gzip && sample.head.length === 0) return "a gzip file whose content could not be decompressed";
  if (isMostlyText(sample.head)) {
    const firstLine = new TextDecoder().decode(sample.head.subarray(0, 200)).split("\n")[0]?.slice(0, 60) ?? "";
    return `${prefix}text that is not a recognised dump (first line: ${JSON.stringify(firstLine)})`;
  }
  const hex = [...sample.head.subarray(0, 8)].map((byte) => byte.toString(16).padStart(2, "0")).join(" ");
  return `${prefix}binary data of no known dump format (first bytes: ${hex})`;
}
