import type { Database } from "bun:sqlite";
import type { VcsTokenPush } from "../../contract/engine";
import { type Clock, iso } from "../../lib/clock";
import { SecretBox } from "../../lib/crypto";
import { InputError } from "../../lib/validation";

/** VcsCredential is a usable code-host token, for builds. */
export interface VcsCredential {
  installationId: number;
  token: string;
  expiresAt: string;
  repos: string[];
}

export interface PushOutcome {
  applied: boolean;
  installation_id: number;
  expires_at: string;
  repos_count: number;
}

/**
 * VcsTokenStore keeps the code-host installation token the cloud link pushes. The token is
 * encrypted at rest (AES-256-GCM, key in `<data-dir>/secret.key`) because builds must use it
 * again; it is never returned by the API nor logged.
 */
export class VcsTokenStore {
  readonly #db: Database;
  readonly #box: SecretBox;
  readonly #clock: Clock;

  constructor(db: Database, key: Buffer, clock: Clock) {
    this.#db = db;
    this.#box = new SecretBox(key);
    this.#clock = clock;
  }

  /**
   * push stores a token unless it is stale: a push whose `issued_at` is older than the stored
   * one for the same installation, or whose `expires_at` has passed, is not applied.
   */
  push(input: VcsTokenPush): PushOutcome {
    const issuedAt = Date.parse(input.issued_at);
    const expiresAt = Date.parse(input.expires_at);
    if (expiresAt <= issuedAt) {
      throw new InputError([
        { loc: ["body", "expires_at"], msg: "expires_at must be later than issued_at", type: "value_error", input: input.expires_at },
      ]);
    }
    const outcome = { installation_id: input.installation_id, expires_at: iso(new Date(expiresAt)), repos_count: input.repos.length };
    if (expiresAt <= this.#clock.now().getTime()) return { applied: false, ...outcome };
    const write = this.#db.transaction(() => {
      const current = this.#db
        .query<{ issued_at: string }, [number]>("SELECT issued_at FROM vcs_tokens WHERE installation_id = ?")
        .get(input.installation_id);
      if (current && Date.parse(current.issued_at) > issuedAt) return false;
      this.#db
        .query(
          `INSERT INTO vcs_tokens (installation_id, sealed_token, issued_at, expires_at, repos, updated_at)
           VALUES (?, ?, ?, ?, ?, ?)
           ON CONFLICT (installation_id) DO UPDATE SET sealed_token = excluded.sealed_token, issued_at = excluded.issued_at,
             expires_at = excluded.expires_at, repos = excluded.repos, updated_at = excluded.updated_at`,
        )
        .run(
          input.installation_id,
          this.#box.seal(input.token, String(input.installation_id)),
          iso(new Date(issuedAt)),
          outcome.expires_at,
          JSON.stringify(input.repos),
          iso(this.#clock.now()),
        );
      return true;
    });
    return { applied: write.immediate(), ...outcome };
  }

  /** credentialFor returns the newest unexpired token whose installation covers `repo`, for a build. */
  credentialFor(repo: string): VcsCredential | undefined {
    const rows = this.#db
      .query<{ installation_id: number; sealed_token: string; expires_at: string; repos: string }, [string]>(
        "SELECT * FROM vcs_tokens WHERE expires_at > ? ORDER BY issued_at DESC",
      )
      .all(iso(this.#clock.now()));
    for (const row of rows) {
      const repos = JSON.parse(row.repos) as string[];
      if (!repos.includes(repo)) continue;
      return {
        installationId: row.installation_id,
        token: this.#box.open(row.sealed_token, String(row.installation_id)),
        expiresAt: row.expires_at,
        repos,
      };
    }
    return undefined;
  }
}
