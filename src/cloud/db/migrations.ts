/** Dialect is the database a statement is written for: the embedded SQLite file or PostgreSQL. */
export type Dialect = "sqlite" | "postgres";

/**
 * Migration is one append-only step of the console's schema, with a dated id. Never edit or
 * reorder one that has shipped: add another. `statements` returns the same portable SQL for
 * both dialects except where a type name differs.
 */
export interface Migration {
  id: string;
  statements(dialect: Dialect): string[];
}

export const MIGRATIONS: Migration[] = [
  {
    id: "2026-11-21-01-console",
    statements: () => [
      // Accounts own nodes, keys and (later) one hosted allocation. `standing` is asserted
      // before a key is minted or a device approved; `remote_link` gates assistant flows.
      `CREATE TABLE accounts (
        id TEXT PRIMARY KEY,
        email TEXT NOT NULL UNIQUE,
        name TEXT NOT NULL DEFAULT '',
        standing TEXT NOT NULL DEFAULT 'active',
        remote_link INTEGER NOT NULL DEFAULT 0,
        paid INTEGER NOT NULL DEFAULT 0,
        node_limit INTEGER NOT NULL DEFAULT 5,
        trials_left INTEGER NOT NULL DEFAULT 1,
        idp_issuer TEXT,
        idp_subject TEXT,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL
      )`,
      "CREATE UNIQUE INDEX accounts_identity ON accounts (idp_issuer, idp_subject)",
      // Sessions keep only the SHA-256 of the token (Lucia's pattern).
      `CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        digest TEXT NOT NULL UNIQUE,
        account_id TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
        kind TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        last_seen_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL,
        absolute_expires_at BIGINT NOT NULL,
        user_agent TEXT NOT NULL DEFAULT '',
        source TEXT NOT NULL DEFAULT ''
      )`,
      "CREATE INDEX sessions_account ON sessions (account_id)",
      // A sign-in in progress: the state's digest, the digest of the browser binding cookie,
      // the nonce, and the PKCE verifier sealed (it is used again at the callback).
      `CREATE TABLE login_attempts (
        id TEXT PRIMARY KEY,
        state_digest TEXT NOT NULL UNIQUE,
        binding_digest TEXT NOT NULL,
        nonce TEXT NOT NULL,
        verifier_sealed TEXT NOT NULL,
        provider TEXT,
        return_to TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL,
        consumed_at BIGINT
      )`,
      // Nodes: a slug unique per account; the node's credential is kept as a digest only.
      `CREATE TABLE nodes (
        id TEXT PRIMARY KEY,
        account_id TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
        slug TEXT NOT NULL,
        hostname TEXT NOT NULL,
        os TEXT NOT NULL DEFAULT '',
        version TEXT NOT NULL DEFAULT '',
        credential_digest TEXT,
        enrolled_via TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL,
        last_seen_at BIGINT
      )`,
      "CREATE UNIQUE INDEX nodes_account_slug ON nodes (account_id, slug)",
      "CREATE UNIQUE INDEX nodes_credential ON nodes (credential_digest)",
      // Link codes (NL-...): single use, short-lived.
      `CREATE TABLE link_codes (
        id TEXT PRIMARY KEY,
        digest TEXT NOT NULL UNIQUE,
        account_id TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL,
        consumed_at BIGINT,
        node_id TEXT
      )`,
      // Device link requests (RFC 8628): digests of both plaintexts; the three reported strings;
      // the source address; the user code's attempt budget; no account until approved.
      `CREATE TABLE device_requests (
        id TEXT PRIMARY KEY,
        device_code_digest TEXT NOT NULL UNIQUE,
        user_code_digest TEXT NOT NULL UNIQUE,
        hostname TEXT NOT NULL,
        os TEXT NOT NULL,
        version TEXT NOT NULL,
        source TEXT NOT NULL,
        state TEXT NOT NULL,
        attempts_left INTEGER NOT NULL,
        interval_s INTEGER NOT NULL,
        account_id TEXT REFERENCES accounts(id) ON DELETE CASCADE,
        node_id TEXT,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL,
        decided_at BIGINT,
        consumed_at BIGINT
      )`,
      "CREATE INDEX device_requests_expiry ON device_requests (expires_at)",
      // Pre-authorized link keys: uuid ids, digests only; uses counted even after a node is deleted.
      `CREATE TABLE preauth_keys (
        id TEXT PRIMARY KEY,
        account_id TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
        digest TEXT NOT NULL UNIQUE,
        description TEXT NOT NULL DEFAULT '',
        max_uses INTEGER NOT NULL,
        uses INTEGER NOT NULL DEFAULT 0,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL,
        revoked_at BIGINT
      )`,
      "CREATE INDEX preauth_keys_account ON preauth_keys (account_id, created_at)",
      // Audit rows: never a secret's plaintext.
      `CREATE TABLE audit (
        id TEXT PRIMARY KEY,
        account_id TEXT,
        action TEXT NOT NULL,
        subject TEXT NOT NULL DEFAULT '',
        source TEXT NOT NULL DEFAULT '',
        details TEXT NOT NULL DEFAULT '{}',
        created_at BIGINT NOT NULL
      )`,
      "CREATE INDEX audit_account ON audit (account_id, created_at)",
      // Token buckets shared by replicas (used when the limiter runs in the database).
      `CREATE TABLE rate_buckets (
        key TEXT PRIMARY KEY,
        tokens DOUBLE PRECISION NOT NULL,
        updated_at BIGINT NOT NULL
      )`,
    ],
  },
  {
    id: "2026-11-23-01-write-probe",
    // One row that GET /api/ready rewrites after a write failed for lack of space, to learn
    // whether a commit is stored again (Database.writable).
    statements: () => ["CREATE TABLE write_probe (id INTEGER PRIMARY KEY, at BIGINT NOT NULL)"],
  },
  {
    id: "2026-11-24-01-login-started-origin",
    // The origin a sign-in was started at, so a callback that comes back on another host
    // (localhost vs 127.0.0.1: no binding cookie there) can say so. Null for older rows.
    statements: () => ["ALTER TABLE login_attempts ADD COLUMN started_origin TEXT"],
  },
  {
    id: "2026-11-23-20-oauth-assistants",
    // The authorization server for assistants (src/cloud/oauth). Every secret is a SHA-256
    // digest: the pending request's rid, the authorization code, access and refresh tokens.
    statements: () => [
      // Clients that registered themselves (RFC 7591). `metadata_digest` de-duplicates a
      // repeated identical registration; unused ones are swept.
      `CREATE TABLE oauth_clients (
        id TEXT PRIMARY KEY,
        metadata_digest TEXT NOT NULL UNIQUE,
        name TEXT NOT NULL DEFAULT '',
        redirect_uris TEXT NOT NULL,
        metadata TEXT NOT NULL DEFAULT '{}',
        created_at BIGINT NOT NULL,
        last_used_at BIGINT NOT NULL
      )`,
      // Pending authorizations: created by /oauth/authorize, read by context, decided once.
      `CREATE TABLE oauth_requests (
        id TEXT PRIMARY KEY,
        rid_digest TEXT NOT NULL UNIQUE,
        client_id TEXT NOT NULL,
        client_kind TEXT NOT NULL,
        client_label TEXT NOT NULL,
        client_name TEXT NOT NULL DEFAULT '',
        redirect_uri TEXT NOT NULL,
        state TEXT,
        code_challenge TEXT NOT NULL,
        scopes TEXT NOT NULL,
        resource TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL,
        decided_at BIGINT,
        decision TEXT,
        account_id TEXT
      )`,
      "CREATE INDEX oauth_requests_expiry ON oauth_requests (expires_at)",
      // A grant is one consent: the account, the client, the scopes and nodes the person chose,
      // and its single-use code (digest, PKCE challenge, redirect). Revoking it ends every token.
      `CREATE TABLE oauth_grants (
        id TEXT PRIMARY KEY,
        account_id TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
        client_id TEXT NOT NULL,
        client_label TEXT NOT NULL,
        redirect_uri TEXT NOT NULL,
        scopes TEXT NOT NULL,
        node_ids TEXT,
        resource TEXT NOT NULL,
        code_digest TEXT NOT NULL UNIQUE,
        code_challenge TEXT NOT NULL,
        code_expires_at BIGINT NOT NULL,
        code_used_at BIGINT,
        created_at BIGINT NOT NULL,
        last_used_at BIGINT,
        revoked_at BIGINT,
        revoked_reason TEXT
      )`,
      "CREATE INDEX oauth_grants_account ON oauth_grants (account_id, created_at)",
      // Access and refresh tokens of a grant. A refresh token's `parent_id` is the one it was
      // rotated from; `used_at` is when it was itself rotated (the reuse policy reads both).
      `CREATE TABLE oauth_tokens (
        id TEXT PRIMARY KEY,
        digest TEXT NOT NULL UNIQUE,
        kind TEXT NOT NULL,
        grant_id TEXT NOT NULL REFERENCES oauth_grants(id) ON DELETE CASCADE,
        client_id TEXT NOT NULL,
        scopes TEXT NOT NULL,
        resource TEXT NOT NULL,
        parent_id TEXT,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL,
        used_at BIGINT,
        revoked_at BIGINT
      )`,
      "CREATE INDEX oauth_tokens_grant ON oauth_tokens (grant_id)",
      "CREATE INDEX oauth_tokens_expiry ON oauth_tokens (expires_at)",
    ],
  },
  {
    id: "2026-11-30-01-relay-nodes",
    // What a linked engine reports over its tunnel (the relay): its GPUs, and its MCP tools as
    // its own server lists them (JSON), so the console's /mcp can list them while it is offline.
    // Null until the node first connects.
    statements: () => ["ALTER TABLE nodes ADD COLUMN gpus TEXT", "ALTER TABLE nodes ADD COLUMN mcp_tools TEXT"],
  },
  {
    id: "2026-12-01-01-managed",
    // Hosted machines (src/cloud/managed). Purchase and billing state is derived from these
    // rows, never stored as a state: a purchase request, invoices, seats, and the operator's
    // places. An allocation is one box at the provider; at most one is current per account.
    statements: () => [
      `CREATE TABLE managed_allocations (
        id TEXT PRIMARY KEY,
        account_id TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
        kind TEXT NOT NULL,
        status TEXT NOT NULL,
        power TEXT NOT NULL DEFAULT 'none',
        sandbox_id TEXT,
        node_id TEXT,
        box_version TEXT NOT NULL,
        template_version TEXT NOT NULL,
        restore_from TEXT,
        sleep_after_ms BIGINT NOT NULL DEFAULT 0,
        expires_at BIGINT,
        ready_at BIGINT,
        last_activity_at BIGINT,
        start_started_at BIGINT,
        start_window_at BIGINT,
        starts_in_window INTEGER NOT NULL DEFAULT 0,
        update_state TEXT,
        update_target TEXT,
        update_from TEXT,
        update_requested_at BIGINT,
        update_error TEXT,
        backing_up_since BIGINT,
        final_backup_tried INTEGER NOT NULL DEFAULT 0,
        operation TEXT,
        operation_started_at BIGINT,
        attempts INTEGER NOT NULL DEFAULT 0,
        error TEXT,
        lease_owner TEXT,
        lease_until BIGINT,
        next_check_at BIGINT NOT NULL,
        delete_requested_at BIGINT,
        deleted_at BIGINT,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL
      )`,
      // At most one current allocation per account: a deleted one, and a failed one with no
      // sandbox (replaced by the next POST), no longer count.
      `CREATE UNIQUE INDEX managed_allocations_current ON managed_allocations (account_id)
        WHERE status IN ('provisioning', 'ready', 'deleting') OR (status = 'failed' AND sandbox_id IS NOT NULL)`,
      "CREATE INDEX managed_allocations_account ON managed_allocations (account_id, created_at)",
      "CREATE INDEX managed_allocations_due ON managed_allocations (status, next_check_at)",
      `CREATE TABLE managed_backups (
        id TEXT PRIMARY KEY,
        allocation_id TEXT NOT NULL REFERENCES managed_allocations(id) ON DELETE CASCADE,
        account_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        state TEXT NOT NULL,
        size_bytes BIGINT NOT NULL DEFAULT 0,
        started_at BIGINT NOT NULL,
        taken_at BIGINT,
        expires_at BIGINT,
        forgotten_at BIGINT,
        error TEXT
      )`,
      "CREATE INDEX managed_backups_allocation ON managed_backups (allocation_id, started_at)",
      `CREATE TABLE managed_purchase_requests (
        id TEXT PRIMARY KEY,
        account_id TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
        requested_at BIGINT NOT NULL,
        closed_at BIGINT
      )`,
      "CREATE UNIQUE INDEX managed_purchase_requests_open ON managed_purchase_requests (account_id) WHERE closed_at IS NULL",
      `CREATE TABLE managed_invoices (
        id TEXT PRIMARY KEY,
        account_id TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
        state TEXT NOT NULL,
        amount TEXT NOT NULL DEFAULT '',
        note TEXT NOT NULL DEFAULT '',
        created_at BIGINT NOT NULL,
        decided_at BIGINT
      )`,
      "CREATE INDEX managed_invoices_account ON managed_invoices (account_id, created_at)",
      `CREATE TABLE managed_seats (
        id TEXT PRIMARY KEY,
        account_id TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
        invoice_id TEXT,
        granted_at BIGINT NOT NULL,
        released_at BIGINT
      )`,
      "CREATE UNIQUE INDEX managed_seats_held ON managed_seats (account_id) WHERE released_at IS NULL",
      "CREATE TABLE managed_places (kind TEXT PRIMARY KEY, places INTEGER NOT NULL, updated_at BIGINT NOT NULL)",
    ],
  },
];
