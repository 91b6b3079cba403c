import { afterAll, beforeAll, expect, test } from "bun:test";
import { IdentityStore } from "../../../src/engine/link";
import { startTestEngine, type TestEngine } from "../../helpers";

let engine: TestEngine;
beforeAll(async () => {
  engine = await startTestEngine();
});
afterAll(() => engine.close());

test("GET /api/link/status says unlinked, then names the node once an identity exists, never its credential", async () => {
  const before = await engine.json<{ linked: boolean; node_id: string | null }>("GET", "/api/link/status");
  expect(before.status).toBe(200);
  expect(before.body).toMatchObject({ linked: false, node_id: null });

  new IdentityStore(engine.dataDir).save({
    node_id: "node_123",
    slug: "ada-box",
    account_id: "acct_9",
    node_credential: "enc_theNodeCredentialNeverShown",
    cloud_url: "https://cloud.example",
    hosted_base_domain: "ada-box.example.net",
  });
  const after = await engine.call("GET", "/api/link/status");
  expect(after.status).toBe(200);
  const text = await after.text();
  expect(JSON.parse(text)).toMatchObject({ linked: true, node_id: "node_123", slug: "ada-box", cloud_url: "https://cloud.example" });
  expect(text).not.toContain("theNodeCredentialNeverShown");
});
