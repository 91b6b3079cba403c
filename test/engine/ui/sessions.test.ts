import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { TokenStore } from "../../../src/engine/auth";
import { LOGIN_CODE_TTL_MS, SESSION_TTL_MS, UiSessions } from "../../../src/engine/ui/sessions";
import { createToken, startTestEngine, type TestEngine } from "../../helpers";

let engine: TestEngine;

beforeAll(async () => {
  engine = await startTestEngine();
});
afterAll(() => engine.close());

/** signIn opens a web session with a token, as the sign-in form does, and returns its cookie and CSRF token. */
async function signIn(token: string): Promise<{ cookie: string; csrf: string; setCookie: string }> {
  const response = await fetch(`${engine.url}/ui/session`, {
    method: "POST",
    headers: { "content-type": "application/json", origin: engine.url, "sec-fetch-site": "same-origin" },
    body: JSON.stringify({ token }),
  });
  expect(response.status).toBe(201);
  const setCookie = response.headers.get("set-cookie") ?? "";
  const cookie = /engine_ui_session=([^;]+)/.exec(setCookie)?.[1] ?? "";
  const body = (await response.json()) as { csrf: string };
  return { cookie, csrf: body.csrf, setCookie };
}

function withCookie(cookie: string, extra: Record<string, string> = {}): Record<string, string> {
  return { cookie: `engine_ui_session=${cookie}`, ...extra };
}

