import { afterAll, beforeAll, expect, test } from "bun:test";
import { describeEachDialect, startTestCloud, type TestCloud } from "../helpers";

/**
 * A cookie-authenticated state change must carry `X-Engine-CSRF: 1` and, when it names an
 * Origin, the console's own; bearer-token calls, safe methods and cookie-less calls are not
 * affected.
 */
describeEachDialect("CSRF protection of cookie sessions", (dialect) => {
  let cloud: TestCloud;
  let token: string;
  let origin: string;
  const cookie = () => `engine_session=${token}`;
  beforeAll(async () => {
    cloud = await startTestCloud(dialect);
    ({ token } = await cloud.signIn("ada@example.com"));
    origin = new URL(cloud.deps.site.publicUrl).origin;
  });
  afterAll(async () => {
    await cloud?.close();
  });

  test.each([
    ["cookie, no header", () => ({ cookie: cookie() }), 403],
    ["cookie, header 0", () => ({ cookie: cookie(), "x-engine-csrf": "0" }), 403],
    ["cookie, header, another Origin", () => ({ cookie: cookie(), "x-engine-csrf": "1", origin: "https://evil.example" }), 403],
    ["cookie, header, Origin null", () => ({ cookie: cookie(), "x-engine-csrf": "1", origin: "null" }), 403],
    ["cookie, header, no Origin", () => ({ cookie: cookie(), "x-engine-csrf": "1" }), 201],
    ["cookie, header, own Origin", () => ({ cookie: cookie(), "x-engine-csrf": "1", origin }), 201],
    ["bearer token, no header", () => ({ authorization: `Bearer ${token}` }), 201],
    ["bearer token and cookie, no header", () => ({ authorization: `Bearer ${token}`, cookie: cookie() }), 201],
    ["another cookie only", () => ({ cookie: "theme=dark" }), 401],
  ])("POST /api/link/codes with %s answers %d", async (_name, headers, status) => {
    const answer = await cloud.api("POST", "/api/link/codes", { body: {}, headers: headers() });
    expect(answer.status).toBe(status);
    if (status === 403) expect(answer.body.error.code).toBe("csrf_rejected");
  });

  test("the check runs before the route: a forged revoke or logout-all changes nothing", async () => {
    const minted = await cloud.api("POST", "/api/preauth-keys", { body: {}, token });
    expect(minted.status).toBe(201);
    const forged = await cloud.api("DELETE", `/api/preauth-keys/${minted.body.id}`, { headers: { cookie: cookie() } });
    expect(forged.status).toBe(403);
    const forgedLogout = await cloud.api("POST", "/api/auth/logout-all", { headers: { cookie: cookie(), origin: "https://evil.example" } });
    expect(forgedLogout.status).toBe(403);
    const listed = await cloud.api("GET", "/api/preauth-keys", { headers: { cookie: cookie() } });
    expect(listed.status).toBe(200);
    expect(listed.body.keys.find((key: { id: string }) => key.id === minted.body.id).revoked).toBe(false);
    const revoked = await cloud.api("DELETE", `/api/preauth-keys/${minted.body.id}`, {
      headers: { cookie: cookie(), "x-engine-csrf": "1", origin },
    });
    expect(revoked.status).toBe(204);
  });

  test("safe methods, and routes that never act as a session, need no header even with the cookie", async () => {
    expect((await cloud.api("GET", "/api/auth/session", { headers: { cookie: cookie() } })).status).toBe(200);
    const device = await cloud.api("POST", "/api/link/device", {
      body: { hostname: "box", os: "linux", version: "1" },
      headers: { cookie: cookie(), origin: "https://evil.example" },
    });
    expect(device.status).toBe(201);
    // Logout answers 204 in every case (the contract lists no other status).
    const other = await cloud.signIn("grace@example.com");
    const logout = await cloud.api("POST", "/api/auth/logout", { headers: { cookie: `engine_session=${other.token}` } });
    expect(logout.status).toBe(204);
  });
});
