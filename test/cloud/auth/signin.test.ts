import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import pino from "pino";
import { RelyingParty, signinRoutes } from "../../../src/cloud/auth";
import { digestSecret, SecretBox } from "../../../src/lib/crypto";
import { browserSignIn, CookieJar, startTestIdp, type TestIdp } from "../../fixtures/cloud/idp";
import { describeEachDialect, startTestCloud, type TestCloud } from "../helpers";
import { GOOD_RETURN_TOS, OPEN_REDIRECT_PAYLOADS } from "./return-to-cases";

/** HOOK_TIMEOUT_MS gives start-up (RSA keys for the IdP, a database schema) room on a busy machine. */
const HOOK_TIMEOUT_MS = 30_000;

/** capturingLogger keeps every log line (debug and up, unredacted) so a test can prove no secret was logged. */
function capturingLogger() {
  const lines: string[] = [];
  const log = pino({ level: "debug" }, { write: (line: string) => void lines.push(line) });
  return { log, lines };
}

/** startLogin asks the console where to go and returns the URL and the browser's cookie jar. */
async function startLogin(cloud: TestCloud, path = "/api/auth/login", headers: Record<string, string> = {}) {
  const response = await fetch(`${cloud.url}${path}`, { headers });
  const body = (await response.json()) as { url: string; expires_in: number };
  const jar = new CookieJar();
  jar.take(response);
  return { response, body, jar };
}

const callback = (url: URL, changes: Record<string, string | null>) => {
  const next = new URL(url);
  for (const [name, value] of Object.entries(changes)) {
    if (value === null) next.searchParams.delete(name);
    else next.searchParams.set(name, value);
  }
  return next;
};

const getJson = async (url: URL | string, headers: Record<string, string> = {}) => {
  const response = await fetch(url, { headers, redirect: "manual" });
  const text = await response.text();
  return { status: response.status, body: text ? JSON.parse(text) : null, text, headers: response.headers };
};