describe("web UI sessions", () => {
  test("the page shell, script and stylesheet are served without a credential, with a strict CSP", async () => {
    const page = await fetch(`${engine.url}/`);
    expect(page.status).toBe(200);
    expect(page.headers.get("content-type")).toContain("text/html");
    expect(page.headers.get("content-security-policy")).toContain("script-src 'self'");
    expect(await page.text()).toContain('src="/ui/app.js"');
    const script = await fetch(`${engine.url}/ui/app.js`);
    expect(script.status).toBe(200);
    expect(script.headers.get("content-type")).toContain("javascript");
    expect((await script.text()).length).toBeGreaterThan(1000);
    const style = await fetch(`${engine.url}/ui/app.css`);
    expect(style.status).toBe(200);
    expect(style.headers.get("content-type")).toContain("text/css");
  });

  test("a token opens an HttpOnly, SameSite=Strict session that calls the API with the token's role", async () => {
    const readonly = await createToken(engine, { name: "ui-ro", role: "readonly" });
    const { cookie, csrf, setCookie } = await signIn(readonly.secret);
    expect(setCookie).toContain("HttpOnly");
    expect(setCookie).toContain("SameSite=Strict");
    expect(cookie.length).toBeGreaterThan(20);
    const me = await fetch(`${engine.url}/ui/session`, { headers: withCookie(cookie) });
    expect(me.status).toBe(200);
    expect(((await me.json()) as { role: string; csrf: string }).csrf).toBe(csrf);
    const list = await fetch(`${engine.url}/api/services`, { headers: withCookie(cookie) });
    expect(list.status).toBe(200);
    // The role comes with the session: a readonly session may not create tokens.
    const create = await fetch(`${engine.url}/api/tokens`, {
      method: "POST",
      headers: withCookie(cookie, { "content-type": "application/json", "x-engine-csrf": csrf, origin: engine.url }),
      body: JSON.stringify({ name: "nope" }),
    });
    expect(create.status).toBe(403);
  });

  test("a wrong token opens no session", async () => {
    const response = await fetch(`${engine.url}/ui/session`, {
      method: "POST",
      headers: { "content-type": "application/json", origin: engine.url },
      body: JSON.stringify({ token: "eng_notARealTokenAtAll0123456789" }),
    });
    expect(response.status).toBe(401);
    expect(response.headers.get("set-cookie")).toBeNull();
  });

  test("signing in from another site is refused", async () => {
    const response = await fetch(`${engine.url}/ui/session`, {
      method: "POST",
      headers: { "content-type": "application/json", origin: "https://evil.example", "sec-fetch-site": "cross-site" },
      body: JSON.stringify({ token: engine.adminToken }),
    });
    expect(response.status).toBe(403);
  });

  test.each([
    ["no CSRF header", { origin: "ORIGIN" }, 403],
    ["a wrong CSRF header", { origin: "ORIGIN", "x-engine-csrf": "wrong" }, 403],
    ["a cross-site Origin", { origin: "https://evil.example", "x-engine-csrf": "CSRF" }, 403],
    ["Sec-Fetch-Site cross-site", { "sec-fetch-site": "cross-site", "x-engine-csrf": "CSRF" }, 403],
    ["Sec-Fetch-Site same-site (another port or subdomain)", { "sec-fetch-site": "same-site", "x-engine-csrf": "CSRF" }, 403],
    ["the CSRF header from the same origin", { origin: "ORIGIN", "sec-fetch-site": "same-origin", "x-engine-csrf": "CSRF" }, 201],
  ])("a cookie POST with %s → %d", async (_label, headers, status) => {
    const { cookie, csrf } = await signIn(engine.adminToken);
    const sent: Record<string, string> = { "content-type": "application/json" };
    for (const [name, value] of Object.entries(headers)) sent[name] = value === "ORIGIN" ? engine.url : value === "CSRF" ? csrf : value;
    const response = await fetch(`${engine.url}/api/tokens`, {
      method: "POST",
      headers: withCookie(cookie, sent),
      body: JSON.stringify({ name: `csrf-${Math.random().toString(36).slice(2, 8)}`, role: "readonly" }),
    });
    expect(response.status).toBe(status);
    if (status === 403) expect(((await response.json()) as { error: { code: string } }).error.code).toBe("forbidden");
  });

  test("a cookie DELETE without the CSRF header is refused too", async () => {
    const { cookie } = await signIn(engine.adminToken);
    const target = await createToken(engine, { name: "csrf-target", role: "readonly" });
    const response = await fetch(`${engine.url}/api/tokens/${target.id}`, {
      method: "DELETE",
      headers: withCookie(cookie, { origin: engine.url }),
    });
    expect(response.status).toBe(403);
    expect(
      (await engine.json<{ revoked: boolean }[]>("GET", "/api/tokens")).body.find((t) => (t as { id?: string }).id === target.id)?.revoked,
    ).toBe(false);
  });

  test("bearer calls are unaffected by the CSRF rules, with or without a cookie", async () => {
    const { cookie } = await signIn(engine.adminToken);
    const response = await fetch(`${engine.url}/api/tokens`, {
      method: "POST",
      headers: withCookie(cookie, {
        authorization: `Bearer ${engine.adminToken}`,
        "content-type": "application/json",
        origin: "https://evil.example",
      }),
      body: JSON.stringify({ name: "bearer-with-cookie", role: "readonly" }),
    });
    expect(response.status).toBe(201);
  });

  test("revoking the token ends the sessions made from it", async () => {
    const admin2 = await createToken(engine, { name: "ui-admin-2", role: "admin" });
    const { cookie } = await signIn(admin2.secret);
    expect((await fetch(`${engine.url}/api/tokens`, { headers: withCookie(cookie) })).status).toBe(200);
    expect((await engine.call("DELETE", `/api/tokens/${admin2.id}`)).status).toBe(200);
    const after = await fetch(`${engine.url}/api/tokens`, { headers: withCookie(cookie) });
    expect(after.status).toBe(401);
  });

  test("signing out ends the session; it needs the CSRF token", async () => {
    const { cookie, csrf } = await signIn(engine.adminToken);
    const refused = await fetch(`${engine.url}/ui/session`, { method: "DELETE", headers: withCookie(cookie, { origin: engine.url }) });
    expect(refused.status).toBe(403);
    const out = await fetch(`${engine.url}/ui/session`, {
      method: "DELETE",
      headers: withCookie(cookie, { origin: engine.url, "x-engine-csrf": csrf }),
    });
    expect(out.status).toBe(200);
    expect(out.headers.get("set-cookie")).toContain("Max-Age=0");
    expect((await fetch(`${engine.url}/api/services`, { headers: withCookie(cookie) })).status).toBe(401);
  });

  test("a login link needs an admin, opens an admin session once, and is then spent", async () => {
    const readonly = await createToken(engine, { name: "ui-ro-link", role: "readonly" });
    expect((await engine.call("POST", "/api/ui/login-links", { token: readonly.secret })).status).toBe(403);
    expect((await engine.call("POST", "/api/ui/login-links", { token: null })).status).toBe(401);
    // Over the unix socket, as `engine ui` does.
    const minted = await fetch("http://engine/api/ui/login-links", { method: "POST", unix: engine.daemon.socketPath });
    expect(minted.status).toBe(201);
    const link = (await minted.json()) as { code: string; path: string; expires_at: string };
    expect(link.path).toBe(`/ui/login?code=${encodeURIComponent(link.code)}`);
    expect(Date.parse(link.expires_at)).toBeGreaterThan(Date.now());

    const first = await fetch(`${engine.url}${link.path}`, { redirect: "manual" });
    expect(first.status).toBe(303);
    expect(first.headers.get("location")).toBe("/");
    expect(first.headers.get("referrer-policy")).toBe("no-referrer");
    const cookie = /engine_ui_session=([^;]+)/.exec(first.headers.get("set-cookie") ?? "")?.[1] ?? "";
    const me = await fetch(`${engine.url}/ui/session`, { headers: withCookie(cookie) });
    expect(((await me.json()) as { role: string }).role).toBe("admin");

    const second = await fetch(`${engine.url}${link.path}`, { redirect: "manual" });
    expect(second.status).toBe(401);
    expect(second.headers.get("set-cookie")).toBeNull();
  });

  test("an unknown login code opens nothing and spends no real one", async () => {
    const minted = await fetch("http://engine/api/ui/login-links", { method: "POST", unix: engine.daemon.socketPath });
    const link = (await minted.json()) as { path: string };
    const unknown = await fetch(`${engine.url}/ui/login?code=eng_made_up_code`, { redirect: "manual" });
    expect(unknown.status).toBe(401);
    // The link itself still works: unknown codes do not spend real ones.
    expect((await fetch(`${engine.url}${link.path}`, { redirect: "manual" })).status).toBe(303);
  });
});

describe("UiSessions", () => {
  test("a login code expires after LOGIN_CODE_TTL_MS and a session after SESSION_TTL_MS", () => {
    let now = 1_000_000;
    const sessions = new UiSessions({} as TokenStore, () => now);
    const late = sessions.mintLoginCode();
    now += LOGIN_CODE_TTL_MS + 1;
    expect(() => sessions.redeemLoginCode(late.code)).toThrow(/expired/);
    const fresh = sessions.mintLoginCode();
    const opened = sessions.redeemLoginCode(fresh.code);
    expect(sessions.resolve(opened.cookie).principal.role).toBe("admin");
    now += SESSION_TTL_MS + 1;
    expect(() => sessions.resolve(opened.cookie)).toThrow(/ended/);
  });
});
