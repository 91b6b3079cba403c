import { afterAll, beforeAll, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { eventually, runCli, type SpawnedEngine, spawnEngine, tempDir } from "../helpers";
import { type Binaries, buildBinaries } from "./binaries";
import { Children, cloudListening, mintSession, type Running } from "./processes";

/**
 * The relay between the compiled binaries: a `dist/engine` linked to a `dist/engine-cloud`
 * opens its tunnel, the console lists it online, and stopping the engine shows it offline. The
 * console's /mcp answers as the resource server; with no authorization server wired into the
 * binary yet, it refuses every token and says why (test/cloud/relay runs the assistants' calls
 * through the relay with a fixture verifier).
 */

const children = new Children();
let binaries: Binaries;
let workDir: string;
let cloud: Running;
let cloudUrl: string;
let session: string;
let engine: SpawnedEngine | undefined;

async function nodes(): Promise<{ slug: string; online: boolean; version: string; last_seen_at: string | null }[]> {
  const response = await fetch(`${cloudUrl}/api/nodes`, { headers: { authorization: `Bearer ${session}` } });
  expect(response.status).toBe(200);
  return ((await response.json()) as { nodes: never[] }).nodes;
}

beforeAll(async () => {
  binaries = await buildBinaries();
  workDir = tempDir("engine-e2e-relay-");
  const cloudDir = join(workDir, "cloud");
  cloud = children.start([binaries.cloud, "--data-dir", cloudDir, "serve", "--port", "0", "--log-level", "info"]);
  cloudUrl = await cloudListening(cloud);
  session = await mintSession(binaries.cloud, cloudDir, "--email", "relay@example.com", "--create");
}, 240_000);

afterAll(async () => {
  await engine?.stop();
  await children.stopAll();
  if (workDir) rmSync(workDir, { recursive: true, force: true });
});

test("a linked engine's tunnel connects; the console lists it online, and offline once the engine stops", async () => {
  const dataDir = join(workDir, "engine");
  const key = await fetch(`${cloudUrl}/api/preauth-keys`, {
    method: "POST",
    headers: { authorization: `Bearer ${session}`, "content-type": "application/json" },
    body: "{}",
  });
  expect(key.status).toBe(201);
  const linked = await runCli(
    ["--data-dir", dataDir, "link", "--cloud", cloudUrl, "--key", ((await key.json()) as { key: string }).key],
    {},
    [binaries.engine],
  );
  expect(linked.code).toBe(0);
  engine = await spawnEngine(dataDir, { command: [binaries.engine] });
  const status = await eventually(
    async () => {
      const shown = await runCli(["--data-dir", dataDir, "link", "status", "--json"], {}, [binaries.engine]);
      const value = JSON.parse(shown.stdout) as { tunnel: { state: string } };
      return value.tunnel.state === "connected" ? value : null;
    },
    { timeoutMs: 30_000 },
  );
  expect(status).toMatchObject({ linked: true, tunnel: { state: "connected", last_error: null } });
  const [node] = await nodes();
  expect(node).toMatchObject({ online: true });

  await engine.stop();
  engine = undefined;
  const offline = await eventually(async () => (await nodes()).find((row) => !row.online), { timeoutMs: 15_000 });
  expect(offline.last_seen_at).not.toBeNull();
});

test("the console's /mcp is a resource server: RFC 9728 metadata, and a token its authorization server did not issue is refused", async () => {
  const metadata = await fetch(`${cloudUrl}/.well-known/oauth-protected-resource/mcp`);
  expect(metadata.status).toBe(200);
  expect(await metadata.json()).toMatchObject({ resource: `${cloudUrl}/mcp`, authorization_servers: [cloudUrl] });
  const bare = await fetch(`${cloudUrl}/mcp`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
  expect(bare.status).toBe(401);
  expect(bare.headers.get("www-authenticate")).toBe(`Bearer resource_metadata="${cloudUrl}/.well-known/oauth-protected-resource/mcp"`);
  const refused = await fetch(`${cloudUrl}/mcp`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: "Bearer some-token" },
    body: "{}",
  });
  expect(refused.status).toBe(401);
  expect(refused.headers.get("www-authenticate")).toContain('error="invalid_token"');
});
