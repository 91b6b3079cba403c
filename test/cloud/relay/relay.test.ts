import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { resolveCloudConfig } from "../../../src/cloud/config";
import type { AssistantScope } from "../../../src/cloud/oauth/grant";
import { type RunningCloud, startCloud } from "../../../src/cloud/server";
import type { Diagnosis, LinkStatus, ServiceRecord } from "../../../src/contract/engine";
import type { RelayAssertion } from "../../../src/contract/relay";
import { CloudLinkClient, IdentityStore, openTunnelSocket } from "../../../src/engine/link";
import { TOOLS } from "../../../src/engine/mcp";
import { createLogger } from "../../../src/lib/logger";
import { VERSION } from "../../../src/lib/version";
import { connectHttp, ERAS, structured, toolError } from "../../engine/mcp/harness";
import { parseExposition, seriesValue } from "../../engine/metrics/exposition";
import { eventually, runCli, startTestEngine, type TestEngine } from "../../helpers";
import { startTestCloud, type TestCloud } from "../helpers";
import { FixtureVerifier } from "./fixture-verifier";

/**
 * The relay end to end, in process: a real console and real engines linked as users link them;
 * each engine's tunnel connects, the console lists the nodes online with version and GPUs, and
 * an assistant (the SDK v2 client, with a token the TEST-ONLY fixture verifier stands behind:
 * the authorization server is another slice) reaches the engines' tools through the console's
 * /mcp, within what its grant allows.
 */

const TUNNEL_TIMINGS = { heartbeatMs: 100, deadAfterMs: 1500, backoff: { baseMs: 50, maxMs: 400 }, stableMs: 60_000, unlinkedPollMs: 100 };
const RELAY_TIMINGS = { deadAfterMs: 1500, callTimeoutMs: 15_000 };

const verifier = new FixtureVerifier();
/** frames are every tunnel message the first engine received: the assistant's token must be in none. */
const frames: string[] = [];
let cloud: TestCloud;
/** restarted is the console after the restart test; its stop is what afterAll calls. */
let restarted: RunningCloud | undefined;
let engine: TestEngine;
let second: TestEngine | undefined;
let session: string;
let accountId: string;
let resource: string;
let nodeId: string;

async function mintKey(): Promise<string> {
  const answer = await cloud.api("POST", "/api/preauth-keys", { token: session, body: { max_uses: 5 } });
  expect(answer.status).toBe(201);
  return answer.body.key as string;
}

async function linkStatus(target: TestEngine = engine): Promise<LinkStatus> {
  const answer = await target.json<LinkStatus>("GET", "/api/link/status");
  expect(answer.status).toBe(200);
  return answer.body;
}

interface NodeRow {
  id: string;
  slug: string;
  online: boolean;
  online_since: string | null;
  version: string;
  last_seen_at: string | null;
  gpus: { index: number; name: string; memory_total_mb: number; mig_profile: string | null }[] | null;
}

async function nodes(): Promise<NodeRow[]> {
  const answer = await cloud.api("GET", "/api/nodes", { token: session });
  expect(answer.status).toBe(200);
  return answer.body.nodes;
}

const tokenFor = (scopes: AssistantScope[], nodeIds: string[] | null = null) =>
  verifier.issue({ accountId, scopes, nodeIds }, resource).token;

function assertionFor(scopes: string[], changes: Partial<RelayAssertion> = {}): RelayAssertion {
  return {
    account_id: accountId,
    node_id: nodeId,
    client_id: "https://claude.ai/oauth/mcp-oauth-client-metadata",
    grant_id: "grant_direct",
    scopes,
    expires_at: new Date(Date.now() + 3600_000).toISOString(),
    ...changes,
  };
}

