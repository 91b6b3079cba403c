import { afterAll, beforeAll, expect, test } from "bun:test";
import { num } from "../../../src/cloud/db";
import { PREAUTH_KEY_BOUNDS } from "../../../src/cloud/keys";
import { digestSecret } from "../../../src/lib/crypto";
import { describeEachDialect, startTestCloud, type TestCloud } from "../helpers";

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
const KEY_VIEW_FIELDS = ["created_at", "description", "expired", "expires_at", "id", "max_uses", "revoked", "uses"];

describeEachDialect("pre-authorized link keys: mint, list, revoke", (dialect) => {
  let cloud: TestCloud;
  let sources = 0;
  /** nextSource gives each enrollment its own address, so the per-source bucket of one test never starves another. */
  const nextSource = () => {
    sources += 1;
    return `10.20.${sources >> 8}.${sources & 255}`;
  };
  const mint = (token: string, body: Record<string, unknown> = {}) => cloud.api("POST", "/api/preauth-keys", { token, body });
  const list = (token: string) => cloud.api("GET", "/api/preauth-keys", { token });
  const revoke = (token: string, id: string) => cloud.api("DELETE", `/api/preauth-keys/${id}`, { token });
  const enroll = (key: string, hostname: string) =>
    cloud.api("POST", "/api/link/preauth", {
      body: { key, hostname, os: "linux", version: "0.6.0" },
      headers: { "x-forwarded-for": nextSource() },
    });
  const auditCount = async (action: string, subject: string) => {
    const [row] = await cloud.deps.db.sql`SELECT COUNT(*) AS n FROM audit WHERE action = ${action} AND subject = ${subject}`;
    return num(row.n);
  };

  beforeAll(async () => {
    cloud = await startTestCloud(dialect, { trustedProxies: "127.0.0.1" });
  });
  afterAll(async () => {
    await cloud?.close();
  });

  test("every key route answers 401 without a session", async () => {
    expect((await cloud.api("POST", "/api/preauth-keys", { body: {} })).status).toBe(401);
    expect((await cloud.api("GET", "/api/preauth-keys")).status).toBe(401);
    expect((await cloud.api("DELETE", `/api/preauth-keys/${crypto.randomUUID()}`)).status).toBe(401);
    const bad = await cloud.api("GET", "/api/preauth-keys", { token: "ecs_invented" });
    expect(bad.status).toBe(401);
    expect(bad.body.error.code).toBe("invalid_session");
  });

  test("mint answers 201 with a uuid, an epk_ key shown once, a 24 h lifetime and one use by default", async () => {
    const { token, accountId } = await cloud.signIn("mint@example.com");
    const before = Date.now();
    const minted = await mint(token);
    const after = Date.now();
    expect(minted.status).toBe(201);
    expect(Object.keys(minted.body).sort()).toEqual(["expires_at", "id", "key", "max_uses"]);
    expect(minted.body.id).toMatch(UUID);
    expect(minted.body.key).toMatch(/^epk_[A-Za-z0-9_-]{43}$/);
    expect(minted.body.max_uses).toBe(1);
    const expiresAt = Date.parse(minted.body.expires_at);
    expect(expiresAt).toBeGreaterThanOrEqual(before + 86_400_000);
    expect(expiresAt).toBeLessThanOrEqual(after + 86_400_000 + 5);

    // Only the digest is stored; no column holds the key.
    const [row] = await cloud.deps.db.sql`SELECT * FROM preauth_keys WHERE id = ${minted.body.id}`;
    expect(row.account_id).toBe(accountId);
    expect(row.digest).toBe(digestSecret(minted.body.key));
    expect(JSON.stringify(row, (_, v) => (typeof v === "bigint" ? String(v) : v))).not.toContain(minted.body.key);

    // The audit row names the key by id, with its fan-out and expiry, and never holds the key.
    const [audit] = await cloud.deps.db.sql`SELECT * FROM audit WHERE action = 'preauth_key.minted' AND subject = ${minted.body.id}`;
    expect(audit.account_id).toBe(accountId);
    expect(JSON.parse(audit.details as string)).toEqual({ key_id: minted.body.id, max_uses: 1, expires_at: minted.body.expires_at });
    expect(JSON.stringify(audit)).not.toContain(minted.body.key);
  });

  test("mint takes a lifetime, a fan-out and a description cleaned of control characters", async () => {
    const { token } = await cloud.signIn("choose@example.com");
    const before = Date.now();
    const minted = await mint(token, { expires_in_s: 3600, max_uses: 7, description: "  rack\u0007 A\u202e \u001b[31mgpu\n " });
    expect(minted.status).toBe(201);
    expect(minted.body.max_uses).toBe(7);
    expect(Date.parse(minted.body.expires_at) - before).toBeGreaterThanOrEqual(3_600_000);
    expect(Date.parse(minted.body.expires_at) - before).toBeLessThan(3_600_000 + 60_000);
    const listed = await list(token);
    expect(listed.body.keys[0]).toMatchObject({ id: minted.body.id, description: "rack A [31mgpu", max_uses: 7, uses: 0 });
    // The bounds themselves are accepted.
    expect((await mint(token, { expires_in_s: 60, max_uses: 1000, description: "x".repeat(200) })).status).toBe(201);
    expect((await mint(token, { expires_in_s: 90 * 86_400 })).status).toBe(201);
  });

  test.each([
    ["a lifetime under a minute", { expires_in_s: 59 }, "expires_in_s"],
    ["a lifetime over 90 days", { expires_in_s: 90 * 86_400 + 1 }, "expires_in_s"],
    ["a fractional lifetime", { expires_in_s: 120.5 }, "expires_in_s"],
    ["no uses", { max_uses: 0 }, "max_uses"],
    ["more than 1000 uses", { max_uses: 1001 }, "max_uses"],
    ["a description over 200 characters", { description: "x".repeat(201) }, "description"],
    ["a description that is not text", { description: 5 }, "description"],
  ])("mint refuses %s by schema (422)", async (_, body, field) => {
    const { token, accountId } = await cloud.signIn("bounds@example.com");
    const answer = await mint(token, body);
    expect(answer.status).toBe(422);
    expect(answer.body.detail[0].loc).toEqual(["body", field]);
    const [row] = await cloud.deps.db.sql`SELECT COUNT(*) AS n FROM preauth_keys WHERE account_id = ${accountId}`;
    expect(num(row.n)).toBe(0);
  });

  test("a body that is not an object is 422", async () => {
    const { token } = await cloud.signIn("bounds@example.com");
    expect((await cloud.api("POST", "/api/preauth-keys", { token, body: [] })).status).toBe(422);
  });

  test.each(["suspended", "closed"] as const)("a %s account may not mint (403), and nothing is written", async (standing) => {
    const { token, accountId } = await cloud.signIn(`${standing}-minter@example.com`, { standing });
    const answer = await mint(token);
    expect(answer.status).toBe(403);
    expect(answer.body.error.code).toBe("account_suspended");
    const [keys] = await cloud.deps.db.sql`SELECT COUNT(*) AS n FROM preauth_keys WHERE account_id = ${accountId}`;
    const [audits] = await cloud.deps.db.sql`SELECT COUNT(*) AS n FROM audit WHERE account_id = ${accountId}`;
    expect(num(keys.n)).toBe(0);
    expect(num(audits.n)).toBe(0);
  });

  test("an account holds at most 100 keys that can still enroll; revoked, expired and spent keys do not count (409)", async () => {
    const { token } = await cloud.signIn("cap@example.com");
    const ids: string[] = [];
    for (let i = 0; i < PREAUTH_KEY_BOUNDS.maxActivePerAccount; i++) {
      const answer = await mint(token, { description: `key ${i}` });
      expect(answer.status).toBe(201);
      ids.push(answer.body.id);
    }
    const refused = await mint(token);
    expect(refused.status).toBe(409);
    expect(refused.body.error.code).toBe("preauth_key_limit_reached");

    expect((await revoke(token, ids[0] as string)).status).toBe(204);
    const afterRevoke = await mint(token);
    expect(afterRevoke.status).toBe(201);
    expect((await mint(token)).status).toBe(409);

    await cloud.deps.db.sql`UPDATE preauth_keys SET expires_at = ${Date.now() - 1000} WHERE id = ${ids[1] as string}`;
    expect((await mint(token)).status).toBe(201);
    expect((await mint(token)).status).toBe(409);

    // A spent key no longer counts either.
    expect((await enroll(afterRevoke.body.key, "cap-host")).status).toBe(200);
    expect((await mint(token)).status).toBe(201);
    expect((await mint(token)).status).toBe(409);
  });

  test("the cap holds under concurrent mints", async () => {
    const { token, accountId } = await cloud.signIn("cap-race@example.com");
    const now = Date.now();
    for (let i = 0; i < PREAUTH_KEY_BOUNDS.maxActivePerAccount - 2; i++) {
      await cloud.deps.db.sql`INSERT INTO preauth_keys (id, account_id, digest, max_uses, uses, created_at, expires_at)
        VALUES (${crypto.randomUUID()}, ${accountId}, ${digestSecret(`filler-${i}`)}, 1, 0, ${now}, ${now + 3_600_000})`;
    }
    const answers = await Promise.all(Array.from({ length: 6 }, () => mint(token)));
    expect(answers.map((answer) => answer.status).sort()).toEqual([201, 201, 409, 409, 409, 409]);
  });

  test("list shows only the caller's keys, newest first, revoked and expired included, with their flags and never the key", async () => {
    const { token } = await cloud.signIn("lister@example.com");
    const other = await cloud.signIn("someone-else@example.com");
    const othersKey = await mint(other.token, { description: "not yours" });
    const oldest = await mint(token, { description: "oldest", max_uses: 2 });
    const middle = await mint(token, { description: "middle" });
    const newest = await mint(token, { description: "newest" });
    expect((await revoke(token, middle.body.id)).status).toBe(204);
    // Expired by moving the expiry into the past, rather than by waiting.
    await cloud.deps.db.sql`UPDATE preauth_keys SET expires_at = ${Date.now() - 1} WHERE id = ${newest.body.id}`;
    expect((await enroll(oldest.body.key, "lister-box")).status).toBe(200);

    const listed = await list(token);
    expect(listed.status).toBe(200);
    expect(listed.body.keys.map((key: { id: string }) => key.id)).toEqual([newest.body.id, middle.body.id, oldest.body.id]);
    for (const key of listed.body.keys) expect(Object.keys(key).sort()).toEqual(KEY_VIEW_FIELDS);
    const [first, second, third] = listed.body.keys;
    expect(first).toMatchObject({ description: "newest", revoked: false, expired: true, uses: 0, max_uses: 1 });
    expect(second).toMatchObject({ description: "middle", revoked: true, expired: false, uses: 0, max_uses: 1 });
    expect(third).toMatchObject({ description: "oldest", revoked: false, expired: false, uses: 1, max_uses: 2 });
    expect(Date.parse(first.created_at)).toBeGreaterThan(Date.parse(second.created_at));
    expect(Date.parse(second.created_at)).toBeGreaterThan(Date.parse(third.created_at));

    const text = JSON.stringify(listed.body);
    for (const minted of [oldest, middle, newest, othersKey]) {
      expect(text).not.toContain(minted.body.key);
      expect(text).not.toContain(digestSecret(minted.body.key));
    }
    expect(text).not.toContain(othersKey.body.id);
  });

  test("newest first holds for keys minted in the same millisecond", async () => {
    const { token } = await cloud.signIn("burst@example.com");
    const minted = await Promise.all(Array.from({ length: 8 }, (_, i) => mint(token, { description: `burst ${i}` })));
    expect(minted.map((answer) => answer.status)).toEqual(Array(8).fill(201));
    const listed = (await list(token)).body.keys;
    const created = listed.map((key: { created_at: string }) => Date.parse(key.created_at));
    expect(new Set(created).size).toBe(8);
    expect([...created].sort((a, b) => b - a)).toEqual(created);
  });

  test("list: a suspended account still sees its keys; a closed one is refused (403)", async () => {
    const { token, accountId } = await cloud.signIn("standing-lister@example.com");
    const minted = await mint(token);
    await cloud.deps.accounts.set(accountId, { standing: "suspended" });
    const suspended = await list(token);
    expect(suspended.status).toBe(200);
    expect(suspended.body.keys.map((key: { id: string }) => key.id)).toEqual([minted.body.id]);
    await cloud.deps.accounts.set(accountId, { standing: "closed" });
    const closed = await list(token);
    expect(closed.status).toBe(403);
    expect(closed.body.error.code).toBe("account_suspended");
  });

  test.each([
    ["the caller's live key", "own", 1],
    ["a key the caller already revoked", "revoked", 0],
    ["an unknown id", "unknown", 0],
    ["another account's key", "foreign", 0],
  ] as const)("revoke answers 204 for %s (%s) and writes %i audit row(s)", async (_, kind, audits) => {
    const { token } = await cloud.signIn(`revoker-${kind}@example.com`);
    const other = await cloud.signIn(`owner-${kind}@example.com`);
    let id: string = crypto.randomUUID();
    if (kind === "own" || kind === "revoked") id = (await mint(token)).body.id;
    if (kind === "revoked") expect((await revoke(token, id)).status).toBe(204);
    if (kind === "foreign") id = (await mint(other.token)).body.id;
    const before = await auditCount("preauth_key.revoked", id);

    // The uuid may come in upper case; it names the same key.
    const answer = await revoke(token, id.toUpperCase());
    expect(answer.status).toBe(204);
    expect(answer.body).toBeNull();
    expect((await auditCount("preauth_key.revoked", id)) - before).toBe(audits);

    if (kind === "foreign") {
      const owners = await list(other.token);
      expect(owners.body.keys[0]).toMatchObject({ id, revoked: false });
    }
    if (kind === "own") {
      const [row] = await cloud.deps.db.sql`SELECT details FROM audit WHERE action = 'preauth_key.revoked' AND subject = ${id}`;
      expect(JSON.parse(row.details as string)).toEqual({ key_id: id, uses: 0, max_uses: 1 });
    }
  });

  test("revoke with an id that is not a uuid is 422 by schema", async () => {
    const { token } = await cloud.signIn("revoker-own@example.com");
    const answer = await revoke(token, "not-a-uuid");
    expect(answer.status).toBe(422);
    expect(answer.body.detail[0].loc).toEqual(["path", "key_id"]);
  });

  test("a suspended account may still revoke; a closed one is refused (403)", async () => {
    const { token, accountId } = await cloud.signIn("standing-revoker@example.com");
    const first = await mint(token);
    const second = await mint(token);
    await cloud.deps.accounts.set(accountId, { standing: "suspended" });
    expect((await revoke(token, first.body.id)).status).toBe(204);
    expect(await auditCount("preauth_key.revoked", first.body.id)).toBe(1);
    await cloud.deps.accounts.set(accountId, { standing: "closed" });
    const closed = await revoke(token, second.body.id);
    expect(closed.status).toBe(403);
    expect(await auditCount("preauth_key.revoked", second.body.id)).toBe(0);
  });

  test("the OpenAPI document declares the key routes with their statuses", async () => {
    const doc = (await cloud.api("GET", "/api/openapi.json")).body;
    expect(Object.keys(doc.paths["/api/preauth-keys"].post.responses).sort()).toEqual(["201", "400", "401", "403", "409", "422"]);
    expect(Object.keys(doc.paths["/api/preauth-keys"].get.responses).sort()).toEqual(["200", "401", "403"]);
    expect(Object.keys(doc.paths["/api/preauth-keys/{key_id}"].delete.responses).sort()).toEqual(["204", "401", "403", "422"]);
    expect(Object.keys(doc.paths["/api/link/preauth"].post.responses).sort()).toEqual(["200", "400", "403", "404", "409", "422", "429"]);
  });
});
