import { afterAll, beforeAll, expect, test } from "bun:test";
import { Value } from "@sinclair/typebox/value";
import { num } from "../../../src/cloud/db";
import { LinkClaimResponse } from "../../../src/contract/cloud";
import { describeEachDialect, startTestCloud, type TestCloud } from "../helpers";

describeEachDialect("enrollment with a pre-authorized link key", (dialect) => {
  let cloud: TestCloud;
  let sources = 0;
  /** nextSource gives each request its own address, so only the rate-limit tests share a source bucket. */
  const nextSource = () => {
    sources += 1;
    return `10.30.${sources >> 8}.${sources & 255}`;
  };
  const enroll = (key: string, hostname: string, source = nextSource()) =>
    cloud.api("POST", "/api/link/preauth", {
      body: { key, hostname, os: "linux", version: "0.6.0" },
      headers: { "x-forwarded-for": source },
    });
  const mint = async (token: string, body: Record<string, unknown> = {}) => {
    const answer = await cloud.api("POST", "/api/preauth-keys", { token, body });
    expect(answer.status).toBe(201);
    return answer.body as { id: string; key: string };
  };
  const usesOf = async (id: string) => {
    const [row] = await cloud.deps.db.sql`SELECT uses FROM preauth_keys WHERE id = ${id}`;
    return num(row.uses);
  };
  const inventedKey = () => `epk_${Buffer.from(crypto.getRandomValues(new Uint8Array(32))).toString("base64url")}`;

  beforeAll(async () => {
    cloud = await startTestCloud(dialect, { trustedProxies: "127.0.0.1" });
  });
  afterAll(async () => {
    await cloud?.close();
  });

  test("a key enrolls the machine and answers LinkClaimResponse, the same shape as claim and poll", async () => {
    const { token, accountId } = await cloud.signIn("enroller@example.com");
    const key = await mint(token);
    const answer = await enroll(key.key, "Lab-Box.example.lan");
    expect(answer.status).toBe(200);
    expect(Object.keys(answer.body).sort()).toEqual(Object.keys(LinkClaimResponse.properties).sort());
    expect(Value.Check(LinkClaimResponse, answer.body)).toBe(true);
    expect(answer.body).toMatchObject({
      slug: "lab-box",
      account_id: accountId,
      cloud_url: cloud.deps.site.publicUrl,
      hosted_base_domain: cloud.deps.site.hostedBaseDomain,
    });
    expect(answer.body.node_credential).toMatch(/^enc_[A-Za-z0-9_-]{43}$/);

    const [node] = await cloud.deps.nodes.list(accountId);
    expect(node).toMatchObject({ id: answer.body.node_id, hostname: "Lab-Box.example.lan", enrolledVia: "preauth_key" });
    expect((await cloud.deps.nodes.authenticate(answer.body.node_credential)).id).toBe(answer.body.node_id);
    expect(await usesOf(key.id)).toBe(1);

    const [audit] = await cloud.deps.db.sql`SELECT * FROM audit WHERE action = 'preauth_key.enrolled' AND subject = ${key.id}`;
    expect(audit.account_id).toBe(accountId);
    expect(JSON.parse(audit.details as string)).toEqual({
      key_id: key.id,
      node_id: answer.body.node_id,
      adopted: false,
      uses: 1,
      max_uses: 1,
    });
    expect(JSON.stringify(audit)).not.toContain(key.key);
    expect(JSON.stringify(audit)).not.toContain(answer.body.node_credential);
  });

  test("a key with several uses adopts a machine that links again under the same name, and each link spends a use", async () => {
    const { token } = await cloud.signIn("adopter@example.com");
    const key = await mint(token, { max_uses: 3 });
    const first = await enroll(key.key, "workstation");
    const again = await enroll(key.key, "workstation");
    expect(first.status).toBe(200);
    expect(again.status).toBe(200);
    expect(again.body.node_id).toBe(first.body.node_id);
    expect(again.body.node_credential).not.toBe(first.body.node_credential);
    expect(await usesOf(key.id)).toBe(2);
  });

  test.each([
    ["a key without the epk_ prefix", "abc"],
    ["a key of the wrong length", "epk_short"],
    ["a key of the right length with another prefix", `xpk_${"A".repeat(43)}`],
    ["a key with characters outside base64url", `epk_${"A".repeat(42)}=`],
  ])("%s is 400 invalid_request", async (_, key) => {
    const answer = await enroll(key, "malformed");
    expect(answer.status).toBe(400);
    expect(answer.body.error.code).toBe("invalid_request");
  });

  test.each([
    ["no key", { hostname: "h", os: "", version: "" }],
    ["an empty key", { key: "", hostname: "h", os: "", version: "" }],
    ["a key over 256 characters", { key: `epk_${"A".repeat(253)}`, hostname: "h", os: "", version: "" }],
    ["no hostname", { key: `epk_${"A".repeat(43)}`, os: "", version: "" }],
  ])("%s is 422 by schema", async (_, body) => {
    const answer = await cloud.api("POST", "/api/link/preauth", { body, headers: { "x-forwarded-for": nextSource() } });
    expect(answer.status).toBe(422);
  });

  test("unknown, revoked and expired keys get one answer: 404 preauth_key_invalid with the same message", async () => {
    const { token } = await cloud.signIn("invalid@example.com");
    const revoked = await mint(token, { max_uses: 5 });
    expect((await cloud.api("DELETE", `/api/preauth-keys/${revoked.id}`, { token })).status).toBe(204);
    const expired = await mint(token, { max_uses: 5 });
    await cloud.deps.db.sql`UPDATE preauth_keys SET expires_at = ${Date.now() - 1} WHERE id = ${expired.id}`;
    const answers = [await enroll(inventedKey(), "a"), await enroll(revoked.key, "b"), await enroll(expired.key, "c")];
    for (const answer of answers) {
      expect(answer.status).toBe(404);
      expect(answer.body.error.code).toBe("preauth_key_invalid");
    }
    expect(new Set(answers.map((answer) => answer.body.error.message)).size).toBe(1);
    expect(await usesOf(revoked.id)).toBe(0);
    expect(await usesOf(expired.id)).toBe(0);
  });

  test("a live key whose uses are spent is 409 preauth_key_exhausted; spent and revoked is 404", async () => {
    const { token } = await cloud.signIn("exhausted@example.com");
    const key = await mint(token);
    expect((await enroll(key.key, "first")).status).toBe(200);
    const spent = await enroll(key.key, "second");
    expect(spent.status).toBe(409);
    expect(spent.body.error.code).toBe("preauth_key_exhausted");
    expect(await usesOf(key.id)).toBe(1);
    expect((await cloud.api("DELETE", `/api/preauth-keys/${key.id}`, { token })).status).toBe(204);
    expect((await enroll(key.key, "third")).status).toBe(404);
  });

  test.each(["suspended", "closed"] as const)("a %s account's key no longer enrolls (403) and its use is not spent", async (standing) => {
    const { token, accountId } = await cloud.signIn(`later-${standing}@example.com`);
    const key = await mint(token);
    await cloud.deps.accounts.set(accountId, { standing });
    const answer = await enroll(key.key, "too-late");
    expect(answer.status).toBe(403);
    expect(answer.body.error.code).toBe("account_suspended");
    expect(await usesOf(key.id)).toBe(0);
    expect(await cloud.deps.nodes.list(accountId)).toEqual([]);
    await cloud.deps.accounts.set(accountId, { standing: "active" });
    expect((await enroll(key.key, "in-time")).status).toBe(200);
  });

  test("at the node limit the enrollment is refused (403) and the spend is rolled back with it", async () => {
    const { token, accountId } = await cloud.signIn("full@example.com", { nodeLimit: 1 });
    const key = await mint(token, { max_uses: 5 });
    expect((await enroll(key.key, "only-one")).status).toBe(200);
    const refused = await enroll(key.key, "one-too-many");
    expect(refused.status).toBe(403);
    expect(refused.body.error.code).toBe("node_limit_reached");
    expect(await usesOf(key.id)).toBe(1);
    const [audits] = await cloud.deps.db.sql`SELECT COUNT(*) AS n FROM audit WHERE action = 'preauth_key.enrolled' AND subject = ${key.id}`;
    expect(num(audits.n)).toBe(1);
    // Re-linking the machine it already has adopts it, which the limit allows.
    expect((await enroll(key.key, "only-one")).status).toBe(200);
    expect((await cloud.deps.nodes.list(accountId)).length).toBe(1);
  });

  test("revoking a key leaves the nodes it enrolled linked, with working credentials", async () => {
    const { token, accountId } = await cloud.signIn("revoked-fleet@example.com");
    const key = await mint(token, { max_uses: 10 });
    const one = await enroll(key.key, "fleet-1");
    const two = await enroll(key.key, "fleet-2");
    expect((await cloud.api("DELETE", `/api/preauth-keys/${key.id}`, { token })).status).toBe(204);
    const nodes = await cloud.deps.nodes.list(accountId);
    expect(nodes.map((node) => node.id).sort()).toEqual([one.body.node_id, two.body.node_id].sort());
    expect((await cloud.deps.nodes.authenticate(one.body.node_credential)).id).toBe(one.body.node_id);
    expect((await cloud.deps.nodes.authenticate(two.body.node_credential)).id).toBe(two.body.node_id);
    expect((await enroll(key.key, "fleet-3")).status).toBe(404);
  });

  test("a single-use key stays spent after its node is deleted (headscale#158)", async () => {
    const { token, accountId } = await cloud.signIn("deleted-node@example.com");
    const key = await mint(token);
    const first = await enroll(key.key, "ephemeral");
    expect(first.status).toBe(200);
    expect(await cloud.deps.nodes.remove(accountId, first.body.node_id)).toBe(true);
    expect(await cloud.deps.nodes.list(accountId)).toEqual([]);
    for (const hostname of ["ephemeral", "another"]) {
      const again = await enroll(key.key, hostname);
      expect(again.status).toBe(409);
      expect(again.body.error.code).toBe("preauth_key_exhausted");
    }
    const listed = await cloud.api("GET", "/api/preauth-keys", { token });
    expect(listed.body.keys[0]).toMatchObject({ id: key.id, uses: 1, max_uses: 1 });
  });

  test("twenty concurrent enrollments with a three-use key yield exactly three nodes", async () => {
    const { token, accountId } = await cloud.signIn("race@example.com", { nodeLimit: 50 });
    const key = await mint(token, { max_uses: 3 });
    const answers = await Promise.all(Array.from({ length: 20 }, (_, i) => enroll(key.key, `racer-${i}`)));
    const statuses = answers.map((answer) => answer.status);
    expect(statuses.filter((status) => status === 200).length).toBe(3);
    expect(statuses.filter((status) => status === 409).length).toBe(17);
    expect((await cloud.deps.nodes.list(accountId)).length).toBe(3);
    expect(await usesOf(key.id)).toBe(3);
    const [audits] = await cloud.deps.db.sql`SELECT COUNT(*) AS n FROM audit WHERE action = 'preauth_key.enrolled' AND subject = ${key.id}`;
    expect(num(audits.n)).toBe(3);
  });

  test("the source address is charged first: its 21st request within the burst is 429 with Retry-After", async () => {
    const source = "192.0.2.10";
    const statuses: number[] = [];
    for (let i = 0; i < 20; i++) statuses.push((await enroll("not-a-key", `s-${i}`, source)).status);
    expect(new Set(statuses)).toEqual(new Set([400]));
    const limited = await enroll(inventedKey(), "s-limited", source);
    expect(limited.status).toBe(429);
    expect(limited.body.error.code).toBe("rate_limited");
    expect(Number(limited.headers.get("retry-after"))).toBeGreaterThan(0);
  });

  test("one key is limited across sources: its 21st try within the burst is 429, whatever the address", async () => {
    const key = inventedKey();
    const statuses: number[] = [];
    for (let i = 0; i < 20; i++) statuses.push((await enroll(key, `k-${i}`)).status);
    expect(new Set(statuses)).toEqual(new Set([404]));
    const limited = await enroll(key, "k-limited");
    expect(limited.status).toBe(429);
    // Another key from a fresh address is unaffected.
    expect((await enroll(inventedKey(), "k-other")).status).toBe(404);
  });
});