describeEachDialect("sign-in through an OpenID provider", (dialect) => {
  let idp: TestIdp;
  let cloud: TestCloud;
  const logs = capturingLogger();
  /** seen collects every answer's headers and body, for the test that no secret is ever returned. */
  const seen: string[] = [];
  let forwarded = 0;
  /** fresh gives each request group its own source address, so the login rate limit is spent only where a test means to. */
  const fresh = () => ({ "x-forwarded-for": `203.0.113.${++forwarded % 250}` });
  const attempts = async () => Number((await cloud.deps.db.sql`SELECT COUNT(*) AS n FROM login_attempts`)[0].n);
  /** attemptOf reads the stored attempt of an authorization URL (or of the IdP's record of one) by its state's digest. */
  const attemptOf = async (stateOrUrl: string) => {
    const state = stateOrUrl.startsWith("http") ? (new URL(stateOrUrl).searchParams.get("state") as string) : stateOrUrl;
    const [row] = await cloud.deps.db.sql`SELECT * FROM login_attempts WHERE state_digest = ${digestSecret(state)}`;
    return row;
  };

  beforeAll(async () => {
    idp = await startTestIdp();
    cloud = await startTestCloud(
      dialect,
      { ...idp.cloudConfig, trustedProxies: "127.0.0.1", oidcPublishableKey: "pk_test_browser_safe" },
      { modules: [signinRoutes], log: logs.log },
    );
    const api = cloud.api;
    cloud.api = async (method, path, options) => {
      const answer = await api(method, path, options);
      answer.headers.forEach((value, name) => void seen.push(`${name}: ${value}`));
      seen.push(JSON.stringify(answer.body));
      return answer;
    };
  }, HOOK_TIMEOUT_MS);
  afterAll(async () => {
    await cloud?.close();
    await idp?.close();
  });

  test("a full sign-in mints a browser session that works on /api/auth/session", async () => {
    const before = idp.authorizationRequests.length;
    const signedIn = await browserSignIn(cloud, idp, {
      email: "ada@example.com",
      returnTo: "/nodes?tab=keys",
      identity: "ada@example.com",
      headers: { ...fresh(), "user-agent": "test-browser/1.0" },
    });
    expect(signedIn.returnTo).toBe("/nodes?tab=keys");
    expect(Date.parse(signedIn.expiresAt)).toBeGreaterThan(Date.now());
    const session = await cloud.api("GET", "/api/auth/session", { headers: { cookie: signedIn.cookie } });
    expect(session.status).toBe(200);
    expect(session.body.kind).toBe("browser");
    expect(session.body.account).toMatchObject({ id: signedIn.accountId, email: "ada@example.com", name: "ada" });

    // What the IdP was asked: code flow, PKCE S256, state, nonce, the console's own callback, the login hint.
    expect(idp.authorizationRequests.length).toBe(before + 1);
    const asked = idp.authorizationRequests.at(-1) as URLSearchParams;
    expect(asked.get("response_type")).toBe("code");
    expect(asked.get("code_challenge_method")).toBe("S256");
    expect(asked.get("code_challenge")).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(asked.get("state")?.length).toBeGreaterThanOrEqual(32);
    expect(asked.get("nonce")?.length).toBeGreaterThanOrEqual(32);
    expect(asked.get("scope")).toBe("openid email profile");
    expect(asked.get("redirect_uri")).toBe(`${cloud.deps.site.publicUrl}/api/auth/callback`);
    expect(asked.get("login_hint")).toBe("ada@example.com");
    expect(asked.get("client_id")).toBe(idp.clientId);
    expect(asked.has(idp.providerHintParam)).toBe(false);

    // The attempt keeps digests and a sealed verifier, never the state or the verifier themselves.
    const row = await attemptOf(asked.get("state") as string);
    expect(row.consumed_at).not.toBeNull();
    expect(row.provider).toBeNull();
    expect(row.return_to).toBe("/nodes?tab=keys");
    expect(JSON.stringify(row)).not.toContain(asked.get("state") as string);
    expect(row.verifier_sealed).toMatch(/^v1\./);
  });

  test("the session cookie is HttpOnly, Secure, SameSite=Lax and the binding cookie is cleared", async () => {
    const { body, jar, response } = await startLogin(cloud, "/api/auth/login?return_to=%2F", fresh());
    expect(response.status).toBe(200);
    expect(response.headers.get("cache-control")).toBe("no-store");
    expect(body.expires_in).toBe(600);
    const [binding] = response.headers.getSetCookie();
    expect(binding).toMatch(/^engine_login_[0-9a-f]{16}=[A-Za-z0-9_-]{43}; Path=\/api\/auth; HttpOnly; Secure; SameSite=Lax; Max-Age=600$/);
    const back = await idp.authorize(body.url, { login: "ada@example.com" });
    const done = await fetch(back, { headers: { cookie: jar.header() } });
    expect(done.status).toBe(200);
    const cookies = done.headers.getSetCookie();
    expect(cookies).toHaveLength(2);
    expect(cookies[0]).toMatch(/^engine_session=ecs_[A-Za-z0-9_-]+; Path=\/; HttpOnly; Secure; SameSite=Lax; Max-Age=\d+$/);
    // The cookie lives to the session's absolute end (30 days by default); the server enforces the idle end.
    expect(Number(/Max-Age=(\d+)/.exec(cookies[0] as string)?.[1])).toBeGreaterThan(29 * 86_400);
    expect(cookies[1]).toBe(`${(binding as string).split("=")[0]}=; Path=/api/auth; HttpOnly; Secure; SameSite=Lax; Max-Age=0`);
  });

  test.each(["github", "google"] as const)("social sign-in with %s passes the provider hint to the IdP", async (provider) => {
    const signedIn = await browserSignIn(cloud, idp, { email: "ada@example.com", provider, returnTo: "/keys", headers: fresh() });
    const asked = idp.authorizationRequests.at(-1) as URLSearchParams;
    expect(asked.get(idp.providerHintParam)).toBe(provider);
    expect(asked.get("redirect_uri")).toBe(`${cloud.deps.site.publicUrl}/api/auth/social/callback`);
    expect(asked.has("login_hint")).toBe(false);
    // The same IdP subject is the same account, whichever way it signed in.
    const [account] = await cloud.deps.db.sql`SELECT id FROM accounts WHERE email = ${"ada@example.com"}`;
    expect(signedIn.accountId).toBe(account.id);
    expect(signedIn.returnTo).toBe("/keys");
    expect((await cloud.api("GET", "/api/auth/session", { token: signedIn.token })).status).toBe(200);
    expect((await attemptOf(asked.get("state") as string)).provider).toBe(provider);
  });

  test("a provider outside the two is a 422 by validation, and no attempt is written", async () => {
    const before = await attempts();
    const asked = idp.authorizationRequests.length;
    for (const query of ["provider=gitlab", "provider=GitHub", "provider=", ""]) {
      const answer = await cloud.api("GET", `/api/auth/social?${query}`, { headers: fresh() });
      expect(answer.status).toBe(422);
      expect(answer.body.detail[0].loc).toEqual(expect.arrayContaining(["query"]));
    }
    expect(await attempts()).toBe(before);
    expect(idp.authorizationRequests.length).toBe(asked);
  });

  test("a callback without code or state is a 422; a missing state never skips the check", async () => {
    for (const path of ["/api/auth/callback", "/api/auth/social/callback"]) {
      expect((await cloud.api("GET", `${path}?code=abc`)).status).toBe(422);
      expect((await cloud.api("GET", `${path}?state=abc`)).status).toBe(422);
      expect((await cloud.api("GET", path)).status).toBe(422);
      const empty = await cloud.api("GET", `${path}?code=abc&state=`);
      expect(empty.status).toBe(401);
      expect(empty.body.error.code).toBe("login_failed");
    }
  });

  test("the callback refuses a wrong state, a missing or wrong binding cookie, the other callback, and a replay", async () => {
    const { body, jar } = await startLogin(cloud, "/api/auth/login", fresh());
    const back = await idp.authorize(body.url, { login: "ada@example.com" });
    const tokensBefore = idp.tokenRequests;
    const refused = async (url: URL, cookie: string) => {
      const answer = await getJson(url, { cookie });
      seen.push(answer.text);
      expect(answer.status).toBe(401);
      expect(answer.body.error.code).toBe("login_failed");
      expect(answer.headers.get("set-cookie")).toBeNull();
    };
    await refused(callback(back, { state: "not-the-state" }), jar.header());
    await refused(back, "");
    const [name] = [...jar.cookies.keys()];
    await refused(back, `${name}=${"A".repeat(43)}`);
    await refused(new URL(`${cloud.url}/api/auth/social/callback${back.search}`), jar.header());
    // None of those reached the IdP or used the attempt up: the real browser still signs in, once.
    expect(idp.tokenRequests).toBe(tokensBefore);
    const first = await getJson(back, { cookie: jar.header() });
    expect(first.status).toBe(200);
    await refused(back, jar.header());
    expect(idp.tokenRequests).toBe(tokensBefore + 1);
  });

  test("a tampered code is refused by the IdP and uses the attempt up", async () => {
    const { body, jar } = await startLogin(cloud, "/api/auth/login", fresh());
    const back = await idp.authorize(body.url, { login: "ada@example.com" });
    const code = back.searchParams.get("code") as string;
    const tampered = await getJson(callback(back, { code: `${code.slice(0, -2)}xy` }), { cookie: jar.header() });
    expect(tampered.status).toBe(401);
    expect(tampered.body.error.code).toBe("login_failed");
    // The attempt is spent: the genuine code cannot be tried again with it.
    expect((await getJson(back, { cookie: jar.header() })).status).toBe(401);
    // The reason is logged; the code is not.
    expect(logs.lines.some((line) => line.includes("sign-in refused") && line.includes("code redemption failed"))).toBe(true);
    expect(logs.lines.some((line) => line.includes(code))).toBe(false);
  });

  test.each([
    ["another issuer", "https://evil.example"],
    ["no issuer", null],
  ])("a callback naming %s in iss is refused (RFC 9207, the IdP advertises iss)", async (_name, iss) => {
    const { body, jar } = await startLogin(cloud, "/api/auth/login", fresh());
    const back = await idp.authorize(body.url, { login: "ada@example.com" });
    expect(back.searchParams.get("iss")).toBe(idp.issuer);
    const tokensBefore = idp.tokenRequests;
    const answer = await getJson(callback(back, { iss }), { cookie: jar.header() });
    expect(answer.status).toBe(401);
    expect(answer.body.error.code).toBe("login_failed");
    // Refused before the code went anywhere.
    expect(idp.tokenRequests).toBe(tokensBefore);
  });

  test("a code is redeemed only with the PKCE verifier and nonce of its own attempt", async () => {
    // One browser starts two sign-ins; the code of the first comes back under the second's state.
    const a = await startLogin(cloud, "/api/auth/login", fresh());
    const b = await startLogin(cloud, "/api/auth/login", fresh());
    const backA = await idp.authorize(a.body.url, { login: "ada@example.com" });
    const backB = await idp.authorize(b.body.url, { login: "ada@example.com" });
    const jar = new CookieJar();
    for (const [name, value] of [...a.jar.cookies, ...b.jar.cookies]) jar.cookies.set(name, value);
    const crossed = await getJson(callback(backB, { code: backA.searchParams.get("code") as string }), { cookie: jar.header() });
    expect(crossed.status).toBe(401);
    // Each tab's own callback still works: each attempt has its own binding cookie.
    expect((await getJson(backA, { cookie: jar.header() })).status).toBe(200);
  });

  test("an expired attempt is refused", async () => {
    const { body, jar } = await startLogin(cloud, "/api/auth/login", fresh());
    const back = await idp.authorize(body.url, { login: "ada@example.com" });
    await cloud.deps.db.sql`UPDATE login_attempts SET expires_at = ${Date.now() - 1} WHERE consumed_at IS NULL`;
    expect((await getJson(back, { cookie: jar.header() })).status).toBe(401);
  });

  test.each(OPEN_REDIRECT_PAYLOADS)("return_to refuses %s with 400 before anything is written", async (_name, payload) => {
    const before = await attempts();
    for (const path of ["/api/auth/login", "/api/auth/social?provider=github&"]) {
      const joiner = path.includes("?") ? "" : "?";
      const answer = await cloud.api("GET", `${path}${joiner}return_to=${encodeURIComponent(payload)}`, { headers: fresh() });
      expect(answer.status).toBe(400);
      expect(answer.body.error.code).toBe("invalid_return_to");
    }
    expect(await attempts()).toBe(before);
  });

  test.each(GOOD_RETURN_TOS)("return_to %p is stored as %p", async (given, normalized) => {
    const answer = await cloud.api("GET", `/api/auth/login?return_to=${encodeURIComponent(given)}`, { headers: fresh() });
    expect(answer.status).toBe(200);
    expect((await attemptOf(answer.body.url)).return_to).toBe(normalized);
  });

  test("return_to defaults to /", async () => {
    const signedIn = await browserSignIn(cloud, idp, { email: "ada@example.com", headers: fresh() });
    expect(signedIn.returnTo).toBe("/");
  });

  test("provider-config answers exactly the three browser-safe values", async () => {
    const answer = await cloud.api("GET", "/api/auth/provider-config");
    expect(answer.status).toBe(200);
    expect(answer.body).toEqual({ publishable_key: "pk_test_browser_safe", project_url: idp.issuer, client_id: idp.clientId });
  });

  test("the OpenAPI document lists the five sign-in routes with their answers", async () => {
    const doc = await cloud.api("GET", "/api/openapi.json");
    expect(doc.status).toBe(200);
    const paths = ["/api/auth/login", "/api/auth/social", "/api/auth/callback", "/api/auth/social/callback", "/api/auth/provider-config"];
    expect(Object.keys(doc.body.paths)).toEqual(expect.arrayContaining(paths));
    expect(Object.keys(doc.body.paths["/api/auth/social"].get.responses)).toEqual(expect.arrayContaining(["200", "400", "404"]));
    expect(Object.keys(doc.body.paths["/api/auth/social"].get.responses)).not.toContain("429");
    expect(Object.keys(doc.body.paths["/api/auth/callback"].get.responses)).toEqual(expect.arrayContaining(["200", "401"]));
  });

  test("ready reports the identity provider", async () => {
    const ready = await cloud.api("GET", "/api/ready");
    expect(ready.status).toBe(200);
    expect(ready.body).toMatchObject({ ready: true, database: true, identity_provider: true });
  });

  test("the login start is rate limited per source, charged first", async () => {
    const source = { "x-forwarded-for": "198.51.100.77" };
    const statuses: number[] = [];
    for (let i = 0; i < 31; i++) statuses.push((await cloud.api("GET", "/api/auth/social?provider=google", { headers: source })).status);
    expect(statuses.slice(0, 30).every((status) => status === 200)).toBe(true);
    // The contract lists 400 ("refused request") and no 429 on the sign-in starts.
    expect(statuses[30]).toBe(400);
    // Charged before the return_to check: a bad one from a spent source is refused by the limit.
    const bad = await cloud.api("GET", "/api/auth/login?return_to=//evil.example", { headers: source });
    expect(bad.status).toBe(400);
    expect((bad.body as { error: { code: string } }).error.code).toBe("sign_in_rate_limited");
    expect(bad.headers.get("retry-after")).toMatch(/^\d+$/);
  });

  test("logout-all from a browser ends every session of the account, browser and minted alike", async () => {
    const laptop = await browserSignIn(cloud, idp, { email: "hopper@example.com", headers: fresh() });
    const phone = await browserSignIn(cloud, idp, { email: "hopper@example.com", headers: fresh() });
    const minted = await cloud.deps.sessions.mint(laptop.accountId, "minted");
    const other = await browserSignIn(cloud, idp, { email: "ada@example.com", headers: fresh() });
    // A page sends the CSRF header with every cookie-authenticated change (decision: console pages, issue 7).
    const all = await cloud.api("POST", "/api/auth/logout-all", { headers: { cookie: laptop.cookie, "x-engine-csrf": "1" } });
    expect(all.status).toBe(200);
    expect(all.body).toEqual({ ended: 3 });
    for (const token of [laptop.token, phone.token, minted.token])
      expect((await cloud.api("GET", "/api/auth/session", { token })).status).toBe(401);
    expect((await cloud.api("GET", "/api/auth/session", { token: other.token })).status).toBe(200);
  });

  test("an operator's account is adopted by a verified email; an unverified or taken email is refused", async () => {
    const made = await cloud.deps.accounts.add("grace@example.com", { name: "Grace" });
    const grace = await browserSignIn(cloud, idp, { email: "grace@example.com", headers: fresh() });
    expect(grace.accountId).toBe(made.id);

    await cloud.deps.accounts.add("eve@example.com");
    idp.addUser("eve@example.com", { email_verified: false });
    await expect(browserSignIn(cloud, idp, { email: "eve@example.com", headers: fresh() })).rejects.toThrow(/401.*login_failed/);

    // Another IdP subject claiming Grace's email does not get her account.
    idp.addUser("GRACE@example.com", { sub: "someone-else" });
    await expect(browserSignIn(cloud, idp, { email: "GRACE@example.com", headers: fresh() })).rejects.toThrow(/401.*login_failed/);
  });

  test("a social provider the operator did not list is refused with 400 before anything is written", async () => {
    const only = await startTestCloud(dialect, { ...idp.cloudConfig, oidcSocialProviders: "github" }, { modules: [signinRoutes] });
    try {
      const before = Number((await only.deps.db.sql`SELECT COUNT(*) AS n FROM login_attempts`)[0].n);
      const refused = await only.api("GET", "/api/auth/social?provider=google");
      expect(refused.status).toBe(400);
      expect(refused.body.error.code).toBe("social_provider_not_configured");
      expect(refused.body.error.message).toContain("ENGINE_CLOUD_OIDC_SOCIAL_PROVIDERS");
      expect(Number((await only.deps.db.sql`SELECT COUNT(*) AS n FROM login_attempts`)[0].n)).toBe(before);
      expect((await only.api("GET", "/api/auth/social?provider=github")).status).toBe(200);
    } finally {
      await only.close();
    }
  });

  /** refusedLine is the newest "sign-in refused" log line, parsed. */
  const refusedLine = () => {
    const line = logs.lines.findLast((entry) => entry.includes('"sign-in refused"'));
    return line ? (JSON.parse(line) as Record<string, unknown>) : undefined;
  };

  test.each([
    // A provider that takes the Basic user name undecoded makes the form-encoded id its audience.
    [
      "aud",
      (c: Record<string, unknown>) => ({ ...c, aud: "engine%2Dconsole" }),
      '"aud" claim does not match: expected "engine-console", got "engine%2Dconsole" (the client id as form-encoded in the Basic header',
    ],
    ["iss", (c: Record<string, unknown>) => ({ ...c, iss: "https://elsewhere.example" }), 'got "https://elsewhere.example"'],
    ["nonce", (c: Record<string, unknown>) => ({ ...c, nonce: "not-the-nonce" }), '"nonce" claim does not match (values not logged)'],
    [
      "exp",
      (c: Record<string, unknown>) => ({ ...c, iat: Math.floor(Date.now() / 1000) - 7200, exp: Math.floor(Date.now() / 1000) - 3600 }),
      '"exp" claim fails the time check',
    ],
  ])("an ID token whose %s does not check out is refused, and the log line names the claim", async (claim, rewrite, reason) => {
    idp.rewriteIdTokens(rewrite);
    try {
      const { body, jar } = await startLogin(cloud, "/api/auth/login", fresh());
      const back = await idp.authorize(body.url, { login: "ada@example.com" });
      const answer = await getJson(back, { cookie: jar.header() });
      expect(answer.status).toBe(401);
      expect(answer.body.error.code).toBe("login_failed");
      const line = refusedLine();
      expect(line?.claim).toBe(claim);
      expect(String(line?.reason)).toStartWith("code redemption failed: the ID token's");
      expect(String(line?.reason)).toContain(reason);
      if (claim === "aud") expect(line).toMatchObject({ expected: "engine-console", got: "engine%2Dconsole" });
      // Named, never shown: the nonce's values, the code, and the claims the token carried (email).
      const row = await attemptOf(body.url);
      const text = JSON.stringify(line);
      expect(text).not.toContain(row.nonce as string);
      expect(text).not.toContain(back.searchParams.get("code") as string);
      expect(text).not.toContain("ada@example.com");
    } finally {
      idp.rewriteIdTokens(undefined);
    }
  });

  test("a browser that comes back on another host is told where it started and where to open the console; the checks still run", async () => {
    const port = new URL(cloud.url).port;
    const localhost = `http://localhost:${port}`;
    // The page was opened at localhost; the IdP sends the browser back to the public URL (127.0.0.1), where localhost's cookie is not sent.
    const { body, jar } = await startLogin(cloud, "/api/auth/login", { ...fresh(), host: `localhost:${port}` });
    expect((await attemptOf(body.url)).started_origin).toBe(localhost);
    const back = await idp.authorize(body.url, { login: "ada@example.com" });
    expect(back.origin).toBe(new URL(cloud.deps.site.publicUrl).origin);
    const tokensBefore = idp.tokenRequests;

    const api = await getJson(back);
    expect(api.status).toBe(401);
    expect(api.body.error.code).toBe("login_failed");
    expect(api.body.error.message).toContain(`you started sign-in at ${localhost} but came back at ${new URL(cloud.url).origin}`);
    expect(api.body.error.message).toContain(`open the console at ${cloud.deps.site.publicUrl}`);
    expect(refusedLine()).toMatchObject({ reason: expect.stringContaining("no binding cookie"), started_at: localhost });

    const navigated = await fetch(back, { redirect: "manual", headers: { "sec-fetch-mode": "navigate" } });
    expect(navigated.status).toBe(303);
    expect(navigated.headers.get("location")).toBe(`/signin?error=login_failed&started_at=${encodeURIComponent(localhost)}`);

    // Only the message changes: a wrong state, or a wrong cookie, is the plain refusal.
    const wrongState = await getJson(callback(back, { state: "not-the-state" }));
    expect(wrongState.status).toBe(401);
    expect(wrongState.body.error.message).not.toContain("started sign-in at");
    const [name] = [...jar.cookies.keys()];
    const wrongCookie = await getJson(back, { cookie: `${name}=${"A".repeat(43)}` });
    expect(wrongCookie.status).toBe(401);
    expect(wrongCookie.body.error.message).not.toContain("started sign-in at");
    // Nothing was redeemed or spent: the browser that kept its cookie still signs in, once.
    expect(idp.tokenRequests).toBe(tokensBefore);
    expect((await getJson(back, { cookie: jar.header() })).status).toBe(200);
    expect((await getJson(back, { cookie: jar.header() })).status).toBe(401);
  });

  test("a browser that lost its cookie on the same host gets the plain refusal", async () => {
    const { body } = await startLogin(cloud, "/api/auth/login", fresh());
    const back = await idp.authorize(body.url, { login: "ada@example.com" });
    const answer = await getJson(back);
    expect(answer.status).toBe(401);
    expect(answer.body.error.message).toBe("sign-in failed; start again from the sign-in page");
    const navigated = await fetch(back, { redirect: "manual", headers: { "sec-fetch-mode": "navigate" } });
    expect(navigated.headers.get("location")).toBe("/signin?error=login_failed");
  });

  test("the client secret never appears in any answer or log line, nor do codes or tokens", async () => {
    const extra = ["/api/auth/provider-config", "/api/ready", "/api/openapi.json", "/api/auth/login", "/api/auth/social?provider=github"];
    for (const path of extra) await cloud.api("GET", path, { headers: fresh() });
    const signedIn = await browserSignIn(cloud, idp, { email: "ada@example.com", headers: fresh() });
    expect(seen.length).toBeGreaterThan(20);
    for (const answer of seen) expect(answer).not.toContain(idp.clientSecret);
    for (const line of logs.lines) {
      expect(line).not.toContain(idp.clientSecret);
      expect(line).not.toContain(signedIn.token);
    }
    expect(logs.lines.some((line) => line.includes('"signed in"'))).toBe(true);
  });
});

