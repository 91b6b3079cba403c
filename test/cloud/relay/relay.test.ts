import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { Diagnosis, LinkStatus, ServiceRecord } from "../../../src/contract/engine";
import { TOOLS } from "../../../src/engine/mcp";
import { connectHttp, ERAS, structured, toolError } from "../../engine/mcp/harness";
import { eventually, runCli, startTestEngine, type TestEngine } from "../../helpers";
import { startTestCloud, type TestCloud } from "../helpers";
import { FixtureVerifier } from "./fixture-verifier";

/**
 * The relay end to end, in process: a real console and a real engine linked by `engine link
 * --key` as a user links one; the engine's tunnel connects, the console lists the node online
 * with its version and GPUs, and an assistant (the SDK v2 client, with a token the fixture
 * verifier stands behind) reaches the engine's tools through the console's /mcp.
 */

const TUNNEL = { heartbeatMs: 100, deadAfterMs: 1500, backoff: { baseMs: 50, maxMs: 400 }, stableMs: 60_000, unlinkedPollMs: 100 };

const verifier = new FixtureVerifier();
let cloud: TestCloud;
let engine: TestEngine;
let session: string;
let accountId: string;
let resource: string;

async function mintKey(): Promise<string> {
  const answer = await cloud.api("POST", "/api/preauth-keys", { token: session, body: { max_uses: 5 } });
  expect(answer.status).toBe(201);
  return answer.body.key as string;
}

async function linkStatus(target = engine): Promise<LinkStatus> {
  const answer = await target.json<LinkStatus>("GET", "/api/link/status");
  expect(answer.status).toBe(200);
  return answer.body;
}

async function nodesOf(): Promise<
  { id: string; slug: string; online: boolean; version: string; last_seen_at: string | null; gpus: { name: string }[] | null }[]
> {
  const answer = await cloud.api("GET", "/api/nodes", { token: session });
  expect(answer.status).toBe(200);
  return answer.body.nodes;
}

beforeAll(async () => {
  cloud = await startTestCloud("sqlite", {}, { verifyAccessToken: verifier.verify, relay: { deadAfterMs: 1500, callTimeoutMs: 15_000 } });
  resource = `${cloud.deps.site.publicUrl}/mcp`;
  ({ token: session, accountId } = await cloud.signIn("ada@example.com"));
  engine = await startTestEngine({ gpus: "2x24576", logLevel: "debug" }, { tunnel: TUNNEL });
  const linked = await runCli(["--data-dir", engine.dataDir, "link", "--cloud", cloud.url, "--key", await mintKey()]);
  expect(linked.stderr).toBe("");
  expect(linked.code).toBe(0);
  await eventually(async () => (await linkStatus()).tunnel.state === "connected", { timeoutMs: 20_000 });
  const deployed = await engine.json("POST", "/api/services", { body: { name: "sleeper", command: "exec sleep 300" } });
  expect(deployed.status).toBe(201);
  await eventually(async () => (await engine.json<ServiceRecord>("GET", "/api/services/sleeper")).body.status === "running", {
    timeoutMs: 20_000,
  });
}, 60_000);

afterAll(async () => {
  await engine?.close();
  await cloud?.close();
});

describe("the tunnel", () => {
  test("a linked engine connects; the console lists its node online with the engine's version and GPUs", async () => {
    const status = await linkStatus();
    expect(status.tunnel).toMatchObject({ state: "connected", url: `${cloud.url.replace("http", "ws")}/link/tunnel` });
    expect(status.tunnel.connected_at).not.toBeNull();
    const [node] = await nodesOf();
    expect(node).toMatchObject({
      slug: status.slug,
      online: true,
      version: (await engine.json<{ version: string }>("GET", "/api/health")).body.version,
    });
    expect(node?.gpus?.length).toBe(2);
    expect(node?.last_seen_at).not.toBeNull();
  });
});

describe.each(ERAS)("an assistant through the console's /mcp, protocol %s", (era) => {
  test("lists the engine's tools with a node argument, and list_machines", async () => {
    const { token } = verifier.issue({ accountId, scopes: ["engine:read"] }, resource);
    const assistant = await connectHttp(cloud.url, token, era);
    try {
      const { tools } = await assistant.client.listTools();
      expect(tools.map((tool) => tool.name)).toEqual(["list_machines", ...TOOLS.map((tool) => tool.name)]);
      const diagnose = tools.find((tool) => tool.name === "diagnose");
      expect(Object.keys(diagnose?.inputSchema.properties ?? {})).toContain("node");
      const machines = structured<{ machines: { name: string; online: boolean }[] }>(
        await assistant.client.callTool({ name: "list_machines", arguments: {} }),
      );
      expect(machines.machines).toEqual([expect.objectContaining({ online: true })]);
    } finally {
      await assistant.close();
    }
  });

  test("list_services and diagnose run on the engine through the relay", async () => {
    const { token } = verifier.issue({ accountId, scopes: ["engine:read"] }, resource);
    const assistant = await connectHttp(cloud.url, token, era);
    try {
      const listed = structured<{ services: ServiceRecord[] }>(await assistant.client.callTool({ name: "list_services", arguments: {} }));
      expect(listed.services.map((service) => service.name)).toContain("sleeper");
      const diagnosed = structured<{ cause: string; service: string; diagnosis: Diagnosis }>(
        await assistant.client.callTool({ name: "diagnose", arguments: { service: "sleeper" } }),
      );
      expect(diagnosed.service).toBe("sleeper");
      expect(diagnosed.cause.length).toBeGreaterThan(0);
    } finally {
      await assistant.close();
    }
  });
});

test("the engine's logs never carry the assistant's token", async () => {
  const text = readFileSync(join(engine.dataDir, "engine.log"), "utf8");
  expect(verifier.seen.length).toBeGreaterThan(0);
  for (const token of verifier.seen) expect(text).not.toContain(token);
  expect(toolError).toBeDefined();
});
