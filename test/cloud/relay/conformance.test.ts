import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import type { LinkStatus } from "../../../src/contract/engine";
import { CloudLinkClient, IdentityStore } from "../../../src/engine/link";
import { VERSION } from "../../../src/lib/version";
import { expectServerScenarios, startTokenProxy } from "../../conformance";
import { eventually, startTestEngine, type TestEngine, tempDir } from "../../helpers";
import { startTestCloud, type TestCloud } from "../helpers";
import { assistantDriver, authorized, CLAUDE } from "../oauth/helpers";

/**
 * The official MCP conformance suite's server scenarios (the pinned 0.1.x, protocol 2025-11-25)
 * against the console's `/mcp`: a real console on port 0 with a linked engine, and an
 * `engine:operate` token the console's own authorization server issued (PKCE authorization as
 * the pre-registered Claude client, the consent decision, the code exchanged). The suite's
 * `--url` takes no header, so it talks to the same token-adding loopback proxy as the engine's
 * test (test/conformance.ts), which stands where a reverse proxy stands in front of a console:
 * the console's public URL is the proxy's, so the audience of the token, the resource metadata
 * and the Origin the console accepts are the proxy's, as they are a deployment's public origin.
 * Each check is compared with conformance-baseline.json beside this file. Decision 280.
 */
const TUNNEL_TIMINGS = { heartbeatMs: 100, deadAfterMs: 1500, backoff: { baseMs: 50, maxMs: 400 }, stableMs: 60_000, unlinkedPollMs: 100 };

let proxy: ReturnType<typeof Bun.serve>;
let cloud: TestCloud;
let engine: TestEngine;
/** token is the assistant's access token, issued once the console is up; the proxy reads it at each request. */
let token = "";
let outputDir: string;

beforeAll(async () => {
  // The proxy first: its address is the console's public URL.
  proxy = startTokenProxy(
    () => cloud.url,
    () => token,
  );
  cloud = await startTestCloud("sqlite", { publicUrl: `http://127.0.0.1:${proxy.port}` });
  const { token: session } = await cloud.signIn("ada@example.com", { remoteLink: true });

  // A linked engine, enrolled with a key the account minted. Its tunnel goes to the console
  // directly (the proxy forwards HTTP only), as an engine inside the deployment's network would.
  engine = await startTestEngine({}, { tunnel: TUNNEL_TIMINGS });
  const minted = await cloud.api("POST", "/api/preauth-keys", { token: session, body: { max_uses: 1 } });
  expect(minted.status).toBe(201);
  const claim = await new CloudLinkClient({ cloudUrl: cloud.url }).enrollWithKey(minted.body.key as string, {
    hostname: "conformance-box",
    os: "linux",
    version: VERSION,
  });
  new IdentityStore(engine.dataDir).save({ ...claim, cloud_url: cloud.url });
  await eventually(async () => (await engine.json<LinkStatus>("GET", "/api/link/status")).body.tunnel.state === "connected", {
    timeoutMs: 20_000,
  });
  const deployed = await engine.json("POST", "/api/services", { body: { name: "sleeper", command: "exec sleep 300" } });
  expect(deployed.status).toBe(201);

  const { tokens } = await authorized(assistantDriver(cloud), session, {
    ...CLAUDE,
    scope: "engine:operate",
    decision: { access: "operate" },
  });
  token = tokens.access_token as string;
  outputDir = tempDir("cloud-mcp-conformance-");
}, 60_000);

afterAll(async () => {
  proxy?.stop(true);
  await engine?.close();
  await cloud?.close();
  if (outputDir) rmSync(outputDir, { recursive: true, force: true });
});

describe("the MCP conformance suite against the console's /mcp", () => {
  test("the console's /mcp wants the token the proxy adds, and takes it", async () => {
    const direct = await fetch(`${cloud.url}/mcp`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    expect(direct.status).toBe(401);
    await direct.body?.cancel();
    const metadata = await fetch(`http://127.0.0.1:${proxy.port}/.well-known/oauth-protected-resource/mcp`);
    expect(((await metadata.json()) as { resource: string }).resource).toBe(`http://127.0.0.1:${proxy.port}/mcp`);
  });

  test("every server scenario answers what the baseline records", async () => {
    await expectServerScenarios(`http://127.0.0.1:${proxy.port}/mcp`, "test/cloud/relay/conformance-baseline.json", outputDir);
  }, 150_000);
});
