import { afterAll, beforeAll, expect, test } from "bun:test";
import { describeEachDialect, startTestCloud, type TestCloud } from "../helpers";

describeEachDialect("console basics", (dialect) => {
  let cloud: TestCloud;
  beforeAll(async () => {
    cloud = await startTestCloud(dialect);
  });
  afterAll(async () => {
    await cloud?.close();
  });

  test("health touches nothing and ready reports the database of this role", async () => {
    const health = await cloud.api("GET", "/api/health");
    expect(health.status).toBe(200);
    expect(health.body.status).toBe("ok");
    for (const value of Object.values(health.body)) expect(typeof value === "string" || typeof value === "object").toBe(true);
    const ready = await cloud.api("GET", "/api/ready");
    expect(ready.status).toBe(200);
    expect(ready.body).toMatchObject({ ready: true, database: true, role: "all", dialect });
  });

  test("the two boundaries answer 501 with the error envelope", async () => {
    for (const path of ["/api/auth", "/api/link"]) {
      const answer = await cloud.api("GET", path);
      expect(answer.status).toBe(501);
      expect(answer.body.error.code).toBe("not_supported");
      expect(answer.body.error.request_id).toBe(answer.headers.get("x-request-id") as string);
    }
  });

  test("link metadata is static, cacheable and publishes only the hosted base domain", async () => {
    const first = await fetch(`${cloud.url}/api/link/metadata`);
    expect(first.status).toBe(200);
    expect(await first.json()).toEqual({ hosted_base_domain: "hosted.localhost" });
    expect(first.headers.get("cache-control")).toContain("max-age");
    const etag = first.headers.get("etag") as string;
    expect(etag).toBeTruthy();
    const again = await fetch(`${cloud.url}/api/link/metadata`, { headers: { "if-none-match": etag } });
    expect(again.status).toBe(304);
    // No rate limiter: a burst far past any bucket is served.
    const burst = await Promise.all(Array.from({ length: 100 }, () => fetch(`${cloud.url}/api/link/metadata`).then((r) => r.status)));
    expect(new Set(burst)).toEqual(new Set([200]));
  });

  test("session routes answer 401 without a session, and show it with one", async () => {
    expect((await cloud.api("GET", "/api/auth/session")).status).toBe(401);
    expect((await cloud.api("GET", "/api/auth/session", { token: "ecs_not-a-real-token" })).status).toBe(401);
    expect((await cloud.api("POST", "/api/auth/logout-all")).status).toBe(401);
    const { token, accountId } = await cloud.signIn("ada@example.com");
    const session = await cloud.api("GET", "/api/auth/session", { token });
    expect(session.status).toBe(200);
    expect(session.body.account).toMatchObject({ id: accountId, email: "ada@example.com", standing: "active" });
    const viaCookie = await cloud.api("GET", "/api/auth/session", { headers: { cookie: `engine_session=${token}` } });
    expect(viaCookie.status).toBe(200);
    // A cookie that is not validly percent-encoded is no credential: 401, never a 500.
    const malformed = await cloud.api("GET", "/api/auth/session", { headers: { cookie: "engine_session=%E0%A4%A" } });
    expect(malformed.status).toBe(401);
  });

  test("logout ends this session and answers 204 always; logout-all ends every session and counts them", async () => {
    expect((await cloud.api("POST", "/api/auth/logout")).status).toBe(204);
    const one = await cloud.signIn("grace@example.com");
    const two = await cloud.signIn("grace@example.com");
    const three = await cloud.signIn("grace@example.com");
    const other = await cloud.signIn("alan@example.com");
    const logout = await cloud.api("POST", "/api/auth/logout", { token: one.token });
    expect(logout.status).toBe(204);
    expect(logout.headers.get("set-cookie")).toContain("Max-Age=0");
    expect((await cloud.api("GET", "/api/auth/session", { token: one.token })).status).toBe(401);
    const all = await cloud.api("POST", "/api/auth/logout-all", { token: two.token });
    expect(all.status).toBe(200);
    expect(all.body).toEqual({ ended: 2 });
    expect((await cloud.api("GET", "/api/auth/session", { token: three.token })).status).toBe(401);
    expect((await cloud.api("GET", "/api/auth/session", { token: other.token })).status).toBe(200);
  });

  test("an unknown route is a 404 envelope and a non-object body a 422", async () => {
    const missing = await cloud.api("GET", "/api/nope");
    expect(missing.status).toBe(404);
    expect(missing.body.error.code).toBe("not_found");
    const { token } = await cloud.signIn("ada@example.com");
    const post = (path: string) =>
      fetch(`${cloud.url}${path}`, {
        method: "POST",
        headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
        body: "[1,2]",
      });
    const bad = await post("/api/link/codes");
    expect(bad.status).toBe(422);
    expect((await bad.json()).detail[0]).toMatchObject({ loc: ["body"], type: "dict_type" });
    // A route that takes no body ignores one, and answers from its own list (logout-all lists 401 only).
    expect((await post("/api/auth/logout-all")).status).toBe(200);
  });

  test("the OpenAPI document lists the routes", async () => {
    const doc = await cloud.api("GET", "/api/openapi.json");
    expect(doc.status).toBe(200);
    expect(Object.keys(doc.body.paths)).toEqual(
      expect.arrayContaining(["/api/health", "/api/ready", "/api/link/metadata", "/api/auth/session"]),
    );
  });
});
