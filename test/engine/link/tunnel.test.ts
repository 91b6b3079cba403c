import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import type { ServerWebSocket } from "bun";
import type { RelayAssertion, TunnelCall } from "../../../src/contract/relay";
import {
  assistantPrincipal,
  backoffDelay,
  checkAssertion,
  describeHandshakeFailure,
  IdentityStore,
  type LinkedNode,
  TunnelClient,
  type TunnelHandlers,
  tunnelUrl,
} from "../../../src/engine/link";
import { createLogger } from "../../../src/lib/logger";
import { VERSION } from "../../../src/lib/version";
import { eventually, tempDir } from "../../helpers";
import { FreezableProxy } from "./freezable-proxy";

const log = createLogger({ level: "silent", stdout: false }).log;
const TIMINGS = { heartbeatMs: 50, deadAfterMs: 400, backoff: { baseMs: 20, maxMs: 200 }, stableMs: 60_000, unlinkedPollMs: 30 };
const CREDENTIAL = "enc_TheNodeCredentialOfThisTest";

describe("backoffDelay", () => {
  test.each([
    [1, 0, 500],
    [1, 1, 1000],
    [2, 0, 1000],
    [3, 0.5, 3000],
    [6, 1, 32_000],
    [7, 0, 30_000],
    [7, 1, 60_000],
    [40, 1, 60_000],
  ])("after %d failures with jitter %d it waits %d ms", (failures, random, expected) => {
    expect(backoffDelay(failures, { baseMs: 1000, maxMs: 60_000 }, () => random)).toBe(expected);
  });
});

