import { afterAll, beforeAll, expect, test } from "bun:test";
import { num } from "../../../src/cloud/db";
import { testCertificates } from "../../fixtures/cloud/idp";
import { describeEachDialect } from "../helpers";
import { type AssistantCloud, authorized, type DocumentServer, pkce, ridOf, startAssistantCloud, startDocumentServer } from "./helpers";

/**
 * How the console knows a client: dynamic registration (RFC 7591), client ID metadata
 * documents (served here from loopback, which the test-only ENGINE_CLOUD_CIMD_ALLOW_LOOPBACK
 * setting admits) and the three pre-registered assistants with their vendors' redirect URIs.
 */
describeEachDialect("assistants: clients", (dialect) => {
  let ac: AssistantCloud;
  let documents: DocumentServer;
  let session: string;

  beforeAll(async () => {
    ac = await startAssistantCloud(dialect);
    documents = startDocumentServer();
    session = (await ac.cloud.signIn("clients@example.com", { remoteLink: true })).token;
  });
  afterAll(async () => {
    documents?.close();
    await ac?.close();
  });

  const request = (clientId: string, redirectUri: string, extra: Record<string, string> = {}) =>
    ac.authorize({
      response_type: "code",
      client_id: clientId,
      redirect_uri: redirectUri,
      code_challenge: pkce().challenge,
      code_challenge_method: "S256",
      state: "s",
      resource: ac.mcpUrl,
      ...extra,
    });
  const contextOf = async (rid: string) => (await ac.cloud.api("GET", `/api/oauth/authorize/context?rid=${rid}`, { token: session })).body;
  const expectErrorPage = (answer: { status: number; location: string | null; text: string }, reason: string) => {
    expect(answer.status).toBe(400);
    expect(answer.location).toBeNull();
    expect(answer.text).toContain(reason);
  };

  // ---- dynamic registration

  test("a registration that asks for client_secret_post is answered as a public client, without a secret", async () => {
    const answer = await ac.registerClient({
      client_name: "Some Assistant",
      redirect_uris: ["https://assistant.example/callback"],
      token_endpoint_auth_method: "client_secret_post",
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
      scope: "engine:read",
    });
    expect(answer.status).toBe(201);
    expect(answer.headers.get("cache-control")).toBe("no-store");
    expect(answer.json).toMatchObject({
      client_id: expect.stringMatching(/^dcr_/),
      token_endpoint_auth_method: "none",
      redirect_uris: ["https://assistant.example/callback"],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
      client_name: "Some Assistant",
    });
    expect(answer.json.client_secret).toBeUndefined();
    expect(typeof answer.json.client_id_issued_at).toBe("number");
  });

  test("an identical registration answers the same client; a different one a new client", async () => {
    const body = { client_name: "Repeat", redirect_uris: ["http://127.0.0.1:33418/callback"] };
    const first = await ac.registerClient(body);
    const again = await ac.registerClient(body);
    expect(again.json.client_id).toBe(first.json.client_id);
    expect(again.json.client_id_issued_at).toBe(first.json.client_id_issued_at);
    const other = await ac.registerClient({ ...body, client_name: "Repeat 2" });
    expect(other.json.client_id).not.toBe(first.json.client_id);
    const [row] = await ac.cloud.deps.db.sql`SELECT COUNT(*) AS n FROM oauth_clients WHERE name = 'Repeat'`;
    expect(num(row.n)).toBe(1);
  });

  test.each<[string, Record<string, unknown>, string]>([
    ["no redirect URIs", { redirect_uris: [] }, "invalid_redirect_uri"],
    ["a javascript: redirect", { redirect_uris: ["javascript:alert(1)"] }, "invalid_redirect_uri"],
    ["plain http to another host", { redirect_uris: ["http://evil.example/cb"] }, "invalid_redirect_uri"],
    ["a redirect with a fragment", { redirect_uris: ["https://a.example/cb#x"] }, "invalid_redirect_uri"],
    [
      "private_key_jwt",
      { redirect_uris: ["https://a.example/cb"], token_endpoint_auth_method: "private_key_jwt" },
      "invalid_client_metadata",
    ],
    [
      "no authorization_code grant",
      { redirect_uris: ["https://a.example/cb"], grant_types: ["client_credentials"] },
      "invalid_client_metadata",
    ],
    ["a name that is not text", { redirect_uris: ["https://a.example/cb"], client_name: 7 }, "invalid_client_metadata"],
  ])("a registration with %s is refused (400 %s)", async (_name, body, error) => {
    const answer = await ac.registerClient(body);
    expect(answer.status).toBe(400);
    expect(answer.json.error).toBe(error);
    expect(typeof answer.json.error_description).toBe("string");
  });

  test("a registration must be JSON", async () => {
    const answer = await fetch(`${ac.cloud.url}/oauth/register`, { method: "POST", body: "redirect_uris=x" });
    expect(answer.status).toBe(400);
    expect((await answer.json()).error).toBe("invalid_client_metadata");
  });

  test("a self-registered client is named on the consent page by where its answers go, its own name only as unverified", async () => {
    const registered = await ac.registerClient({
      client_name: "Claude",
      redirect_uris: ["cursor://anysphere.cursor-mcp/oauth/callback", "http://localhost:8787/callback"],
    });
    expect(registered.status).toBe(201);
    const clientId = registered.json.client_id as string;
    const rid = ridOf(await request(clientId, "http://localhost:51234/callback"));
    const context = await contextOf(rid);
    expect(context.client).toEqual({
      client_id: clientId,
      kind: "dynamic",
      label: "cursor://anysphere.cursor-mcp, localhost:8787",
      declared_name: "Claude",
      verified: false,
    });
    expect(context.redirect_host).toBe("localhost:51234");
    expect(context.redirect_local_only).toBe(true);
    // And it completes the flow, the client id and loopback redirect on any port included.
    const flow = await authorized(ac, session, { clientId, redirectUri: "http://localhost:40111/callback" });
    expect(flow.tokens.scope).toBe("engine:read");
  });

  test("a self-registered client left unused is swept, and its tokens' endpoint then answers invalid_client", async () => {
    const { sweepAssistantRows } = await import("../../../src/cloud/oauth");
    const registered = await ac.registerClient({ client_name: "Idle", redirect_uris: ["https://idle.example/cb"] });
    const clientId = registered.json.client_id as string;
    const swept = await sweepAssistantRows(ac.cloud.deps.db, Date.now() + 31 * 86_400_000);
    expect(swept.clients).toBeGreaterThanOrEqual(1);
    const gone = await ac.form("/oauth/token", { grant_type: "refresh_token", refresh_token: "ecr_x", client_id: clientId });
    expect(gone.status).toBe(401);
    expect(gone.json.error).toBe("invalid_client");
    expectErrorPage(await request(clientId, "https://idle.example/cb"), "does not know this client_id");
  });

  // ---- client ID metadata documents

  const document = (clientId: string, extra: Record<string, unknown> = {}) => ({
    client_id: clientId,
    client_name: "Doc Assistant",
    redirect_uris: ["https://doc-assistant.example/callback"],
    grant_types: ["authorization_code", "refresh_token"],
    response_types: ["code"],
    token_endpoint_auth_method: "none",
    ...extra,
  });

  test("a metadata document client: named by its URL's host, its name unverified, and it completes the flow", async () => {
    const clientId = documents.url("/docs/good.json");
    documents.serve("/docs/good.json", document(clientId));
    const rid = ridOf(await request(clientId, "https://doc-assistant.example/callback"));
    const context = await contextOf(rid);
    expect(context.client).toEqual({
      client_id: clientId,
      kind: "metadata_document",
      label: new URL(clientId).host,
      declared_name: "Doc Assistant",
      verified: false,
    });
    const flow = await authorized(ac, session, { clientId, redirectUri: "https://doc-assistant.example/callback" });
    expect(flow.tokens.token_type).toBe("Bearer");
  });

  test("ChatGPT's document shape (private_key_jwt, with none among its methods) negotiates down to none", async () => {
    const clientId = documents.url("/oauth/Abc123xyz/client.json");
    documents.serve("/oauth/Abc123xyz/client.json", {
      client_id: clientId,
      client_uri: "https://chatgpt.com/",
      redirect_uris: ["https://chatgpt.com/connector/oauth/Abc123xyz"],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
      client_name: "ChatGPT",
      token_endpoint_auth_method: "private_key_jwt",
      token_endpoint_auth_methods_supported: ["none", "private_key_jwt"],
      token_endpoint_auth_signing_alg: "RS256",
      jwks_uri: "https://chatgpt.com/oauth/jwks.json",
    });
    const flow = await authorized(ac, session, { clientId, redirectUri: "https://chatgpt.com/connector/oauth/Abc123xyz" });
    expect(flow.tokens.access_token).toMatch(/^eca_/);
    // private_key_jwt alone is refused: this console has public clients only.
    const strict = documents.url("/oauth/strict/client.json");
    documents.serve("/oauth/strict/client.json", {
      client_id: strict,
      redirect_uris: ["https://chatgpt.com/connector/oauth/strict"],
      token_endpoint_auth_method: "private_key_jwt",
      jwks_uri: "https://chatgpt.com/oauth/jwks.json",
    });
    expectErrorPage(await request(strict, "https://chatgpt.com/connector/oauth/strict"), "public clients only");
  });

  test.each<[string, (id: string) => unknown, string]>([
    ["its client_id is another URL", () => document("https://elsewhere.example/client.json"), "is not the URL it was fetched from"],
    ["it has no redirect URIs", (id) => document(id, { redirect_uris: [] }), "1 to 20 redirect_uris"],
    ["it lists a javascript: redirect", (id) => document(id, { redirect_uris: ["javascript:alert(1)"] }), "will not use"],
    ["it asks for a client secret", (id) => document(id, { token_endpoint_auth_method: "client_secret_basic" }), "public clients only"],
    ["it is not JSON", () => "<html>", "not JSON"],
    ["it is a JSON list", () => [1, 2], "not a JSON object"],
    ["it is too large", (id) => document(id, { client_name: "x".repeat(20_000) }), "larger than"],
  ])("a metadata document where %s: an error page, never a redirect", async (_name, body, reason) => {
    const path = `/docs/bad-${Math.random().toString(36).slice(2)}.json`;
    const clientId = documents.url(path);
    documents.serve(path, body(clientId));
    expectErrorPage(await request(clientId, "https://doc-assistant.example/callback"), reason);
  });

  test("a metadata document URL that answers a redirect or an error is refused; redirects are not followed", async () => {
    const moved = documents.url("/docs/moved.json");
    documents.serve("/docs/moved.json", "", { status: 302, headers: { location: documents.url("/docs/good.json") } });
    expectErrorPage(await request(moved, "https://doc-assistant.example/callback"), "HTTP 302");
    expectErrorPage(await request(documents.url("/docs/missing.json"), "https://doc-assistant.example/callback"), "HTTP 404");
  });

  test("a document the console cannot fetch: the error page says why (an untrusted certificate, a refused connection)", async () => {
    const tls = testCertificates();
    const untrusted = Bun.serve({
      hostname: "127.0.0.1",
      port: 0,
      tls: { cert: tls.certPem, key: tls.keyPem },
      fetch: () => Response.json({}),
    });
    const closed = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: () => new Response() });
    const closedPort = closed.port;
    closed.stop(true);
    try {
      expectErrorPage(
        await request(`https://127.0.0.1:${untrusted.port}/client.json`, "https://doc-assistant.example/callback"),
        "cannot be fetched: its server&#39;s TLS certificate is not trusted by the console (UNABLE_TO_VERIFY_LEAF_SIGNATURE)",
      );
      expectErrorPage(
        await request(`http://127.0.0.1:${closedPort}/client.json`, "https://doc-assistant.example/callback"),
        "cannot be fetched: its server refused the connection",
      );
    } finally {
      untrusted.stop(true);
    }
  });

  test("a redirect URI the document does not list: an error page", async () => {
    const clientId = documents.url("/docs/narrow.json");
    documents.serve("/docs/narrow.json", document(clientId));
    expectErrorPage(await request(clientId, "https://doc-assistant.example/other"), "not one this client registered");
  });

  test("a document is cached as its Cache-Control says: max-age keeps it, no-store fetches again", async () => {
    const kept = documents.url("/docs/kept.json");
    documents.serve("/docs/kept.json", document(kept), { headers: { "cache-control": "public, max-age=600" } });
    ridOf(await request(kept, "https://doc-assistant.example/callback"));
    ridOf(await request(kept, "https://doc-assistant.example/callback"));
    expect(documents.hits("/docs/kept.json")).toBe(1);
    const fresh = documents.url("/docs/fresh.json");
    documents.serve("/docs/fresh.json", document(fresh), { headers: { "cache-control": "no-store" } });
    ridOf(await request(fresh, "https://doc-assistant.example/callback"));
    ridOf(await request(fresh, "https://doc-assistant.example/callback"));
    expect(documents.hits("/docs/fresh.json")).toBe(2);
  });

  test.each([
    ["a private address", "https://10.1.2.3/client.json", "non-public address"],
    ["a link-local address", "https://169.254.169.254/latest/client.json", "non-public address"],
    ["an IPv6 unique-local address", "https://[fd00::1]/client.json", "non-public address"],
    ["a URL without a path", "https://assistant.example/", "must have a path"],
    ["a URL with dot segments", "https://assistant.example/a/../client.json", "normal form"],
    ["a URL with credentials", "https://user:pw@assistant.example/client.json", "user name or password"],
  ])("a client id URL on %s is refused before any fetch", async (_name, clientId, reason) => {
    expectErrorPage(await request(clientId, "https://doc-assistant.example/callback"), reason);
  });

  // ---- the three pre-registered assistants

  test.each([
    ["Claude", "engine-claude", "https://claude.ai/api/mcp/auth_callback"],
    ["Claude (claude.com)", "engine-claude", "https://claude.com/api/mcp/auth_callback"],
    ["ChatGPT (a connector's callback)", "engine-chatgpt", "https://chatgpt.com/connector/oauth/OUbdUMlL15Ct"],
    ["ChatGPT (the older fixed callback)", "engine-chatgpt", "https://chatgpt.com/connector_platform_oauth_redirect"],
    ["Cursor (its app)", "engine-cursor", "cursor://anysphere.cursor-mcp/oauth/callback"],
    ["Cursor (hosted)", "engine-cursor", "https://www.cursor.com/agents/mcp/oauth/callback"],
    ["Cursor (loopback, another port)", "engine-cursor", "http://localhost:39123/callback"],
  ])("%s: its real redirect URI is accepted", async (_name, clientId, redirectUri) => {
    const rid = ridOf(await request(clientId, redirectUri));
    const context = await contextOf(rid);
    expect(context.client.kind).toBe("registered");
    expect(context.redirect_uri).toBe(redirectUri);
  });

  test.each([
    ["ChatGPT's callback prefix on another host", "engine-chatgpt", "https://chatgpt.com.evil.example/connector/oauth/x"],
    ["ChatGPT's callback with a deeper path", "engine-chatgpt", "https://chatgpt.com/connector/oauth/x/y"],
    ["ChatGPT's callback with a query", "engine-chatgpt", "https://chatgpt.com/connector/oauth/x?next=y"],
    ["Cursor's loopback on 127.0.0.1 (registered as localhost)", "engine-cursor", "http://127.0.0.1:8787/callback"],
    ["Cursor's loopback with another path", "engine-cursor", "http://localhost:8787/other"],
    ["Claude's callback over http", "engine-claude", "http://claude.ai/api/mcp/auth_callback"],
  ])("%s is refused with an error page", async (_name, clientId, redirectUri) => {
    expectErrorPage(await request(clientId, redirectUri), "not one this client registered");
  });

  test("the cursor:// answer keeps the app's own scheme, with code, state and iss", async () => {
    const flow = await authorized(ac, session, { clientId: "engine-cursor", redirectUri: "cursor://anysphere.cursor-mcp/oauth/callback" });
    const to = new URL(flow.redirectTo);
    expect(to.protocol).toBe("cursor:");
    expect(to.searchParams.get("iss")).toBe(ac.cloud.deps.site.publicUrl);
  });
});

