import { Database } from "bun:sqlite";
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { VcsTokenStore } from "../../../src/engine/link";
import { openStore } from "../../../src/engine/store";
import { systemClock } from "../../../src/lib/clock";
import { loadSecretKey } from "../../../src/lib/files";
import { eventually, startTestEngine, type TestEngine } from "../../helpers";

let engine: TestEngine;
beforeAll(async () => {
  engine = await startTestEngine();
});
afterAll(() => engine.close());

const SECRET = "ghs_TopSecretInstallationToken0042";
const hour = 3600_000;

function push(overrides: Record<string, unknown> = {}) {
  return engine.json<Record<string, unknown>>("PUT", "/api/link/vcs-token", {
    body: {
      installation_id: 99,
      token: SECRET,
      issued_at: new Date().toISOString(),
      expires_at: new Date(Date.now() + hour).toISOString(),
      repos: ["acme/api", "acme/ml"],
      ...overrides,
    },
  });
}

describe("vcs-token push", () => {
  test("answers applied, installation_id, expires_at and repos_count, never the token", async () => {
    const { status, body } = await push();
    expect(status).toBe(200);
    expect(Object.keys(body).sort()).toEqual(["applied", "expires_at", "installation_id", "repos_count"]);
    expect(body).toMatchObject({ applied: true, installation_id: 99, repos_count: 2 });
    expect(JSON.stringify(body)).not.toContain(SECRET);
  });

  test("the token is encrypted at rest and never logged", async () => {
    await push();
    const db = new Database(join(engine.dataDir, "engine.db"), { readonly: true });
    try {
      const rows = JSON.stringify(db.query("SELECT * FROM vcs_tokens").all());
      expect(rows).not.toContain(SECRET);
      expect(rows).toContain('"sealed_token":"v1.');
    } finally {
      db.close();
    }
    expect(readFileSync(join(engine.dataDir, "engine.db-wal")).includes(SECRET)).toBe(false);
    await eventually(() => readFileSync(join(engine.dataDir, "engine.log"), "utf8").includes("vcs token pushed"));
    expect(readFileSync(join(engine.dataDir, "engine.log"), "utf8")).not.toContain(SECRET);
    expect(statSync(join(engine.dataDir, "secret.key")).mode & 0o777).toBe(0o600);
  });

  test("builds can read it back for a covered repo only", () => {
    const db = openStore(join(engine.dataDir, "engine.db"));
    try {
      const store = new VcsTokenStore(db, loadSecretKey(engine.dataDir), systemClock);
      expect(store.credentialFor("acme/api")?.token).toBe(SECRET);
      expect(store.credentialFor("other/repo")).toBeUndefined();
    } finally {
      db.close();
    }
  });

  test("a stale push (older issued_at) or an expired token is not applied", async () => {
    const older = await push({ issued_at: new Date(Date.now() - 10 * 60_000).toISOString(), token: "ghs_older" });
    expect(older.body.applied).toBe(false);
    const expired = await push({
      issued_at: new Date(Date.now() - 2 * hour).toISOString(),
      expires_at: new Date(Date.now() - hour).toISOString(),
    });
    expect(expired.body.applied).toBe(false);
    const db = openStore(join(engine.dataDir, "engine.db"));
    try {
      expect(new VcsTokenStore(db, loadSecretKey(engine.dataDir), systemClock).credentialFor("acme/api")?.token).toBe(SECRET);
    } finally {
      db.close();
    }
  });
});
