import { afterAll, beforeAll, expect, test } from "bun:test";
import { auth, type StoredOAuthTokens } from "@modelcontextprotocol/client";
import { createAccessTokenVerifier } from "../../../src/cloud/oauth";
import { MemoryOAuthProvider } from "../../fixtures/cloud/oauth-client";
import { describeEachDialect } from "../helpers";
import { type AssistantCloud, startAssistantCloud } from "./helpers";

/**
 * The MCP SDK v2 client's own OAuth code (`auth` from @modelcontextprotocol/client) against the
 * console: RFC 8414 discovery, dynamic registration, PKCE authorization, the code exchange with
 * the RFC 9207 issuer check, and a refresh. The console's RFC 9728 protected-resource metadata
 * belongs to its MCP endpoint (src/cloud/relay, another slice), so this test's fetch answers
 * that one document the way the relay publishes it and passes every other request through.
 */
describeEachDialect("assistants: the MCP SDK v2 client's OAuth against the console", (dialect) => {
  let ac: AssistantCloud;
  let session: string;
  const requested: string[] = [];
  /** fetchFn answers the protected-resource metadata as the relay does; everything else goes to the console. */
  const fetchFn = async (input: string | URL, init?: RequestInit) => {
    const url = new URL(String(input));
    requested.push(`${init?.method ?? "GET"} ${url.pathname}`);
    if (url.pathname.startsWith("/.well-known/oauth-protected-resource")) {
      return Response.json({
        resource: ac.mcpUrl,
        authorization_servers: [ac.cloud.deps.site.publicUrl],
        scopes_supported: ["engine:read", "engine:operate"],
        bearer_methods_supported: ["header"],
      });
    }
    return fetch(input, init);
  };

  beforeAll(async () => {
    ac = await startAssistantCloud(dialect);
    session = (await ac.cloud.signIn("sdk@example.com", { remoteLink: true })).token;
  });
  afterAll(async () => {
    await ac?.close();
  });

  test("discovery, dynamic registration, PKCE, consent, the code exchange with iss, and a refresh", async () => {
    const provider = new MemoryOAuthProvider("SDK test assistant", "http://127.0.0.1:33418/callback");
    const started = await auth(provider, { serverUrl: ac.mcpUrl, fetchFn });
    expect(started).toBe("REDIRECT");
    expect(requested).toContain("GET /.well-known/oauth-authorization-server");
    expect(requested).toContain("POST /oauth/register");
    expect(provider.information?.client_id).toMatch(/^dcr_/);
    const url = provider.authorizations.at(-1) as URL;
    expect(`${url.origin}${url.pathname}`).toBe(`${ac.cloud.deps.site.publicUrl}/oauth/authorize`);
    expect(url.searchParams.get("code_challenge_method")).toBe("S256");
    expect(url.searchParams.get("resource")).toBe(ac.mcpUrl);

    // The browser's part: the authorization endpoint sends it to consent, the person approves.
    const toConsent = await fetch(url, { redirect: "manual" });
    expect(toConsent.status).toBe(302);
    const rid = new URL(toConsent.headers.get("location") as string, ac.cloud.url).searchParams.get("rid") as string;
    const decided = await ac.cloud.api("POST", "/api/oauth/authorize/decision", {
      token: session,
      body: { rid, approve: true, access: "operate" },
    });
    expect(decided.status).toBe(200);
    const back = new URL(decided.body.redirect_to);
    expect(back.searchParams.get("state")).toBe(url.searchParams.get("state"));

    const finished = await auth(provider, {
      serverUrl: ac.mcpUrl,
      authorizationCode: back.searchParams.get("code") as string,
      iss: back.searchParams.get("iss") as string,
      fetchFn,
    });
    expect(finished).toBe("AUTHORIZED");
    const tokens = provider.saved as StoredOAuthTokens;
    expect(tokens.token_type).toBe("Bearer");
    expect(tokens.scope).toBe("engine:read engine:operate");
    const verify = createAccessTokenVerifier(ac.cloud.deps, { clock: ac.clock.read });
    const verified = await verify(tokens.access_token, ac.mcpUrl);
    expect(verified.ok && verified.grant.clientId).toBe(provider.information?.client_id as string);

    // A later call with an expired token: the SDK refreshes with the rotated refresh token.
    provider.saved = { ...tokens, access_token: "eca_expired" };
    const refreshed = await auth(provider, { serverUrl: ac.mcpUrl, fetchFn });
    expect(refreshed).toBe("AUTHORIZED");
    expect(provider.saved?.refresh_token).not.toBe(tokens.refresh_token);
    expect((await verify(provider.saved?.access_token as string, ac.mcpUrl)).ok).toBe(true);
  });

  test("an issuer that does not match the callback's iss is refused by the client before the code is redeemed", async () => {
    const provider = new MemoryOAuthProvider("SDK test assistant", "http://127.0.0.1:33419/callback");
    expect(await auth(provider, { serverUrl: ac.mcpUrl, fetchFn })).toBe("REDIRECT");
    const toConsent = await fetch(provider.authorizations.at(-1) as URL, { redirect: "manual" });
    const rid = new URL(toConsent.headers.get("location") as string, ac.cloud.url).searchParams.get("rid") as string;
    const decided = await ac.cloud.api("POST", "/api/oauth/authorize/decision", { token: session, body: { rid, approve: true } });
    const code = new URL(decided.body.redirect_to).searchParams.get("code") as string;
    await expect(
      auth(provider, { serverUrl: ac.mcpUrl, authorizationCode: code, iss: "https://mix-up.example", fetchFn }),
    ).rejects.toThrow();
    // The code was not spent: the right issuer still redeems it.
    const issuer = new URL(decided.body.redirect_to).searchParams.get("iss") as string;
    expect(await auth(provider, { serverUrl: ac.mcpUrl, authorizationCode: code, iss: issuer, fetchFn })).toBe("AUTHORIZED");
  });
});