describeEachDialect("sign-in at a provider that wants client_secret_post, with a hyphenated client id", (dialect) => {
  let idp: TestIdp;
  let basic: TestCloud;
  let post: TestCloud;
  const basicLogs = capturingLogger();
  const postLogs = capturingLogger();
  beforeAll(async () => {
    // oidc-provider refuses a Basic header for this client: as a provider that reads the Basic
    // user name undecoded refuses `engine%2Dconsole` (RFC 6749 §2.3.1 form-encodes the hyphen).
    idp = await startTestIdp({ tokenEndpointAuthMethod: "client_secret_post" });
    basic = await startTestCloud(
      dialect,
      { ...idp.cloudConfig, oidcAuthMethod: undefined, oidcPublishableKey: "pk_test" },
      { modules: [signinRoutes], log: basicLogs.log },
    );
    post = await startTestCloud(
      dialect,
      { ...idp.cloudConfig, oidcAuthMethod: "client_secret_post", oidcPublishableKey: "pk_test" },
      { modules: [signinRoutes], log: postLogs.log },
    );
  }, HOOK_TIMEOUT_MS);
  afterAll(async () => {
    await basic?.close();
    await post?.close();
    await idp?.close();
  });

  test("client_secret_basic (the default) fails with a log line naming the reason and the setting", async () => {
    expect(idp.clientId).toBe("engine-console");
    expect(basic.deps.config.oidc?.authMethod).toBe("client_secret_basic");
    await expect(browserSignIn(basic, idp, { email: "ada@example.com" })).rejects.toThrow(/401.*login_failed/);
    const line = basicLogs.lines.findLast((entry) => entry.includes('"sign-in refused"')) as string;
    expect(JSON.parse(line)).toMatchObject({ oauth_error: "invalid_client", auth_method: "client_secret_basic" });
    expect(line).toContain("ENGINE_CLOUD_OIDC_AUTH_METHOD=client_secret_post");
    for (const entry of basicLogs.lines) expect(entry).not.toContain(idp.clientSecret);
  });

  test("ENGINE_CLOUD_OIDC_AUTH_METHOD=client_secret_post signs in", async () => {
    const signedIn = await browserSignIn(post, idp, { email: "ada@example.com", provider: "github" });
    expect((await post.api("GET", "/api/auth/session", { token: signedIn.token })).body.account.email).toBe("ada@example.com");
    for (const entry of postLogs.lines) expect(entry).not.toContain(idp.clientSecret);
  });

  test.each(["basic", "post"] as const)("provider-config answers only the three browser-safe values (%s)", async (which) => {
    const answer = await (which === "basic" ? basic : post).api("GET", "/api/auth/provider-config");
    expect(answer.status).toBe(200);
    expect(answer.body).toEqual({ publishable_key: "pk_test", project_url: idp.issuer, client_id: "engine-console" });
  });
});

