import { AppError } from "../../lib/errors";
import { sniffFormat } from "./formats";
import { MariaDbEngine } from "./mariadb";
import { PostgresEngine } from "./postgres";
import { RedisEngine } from "./redis";
import { SqliteEngine } from "./sqlite";
import { DATABASE_ENGINE_NAMES, type DatabaseEngine, type DatabaseEngineName, type DumpFormat, type DumpSample } from "./types";

/**
 * ADAPTERS lists how to make each engine's adapter: one line per engine. An engine whose
 * adapter is not written yet is null; its templates then run their shell `start` command as
 * plain services, and restores into them answer database_engine_unavailable.
 */
const ADAPTERS: Record<DatabaseEngineName, (() => DatabaseEngine) | null> = {
  postgres: () => new PostgresEngine(),
  mariadb: () => new MariaDbEngine(),
  redis: () => new RedisEngine(),
  sqlite: () => new SqliteEngine(),
};

/** isDatabaseEngineName says whether a string names an engine. */
export function isDatabaseEngineName(name: string): name is DatabaseEngineName {
  return (DATABASE_ENGINE_NAMES as readonly string[]).includes(name);
}

/**
 * DatabaseEngines holds the adapters of one daemon. Adapters are stateless, so one set is made
 * per daemon (by the composition root) and shared by the service manager and the restore path.
 */
export class DatabaseEngines {
  private readonly adapters = new Map<DatabaseEngineName, DatabaseEngine>();

  constructor(factories: Partial<Record<DatabaseEngineName, (() => DatabaseEngine) | null>> = ADAPTERS) {
    for (const name of DATABASE_ENGINE_NAMES) {
      const make = factories[name];
      if (make) this.adapters.set(name, make());
    }
  }

  /** available says whether this engine has an adapter for `name`. */
  available(name: DatabaseEngineName): boolean {
    return this.adapters.has(name);
  }

  /** get returns the adapter of `name`, or throws database_engine_unavailable. */
  get(name: DatabaseEngineName): DatabaseEngine {
    const adapter = this.adapters.get(name);
    if (!adapter) {
      throw new AppError(
        "database_engine_unavailable",
        `this engine has no ${name} adapter yet: ${name} services run their template's start command unmanaged`,
      );
    }
    return adapter;
  }

  /**
   * sniff recognises a dump: every engine is asked (engines without an adapter through the
   * shared format table), certain matches first, so a dump of another engine is named as such.
   */
  sniff(sample: DumpSample): DumpFormat[] {
    const matches: DumpFormat[] = [];
    for (const name of DATABASE_ENGINE_NAMES) {
      const adapter = this.adapters.get(name);
      const match = adapter ? adapter.sniff(sample) : sniffFormat(name, sample);
      if (match) matches.push(match);
    }
    return matches.sort((a, b) => (a.confidence === b.confidence ? 0 : a.confidence === "certain" ? -1 : 1));
  }
}