describeEachDialect("assistants: metadata documents without the loopback setting", (dialect) => {
  let ac: AssistantCloud;
  let documents: DocumentServer;
  beforeAll(async () => {
    ac = await startAssistantCloud(dialect, { cimdAllowLoopback: false });
    documents = startDocumentServer();
  });
  afterAll(async () => {
    documents?.close();
    await ac?.close();
  });

  test("a loopback document is refused: over http it is no metadata document, over https its address is not public", async () => {
    const httpId = documents.url("/docs/local.json");
    documents.serve("/docs/local.json", { client_id: httpId, redirect_uris: ["https://a.example/cb"] });
    const params = {
      response_type: "code",
      redirect_uri: "https://a.example/cb",
      code_challenge: pkce().challenge,
      code_challenge_method: "S256",
    };
    const plain = await ac.authorize({ ...params, client_id: httpId });
    expect(plain.status).toBe(400);
    expect(plain.location).toBeNull();
    for (const clientId of ["https://127.0.0.1/client.json", "https://localhost/client.json", "https://[::1]/client.json"]) {
      const answer = await ac.authorize({ ...params, client_id: clientId });
      expect(answer.status).toBe(400);
      expect(answer.location).toBeNull();
      expect(answer.text).toContain("non-public address");
    }
    expect(documents.hits("/docs/local.json")).toBe(0);
  });
});
