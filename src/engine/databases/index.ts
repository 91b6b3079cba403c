/**
 * The databases module: one adapter per engine (PostgreSQL, MariaDB/MySQL, Redis, SQLite)
 * behind the DatabaseEngine interface, the format sniffing shared by all, and the restore
 * coordinator behind POST /api/databases/{name}/restore.
 */
export { describeUnrecognised, isMostlyText, looksLikeSql, readDumpSample, SAMPLE_BYTES, sniffFormat } from "./formats";
export { MariaDbEngine, mariadbSocket, nativePasswordHash, osUserName } from "./mariadb";
export { PostgresEngine } from "./postgres";
export { RedisEngine } from "./redis";
export { DatabaseEngines, isDatabaseEngineName } from "./registry";
export {
  type LastDump,
  PROGRESS_PATTERN,
  progressLine,
  RestoreCoordinator,
  type RestoreHost,
  type RestoreOptions,
  type RestoreResult,
  type RestoreTarget,
} from "./restore";
export { type DatabaseRouteDeps, databaseRoutes } from "./routes";
export { SQLITE_DATABASE_FILE, SqliteEngine, sqliteFile } from "./sqlite";
export { assertTools, asUser, firstUnreachable, freeTcpPort, lookupUser, type RunAs } from "./tools";
export {
  type ConnectionDetails,
  DATABASE_ENGINE_NAMES,
  type DatabaseEngine,
  type DatabaseEngineName,
  type DatabaseInstance,
  type DumpFormat,
  type DumpSample,
  type MissingTool,
  type ReadyResult,
  type RestoreJob,
  type RestoreOutcome,
  type RestoreProgress,
  type ServerControl,
  type ToolContext,
  type ToolReport,
} from "./types";
