import { afterAll, beforeAll, expect, test } from "bun:test";
import { num } from "../../../src/cloud/db";
import { createAccessTokenVerifier } from "../../../src/cloud/oauth";
import { digestSecret } from "../../../src/lib/crypto";
import { describeEachDialect } from "../helpers";
import { type AssistantCloud, authorized, CLAUDE, consent, startAssistantCloud } from "./helpers";

/**
 * The token and revocation endpoints and the access-token verifier, black-box over HTTP: the
 * code is single-use and bound to its PKCE verifier; a replayed code revokes what it issued;
 * `invalid_target` leaves the code usable; tokens are bound to the console's MCP URL; refresh
 * tokens rotate with the stated reuse policy; revocation checks ownership; every secret is a
 * digest in the database and absent from logs and audit rows.
 */
describeEachDialect("assistants: tokens, refresh, revocation and the verifier", (dialect) => {
  let ac: AssistantCloud;
  let session: string;
  let accountId: string;
  // The verifier reads the same manual clock as the server that issued the tokens.
  const verify = (token: string, resource = ac.mcpUrl) =>
    createAccessTokenVerifier(ac.cloud.deps, { clock: ac.clock.read })(token, resource);

  beforeAll(async () => {
    ac = await startAssistantCloud(dialect);
    const signedIn = await ac.cloud.signIn("tokens@example.com", { remoteLink: true });
    session = signedIn.token;
    accountId = signedIn.accountId;
  });
  afterAll(async () => {
    await ac?.close();
  });

  const exchange = (code: string, verifier: string, extra: Record<string, string | string[]> = {}) =>
    ac.form("/oauth/token", {
      grant_type: "authorization_code",
      code,
      code_verifier: verifier,
      client_id: CLAUDE.clientId,
      redirect_uri: CLAUDE.redirectUri,
      ...extra,
    });
  const refresh = (token: string, extra: Record<string, string> = {}) =>
    ac.form("/oauth/token", { grant_type: "refresh_token", refresh_token: token, client_id: CLAUDE.clientId, ...extra });

  test("a code and its verifier give an audience-bound access token, a refresh token and the granted scope", async () => {
    const { code, pkce } = await consent(ac, session, { ...CLAUDE, scope: "engine:operate openid email", decision: { access: "operate" } });
    const answer = await exchange(code as string, pkce.verifier, { resource: ac.mcpUrl });
    expect(answer.status).toBe(200);
    expect(answer.headers.get("cache-control")).toBe("no-store");
    expect(Object.keys(answer.json).sort()).toEqual(["access_token", "expires_in", "refresh_token", "scope", "token_type"]);
    expect(answer.json).toMatchObject({ token_type: "Bearer", expires_in: 3600, scope: "engine:read engine:operate" });
    expect(answer.json.access_token).toMatch(/^eca_[A-Za-z0-9_-]{43}$/);
    expect(answer.json.refresh_token).toMatch(/^ecr_[A-Za-z0-9_-]{43}$/);
    const verified = await verify(answer.json.access_token);
    expect(verified.ok).toBe(true);
    if (!verified.ok) return;
    expect(verified.grant).toMatchObject({
      accountId,
      clientId: CLAUDE.clientId,
      scopes: ["engine:read", "engine:operate"],
      nodeIds: null,
    });
    expect(verified.grant.expiresAt.getTime()).toBe(ac.clock.read() + 3600_000);
  });

  test("a read-only consent grants engine:read only, whatever the client asked", async () => {
    const { tokens } = await authorized(ac, session, { ...CLAUDE, scope: "engine:operate" });
    expect(tokens.scope).toBe("engine:read");
    const verified = await verify(tokens.access_token);
    expect(verified.ok && verified.grant.scopes).toEqual(["engine:read"]);
  });

  test.each<[string, (verifier: string) => Record<string, string | string[]>, string]>([
    ["no code_verifier", () => ({ code_verifier: [] }), "invalid_request"],
    ["a code_verifier of the wrong shape", () => ({ code_verifier: "short" }), "invalid_request"],
  ])("%s: invalid_request, and the code still works", async (_name, extra, error) => {
    const { code, pkce } = await consent(ac, session, CLAUDE);
    const answer = await exchange(code as string, pkce.verifier, extra(pkce.verifier));
    expect(answer.status).toBe(400);
    expect(answer.json.error).toBe(error);
    expect((await exchange(code as string, pkce.verifier)).status).toBe(200);
  });

  test("a wrong verifier is invalid_grant and spends the code", async () => {
    const { code, pkce } = await consent(ac, session, CLAUDE);
    const wrong = await exchange(code as string, `${pkce.verifier.slice(0, -1)}${pkce.verifier.endsWith("A") ? "B" : "A"}`);
    expect(wrong.status).toBe(400);
    expect(wrong.json.error).toBe("invalid_grant");
    const after = await exchange(code as string, pkce.verifier);
    expect(after.status).toBe(400);
    expect(after.json.error).toBe("invalid_grant");
  });

  test("invalid_target does not consume the code", async () => {
    const { code, pkce } = await consent(ac, session, CLAUDE);
    const foreign = await exchange(code as string, pkce.verifier, { resource: "https://other.example/mcp" });
    expect(foreign.status).toBe(400);
    expect(foreign.json.error).toBe("invalid_target");
    const [row] = await ac.cloud.deps.db.sql`SELECT code_used_at FROM oauth_grants WHERE code_digest = ${digestSecret(code as string)}`;
    expect(row.code_used_at).toBeNull();
    expect((await exchange(code as string, pkce.verifier, { resource: ac.mcpUrl })).status).toBe(200);
  });

  test("a replayed code is refused and revokes everything it issued", async () => {
    const { code, pkce, tokens } = await authorized(ac, session, CLAUDE);
    expect((await verify(tokens.access_token)).ok).toBe(true);
    const replay = await exchange(code, pkce.verifier);
    expect(replay.status).toBe(400);
    expect(replay.json.error).toBe("invalid_grant");
    expect(await verify(tokens.access_token)).toEqual({ ok: false, error: "invalid_token", description: expect.any(String) });
    expect((await refresh(tokens.refresh_token)).json.error).toBe("invalid_grant");
    const [audit] = await ac.cloud.deps.db.sql`SELECT details FROM audit WHERE action = 'assistant.revoked' ORDER BY created_at DESC`;
    expect(JSON.parse(audit.details).reason).toBe("authorization code replayed");
  });

  test.each<[string, Record<string, string | string[]>, number, string]>([
    ["another client's id", { client_id: "engine-chatgpt" }, 400, "invalid_grant"],
    ["another redirect_uri", { redirect_uri: "https://claude.com/api/mcp/auth_callback" }, 400, "invalid_grant"],
    ["no client_id", { client_id: [] }, 401, "invalid_client"],
    ["an unknown client_id", { client_id: "dcr_gone" }, 401, "invalid_client"],
  ])("a code presented with %s is refused", async (_name, extra, status, error) => {
    const { code, pkce } = await consent(ac, session, CLAUDE);
    const answer = await exchange(code as string, pkce.verifier, extra);
    expect(answer.status).toBe(status);
    expect(answer.json.error).toBe(error);
    if (status === 401) expect(answer.headers.get("www-authenticate")).toStartWith("Basic");
  });

  test("an expired code is invalid_grant", async () => {
    const { code, pkce } = await consent(ac, session, CLAUDE);
    ac.clock.advance(6 * 60_000);
    expect((await exchange(code as string, pkce.verifier)).json.error).toBe("invalid_grant");
  });

  test.each<[string, Record<string, string>, number, string]>([
    ["no grant_type", {}, 400, "invalid_request"],
    ["grant_type password", { grant_type: "password" }, 400, "unsupported_grant_type"],
    ["client_credentials", { grant_type: "client_credentials", client_id: CLAUDE.clientId }, 400, "unsupported_grant_type"],
  ])("the token endpoint refuses %s", async (_name, fields, status, error) => {
    const answer = await ac.form("/oauth/token", fields);
    expect(answer.status).toBe(status);
    expect(answer.json.error).toBe(error);
  });

  test("the token endpoint takes only a form body", async () => {
    const answer = await fetch(`${ac.cloud.url}/oauth/token`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ grant_type: "authorization_code" }),
    });
    expect(answer.status).toBe(400);
    expect((await answer.json()).error).toBe("invalid_request");
  });

  test("the client id may come in a Basic header (its secret ignored)", async () => {
    const { code, pkce } = await consent(ac, session, CLAUDE);
    const basic = `Basic ${Buffer.from(`${CLAUDE.clientId}:anything`).toString("base64")}`;
    const answer = await ac.form(
      "/oauth/token",
      { grant_type: "authorization_code", code: code as string, code_verifier: pkce.verifier, redirect_uri: CLAUDE.redirectUri },
      { authorization: basic },
    );
    expect(answer.status).toBe(200);
  });

  test("refresh tokens rotate; the previous one is accepted only until the new one is used; then reuse revokes the grant", async () => {
    const { tokens } = await authorized(ac, session, { ...CLAUDE, decision: { access: "operate" } });
    const first = tokens.refresh_token as string;
    const second = await refresh(first, { resource: ac.mcpUrl });
    expect(second.status).toBe(200);
    expect(second.json.refresh_token).not.toBe(first);
    expect(second.json.scope).toBe("engine:read engine:operate");
    expect((await verify(second.json.access_token)).ok).toBe(true);

    // The client lost that answer and presents the first token again: the unused successor is replaced.
    const retried = await refresh(first);
    expect(retried.status).toBe(200);
    expect((await refresh(second.json.refresh_token)).json.error).toBe("invalid_grant");
    expect((await verify(second.json.access_token)).ok).toBe(false);
    expect((await verify(retried.json.access_token)).ok).toBe(true);

    // The successor is used: from now on the first token is reuse, and the whole grant goes.
    const third = await refresh(retried.json.refresh_token);
    expect(third.status).toBe(200);
    const reuse = await refresh(first);
    expect(reuse.status).toBe(400);
    expect(reuse.json.error).toBe("invalid_grant");
    expect((await verify(third.json.access_token)).ok).toBe(false);
    expect((await refresh(third.json.refresh_token)).json.error).toBe("invalid_grant");
    const grants = await ac.cloud.api("GET", "/api/oauth/grants", { token: session });
    const revoked = grants.body.grants.find((grant: { revoked_reason: string | null }) => grant.revoked_reason === "refresh token reused");
    expect(revoked?.revoked).toBe(true);
  });

  test("a refresh may narrow the scope; an unknown scope alone is invalid_scope; a foreign resource is invalid_target", async () => {
    const { tokens } = await authorized(ac, session, { ...CLAUDE, decision: { access: "operate" } });
    expect((await refresh(tokens.refresh_token, { resource: "https://other.example/mcp" })).json.error).toBe("invalid_target");
    expect((await refresh(tokens.refresh_token, { scope: "email" })).json.error).toBe("invalid_scope");
    const narrowed = await refresh(tokens.refresh_token, { scope: "engine:read email" });
    expect(narrowed.status).toBe(200);
    expect(narrowed.json.scope).toBe("engine:read");
    const verified = await verify(narrowed.json.access_token);
    expect(verified.ok && verified.grant.scopes).toEqual(["engine:read"]);
    // The refresh token keeps the grant's scopes.
    expect((await refresh(narrowed.json.refresh_token)).json.scope).toBe("engine:read engine:operate");
  });

  test("a refresh token is the client's: another client, an access token, or an expired one is invalid_grant", async () => {
    const { tokens } = await authorized(ac, session, CLAUDE);
    expect((await refresh(tokens.refresh_token, { client_id: "engine-cursor" })).json.error).toBe("invalid_grant");
    expect((await refresh(tokens.access_token)).json.error).toBe("invalid_grant");
    ac.clock.advance(31 * 86_400_000);
    expect((await refresh(tokens.refresh_token)).json.error).toBe("invalid_grant");
  });

  test("the verifier refuses a wrong audience, an expired token, a refresh token and a malformed one", async () => {
    const { tokens } = await authorized(ac, session, CLAUDE);
    const wrongAudience = await verify(tokens.access_token, "https://other.example/mcp");
    expect(wrongAudience).toMatchObject({ ok: false, error: "invalid_token" });
    expect(wrongAudience.ok === false && wrongAudience.description).toContain("audience");
    expect((await verify(tokens.refresh_token)).ok).toBe(false);
    expect((await verify("eca_invented")).ok).toBe(false);
    expect((await verify("")).ok).toBe(false);
    const later = createAccessTokenVerifier(ac.cloud.deps, { clock: () => ac.clock.read() + 3601_000 });
    expect(await later(tokens.access_token, ac.mcpUrl)).toMatchObject({ ok: false, error: "invalid_token" });
    expect((await verify(tokens.access_token)).ok).toBe(true);
  });

  test("a grant revoked in the console stops its tokens at once; losing the entitlement does too", async () => {
    const { tokens } = await authorized(ac, session, CLAUDE);
    const verified = await verify(tokens.access_token);
    const { body } = await ac.cloud.api("GET", "/api/oauth/grants", { token: session });
    const grant = body.grants.find((g: { id: string }) => verified.ok && g.id === verified.grant.grantId);
    expect(grant).toMatchObject({ client_id: CLAUDE.clientId, client_label: "Claude", redirect_host: "claude.ai", revoked: false });
    // Another account cannot revoke it (204, nothing changes).
    const { token: stranger } = await ac.cloud.signIn("stranger@example.com", { remoteLink: true });
    expect((await ac.cloud.api("DELETE", `/api/oauth/grants/${grant.id}`, { token: stranger })).status).toBe(204);
    expect((await verify(tokens.access_token)).ok).toBe(true);
    expect((await ac.cloud.api("DELETE", `/api/oauth/grants/${grant.id}`, { token: session })).status).toBe(204);
    expect((await verify(tokens.access_token)).ok).toBe(false);
    expect((await refresh(tokens.refresh_token)).json.error).toBe("invalid_grant");
    expect((await ac.cloud.api("DELETE", `/api/oauth/grants/${grant.id}`, { token: session })).status).toBe(204);
    const audits = await ac.cloud.deps.db.sql`SELECT * FROM audit WHERE action = 'assistant.revoked' AND subject = ${grant.id}`;
    expect(audits).toHaveLength(1);

    const { token: other, accountId: otherAccount } = await ac.cloud.signIn("loses@example.com", { remoteLink: true });
    const second = await authorized(ac, other, CLAUDE);
    expect((await verify(second.tokens.access_token)).ok).toBe(true);
    await ac.cloud.deps.accounts.set(otherAccount, { remoteLink: false });
    expect((await verify(second.tokens.access_token)).ok).toBe(false);
  });

  test("revocation (RFC 7009): only the token's own client; an unknown token is 200; a refresh token ends the grant", async () => {
    const { tokens } = await authorized(ac, session, CLAUDE);
    const foreign = await ac.form("/oauth/revoke", { token: tokens.access_token, client_id: "engine-cursor" });
    expect(foreign.status).toBe(400);
    expect(foreign.json.error).toBe("unauthorized_client");
    expect((await verify(tokens.access_token)).ok).toBe(true);
    expect((await ac.form("/oauth/revoke", { token: "eca_unknown", client_id: CLAUDE.clientId })).status).toBe(200);
    expect((await ac.form("/oauth/revoke", { token: tokens.access_token })).status).toBe(401);

    // Revoking the access token ends it alone; the refresh token still works.
    expect((await ac.form("/oauth/revoke", { token: tokens.access_token, client_id: CLAUDE.clientId })).status).toBe(200);
    expect((await verify(tokens.access_token)).ok).toBe(false);
    const refreshed = await refresh(tokens.refresh_token);
    expect(refreshed.status).toBe(200);
    // Revoking the refresh token ends the grant and everything under it.
    const revoked = await ac.form("/oauth/revoke", {
      token: refreshed.json.refresh_token,
      token_type_hint: "refresh_token",
      client_id: CLAUDE.clientId,
    });
    expect(revoked.status).toBe(200);
    expect((await verify(refreshed.json.access_token)).ok).toBe(false);
    expect((await refresh(refreshed.json.refresh_token)).json.error).toBe("invalid_grant");
  });

  test("every secret is stored as a digest and is absent from audit rows and logs", async () => {
    const flow = await authorized(ac, session, { ...CLAUDE, decision: { access: "operate" } });
    const rotated = await refresh(flow.tokens.refresh_token);
    const secrets = [
      flow.rid,
      flow.code,
      flow.tokens.access_token,
      flow.tokens.refresh_token,
      rotated.json.access_token,
      rotated.json.refresh_token,
    ];
    const { db } = ac.cloud.deps;
    const dump = async (table: string) =>
      JSON.stringify(await db.sql.unsafe(`SELECT * FROM ${table}`), (_, v) => (typeof v === "bigint" ? String(v) : v));
    const tables = ["oauth_requests", "oauth_grants", "oauth_tokens", "oauth_clients", "audit"];
    for (const table of tables) {
      const text = await dump(table);
      for (const secret of secrets) expect({ table, leaks: text.includes(secret) }).toEqual({ table, leaks: false });
    }
    // The digests are what is kept.
    expect(num((await db.sql`SELECT COUNT(*) AS n FROM oauth_requests WHERE rid_digest = ${digestSecret(flow.rid)}`)[0].n)).toBe(1);
    expect(num((await db.sql`SELECT COUNT(*) AS n FROM oauth_grants WHERE code_digest = ${digestSecret(flow.code)}`)[0].n)).toBe(1);
    for (const token of secrets.slice(2)) {
      expect(num((await db.sql`SELECT COUNT(*) AS n FROM oauth_tokens WHERE digest = ${digestSecret(token)}`)[0].n)).toBe(1);
    }
    // A code replay and a refresh reuse are logged (warnings), without the secrets.
    await ac.form("/oauth/token", {
      grant_type: "authorization_code",
      code: flow.code,
      code_verifier: flow.pkce.verifier,
      client_id: CLAUDE.clientId,
    });
    const log = ac.logText();
    expect(log).toContain("presented twice");
    for (const secret of [...secrets, flow.pkce.verifier]) expect(log.includes(secret)).toBe(false);
  });

  test("the sweep deletes expired requests and tokens a day after, and revoked grants after 30 days", async () => {
    const { sweepAssistantRows } = await import("../../../src/cloud/oauth");
    await authorized(ac, session, CLAUDE);
    const before = num((await ac.cloud.deps.db.sql`SELECT COUNT(*) AS n FROM oauth_tokens`)[0].n);
    expect(before).toBeGreaterThan(0);
    const swept = await sweepAssistantRows(ac.cloud.deps.db, ac.clock.read() + 60 * 86_400_000);
    expect(swept.tokens).toBe(before);
    expect(num((await ac.cloud.deps.db.sql`SELECT COUNT(*) AS n FROM oauth_tokens`)[0].n)).toBe(0);
  });
});
