import { describe, expect, test } from "bun:test";
import { offeredScopes, s256 } from "../../../src/cloud/oauth/authorization";
import { cacheSeconds, clientIdUrlProblem, negotiatedAuthMethod } from "../../../src/cloud/oauth/cimd";
import { registrationMetadata } from "../../../src/cloud/oauth/clients";
import { redirectMatches, redirectTarget, redirectUriProblem, withParameters } from "../../../src/cloud/oauth/redirects";

/** The authorization server's pure rules, as tables. */

describe("which redirect URIs a client may register", () => {
  test.each<[string, string | null]>([
    ["https://claude.ai/api/mcp/auth_callback", null],
    ["http://localhost:8787/callback", null],
    ["http://127.0.0.1/callback", null],
    ["http://[::1]:9000/cb", null],
    ["cursor://anysphere.cursor-mcp/oauth/callback", null],
    ["com.example.app:/oauth2redirect", null],
    ["http://evil.example/cb", "plain http"],
    ["http://localhost.evil.example/cb", "plain http"],
    ["https://a.example/cb#frag", "fragment"],
    ["https://user:pw@a.example/cb", "user name"],
    ["javascript:alert(1)", "javascript:"],
    ["data:text/html,hi", "data:"],
    ["file:///etc/passwd", "file:"],
    ["/relative/callback", "absolute"],
    ["https://a.example/c b", "spaces"],
    [`https://a.example/${"x".repeat(2100)}`, "at most"],
  ])("%s", (uri, problem) => {
    const found = redirectUriProblem(uri);
    if (problem === null) expect(found).toBeNull();
    else expect(found).toContain(problem);
  });
});

describe("whether a presented redirect URI is a registered one", () => {
  test.each<[string, string, boolean]>([
    ["https://a.example/cb", "https://a.example/cb", true],
    ["https://a.example/cb", "https://a.example/cb/", false],
    ["https://a.example/cb", "https://A.example/cb", false],
    ["https://a.example/cb", "https://a.example/cb?x=1", false],
    ["https://a.example:443/cb", "https://a.example/cb", false],
    // RFC 8252 §7.3: a loopback redirect matches on any port, and on nothing else.
    ["http://localhost:8787/callback", "http://localhost:51234/callback", true],
    ["http://localhost/callback", "http://localhost:51234/callback", true],
    ["http://127.0.0.1/callback", "http://127.0.0.1:4000/callback", true],
    ["http://localhost:8787/callback", "http://127.0.0.1:8787/callback", false],
    ["http://localhost:8787/callback", "http://localhost:8787/callback2", false],
    ["http://localhost:8787/callback", "http://localhost:8787/callback#x", false],
    ["http://localhost:8787/callback", "http://user@localhost:8787/callback", false],
    ["https://localhost:8787/callback", "https://localhost:9999/callback", false],
  ])("%s vs %s", (registered, presented, matches) => {
    expect(redirectMatches(registered, presented)).toBe(matches);
  });
});

describe("redirect answers", () => {
  test("parameters are appended, the existing query kept", () => {
    expect(withParameters("https://a.example/cb?keep=1", { code: "c", state: null, iss: "https://x" })).toBe(
      "https://a.example/cb?keep=1&code=c&iss=https%3A%2F%2Fx",
    );
    expect(withParameters("cursor://anysphere.cursor-mcp/oauth/callback", { code: "c" })).toBe(
      "cursor://anysphere.cursor-mcp/oauth/callback?code=c",
    );
  });
  test.each([
    ["https://claude.ai/api/mcp/auth_callback", "claude.ai", false],
    ["http://localhost:8787/cb", "localhost:8787", true],
    ["cursor://anysphere.cursor-mcp/oauth/callback", "cursor://anysphere.cursor-mcp", true],
  ])("%s goes to %s (local only: %s)", (uri, host, local) => {
    expect(redirectTarget(uri)).toEqual({ host, localOnly: local });
  });
});

describe("scopes offered at consent", () => {
  test.each<[string | null, string[]]>([
    [null, ["engine:read", "engine:operate"]],
    ["", ["engine:read", "engine:operate"]],
    ["openid email profile", ["engine:read", "engine:operate"]],
    ["engine:read", ["engine:read"]],
    ["engine:read email", ["engine:read"]],
    ["engine:operate", ["engine:read", "engine:operate"]],
    ["engine:read engine:operate offline_access", ["engine:read", "engine:operate"]],
  ])("%s offers %s", (asked, offered) => {
    expect(offeredScopes(asked)).toEqual(offered as never);
  });
});

describe("PKCE S256", () => {
  test("RFC 7636 appendix B's example", () => {
    expect(s256("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk")).toBe("E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM");
  });
});

describe("metadata documents", () => {
  test.each<[string | null, number]>([
    [null, 300],
    ["public, max-age=600", 600],
    ["max-age=0", 0],
    ["max-age=999999", 86_400],
    ["no-store", 0],
    ["no-cache, max-age=600", 0],
    ["private, max-age=600", 0],
    ["s-maxage=100", 300],
  ])("Cache-Control %s keeps a document %i s", (header, seconds) => {
    expect(cacheSeconds(header)).toBe(seconds);
  });

  test.each<[string, boolean, string | null]>([
    ["https://chatgpt.com/oauth/abc/client.json", false, null],
    ["https://CHATGPT.com/oauth/client.json", false, "normal form"],
    ["https://a.example:443/client.json", false, "normal form"],
    ["https://a.example/x/./client.json", false, "normal form"],
    ["https://a.example", false, "path"],
    ["https://a.example/client.json#x", false, "fragment"],
    ["http://a.example/client.json", false, "https"],
    ["http://127.0.0.1:9000/client.json", false, "https"],
    ["http://127.0.0.1:9000/client.json", true, null],
    ["http://a.example/client.json", true, "https"],
  ])("%s (loopback allowed: %s)", (id, loopback, problem) => {
    const found = clientIdUrlProblem(id, loopback);
    if (problem === null) expect(found).toBeNull();
    else expect(found).toContain(problem);
  });

  test.each<[Record<string, unknown>, "none" | null]>([
    [{}, "none"],
    [{ token_endpoint_auth_method: "none" }, "none"],
    [{ token_endpoint_auth_method: "private_key_jwt", token_endpoint_auth_methods_supported: ["none", "private_key_jwt"] }, "none"],
    [{ token_endpoint_auth_method: "private_key_jwt" }, null],
    [{ token_endpoint_auth_method: "client_secret_basic", token_endpoint_auth_methods_supported: ["client_secret_basic"] }, null],
  ])("%j authenticates with %s", (document, method) => {
    expect(negotiatedAuthMethod(document)).toBe(method);
  });
});

describe("dynamic registration", () => {
  test("what is kept is bounded and cleaned; the grant types are the supported ones asked for", () => {
    expect(
      registrationMetadata({
        redirect_uris: ["https://a.example/cb"],
        client_name: "  Evil\u202e name\u0007 ",
        grant_types: ["authorization_code", "implicit"],
        logo_uri: "https://a.example/logo.png",
      }),
    ).toEqual({ redirect_uris: ["https://a.example/cb"], client_name: "Evil name", grant_types: ["authorization_code"] });
  });
});
