/**
 * MIGRATIONS is append-only: a released migration is never edited or reordered, only
 * followed by a new one. Ids are dated so branches merge without renumbering.
 */
export interface Migration {
  id: string;
  sql: string;
}

export const MIGRATIONS: readonly Migration[] = [
  {
    id: "2026-11-21-01-tokens",
    sql: `
      CREATE TABLE tokens (
        id                  TEXT PRIMARY KEY,
        name                TEXT NOT NULL,
        role                TEXT NOT NULL CHECK (role IN ('admin', 'submitter', 'readonly')),
        digest              TEXT NOT NULL UNIQUE,
        created_at          TEXT NOT NULL,
        max_gpus            INTEGER,
        max_concurrent_jobs INTEGER,
        last_used_at        TEXT,
        revoked_at          TEXT,
        expires_at          TEXT,
        scope_services      TEXT NOT NULL DEFAULT '[]',
        origin              TEXT NOT NULL DEFAULT 'api'
      );
      CREATE UNIQUE INDEX tokens_active_name ON tokens(name) WHERE revoked_at IS NULL;
    `,
  },
  {
    id: "2026-11-21-02-vcs-token",
    sql: `
      CREATE TABLE vcs_tokens (
        installation_id INTEGER PRIMARY KEY,
        sealed_token    TEXT NOT NULL,
        issued_at       TEXT NOT NULL,
        expires_at      TEXT NOT NULL,
        repos           TEXT NOT NULL,
        updated_at      TEXT NOT NULL
      );
    `,
  },
  {
    id: "2026-11-21-03-services",
    sql: `
      CREATE TABLE services (
        id              TEXT PRIMARY KEY,
        name            TEXT NOT NULL UNIQUE,
        kind            TEXT NOT NULL CHECK (kind IN ('batch', 'service', 'model', 'database')),
        version         INTEGER NOT NULL,
        desired_state   TEXT NOT NULL,
        status          TEXT NOT NULL,
        status_message  TEXT,
        owner           TEXT NOT NULL DEFAULT '{}',
        priority        INTEGER NOT NULL DEFAULT 0,
        submitted_at    TEXT NOT NULL,
        created_at      TEXT NOT NULL,
        updated_at      TEXT NOT NULL,
        restart_state   TEXT NOT NULL DEFAULT '{}',
        forensics       TEXT NOT NULL DEFAULT '{}',
        current_run_id  TEXT
      );
      CREATE TABLE service_versions (
        service_id   TEXT NOT NULL REFERENCES services(id) ON DELETE CASCADE,
        version      INTEGER NOT NULL,
        spec         TEXT NOT NULL,
        sealed_secrets TEXT,
        created_at   TEXT NOT NULL,
        build_result TEXT,
        build_reason TEXT,
        build_commit TEXT,
        build_dir    TEXT,
        PRIMARY KEY (service_id, version)
      );
      CREATE TABLE runs (
        id          TEXT PRIMARY KEY,
        service_id  TEXT NOT NULL REFERENCES services(id) ON DELETE CASCADE,
        version     INTEGER NOT NULL,
        run_dir     TEXT NOT NULL,
        shim_pid    INTEGER,
        shim_start  INTEGER,
        pid         INTEGER,
        pid_start   INTEGER,
        cgroup_dir  TEXT,
        gpus        TEXT NOT NULL DEFAULT 'null',
        env_keys    TEXT NOT NULL DEFAULT '[]',
        started_at  TEXT NOT NULL,
        ended_at    TEXT,
        exit        TEXT,
        end_reason  TEXT
      );
      CREATE INDEX runs_by_service ON runs(service_id, started_at);
    `,
  },
  {
    id: "2026-11-21-04-domains",
    sql: `
      CREATE TABLE domains (
        domain      TEXT NOT NULL,
        path_prefix TEXT NOT NULL DEFAULT '/',
        service_id  TEXT NOT NULL,
        created_at  TEXT NOT NULL,
        PRIMARY KEY (domain, path_prefix)
      );
      CREATE INDEX domains_by_service ON domains(service_id);
    `,
  },
  {
    // The last restore into each database service, shown as Diagnosis' last_dump.
    id: "2026-11-22-01-database-dumps",
    sql: `
      CREATE TABLE database_dumps (
        service_id  TEXT PRIMARY KEY REFERENCES services(id) ON DELETE CASCADE,
        record      TEXT NOT NULL,
        updated_at  TEXT NOT NULL
      );
    `,
  },
  {
    // The OS user a service's workload runs as ({name, uid, gid}, JSON; null until its first
    // launch as root), so a relaunch needs no lookup and a remade user gets the same uid.
    id: "2026-11-23-01-service-run-as",
    sql: `ALTER TABLE services ADD COLUMN run_as TEXT;`,
  },
  {
    // A placement pass reads the pending services only (listPendingServices): without an index
    // each pass scanned every row, settled batch jobs included, quadratic under a flood of jobs.
    id: "2026-11-28-01-services-pending",
    sql: `CREATE INDEX services_pending ON services(created_at, name) WHERE status = 'pending' AND desired_state = 'running';`,
  },
];
