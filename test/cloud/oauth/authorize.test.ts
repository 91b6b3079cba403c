import { afterAll, beforeAll, expect, test } from "bun:test";
import { num } from "../../../src/cloud/db";
import { describeEachDialect } from "../helpers";
import { type AssistantCloud, CLAUDE, consent, pkce, ridOf, startAssistantCloud } from "./helpers";

/**
 * The authorization endpoint and the consent routes, black-box over HTTP: a client and its
 * redirect URI are settled before anything is sent to the redirect URI; PKCE S256 only; the
 * resource is the console's MCP URL; `iss` on every redirect; the context reads and never
 * consumes; the decision consumes once; the statuses are the contract's.
 */
describeEachDialect("assistants: the authorization endpoint and consent", (dialect) => {
  let ac: AssistantCloud;
  let entitled: string;
  let entitledAccount: string;

  beforeAll(async () => {
    ac = await startAssistantCloud(dialect);
    const signedIn = await ac.cloud.signIn("consent@example.com", { remoteLink: true });
    entitled = signedIn.token;
    entitledAccount = signedIn.accountId;
  });
  afterAll(async () => {
    await ac?.close();
  });

  /** base is a valid request from the pre-registered Claude client; tests override one thing each. */
  const base = (overrides: Record<string, string | string[]> = {}) => ({
    response_type: "code",
    client_id: CLAUDE.clientId,
    redirect_uri: CLAUDE.redirectUri,
    code_challenge: pkce().challenge,
    code_challenge_method: "S256",
    state: "xyz",
    resource: ac.mcpUrl,
    ...overrides,
  });
  const without = (name: string) => {
    const params: Record<string, string | string[]> = base();
    delete params[name];
    return params;
  };
  const context = (rid: string, token = entitled) =>
    ac.cloud.api("GET", `/api/oauth/authorize/context?rid=${encodeURIComponent(rid)}`, { token });
  const decide = (body: Record<string, unknown>, token = entitled) =>
    ac.cloud.api("POST", "/api/oauth/authorize/decision", { token, body });
  const requestCount = async () => num((await ac.cloud.deps.db.sql`SELECT COUNT(*) AS n FROM oauth_requests`)[0].n);

  test("RFC 8414 metadata: the issuer is the public URL, S256 only, public clients, metadata documents, iss in answers", async () => {
    const answer = await fetch(`${ac.cloud.url}/.well-known/oauth-authorization-server`);
    expect(answer.status).toBe(200);
    expect(answer.headers.get("access-control-allow-origin")).toBe("*");
    const metadata = await answer.json();
    const issuer = ac.cloud.deps.site.publicUrl;
    expect(metadata).toMatchObject({
      issuer,
      authorization_endpoint: `${issuer}/oauth/authorize`,
      token_endpoint: `${issuer}/oauth/token`,
      registration_endpoint: `${issuer}/oauth/register`,
      revocation_endpoint: `${issuer}/oauth/revoke`,
      code_challenge_methods_supported: ["S256"],
      token_endpoint_auth_methods_supported: ["none"],
      client_id_metadata_document_supported: true,
      authorization_response_iss_parameter_supported: true,
      scopes_supported: ["engine:read", "engine:operate"],
      response_types_supported: ["code"],
      grant_types_supported: ["authorization_code", "refresh_token"],
    });
    // The metadata URL's prefix is the issuer (RFC 8414 §3.3).
    expect(`${issuer}/.well-known/oauth-authorization-server`.startsWith(metadata.issuer)).toBe(true);
  });

  test.each<[string, () => Record<string, string | string[]>]>([
    ["an unknown client", () => base({ client_id: "no-such-client" })],
    ["an unknown self-registered client", () => base({ client_id: "dcr_nothere" })],
    ["no client_id", () => without("client_id")],
    ["a redirect URI the client did not register", () => base({ redirect_uri: "https://evil.example/callback" })],
    ["a registered redirect URI with a suffix", () => base({ redirect_uri: `${CLAUDE.redirectUri}/x` })],
    ["a registered redirect URI with a query added", () => base({ redirect_uri: `${CLAUDE.redirectUri}?next=evil` })],
    ["no redirect URI while the client registered several", () => without("redirect_uri")],
    ["two redirect URIs", () => base({ redirect_uri: [CLAUDE.redirectUri, "https://evil.example/cb"] })],
    // Even with other errors present, the page comes first: nothing goes to an unchecked URI.
    ["an unregistered redirect URI and no PKCE", () => ({ ...without("code_challenge"), redirect_uri: "https://evil.example/cb" })],
  ])("%s: an error page, never a redirect", async (_name, params) => {
    const before = await requestCount();
    const answer = await ac.authorize(params());
    expect(answer.status).toBe(400);
    expect(answer.location).toBeNull();
    expect(answer.headers.get("content-type")).toStartWith("text/html");
    expect(answer.headers.get("content-security-policy")).toContain("frame-ancestors 'none'");
    expect(answer.text).toContain("cannot be accepted");
    expect(answer.text).not.toContain("evil.example/cb?");
    expect(await requestCount()).toBe(before);
  });

  test.each<[string, () => Record<string, string | string[]>, string]>([
    ["PKCE missing", () => without("code_challenge"), "invalid_request"],
    ["PKCE method missing (plain by default)", () => without("code_challenge_method"), "invalid_request"],
    ["PKCE plain", () => base({ code_challenge_method: "plain" }), "invalid_request"],
    ["PKCE with an unknown method", () => base({ code_challenge_method: "S512" }), "invalid_request"],
    ["a challenge that is not S256's shape", () => base({ code_challenge: "short" }), "invalid_request"],
    ["response_type token", () => base({ response_type: "token" }), "unsupported_response_type"],
    ["no response_type", () => ({ ...without("response_type") }), "unsupported_response_type"],
    ["a resource that is not the console's MCP URL", () => base({ resource: "https://other.example/mcp" }), "invalid_target"],
    ["two resources, one of them foreign", () => base({ resource: ["MCP", "https://other.example/mcp"] }), "invalid_target"],
    ["a repeated code_challenge", () => base({ code_challenge: [pkce().challenge, pkce().challenge] }), "invalid_request"],
  ])("%s: an error redirect to the client with state and iss", async (_name, params, error) => {
    const raw = params();
    if (Array.isArray(raw.resource)) raw.resource = raw.resource.map((value) => (value === "MCP" ? ac.mcpUrl : value));
    const before = await requestCount();
    const answer = await ac.authorize(raw);
    expect(answer.status).toBe(302);
    const location = new URL(answer.location as string);
    expect(`${location.origin}${location.pathname}`).toBe(CLAUDE.redirectUri);
    expect(location.searchParams.get("error")).toBe(error);
    expect(location.searchParams.get("error_description")).toBeTruthy();
    expect(location.searchParams.get("state")).toBe("xyz");
    expect(location.searchParams.get("iss")).toBe(ac.cloud.deps.site.publicUrl);
    expect(location.searchParams.get("code")).toBeNull();
    expect(await requestCount()).toBe(before);
  });

  test("a valid request is stored and the browser goes to the consent page, which is a console page", async () => {
    const answer = await ac.authorize(base());
    const rid = ridOf(answer);
    expect(rid).toMatch(/^[A-Za-z0-9_-]{43}$/);
    const page = await fetch(`${ac.cloud.url}${answer.location}`);
    expect(page.status).toBe(200);
    expect(await page.text()).toContain('data-page="consent"');
    // A request without a resource is given the console's MCP URL as its audience.
    const noResource = ridOf(await ac.authorize(without("resource")));
    expect((await context(noResource)).body.resource).toBe(ac.mcpUrl);
  });

  test("the context shows who asks, where the answer goes, the scopes and the machines; it never consumes", async () => {
    const { token, accountId } = await ac.cloud.signIn("machines@example.com", { remoteLink: true });
    const node = await ac.cloud.deps.db.transaction((tx) =>
      ac.cloud.deps.nodes.enroll(tx, accountId, { hostname: "gpu-box.lan", os: "linux", version: "0.7.0" }, "link_code"),
    );
    const rid = ridOf(await ac.authorize(base({ scope: "engine:read openid email" })));
    for (let i = 0; i < 3; i++) {
      const read = await context(rid, token);
      expect(read.status).toBe(200);
      expect(read.body).toMatchObject({
        rid,
        client: { client_id: CLAUDE.clientId, kind: "registered", label: "Claude", verified: true },
        redirect_uri: CLAUDE.redirectUri,
        redirect_host: "claude.ai",
        redirect_local_only: false,
        scopes: ["engine:read"],
        access_offered: ["read"],
        resource: ac.mcpUrl,
        nodes: [{ id: node.node.id, slug: "gpu-box", hostname: "gpu-box.lan" }],
      });
    }
    const [row] = await ac.cloud.deps.db
      .sql`SELECT decided_at FROM oauth_requests WHERE client_id = ${CLAUDE.clientId} AND decided_at IS NULL`;
    expect(row).toBeDefined();
    // No grant, no code was made by reading.
    expect(num((await ac.cloud.deps.db.sql`SELECT COUNT(*) AS n FROM oauth_grants WHERE account_id = ${accountId}`)[0].n)).toBe(0);
  });

  test("approving answers the redirect with code, state and iss; the rid is consumed once (409 after)", async () => {
    const rid = ridOf(await ac.authorize(base({ state: "s-approve" })));
    const approved = await decide({ rid, approve: true, access: "operate" });
    expect(approved.status).toBe(200);
    expect(approved.body.approved).toBe(true);
    const to = new URL(approved.body.redirect_to);
    expect(`${to.origin}${to.pathname}`).toBe(CLAUDE.redirectUri);
    expect(to.searchParams.get("code")).toMatch(/^ecc_[A-Za-z0-9_-]{43}$/);
    expect(to.searchParams.get("state")).toBe("s-approve");
    expect(to.searchParams.get("iss")).toBe(ac.cloud.deps.site.publicUrl);
    const again = await decide({ rid, approve: true });
    expect(again.status).toBe(409);
    expect(again.body.error.code).toBe("already_consumed");
    expect((await decide({ rid, approve: false })).status).toBe(409);
    expect((await context(rid)).status).toBe(409);
    // The grant and its audit row: the account, the client, the scopes, never the code.
    const [grant] = await ac.cloud.deps.db.sql`SELECT * FROM oauth_grants WHERE account_id = ${entitledAccount} ORDER BY created_at DESC`;
    expect(grant.scopes).toBe("engine:read engine:operate");
    expect(grant.node_ids).toBeNull();
    const [audit] = await ac.cloud.deps.db.sql`SELECT * FROM audit WHERE action = 'assistant.authorized' AND subject = ${grant.id}`;
    expect(JSON.parse(audit.details)).toEqual({ client_id: CLAUDE.clientId, scope: "engine:read engine:operate", nodes: "all" });
    expect(JSON.stringify(audit)).not.toContain(to.searchParams.get("code") as string);
  });

  test("two decisions at once: one wins, the other is 409", async () => {
    const rid = ridOf(await ac.authorize(base()));
    const answers = await Promise.all([decide({ rid, approve: true }), decide({ rid, approve: false })]);
    expect(answers.map((a) => a.status).sort()).toEqual([200, 409]);
  });

  test("denying answers the redirect with error=access_denied, state and iss, and issues nothing", async () => {
    const rid = ridOf(await ac.authorize(base({ state: "s-deny" })));
    const denied = await decide({ rid, approve: false });
    expect(denied.status).toBe(200);
    expect(denied.body.approved).toBe(false);
    const to = new URL(denied.body.redirect_to);
    expect(to.searchParams.get("error")).toBe("access_denied");
    expect(to.searchParams.get("state")).toBe("s-deny");
    expect(to.searchParams.get("iss")).toBe(ac.cloud.deps.site.publicUrl);
    expect(to.searchParams.get("code")).toBeNull();
    expect((await decide({ rid, approve: false })).status).toBe(409);
  });

  test("a refused decision (400) consumes nothing: operate not asked for, a machine not the account's, no machine", async () => {
    const rid = ridOf(await ac.authorize(base({ scope: "engine:read" })));
    const operate = await decide({ rid, approve: true, access: "operate" });
    expect(operate.status).toBe(400);
    expect(operate.body.error.code).toBe("invalid_request");
    const foreign = await decide({ rid, approve: true, node_ids: ["node_notmine"] });
    expect(foreign.status).toBe(400);
    const none = await decide({ rid, approve: true, node_ids: [] });
    expect(none.status).toBe(400);
    expect((await context(rid)).status).toBe(200);
    expect((await decide({ rid, approve: true, access: "read" })).status).toBe(200);
  });

  test("the chosen machines are the grant's", async () => {
    const { token, accountId } = await ac.cloud.signIn("two-boxes@example.com", { remoteLink: true });
    const enroll = (hostname: string) =>
      ac.cloud.deps.db.transaction((tx) => ac.cloud.deps.nodes.enroll(tx, accountId, { hostname, os: "", version: "" }, "link_code"));
    const [a] = [await enroll("alpha"), await enroll("beta")];
    await consent(ac, token, { ...CLAUDE, decision: { node_ids: [a.node.id, a.node.id] } });
    const grants = await ac.cloud.api("GET", "/api/oauth/grants", { token });
    expect(grants.status).toBe(200);
    expect(grants.body.grants).toHaveLength(1);
    expect(grants.body.grants[0]).toMatchObject({ client_id: CLAUDE.clientId, node_ids: [a.node.id], access: "read", revoked: false });
  });

  test.each([
    ["empty", ""],
    ["513 characters", "r".repeat(513)],
  ])("a rid that is %s is 422", async (_name, rid) => {
    const answer = await context(rid);
    expect(answer.status).toBe(422);
    expect(answer.body.detail[0].loc).toEqual(["query", "rid"]);
    expect((await decide({ rid, approve: true })).status).toBe(422);
  });

  test.each([
    ["1 character", "r"],
    ["512 characters", "r".repeat(512)],
  ])("a rid of %s is valid, and unknown: 404", async (_name, rid) => {
    const answer = await context(rid);
    expect(answer.status).toBe(404);
    expect(answer.body.error.code).toBe("not_found");
    expect((await decide({ rid, approve: true })).status).toBe(404);
  });

  test("without a session every assistant route is 401", async () => {
    const rid = ridOf(await ac.authorize(base()));
    for (const [method, path, body] of [
      ["GET", `/api/oauth/authorize/context?rid=${rid}`, undefined],
      ["POST", "/api/oauth/authorize/decision", { rid, approve: true }],
      ["GET", "/api/oauth/connector", undefined],
      ["GET", "/api/oauth/grants", undefined],
      ["DELETE", "/api/oauth/grants/grant_x", undefined],
    ] as const) {
      const answer = await ac.cloud.api(method, path, { body });
      expect({ path, status: answer.status }).toEqual({ path, status: 401 });
    }
    expect((await context(rid)).status).toBe(200);
  });

  test("an account without the remote-link entitlement: context and decision 403 entitlement_required, nothing consumed", async () => {
    const { token } = await ac.cloud.signIn("plain@example.com");
    const rid = ridOf(await ac.authorize(base()));
    const read = await context(rid, token);
    expect(read.status).toBe(403);
    expect(read.body.error.code).toBe("entitlement_required");
    const decided = await decide({ rid, approve: true }, token);
    expect(decided.status).toBe(403);
    expect(decided.body.error.code).toBe("entitlement_required");
    // Unknown rids too: the entitlement is checked before the rid is looked up.
    expect((await context("unknown", token)).status).toBe(403);
    expect((await context(rid)).status).toBe(200);
  });

  test("the connector: the MCP URL and the registered client id, or a 200 refusal without values", async () => {
    const claude = await ac.cloud.api("GET", "/api/oauth/connector?client_id=claude", { token: entitled });
    expect(claude.status).toBe(200);
    expect(claude.body).toEqual({ assistant: "claude", mcp_url: ac.mcpUrl, client_id: "engine-claude", nodes: [], refusal: null });
    for (const [assistant, id] of [
      ["chatgpt", "engine-chatgpt"],
      ["cursor", "engine-cursor"],
    ]) {
      expect((await ac.cloud.api("GET", `/api/oauth/connector?client_id=${assistant}`, { token: entitled })).body.client_id).toBe(id);
    }
    const none = await ac.cloud.api("GET", "/api/oauth/connector", { token: entitled });
    expect(none.body).toMatchObject({ assistant: null, mcp_url: ac.mcpUrl, client_id: null, refusal: null });
    expect((await ac.cloud.api("GET", "/api/oauth/connector?client_id=gemini", { token: entitled })).status).toBe(422);

    const { token: plain } = await ac.cloud.signIn("plain-connector@example.com");
    const refused = await ac.cloud.api("GET", "/api/oauth/connector?client_id=claude", { token: plain });
    expect(refused.status).toBe(200);
    expect(refused.body).toEqual({
      assistant: "claude",
      mcp_url: null,
      client_id: null,
      nodes: [],
      refusal: { code: "entitlement_required", message: expect.any(String) },
    });
  });

  test("the connector is not rate limited; context is (429 after its budget)", async () => {
    const { token } = await ac.cloud.signIn("busy@example.com", { remoteLink: true });
    for (let i = 0; i < 80; i++) {
      const answer = await ac.cloud.api("GET", "/api/oauth/connector", { token });
      if (answer.status !== 200) throw new Error(`connector call ${i} answered ${answer.status}`);
    }
    let limited = null;
    for (let i = 0; i < 80 && !limited; i++) {
      const answer = await ac.cloud.api("GET", "/api/oauth/authorize/context?rid=none", { token });
      if (answer.status === 429) limited = answer;
      else expect(answer.status).toBe(404);
    }
    expect(limited?.body.error.code).toBe("rate_limited");
    expect(Number(limited?.headers.get("retry-after"))).toBeGreaterThan(0);
  });

  test("an expired request is 404 to context and decision", async () => {
    const rid = ridOf(await ac.authorize(base()));
    ac.clock.advance(11 * 60_000);
    expect((await context(rid)).status).toBe(404);
    expect((await decide({ rid, approve: true })).status).toBe(404);
  });

  test("the decision from a browser needs the CSRF header (cookie sessions)", async () => {
    const rid = ridOf(await ac.authorize(base()));
    const cookie = `engine_session=${entitled}`;
    const forged = await fetch(`${ac.cloud.url}/api/oauth/authorize/decision`, {
      method: "POST",
      headers: { cookie, "content-type": "application/json", origin: "https://evil.example" },
      body: JSON.stringify({ rid, approve: true }),
    });
    expect(forged.status).toBe(403);
    expect((await context(rid)).status).toBe(200);
  });
});