describe("tunnelUrl and the handshake's failures", () => {
  test.each([
    ["http://127.0.0.1:8787", "ws://127.0.0.1:8787/link/tunnel"],
    ["https://cloud.example", "wss://cloud.example/link/tunnel"],
    ["https://example.com/console", "wss://example.com/console/link/tunnel"],
  ])("%s → %s", (cloud, url) => expect(tunnelUrl(cloud)).toBe(url));

  test.each([
    ["Expected 101 status code: 401", /refused this machine's node credential \(401\).*engine link --force/],
    ["Expected 101 status code: 404", /no tunnel endpoint \(404\): it predates the relay/],
    ["Expected 101 status code: 502", /answered 502 instead of opening the tunnel/],
    ["Connection refused", /cannot reach the console at https:\/\/c\.example \(Connection refused\)/],
  ])("%s", (message, expected) => expect(describeHandshakeFailure(message, "https://c.example")).toMatch(expected));
});

describe("assertions", () => {
  const node = { account_id: "acct_1", node_id: "node_1" };
  const now = new Date("2026-03-01T12:00:00Z");
  const good: RelayAssertion = {
    account_id: "acct_1",
    node_id: "node_1",
    client_id: "https://claude.ai/oauth/mcp-oauth-client-metadata",
    grant_id: "grant_1",
    scopes: ["engine:read"],
    expires_at: "2026-03-01T13:00:00Z",
  };
  test.each([
    ["its own account and node", {}, null],
    ["another account", { account_id: "acct_2" }, /account acct_2, not this machine's/],
    ["another node", { node_id: "node_2" }, /node node_2, not this machine/],
    ["an unknown scope", { scopes: ["engine:admin"] }, /unknown scopes: engine:admin/],
    ["an expired grant", { expires_at: "2026-03-01T11:59:59Z" }, /expired/],
    ["an unreadable expiry", { expires_at: "soon" }, /expired/],
  ])("an assertion naming %s", (_name, change, refusal) => {
    const verdict = checkAssertion({ ...good, ...change }, node, now);
    if (refusal === null) expect(verdict).toBeNull();
    else expect(verdict?.message).toMatch(refusal);
  });

  test.each([
    [["engine:read"], "readonly"],
    [["engine:operate"], "submitter"],
    [["engine:read", "engine:operate"], "submitter"],
  ])("scopes %j run as a %s principal, never admin, with no caps or service scope", (scopes, role) => {
    const principal = assistantPrincipal({ ...good, scopes });
    expect(principal).toMatchObject({ kind: "assistant", role, tokenId: null, maxGpus: null, scopeServices: [] });
    expect(principal.name).toBe("assistant claude.ai (grant grant_1)");
  });
});

/** FakeConsole is the console's end of the tunnel, as little of it as the client needs. */
class FakeConsole {
  refuse: number | null = null;
  welcome = true;
  readonly opened: { authorization: string | null; path: string }[] = [];
  readonly received: Record<string, unknown>[] = [];
  readonly closes: { code: number; reason: string }[] = [];
  sockets: ServerWebSocket<unknown>[] = [];
  readonly server: ReturnType<typeof Bun.serve>;

  constructor() {
    this.server = Bun.serve({
      port: 0,
      hostname: "127.0.0.1",
      fetch: (request, server) => {
        if (this.refuse !== null) return Response.json({ error: { code: "invalid_session" } }, { status: this.refuse });
        this.opened.push({ authorization: request.headers.get("authorization"), path: new URL(request.url).pathname });
        if (server.upgrade(request, { data: undefined })) return undefined;
        return new Response("not a websocket", { status: 400 });
      },
      websocket: {
        open: (ws) => {
          this.sockets.push(ws);
        },
        message: (ws, raw) => {
          const message = JSON.parse(String(raw));
          this.received.push(message);
          if (message.type === "hello" && this.welcome) {
            ws.send(JSON.stringify({ type: "welcome", node_id: "node_1", slug: "box", account_id: "acct_1" }));
          }
        },
        close: (ws, code, reason) => {
          this.sockets = this.sockets.filter((socket) => socket !== ws);
          this.closes.push({ code, reason });
        },
      },
    });
  }

  get url(): string {
    return `http://127.0.0.1:${this.server.port}`;
  }

  send(message: object): void {
    for (const socket of this.sockets) socket.send(JSON.stringify(message));
  }

  stop(): void {
    this.server.stop(true);
  }
}

describe("TunnelClient", () => {
  let dataDir: string;
  let fake: FakeConsole;
  let client: TunnelClient | undefined;
  let proxy: FreezableProxy | undefined;
  const calls: { node: LinkedNode; message: TunnelCall }[] = [];
  const handlers: TunnelHandlers = {
    tools: async () => [{ name: "list_services", inputSchema: { type: "object" } }],
    gpus: () => [{ index: 0, name: "NVIDIA H100", memory_total_mb: 81_920, mig_profile: null }],
    call: async (node, message) => {
      calls.push({ node, message });
      return { result: { content: [{ type: "text", text: "ok" }] } };
    },
    vcsToken: async (message) => ({ status: 200, body: { applied: true, echoed: message.push } }),
  };
  const link = (cloudUrl: string) =>
    new IdentityStore(dataDir).save({
      node_id: "node_1",
      slug: "box",
      account_id: "acct_1",
      node_credential: CREDENTIAL,
      cloud_url: cloudUrl,
      hosted_base_domain: "hosted.example",
    });
  const start = () => {
    client = new TunnelClient({ identity: new IdentityStore(dataDir), handlers, log, ...TIMINGS });
    client.start();
    return client;
  };

  beforeEach(() => {
    dataDir = tempDir("engine-tunnel-");
    fake = new FakeConsole();
    calls.length = 0;
  });
  afterEach(async () => {
    await client?.stop();
    client = undefined;
    proxy?.stop();
    proxy = undefined;
    fake.stop();
    rmSync(dataDir, { recursive: true, force: true });
  });

  test("unlinked, it waits; once `engine link` writes an identity it connects with the node credential and says hello", async () => {
    const tunnel = start();
    expect(tunnel.status()).toMatchObject({ state: "not_linked", url: null, last_error: null });
    link(fake.url);
    await eventually(() => tunnel.status().state === "connected", { timeoutMs: 5000 });
    expect(fake.opened).toEqual([{ authorization: `Bearer ${CREDENTIAL}`, path: "/link/tunnel" }]);
    expect(fake.received[0]).toEqual({
      type: "hello",
      protocol: 1,
      version: VERSION,
      gpus: [{ index: 0, name: "NVIDIA H100", memory_total_mb: 81_920, mig_profile: null }],
      tools: [{ name: "list_services", inputSchema: { type: "object" } }],
    });
    expect(tunnel.status()).toMatchObject({ state: "connected", url: `${fake.url.replace("http", "ws")}/link/tunnel`, failures: 0 });
    expect(tunnel.status().connected_at).not.toBeNull();
  });

  test("serves the console's calls and pushes, answering each with its id", async () => {
    link(fake.url);
    const tunnel = start();
    await eventually(() => tunnel.status().state === "connected", { timeoutMs: 5000 });
    const assertion = {
      account_id: "acct_1",
      node_id: "node_1",
      client_id: "c",
      grant_id: "g",
      scopes: ["engine:read"],
      expires_at: "2999-01-01T00:00:00Z",
    };
    fake.send({ type: "call", id: "call-1", assertion, tool: "list_services", arguments: { a: 1 } });
    fake.send({ type: "vcs_token", id: "push-1", push: { installation_id: 7 } });
    await eventually(() => fake.received.length >= 3, { timeoutMs: 5000 });
    expect(calls).toHaveLength(1);
    expect(calls[0]?.node).toMatchObject({ node_id: "node_1", account_id: "acct_1" });
    expect(calls[0]?.message).toMatchObject({ tool: "list_services", arguments: { a: 1 }, assertion });
    expect(fake.received).toContainEqual({ type: "call_result", id: "call-1", result: { content: [{ type: "text", text: "ok" }] } });
    expect(fake.received).toContainEqual({
      type: "vcs_token_result",
      id: "push-1",
      status: 200,
      body: { applied: true, echoed: { installation_id: 7 } },
    });
  });

  test("a refused credential is the last error, with what to do; the client keeps retrying with backoff", async () => {
    fake.refuse = 401;
    link(fake.url);
    const tunnel = start();
    await eventually(() => tunnel.status().failures >= 2, { timeoutMs: 5000 });
    const status = tunnel.status();
    expect(status.state).toMatch(/disconnected|connecting/);
    expect(status.last_error).toMatch(/refused this machine's node credential \(401\).*engine link --force/);
    expect(status.last_error_at).not.toBeNull();
    fake.refuse = null;
    await eventually(() => tunnel.status().state === "connected", { timeoutMs: 5000 });
    // The error stays visible until the next one, beside the state that says all is well now.
    expect(tunnel.status().last_error).toMatch(/401/);
  });

  test("a console that goes away (1001) is reconnected to", async () => {
    link(fake.url);
    const tunnel = start();
    await eventually(() => tunnel.status().state === "connected", { timeoutMs: 5000 });
    for (const socket of fake.sockets) socket.close(1001, "restarting");
    await eventually(() => tunnel.status().last_error?.includes("went away"), { timeoutMs: 5000 });
    await eventually(() => tunnel.status().state === "connected" && fake.opened.length === 2, { timeoutMs: 5000 });
  });

  test("a console that stops answering (a partition) is given up as dead within the deadline, then reconnected to", async () => {
    proxy = new FreezableProxy(fake.server.port ?? 0);
    link(`http://127.0.0.1:${proxy.port}`);
    const tunnel = start();
    await eventually(() => tunnel.status().state === "connected", { timeoutMs: 5000 });
    proxy.frozen = true;
    await eventually(() => tunnel.status().state !== "connected", { timeoutMs: 5000 });
    expect(tunnel.status().last_error).toMatch(/no answer from the console for \d+ s \(heartbeats unanswered\)/);
    proxy.frozen = false;
    await eventually(() => tunnel.status().state === "connected", { timeoutMs: 5000 });
  });

  test("a console that takes the connection but never answers the handshake is given up within the deadline, and tried again", async () => {
    const accepted: number[] = [];
    const silent = Bun.listen({
      hostname: "127.0.0.1",
      port: 0,
      socket: {
        open: () => {
          accepted.push(Date.now());
        },
        data: () => {
          // reads the upgrade request and never answers it
        },
      },
    });
    try {
      link(`http://127.0.0.1:${silent.port}`);
      const tunnel = start();
      await eventually(() => tunnel.status().last_error?.includes("no answer from the console to the tunnel's handshake"), {
        timeoutMs: 5000,
      });
      expect(tunnel.status().state).toMatch(/disconnected|connecting/);
      // Given up, it tries again after its backoff instead of waiting on the first for ever.
      await eventually(() => accepted.length >= 3, { timeoutMs: 5000 });
    } finally {
      await client?.stop();
      client = undefined;
      silent.stop(true);
    }
  });

  test("unlinking while connected closes the tunnel (4004) and the client waits for an identity again", async () => {
    link(fake.url);
    const tunnel = start();
    await eventually(() => tunnel.status().state === "connected", { timeoutMs: 5000 });
    new IdentityStore(dataDir).remove();
    await eventually(() => fake.closes.some((close) => close.code === 4004), { timeoutMs: 5000 });
    await eventually(() => tunnel.status().state === "not_linked", { timeoutMs: 5000 });
  });

  test("stop closes the tunnel with 1001, and the state says stopped", async () => {
    link(fake.url);
    const tunnel = start();
    await eventually(() => tunnel.status().state === "connected", { timeoutMs: 5000 });
    await tunnel.stop();
    expect(tunnel.status().state).toBe("stopped");
    await eventually(() => fake.closes.some((close) => close.code === 1001), { timeoutMs: 5000 });
  });

  test("a message the engine does not understand ends the tunnel as a protocol error (4002)", async () => {
    link(fake.url);
    const tunnel = start();
    await eventually(() => tunnel.status().state === "connected", { timeoutMs: 5000 });
    fake.send({ type: "format_disk" });
    await eventually(() => fake.closes.some((close) => close.code === 4002), { timeoutMs: 5000 });
    expect(tunnel.status().last_error).toMatch(/does not understand/);
  });
});
