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
];
