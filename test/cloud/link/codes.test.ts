import { afterAll, beforeAll, expect, test } from "bun:test";
import { KEEP_EXPIRED_MS, LinkCodes, sweepLinkRows } from "../../../src/cloud/link";
import { digestSecret } from "../../../src/lib/crypto";
import { isAppError } from "../../../src/lib/errors";
import { describeEachDialect } from "../helpers";
import { type LinkTestCloud, startLinkCloud } from "./helpers";

describeEachDialect("link codes", (dialect) => {
  let link: LinkTestCloud;
  beforeAll(async () => {
    link = await startLinkCloud(dialect);
  });
  afterAll(async () => {
    await link?.cloud.close();
  });

  const mint = async (token: string, body?: unknown) => link.cloud.api("POST", "/api/link/codes", { token, body });
  const claim = (code: string, hostname = "gpu-box", extra: Record<string, unknown> = {}, address = link.source()) =>
    link.cloud.api("POST", "/api/link/claim", { body: { code, hostname, ...extra }, headers: link.from(address) });

  test("minting answers 201 with an NL- code of 160 bits and its expiry; only the digest is stored", async () => {
    const { token, accountId } = await link.cloud.signIn("mint@example.com");
    const minted = await mint(token);
    expect(minted.status).toBe(201);
    expect(minted.body.code).toMatch(/^NL-[A-Z2-7]{32}$/);
    expect(Date.parse(minted.body.expires_at) - link.clock.read()).toBe(600_000);
    const rows = await link.cloud.deps.db.sql`SELECT * FROM link_codes WHERE account_id = ${accountId}`;
    expect(rows.length).toBe(1);
    expect(rows[0].digest).toBe(digestSecret(minted.body.code));
    expect(JSON.stringify(rows)).not.toContain(minted.body.code.slice(3));
    const custom = await mint(token, { expires_in_s: 60 });
    expect(Date.parse(custom.body.expires_at) - link.clock.read()).toBe(60_000);
    const audit = JSON.stringify(await link.cloud.deps.audit.list(accountId));
    expect(audit).toContain("link_code.minted");
    expect(audit).not.toContain(minted.body.code.slice(3));
  });

  test.each([[{ expires_in_s: 59 }], [{ expires_in_s: 3601 }], [{ expires_in_s: "600" }]])("minting with %p is a 422", async (body) => {
    const { token } = await link.cloud.signIn("mint@example.com");
    expect((await mint(token, body)).status).toBe(422);
  });

  test("minting needs a session (401) and an account in good standing (403)", async () => {
    expect((await link.cloud.api("POST", "/api/link/codes")).status).toBe(401);
    const { token } = await link.cloud.signIn("suspended-minter@example.com", { standing: "suspended" });
    const refused = await mint(token);
    expect(refused.status).toBe(403);
    expect(refused.body.error.code).toBe("account_suspended");
  });

  test("a claim releases the node identity once: 200, then 409 link_code_used", async () => {
    const { token, accountId } = await link.cloud.signIn("claim@example.com");
    const { code } = (await mint(token)).body;
    const first = await claim(code, "Claimed-Box.lan", { os: "Ubuntu 24.04", version: "0.6.0" });
    expect(first.status).toBe(200);
    expect(first.body).toEqual({
      node_id: expect.stringMatching(/^node_/),
      slug: "claimed-box",
      account_id: accountId,
      node_credential: expect.stringMatching(/^enc_[A-Za-z0-9_-]{43}$/),
      cloud_url: link.cloud.deps.site.publicUrl,
      hosted_base_domain: "hosted.localhost",
    });
    expect((await link.cloud.deps.nodes.authenticate(first.body.node_credential)).id).toBe(first.body.node_id);
    const again = await claim(code);
    expect(again.status).toBe(409);
    expect(again.body.error.code).toBe("link_code_used");
    const [row] = await link.cloud.deps.db.sql`SELECT * FROM link_codes WHERE digest = ${digestSecret(code)}`;
    expect(row.node_id).toBe(first.body.node_id);
    const audit = JSON.stringify(await link.cloud.deps.audit.list(accountId));
    expect(audit).toContain("link_code.claimed");
    expect(audit).not.toContain(code.slice(3));
    expect(audit).not.toContain(first.body.node_credential);
  });

  test("pasted codes are trimmed and case-insensitive", async () => {
    const { token } = await link.cloud.signIn("claim@example.com");
    const { code } = (await mint(token)).body;
    expect((await claim(`  ${code.toLowerCase()}\n`, "paste-box")).status).toBe(200);
  });

  test.each([
    ["NL-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", 404, "link_code_not_found"],
    ["NL-", 404, "link_code_not_found"],
    // Not a link code at all is an unknown one: the contract lists no 400 on claim.
    ["AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", 404, "link_code_not_found"],
    ["PK-AAAA", 404, "link_code_not_found"],
  ])("claiming %p answers %p %p", async (code, status, errorCode) => {
    const answer = await claim(code);
    expect(answer.status).toBe(status);
    expect(answer.body.error.code).toBe(errorCode);
  });

  test("a claim without a hostname, with one too long, or with one empty once cleaned is a 422", async () => {
    expect((await link.cloud.api("POST", "/api/link/claim", { body: { code: "NL-X" }, headers: link.from(link.source()) })).status).toBe(
      422,
    );
    expect((await claim("NL-X", "h".repeat(1025))).status).toBe(422);
    const { token } = await link.cloud.signIn("claim@example.com");
    const { code } = (await mint(token)).body;
    const empty = await claim(code, "\u202e\u0007 ");
    expect(empty.status).toBe(422);
    expect(empty.body.detail[0].loc).toEqual(["body", "hostname"]);
    expect((await claim(code, "still-usable")).status).toBe(200);
  });

  test("an expired code answers 410 link_code_expired", async () => {
    const { token } = await link.cloud.signIn("claim@example.com");
    const { code } = (await mint(token, { expires_in_s: 60 })).body;
    link.clock.advance(60_001);
    const answer = await claim(code);
    expect(answer.status).toBe(410);
    expect(answer.body.error.code).toBe("link_code_expired");
  });

  test("reported strings are cleaned before they are stored", async () => {
    const { token, accountId } = await link.cloud.signIn("clean@example.com");
    const { code } = (await mint(token)).body;
    const answer = await claim(code, "evil\u202Eexe\u0007-box", { os: `Linux\u0000 6.1${"x".repeat(300)}`, version: "v\u200f1" });
    expect(answer.status).toBe(200);
    const [node] = await link.cloud.deps.nodes.list(accountId);
    expect(node).toMatchObject({ hostname: "evilexe-box", slug: "evilexe-box", version: "v1" });
    expect(node?.os).toBe(`Linux 6.1${"x".repeat(119)}`);
  });

  test("at the node limit the claim is refused (403) and rolled back: the code stays usable", async () => {
    const { token, accountId } = await link.cloud.signIn("full@example.com", { nodeLimit: 1 });
    await claim((await mint(token)).body.code, "first");
    const { code } = (await mint(token)).body;
    const refused = await claim(code, "second");
    expect(refused.status).toBe(403);
    expect(refused.body.error.code).toBe("node_limit_reached");
    // The same slug adopts the existing node instead, with the very same code.
    const adopted = await claim(code, "first");
    expect(adopted.status).toBe(200);
    expect((await link.cloud.deps.nodes.list(accountId)).length).toBe(1);
  });

  test("a code minted before its account was suspended is refused at claim (403) and stays unused", async () => {
    const { token, accountId } = await link.cloud.signIn("later-suspended@example.com");
    const { code } = (await mint(token)).body;
    await link.cloud.deps.accounts.set(accountId, { standing: "suspended" });
    const refused = await claim(code);
    expect(refused.status).toBe(403);
    expect(refused.body.error.code).toBe("account_suspended");
    const [row] = await link.cloud.deps.db.sql`SELECT consumed_at FROM link_codes WHERE digest = ${digestSecret(code)}`;
    expect(row.consumed_at).toBeNull();
  });

  test("the limits are charged first: per code (5) whatever the address, and per address (10) whatever the code", async () => {
    const { token } = await link.cloud.signIn("limits@example.com");
    const { code } = (await mint(token)).body;
    const statuses = [];
    for (let i = 0; i < 6; i++) statuses.push((await claim(code, "limit-box")).status);
    // One success, four 409s, then the code's bucket is empty: even its owner waits.
    expect(statuses).toEqual([200, 409, 409, 409, 409, 429]);
    const address = link.source();
    const bySource = [];
    for (let i = 0; i < 11; i++) bySource.push(await claim(`PK-not-a-link-code-${i}`, "x", {}, address));
    expect(bySource.slice(0, 10).map((a) => a.status)).toEqual(Array(10).fill(404));
    expect(bySource[10]?.status).toBe(429);
    expect(bySource[10]?.body.error.code).toBe("rate_limited");
    expect(Number(bySource[10]?.headers.get("retry-after"))).toBeGreaterThan(0);
  });

  test("50 concurrent claims of one code over HTTP: exactly one 200", async () => {
    const { token, accountId } = await link.cloud.signIn("race-http@example.com");
    const { code } = (await mint(token)).body;
    const answers = await Promise.all(Array.from({ length: 50 }, (_, i) => claim(code, `racer-${i}`)));
    const statuses = answers.map((a) => a.status);
    expect(statuses.filter((s) => s === 200).length).toBe(1);
    // The rest lost the compare-and-set (409) or found the code's bucket empty (429).
    expect(statuses.every((s) => s === 200 || s === 409 || s === 429)).toBe(true);
    expect((await link.cloud.deps.nodes.list(accountId)).length).toBe(1);
  });

  test("50 concurrent claims of one code in the module (no limiter in front): exactly one wins", async () => {
    const { token, accountId } = await link.cloud.signIn("race-module@example.com");
    const { code } = (await mint(token)).body;
    const codes = new LinkCodes({ ...link.cloud.deps, clock: link.clock.read });
    const outcomes = await Promise.all(
      Array.from({ length: 50 }, (_, i) =>
        codes
          .claim(code, { hostname: `racer-${i}`, os: "", version: "" }, "127.0.0.1")
          .then(() => "ok")
          .catch((error) => (isAppError(error) ? error.code : String(error))),
      ),
    );
    expect(outcomes.filter((o) => o === "ok").length).toBe(1);
    expect(outcomes.filter((o) => o === "link_code_used").length).toBe(49);
    expect((await link.cloud.deps.nodes.list(accountId)).length).toBe(1);
  });

  test("device requests and link codes are kept a day past their expiry, then deleted, and counted", async () => {
    const device = await link.requestDevice({ hostname: "swept-box" });
    const { token } = await link.cloud.signIn("sweep@example.com");
    const minted = await link.cloud.api("POST", "/api/link/codes", { token });
    expect(minted.status).toBe(201);
    const { db } = link.cloud.deps;
    const id = (device.device_code as string).split(".")[0] as string;
    const [request] = await db.sql`SELECT expires_at FROM device_requests WHERE id = ${id}`;
    const [code] = await db.sql`SELECT expires_at FROM link_codes WHERE digest = ${digestSecret(minted.body.code)}`;
    const expiries = [Number(request.expires_at), Number(code.expires_at)];
    const stillThere = async () => ({
      request: (await db.sql`SELECT id FROM device_requests WHERE id = ${id}`).length,
      code: (await db.sql`SELECT id FROM link_codes WHERE digest = ${digestSecret(minted.body.code)}`).length,
    });

    // A day after the earlier expiry, less a second: both are kept for support questions.
    await sweepLinkRows(link.cloud.deps, Math.min(...expiries) + KEEP_EXPIRED_MS - 1000);
    expect(await stillThere()).toEqual({ request: 1, code: 1 });

    const swept = await sweepLinkRows(link.cloud.deps, Math.max(...expiries) + KEEP_EXPIRED_MS + 1000);
    expect(swept.device_requests).toBeGreaterThanOrEqual(1);
    expect(swept.link_codes).toBeGreaterThanOrEqual(1);
    expect(await stillThere()).toEqual({ request: 0, code: 0 });
  });
});