/** modernCall posts one 2026-07-28 tools/call to the console's /mcp, as a client on the wire does. */
function modernCall(token: string, name: string, args: Record<string, unknown>, headers: Record<string, string> = {}) {
  const meta = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": { name: "raw", version: "1" },
    "io.modelcontextprotocol/clientCapabilities": {},
  };
  return fetch(`${cloud.url}/mcp`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${token}`,
      "content-type": "application/json",
      accept: "application/json, text/event-stream",
      "mcp-protocol-version": "2026-07-28",
      "mcp-method": "tools/call",
      "mcp-name": name,
      ...headers,
    },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/call", params: { name, arguments: args, _meta: meta } }),
  });
}

async function serviceStatus(name: string, target: TestEngine = engine): Promise<string> {
  return (await target.json<ServiceRecord>("GET", `/api/services/${name}`)).body.status;
}

beforeAll(async () => {
  cloud = await startTestCloud("sqlite", {}, { verifyAccessToken: verifier.verify, relay: RELAY_TIMINGS });
  resource = `${cloud.deps.site.publicUrl}/mcp`;
  ({ token: session, accountId } = await cloud.signIn("ada@example.com"));
  engine = await startTestEngine(
    { gpus: "2x24576", logLevel: "debug" },
    {
      tunnel: {
        ...TUNNEL_TIMINGS,
        open: (url, headers) => {
          const socket = openTunnelSocket(url, headers);
          socket.addEventListener("message", (event: MessageEvent) => frames.push(String(event.data)));
          return socket;
        },
      },
    },
  );
  // Linked as a user links it: `engine link --key` writes the identity; the running daemon notices.
  const linked = await runCli(["--data-dir", engine.dataDir, "link", "--cloud", cloud.url, "--key", await mintKey()]);
  expect(linked.stderr).toBe("");
  expect(linked.code).toBe(0);
  await eventually(async () => (await linkStatus()).tunnel.state === "connected", { timeoutMs: 20_000 });
  nodeId = (await linkStatus()).node_id ?? "";
  const deployed = await engine.json("POST", "/api/services", { body: { name: "sleeper", command: "exec sleep 300" } });
  expect(deployed.status).toBe(201);
  await eventually(async () => (await serviceStatus("sleeper")) === "running", { timeoutMs: 20_000 });
}, 60_000);

afterAll(async () => {
  await second?.close();
  await engine?.close();
  await restarted?.stop();
  await cloud?.close();
});

describe("the tunnel", () => {
  test("a linked engine connects; the console lists its node online with the engine's version and GPUs", async () => {
    const status = await linkStatus();
    expect(status.tunnel).toMatchObject({ state: "connected", url: `${cloud.url.replace("http", "ws")}/link/tunnel` });
    expect(status.tunnel.connected_at).not.toBeNull();
    const [node] = await nodes();
    expect(node).toMatchObject({ id: nodeId, slug: status.slug ?? "", online: true, version: VERSION });
    expect(node?.online_since).not.toBeNull();
    expect(node?.last_seen_at).not.toBeNull();
    expect(node?.gpus).toEqual([
      { index: 0, name: expect.any(String), memory_total_mb: 24576, mig_profile: null },
      { index: 1, name: expect.any(String), memory_total_mb: 24576, mig_profile: null },
    ]);
    // The console's /metrics counts it online from the open tunnel (a loopback scrape needs no token).
    const scrape = parseExposition(await (await fetch(`${cloud.url}/metrics`)).text());
    expect(seriesValue(scrape, "engine_cloud_nodes_online")).toBe(1);
  });

  test("`engine link status` shows the tunnel as the running engine sees it", async () => {
    const json = await runCli(["--data-dir", engine.dataDir, "link", "status", "--json"]);
    expect(json.code).toBe(0);
    expect(JSON.parse(json.stdout)).toMatchObject({ linked: true, node_id: nodeId, tunnel: { state: "connected", last_error: null } });
    const human = await runCli(["--data-dir", engine.dataDir, "link", "status"]);
    expect(human.stdout).toMatch(/tunnel\s+connected since \d{4}-/);
  });

  test("the console refuses a tunnel without a valid node credential before upgrading, and a request that is not an upgrade", async () => {
    const bare = await fetch(`${cloud.url}/link/tunnel`);
    expect(bare.status).toBe(426);
    const refused = await fetch(`${cloud.url}/link/tunnel`, {
      headers: {
        upgrade: "websocket",
        connection: "Upgrade",
        "sec-websocket-version": "13",
        "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
        authorization: "Bearer enc_invented",
      },
    });
    expect(refused.status).toBe(401);
    expect(((await refused.json()) as { error: { code: string } }).error.code).toBe("invalid_session");
  });
});

describe.each(ERAS)("an assistant through the console's /mcp, protocol %s", (era) => {
  test("lists list_machines and the engine's own tools, each with a node argument", async () => {
    const assistant = await connectHttp(cloud.url, tokenFor(["engine:read"]), era);
    try {
      const { tools } = await assistant.client.listTools();
      expect(tools.map((tool) => tool.name)).toEqual(["list_machines", ...TOOLS.map((tool) => tool.name)]);
      const stop = tools.find((tool) => tool.name === "stop_service");
      expect(Object.keys(stop?.inputSchema.properties ?? {})).toEqual(expect.arrayContaining(["service", "node"]));
      expect(stop?.annotations).toMatchObject({ readOnlyHint: false, destructiveHint: true });
      const machines = structured<{ machines: { id: string; online: boolean; version: string }[] }>(
        await assistant.client.callTool({ name: "list_machines", arguments: {} }),
      );
      expect(machines.machines).toEqual([expect.objectContaining({ id: nodeId, online: true, version: VERSION })]);
    } finally {
      await assistant.close();
    }
  });

  test("list_services and diagnose run on the engine through the relay", async () => {
    const assistant = await connectHttp(cloud.url, tokenFor(["engine:read"]), era);
    try {
      const listed = structured<{ services: ServiceRecord[] }>(await assistant.client.callTool({ name: "list_services", arguments: {} }));
      expect(listed.services.map((service) => service.name)).toEqual(["sleeper"]);
      const diagnosed = structured<{ cause: string; service: string; diagnosis: Diagnosis }>(
        await assistant.client.callTool({ name: "diagnose", arguments: { service: "sleeper", node: nodeId } }),
      );
      expect(diagnosed.service).toBe("sleeper");
      expect(diagnosed.cause.length).toBeGreaterThan(0);
      // The engine's own refusals come back as they are.
      const missing = toolError(await assistant.client.callTool({ name: "diagnose", arguments: { service: "nope" } }));
      expect(missing).toMatchObject({ status: 404 });
    } finally {
      await assistant.close();
    }
  });

  test("a read-only grant cannot stop a service: the call is refused before it reaches the engine", async () => {
    const assistant = await connectHttp(cloud.url, tokenFor(["engine:read"]), era);
    try {
      await expect(assistant.client.callTool({ name: "stop_service", arguments: { service: "sleeper" } })).rejects.toThrow();
    } finally {
      await assistant.close();
    }
    expect(await serviceStatus("sleeper")).toBe("running");
  });
});

describe("scopes", () => {
  test("a write tool with only engine:read answers 403 insufficient_scope with the step-up challenge", async () => {
    const response = await modernCall(tokenFor(["engine:read"]), "stop_service", { service: "sleeper" });
    expect(response.status).toBe(403);
    const challenge = response.headers.get("www-authenticate") ?? "";
    expect(challenge).toStartWith('Bearer error="insufficient_scope"');
    expect(challenge).toContain('scope="engine:operate"');
    expect(challenge).toContain(`resource_metadata="${cloud.deps.site.publicUrl}/.well-known/oauth-protected-resource/mcp"`);
    expect(((await response.json()) as { error: string }).error).toBe("insufficient_scope");
    expect(await serviceStatus("sleeper")).toBe("running");
  });

  test("the engine refuses on its own too: a read-only assertion runs as a readonly principal", async () => {
    const outcome = await cloud.deps.relay.call(nodeId, assertionFor(["engine:read"]), "stop_service", { service: "sleeper" });
    if (!outcome.ok) throw new Error(outcome.message);
    const refusal = toolError(outcome.value as never);
    expect(refusal).toMatchObject({ status: 403, error: { code: "forbidden" } });
    expect(refusal.error?.message).toContain("an assistant with readonly rights");
    expect(await serviceStatus("sleeper")).toBe("running");
  });

  test("the engine refuses an assertion that names another account or another node", async () => {
    for (const change of [{ account_id: "acct_someone_else" }, { node_id: "node_elsewhere" }]) {
      const outcome = await cloud.deps.relay.call(nodeId, assertionFor(["engine:operate"], change), "list_services", {});
      expect(outcome).toMatchObject({ ok: false, code: "assertion_refused" });
    }
  });

  test("an engine:operate grant stops, starts, deploys and removes services", async () => {
    const assistant = await connectHttp(cloud.url, tokenFor(["engine:operate"]), "2026-07-28");
    try {
      structured(await assistant.client.callTool({ name: "stop_service", arguments: { service: "sleeper" } }));
      expect(await serviceStatus("sleeper")).toBe("stopped");
      structured(await assistant.client.callTool({ name: "start_service", arguments: { service: "sleeper" } }));
      await eventually(async () => (await serviceStatus("sleeper")) === "running", { timeoutMs: 20_000 });
      const deployed = structured<{ service: ServiceRecord }>(
        await assistant.client.callTool({ name: "deploy_service", arguments: { name: "by-assistant", command: "exec sleep 300" } }),
      );
      expect(deployed.service.name).toBe("by-assistant");
      structured(await assistant.client.callTool({ name: "remove_service", arguments: { service: "by-assistant" } }));
    } finally {
      await assistant.close();
    }
  });
});

describe("the bearer token on /mcp", () => {
  const metadataUrl = () => `${cloud.deps.site.publicUrl}/.well-known/oauth-protected-resource/mcp`;

  test("no token: 401 with the bare RFC 9728 challenge; a bad one adds invalid_token", async () => {
    const bare = await fetch(`${cloud.url}/mcp`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    expect(bare.status).toBe(401);
    expect(bare.headers.get("www-authenticate")).toBe(`Bearer resource_metadata="${metadataUrl()}"`);
    const bad = await modernCall("invented-token", "list_services", {});
    expect(bad.status).toBe(401);
    expect(bad.headers.get("www-authenticate")).toBe(
      `Bearer resource_metadata="${metadataUrl()}", error="invalid_token", error_description="the access token is not known"`,
    );
  });

  test("a token issued for another audience, or revoked, is refused at once", async () => {
    const elsewhere = verifier.issue({ accountId, scopes: ["engine:read"] }, "https://other.example/mcp").token;
    expect((await modernCall(elsewhere, "list_services", {})).status).toBe(401);
    const token = tokenFor(["engine:read"]);
    const assistant = await connectHttp(cloud.url, token, "2025-11-25");
    try {
      structured(await assistant.client.callTool({ name: "list_services", arguments: {} }));
      verifier.revoke(token);
      await expect(assistant.client.callTool({ name: "list_services", arguments: {} })).rejects.toThrow();
    } finally {
      await assistant.close().catch(() => undefined);
    }
  });

  test("the protected-resource metadata names the console as the authorization server, at both paths", async () => {
    for (const path of ["/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"]) {
      const response = await fetch(`${cloud.url}${path}`);
      expect(response.status).toBe(200);
      expect(await response.json()).toMatchObject({
        resource,
        authorization_servers: [cloud.deps.site.publicUrl],
        scopes_supported: ["engine:read", "engine:operate"],
        bearer_methods_supported: ["header"],
      });
    }
  });

  test("a browser page of another site is refused (403) before the token is looked at", async () => {
    const response = await modernCall(tokenFor(["engine:read"]), "list_services", {}, { origin: "https://evil.example" });
    expect(response.status).toBe(403);
  });
});

describe("several machines, grants that reach some, and a machine that drops its link", () => {
  let secondId: string;

  beforeAll(async () => {
    second = await startTestEngine({}, { tunnel: TUNNEL_TIMINGS });
    // Both engines run on this host and would report the same hostname (one node, adopted): the
    // second enrolls in-process with the link client `engine link --key` uses, under another name.
    const claim = await new CloudLinkClient({ cloudUrl: cloud.url }).enrollWithKey(await mintKey(), {
      hostname: "second-box",
      os: "linux",
      version: VERSION,
    });
    new IdentityStore(second.dataDir).save(claim);
    secondId = claim.node_id;
    await eventually(async () => (await nodes()).filter((node) => node.online).length === 2, { timeoutMs: 20_000 });
  }, 60_000);

  test("without a node argument the assistant is asked to name one; with it the call runs on that machine", async () => {
    const assistant = await connectHttp(cloud.url, tokenFor(["engine:read"]), "2026-07-28");
    try {
      const ambiguous = toolError(await assistant.client.callTool({ name: "list_services", arguments: {} }));
      expect(ambiguous.error).toMatchObject({ code: "machine_required" });
      expect(ambiguous.error?.message).toContain("second-box");
      const onSecond = structured<{ services: ServiceRecord[] }>(
        await assistant.client.callTool({ name: "list_services", arguments: { node: "second-box" } }),
      );
      expect(onSecond.services).toEqual([]);
      const onFirst = structured<{ services: ServiceRecord[] }>(
        await assistant.client.callTool({ name: "list_services", arguments: { node: nodeId } }),
      );
      expect(onFirst.services.map((service) => service.name)).toEqual(["sleeper"]);
    } finally {
      await assistant.close();
    }
  });

  test("a grant that does not cover a machine cannot reach it, nor see it in list_machines", async () => {
    const assistant = await connectHttp(cloud.url, tokenFor(["engine:operate"], [nodeId]), "2026-07-28");
    try {
      const machines = structured<{ machines: { id: string }[] }>(
        await assistant.client.callTool({ name: "list_machines", arguments: {} }),
      );
      expect(machines.machines.map((machine) => machine.id)).toEqual([nodeId]);
      const refused = toolError(await assistant.client.callTool({ name: "list_services", arguments: { node: "second-box" } }));
      expect(refused.error).toMatchObject({ code: "machine_not_granted" });
      const unknown = toolError(await assistant.client.callTool({ name: "list_services", arguments: { node: "no-such-box" } }));
      expect(unknown.error).toMatchObject({ code: "machine_not_found" });
      const odd = toolError(await assistant.client.callTool({ name: "list_services", arguments: { node: 42 } }));
      expect(odd.error).toMatchObject({ code: "invalid_argument" });
      // The grant's only machine needs no name.
      const only = structured<{ services: ServiceRecord[] }>(await assistant.client.callTool({ name: "list_services", arguments: {} }));
      expect(only.services.map((service) => service.name)).toEqual(["sleeper"]);
    } finally {
      await assistant.close();
    }
    const none = await connectHttp(cloud.url, tokenFor(["engine:read"], []), "2026-07-28");
    try {
      expect(structured<{ machines: unknown[] }>(await none.client.callTool({ name: "list_machines", arguments: {} })).machines).toEqual(
        [],
      );
      // The engine tools listed are those of the machines the grant reaches: here, none.
      expect((await none.client.listTools()).tools.map((tool) => tool.name)).toEqual(["list_machines"]);
      await expect(none.client.callTool({ name: "list_services", arguments: {} })).rejects.toThrow(/not found/);
    } finally {
      await none.close();
    }
  });

  test("an engine that drops its link is reported offline, and a call to it says since when", async () => {
    await second?.close();
    second = undefined;
    await eventually(async () => (await nodes()).find((node) => node.id === secondId)?.online === false, { timeoutMs: 10_000 });
    const row = (await nodes()).find((node) => node.id === secondId);
    expect(row?.last_seen_at).not.toBeNull();
    const assistant = await connectHttp(cloud.url, tokenFor(["engine:read"]), "2025-11-25");
    try {
      const offline = toolError(await assistant.client.callTool({ name: "diagnose", arguments: { service: "x", node: "second-box" } }));
      expect(offline.error?.code).toBe("machine_offline");
      expect(offline.error?.message).toBe(`machine second-box is offline since ${row?.last_seen_at}`);
      const machines = structured<{ machines: { name: string; online: boolean }[] }>(
        await assistant.client.callTool({ name: "list_machines", arguments: {} }),
      );
      expect(machines.machines.find((machine) => machine.name === "second-box")?.online).toBe(false);
    } finally {
      await assistant.close();
    }
  });
});

describe("the code-host token push over the tunnel", () => {
  const push = (overrides: Record<string, unknown> = {}) => ({
    installation_id: 4242,
    token: "ghs_RelayedInstallationToken0042",
    issued_at: new Date().toISOString(),
    expires_at: new Date(Date.now() + 3600_000).toISOString(),
    repos: ["acme/api"],
    ...overrides,
  });

  test("is applied by the engine's own route, which still answers its 422 for a bad body", async () => {
    const applied = await cloud.deps.relay.pushVcsToken(nodeId, push());
    expect(applied).toEqual({
      ok: true,
      value: { status: 200, body: { applied: true, installation_id: 4242, expires_at: expect.any(String), repos_count: 1 } },
    });
    const invalid = await cloud.deps.relay.pushVcsToken(nodeId, push({ installation_id: "many" }));
    expect(invalid.ok && invalid.value.status).toBe(422);
    expect(await cloud.deps.relay.pushVcsToken("node_not_connected", push())).toMatchObject({ ok: false, code: "offline" });
    expect(readFileSync(join(engine.dataDir, "engine.log"), "utf8")).not.toContain("ghs_RelayedInstallationToken0042");
  });
});

describe("the console's side of a silent tunnel", () => {
  test("a tunnel nothing arrives on is closed within the deadline and its node shown offline", async () => {
    const claim = await new CloudLinkClient({ cloudUrl: cloud.url }).enrollWithKey(await mintKey(), {
      hostname: "silent-box",
      os: "linux",
      version: VERSION,
    });
    const socket = openTunnelSocket(`${cloud.url.replace("http", "ws")}/link/tunnel`, { authorization: `Bearer ${claim.node_credential}` });
    const received: string[] = [];
    let closed = false;
    socket.addEventListener("message", (event: MessageEvent) => received.push(String(event.data)));
    socket.addEventListener("close", () => {
      closed = true;
    });
    socket.addEventListener("open", () =>
      socket.send(JSON.stringify({ type: "hello", protocol: 1, version: "0.0.1-silent", gpus: [], tools: [] })),
    );
    await eventually(() => received.some((text) => text.includes('"welcome"')), { timeoutMs: 5000 });
    expect((await nodes()).find((node) => node.id === claim.node_id)).toMatchObject({ online: true, version: "0.0.1-silent" });
    // It says nothing more, and answers no heartbeat: the console gives up on it.
    await eventually(() => closed, { timeoutMs: 10_000 });
    expect((await nodes()).find((node) => node.id === claim.node_id)?.online).toBe(false);
  });
});

describe("the assistant's token", () => {
  test("never reaches the engine: not in a tunnel frame, not in its log", () => {
    expect(verifier.seen.length).toBeGreaterThan(5);
    expect(frames.some((frame) => frame.includes('"type":"call"'))).toBe(true);
    const log = readFileSync(join(engine.dataDir, "engine.log"), "utf8");
    expect(log).toContain("link tunnel: connected");
    for (const token of verifier.seen) {
      expect(frames.some((frame) => frame.includes(token))).toBe(false);
      expect(log).not.toContain(token);
    }
  });
});

describe("a console restart", () => {
  test("the engine reconnects on its own, and assistants reach it again", async () => {
    const config = resolveCloudConfig(
      { dataDir: cloud.dataDir, port: cloud.port, databaseUrl: cloud.databaseUrl, logLevel: "warn", logToStdout: false },
      {},
    );
    await cloud.stop();
    await eventually(async () => (await linkStatus()).tunnel.state !== "connected", { timeoutMs: 10_000 });
    const down = await linkStatus();
    expect(down.tunnel.last_error).toMatch(/went away|cannot reach/);
    restarted = await startCloud(config, {
      log: createLogger({ level: "warn", dataDir: cloud.dataDir, stdout: false, fileName: "cloud.log" }).log,
      verifyAccessToken: verifier.verify,
      relay: RELAY_TIMINGS,
    });
    await eventually(async () => (await linkStatus()).tunnel.state === "connected", { timeoutMs: 20_000 });
    const again = await connectHttp(cloud.url, tokenFor(["engine:read"]), "2026-07-28");
    try {
      const listed = structured<{ services: ServiceRecord[] }>(
        await again.client.callTool({ name: "list_services", arguments: { node: nodeId } }),
      );
      expect(listed.services.map((service) => service.name)).toContain("sleeper");
    } finally {
      await again.close();
    }
  });
});