describeEachDialect("sign-in without an OpenID provider", (dialect) => {
  let cloud: TestCloud;
  beforeAll(async () => {
    cloud = await startTestCloud(dialect, {}, { modules: [signinRoutes] });
  }, HOOK_TIMEOUT_MS);
  afterAll(async () => {
    await cloud?.close();
  });

  test("the starts and provider-config answer 404 provider_not_configured; the callbacks 401", async () => {
    for (const path of ["/api/auth/login", "/api/auth/social?provider=github", "/api/auth/provider-config"]) {
      const answer = await cloud.api("GET", path);
      expect(answer.status).toBe(404);
      expect(answer.body.error.code).toBe("provider_not_configured");
    }
    for (const path of ["/api/auth/callback", "/api/auth/social/callback"]) {
      const answer = await cloud.api("GET", `${path}?code=c&state=s`);
      expect(answer.status).toBe(401);
      expect(answer.body.error.code).toBe("login_failed");
    }
    // Validation still comes first.
    expect((await cloud.api("GET", "/api/auth/social?provider=gitlab")).status).toBe(422);
    const ready = await cloud.api("GET", "/api/ready");
    expect(ready.body.ready).toBe(true);
    expect("identity_provider" in ready.body).toBe(false);
  });
});

describeEachDialect("sign-in when the IdP is down at start, over plain http on loopback", (dialect) => {
  let idp: TestIdp;
  let cloud: TestCloud;
  beforeAll(async () => {
    idp = await startTestIdp({ tls: false, claimsInIdToken: false });
    idp.setAvailable(false);
    cloud = await startTestCloud(dialect, { ...idp.cloudConfig, trustedProxies: "127.0.0.1" }, { modules: [signinRoutes] });
  }, HOOK_TIMEOUT_MS);
  afterAll(async () => {
    await cloud?.close();
    await idp?.close();
  });

  test("ready says the IdP is down and a start answers 503 without writing; once it is back, sign-in works", async () => {
    const down = await cloud.api("GET", "/api/ready");
    expect(down.body).toMatchObject({ ready: false, database: true, identity_provider: false });
    const refused = await cloud.api("GET", "/api/auth/login", { headers: { "x-forwarded-for": "192.0.2.1" } });
    expect(refused.status).toBe(503);
    expect(refused.body.error.code).toBe("identity_provider_unavailable");
    expect(Number((await cloud.deps.db.sql`SELECT COUNT(*) AS n FROM login_attempts`)[0].n)).toBe(0);

    idp.setAvailable(true);
    expect((await cloud.api("GET", "/api/ready")).body).toMatchObject({ ready: true, identity_provider: true });
    // This IdP keeps email and name to userinfo: the console fetches them there.
    const signedIn = await browserSignIn(cloud, idp, { email: "lin@example.com", headers: { "x-forwarded-for": "192.0.2.2" } });
    const session = await cloud.api("GET", "/api/auth/session", { token: signedIn.token });
    expect(session.body.account).toMatchObject({ email: "lin@example.com", name: "lin" });
  });
});

describe("the relying party's configuration checks", () => {
  const oidc = {
    issuer: "http://idp.example.com",
    clientId: "c",
    clientSecret: "s",
    authMethod: "client_secret_basic" as const,
    socialProviders: [],
    providerHintParam: "identity_provider",
    publishableKey: "",
    extraCaFile: undefined,
  };
  const box = new SecretBox(Buffer.alloc(32, 1));
  const log = pino({ level: "silent" });

  test("a plain-http issuer off loopback and an unreadable CA file stop the start with config_invalid", () => {
    expect(() => new RelyingParty(oidc, null as never, box, log)).toThrow(/https/);
    expect(
      () => new RelyingParty({ ...oidc, issuer: "https://idp.example.com", extraCaFile: "/nonexistent/ca.pem" }, null as never, box, log),
    ).toThrow(/oidc_ca_file/);
    expect(() => new RelyingParty({ ...oidc, issuer: "http://127.0.0.1:9" }, null as never, box, log)).not.toThrow();
  });
});
