import { afterAll, beforeAll, expect, test } from "bun:test";
import { describeEachDialect, startTestCloud, type TestCloud } from "../helpers";

describeEachDialect("GET /api/nodes", (dialect) => {
  let cloud: TestCloud;
  beforeAll(async () => {
    cloud = await startTestCloud(dialect);
  });
  afterAll(async () => {
    await cloud?.close();
  });

  test("401 without a session", async () => {
    const answer = await cloud.api("GET", "/api/nodes");
    expect(answer.status).toBe(401);
    expect(answer.body.error.code).toBe("unauthenticated");
  });

  test("lists only the caller's nodes, oldest first, never a credential", async () => {
    const ada = await cloud.signIn("ada@example.com");
    const grace = await cloud.signIn("grace@example.com");
    expect((await cloud.api("GET", "/api/nodes", { token: ada.token })).body).toEqual({ nodes: [] });
    for (const hostname of ["alpha.lan", "beta.lan"]) {
      const code = await cloud.api("POST", "/api/link/codes", { body: {}, token: ada.token });
      const claimed = await cloud.api("POST", "/api/link/claim", {
        body: { code: code.body.code, hostname, os: "linux", version: "0.1.0" },
      });
      expect(claimed.status).toBe(200);
    }
    const listed = await cloud.api("GET", "/api/nodes", { token: ada.token });
    expect(listed.status).toBe(200);
    expect(listed.body.nodes.map((node: { slug: string }) => node.slug)).toEqual(["alpha", "beta"]);
    // Never connected: offline, never seen, no GPUs reported (the relay fills these in; test/cloud/relay).
    expect(listed.body.nodes[0]).toMatchObject({
      hostname: "alpha.lan",
      os: "linux",
      version: "0.1.0",
      enrolled_via: "link_code",
      online: false,
      online_since: null,
      last_seen_at: null,
      gpus: null,
    });
    expect(Object.keys(listed.body.nodes[0]).sort()).toEqual(
      ["created_at", "enrolled_via", "gpus", "hostname", "id", "last_seen_at", "online", "online_since", "os", "slug", "version"].sort(),
    );
    expect(JSON.stringify(listed.body)).not.toContain("enc_");
    expect((await cloud.api("GET", "/api/nodes", { token: grace.token })).body).toEqual({ nodes: [] });
  });
});
