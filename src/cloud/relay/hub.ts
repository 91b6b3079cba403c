import { randomUUID } from "node:crypto";
import { Value } from "@sinclair/typebox/value";
import type { Server, ServerWebSocket, WebSocketHandler } from "bun";
import {
  EngineMessage,
  type RelayAssertion,
  type RelayTool,
  type ReportedGpu,
  TUNNEL_CLOSE,
  TUNNEL_PROTOCOL,
  type TunnelHello,
} from "../../contract/relay";
import { isAppError } from "../../lib/errors";
import type { Logger } from "../../lib/logger";
import type { Node, NodeStore } from "../nodes";

/** RELAY_CALL_TIMEOUT_MS bounds how long a relayed call waits for its engine (long work answers a handle well before). */
export const RELAY_CALL_TIMEOUT_MS = 120_000;
/** RELAY_DEAD_AFTER_MS closes a tunnel nothing arrived on for this long (the engine pings every 15 s). */
export const RELAY_DEAD_AFTER_MS = 60_000;
/** LAST_SEEN_FLUSH_MS is how often a connected node's last-seen time is written while its heartbeats arrive. */
const LAST_SEEN_FLUSH_MS = 60_000;
/** MAX_FRAME_BYTES bounds one tunnel message (a tool's answer is capped far below: logs at 1 MiB). */
const MAX_FRAME_BYTES = 8 * 1024 * 1024;

/** TunnelSocketData is what Bun keeps with each tunnel socket: the node its credential authenticated. */
export interface TunnelSocketData {
  node: Node;
  connection?: Connection;
}

interface Pending {
  resolve(message: EngineMessage): void;
  reject(reason: { code: string; message: string }): void;
}

interface Connection {
  node: Node;
  ws: ServerWebSocket<TunnelSocketData>;
  openedAt: number;
  /** onlineSince is when the engine said hello; the node is online from then. */
  onlineSince: number | null;
  lastSeen: number;
  lastWritten: number;
  version: string | null;
  gpus: ReportedGpu[];
  tools: RelayTool[] | null;
  pending: Map<string, Pending>;
}

/** Presence is what the console knows of a node's tunnel right now. */
export interface Presence {
  online: boolean;
  /** onlineSince is when the current tunnel said hello; null while offline. */
  onlineSince: number | null;
  /** lastSeen is the last frame of the current tunnel; null while offline (the node row keeps the stored one). */
  lastSeen: number | null;
  version: string | null;
  gpus: ReportedGpu[] | null;
}

/**
 * NodeNow is how a node stands now, as GET /api/nodes and list_machines show it: what its open
 * tunnel reports, over what its row last kept (times in ISO 8601).
 */
export interface NodeNow {
  online: boolean;
  online_since: string | null;
  last_seen_at: string | null;
  version: string;
  gpus: ReportedGpu[] | null;
}

/** RelayOutcome is what a relayed request came to: the engine's answer, or why there is none. */
export type RelayOutcome<T> = { ok: true; value: T } | { ok: false; code: RelayFailure; message: string };

/**
 * RelayFailure names why a relayed request has no answer: the node is `offline`, its tunnel
 * closed under the call (`disconnected`), it did not answer in time (`timeout`), or the engine
 * refused to run it (its own code: `assertion_refused`, `busy`, `jsonrpc_-32602`, …).
 */
export type RelayFailure = "offline" | "disconnected" | "timeout" | (string & {});

export interface RelayHubOptions {
  nodes: NodeStore;
  log: Logger;
  callTimeoutMs?: number;
  deadAfterMs?: number;
  /** now replaces Date.now (tests). */
  now?: () => number;
}

/**
 * RelayHub is the console's end of the relay (docs/decisions.md 240 onwards): it accepts each
 * linked engine's one tunnel at `/link/tunnel` (a WebSocket; the upgrade authenticates the node
 * credential, so nothing unauthenticated is ever upgraded), keeps the registry of connected
 * nodes, records what they report (version, GPUs, MCP tools) on the node row, and sends them
 * relayed tool calls and code-host token pushes.
 *
 * A node is online from its hello to its tunnel's close. A newer tunnel of the same node
 * replaces the older one (closed with 4000). A tunnel nothing arrived on for `deadAfterMs`
 * (the engine pings every 15 s) is closed as dead, so a vanished engine is shown offline within
 * a minute. The registry lives in this process: with several console replicas, tunnels and
 * `/mcp` must be routed to the same one (decision 248).
 *
 * start() and stop() follow the modules' lifecycle; stop() closes every tunnel with 1001.
 */
export class RelayHub {
  readonly #o: RelayHubOptions;
  readonly #byNode = new Map<string, Connection>();
  readonly #now: () => number;
  #sweeper: ReturnType<typeof setInterval> | undefined;
  #stopping = false;

  constructor(options: RelayHubOptions) {
    this.#o = options;
    this.#now = options.now ?? Date.now;
  }

  /** start begins closing tunnels that went silent. */
  start(): void {
    this.#stopping = false;
    const deadAfter = this.#o.deadAfterMs ?? RELAY_DEAD_AFTER_MS;
    this.#sweeper = setInterval(() => this.#sweep(deadAfter), Math.max(50, Math.min(15_000, deadAfter / 4)));
    this.#sweeper.unref?.();
  }

  /** stop closes every tunnel (1001: the engines reconnect with backoff) and fails the calls in flight. */
  async stop(): Promise<void> {
    this.#stopping = true;
    if (this.#sweeper) clearInterval(this.#sweeper);
    this.#sweeper = undefined;
    const open = [...this.#byNode.values()];
    for (const connection of open) {
      this.#drop(connection, { code: "disconnected", message: "the console is stopping" });
      try {
        connection.ws.close(1001, "the console is stopping");
      } catch {
        // already closed
      }
    }
    await Promise.all(open.map((connection) => this.#o.nodes.touch(connection.node.id, this.#now()).catch(() => undefined)));
  }

  /**
   * upgrade authenticates a tunnel request by its node credential (`Authorization: Bearer
   * enc_…`) and upgrades it. It answers a refusal as the API would (401 with the error envelope;
   * 426 for a request that is not a WebSocket upgrade), or undefined once upgraded.
   */
  async upgrade(request: Request, server: Server<TunnelSocketData>): Promise<Response | undefined> {
    if (this.#stopping) return refusal(503, "unavailable", "the console is stopping; try again in a moment");
    if (request.headers.get("upgrade")?.toLowerCase() !== "websocket") {
      return refusal(426, "upgrade_required", "the link tunnel is a WebSocket: linked engines open it themselves", {
        upgrade: "websocket",
      });
    }
    const header = request.headers.get("authorization") ?? "";
    const credential = /^Bearer +(\S+)$/i.exec(header)?.[1];
    let node: Node;
    try {
      node = await this.#o.nodes.authenticate(credential);
    } catch (error) {
      if (!isAppError(error)) throw error;
      return refusal(401, error.code, error.message, { "www-authenticate": `Bearer realm="engine-cloud link"` });
    }
    if (server.upgrade(request, { data: { node } })) return undefined;
    return refusal(400, "invalid_request", "the WebSocket upgrade failed");
  }

  /** websocket are the tunnel socket's handlers, for Bun.serve. */
  readonly websocket: WebSocketHandler<TunnelSocketData> = {
    maxPayloadLength: MAX_FRAME_BYTES,
    // Bun's own idle close is a backstop; the sweeper closes silent tunnels sooner.
    idleTimeout: 120,
    open: (ws) => this.#open(ws),
    message: (ws, raw) => {
      const connection = ws.data.connection;
      if (connection) void this.#message(connection, raw);
    },
    ping: (ws) => this.#seen(ws.data.connection),
    pong: (ws) => this.#seen(ws.data.connection),
    close: (ws, code, reason) => {
      const connection = ws.data.connection;
      if (connection) this.#closed(connection, code, reason);
    },
  };

  /** presence says whether a node is online now, and what its tunnel reported. */
  presence(nodeId: string): Presence {
    const connection = this.#byNode.get(nodeId);
    if (!connection || connection.onlineSince === null)
      return { online: false, onlineSince: null, lastSeen: null, version: null, gpus: null };
    return {
      online: true,
      onlineSince: connection.onlineSince,
      lastSeen: connection.lastSeen,
      version: connection.version,
      gpus: connection.gpus,
    };
  }

  /** nodeNow says how a node stands now: online (this process's registry) and what its tunnel reported, else what its row kept. */
  nodeNow(node: Node): NodeNow {
    const presence = this.presence(node.id);
    const lastSeen = presence.lastSeen ?? node.lastSeenAt;
    return {
      online: presence.online,
      online_since: presence.onlineSince === null ? null : new Date(presence.onlineSince).toISOString(),
      last_seen_at: lastSeen === null ? null : new Date(lastSeen).toISOString(),
      version: presence.version ?? node.version,
      gpus: presence.gpus ?? node.gpus,
    };
  }

  /** toolsOf returns the MCP tools a connected node listed in its hello, or undefined when it is not online. */
  toolsOf(nodeId: string): RelayTool[] | undefined {
    const connection = this.#byNode.get(nodeId);
    return connection?.onlineSince != null ? (connection.tools ?? undefined) : undefined;
  }

  /** onlineCount is how many nodes have an open, welcomed tunnel. */
  onlineCount(): number {
    let count = 0;
    for (const connection of this.#byNode.values()) if (connection.onlineSince !== null) count += 1;
    return count;
  }

  /**
   * call runs one MCP tool on a node as the assertion says (never with the assistant's token,
   * which stays here) and answers the engine's CallToolResult.
   */
  async call(
    nodeId: string,
    assertion: RelayAssertion,
    tool: string,
    args: Record<string, unknown>,
  ): Promise<RelayOutcome<Record<string, unknown>>> {
    const answer = await this.#request(nodeId, (id) => ({ type: "call", id, assertion, tool, arguments: args }));
    if (!answer.ok) return answer;
    const message = answer.value;
    if (message.type !== "call_result")
      return { ok: false, code: "protocol_error", message: "the engine answered a call with another message" };
    if (message.error) return { ok: false, code: message.error.code, message: message.error.message };
    if (!message.result)
      return { ok: false, code: "protocol_error", message: "the engine answered a call with neither a result nor an error" };
    return { ok: true, value: message.result };
  }

  /**
   * pushVcsToken sends a code-host installation token to a node over its tunnel; the engine
   * applies it as its `PUT /api/link/vcs-token` route would and this answers that route's status
   * and body.
   */
  async pushVcsToken(nodeId: string, push: unknown): Promise<RelayOutcome<{ status: number; body: unknown }>> {
    const answer = await this.#request(nodeId, (id) => ({ type: "vcs_token", id, push }));
    if (!answer.ok) return answer;
    const message = answer.value;
    if (message.type !== "vcs_token_result")
      return { ok: false, code: "protocol_error", message: "the engine answered a push with another message" };
    return { ok: true, value: { status: message.status, body: message.body } };
  }

  async #request(nodeId: string, make: (id: string) => object): Promise<RelayOutcome<EngineMessage>> {
    const connection = this.#byNode.get(nodeId);
    if (!connection || connection.onlineSince === null) return { ok: false, code: "offline", message: "the machine is not connected" };
    const id = randomUUID();
    const timeoutMs = this.#o.callTimeoutMs ?? RELAY_CALL_TIMEOUT_MS;
    return new Promise<RelayOutcome<EngineMessage>>((resolve) => {
      const timer = setTimeout(() => {
        connection.pending.delete(id);
        resolve({ ok: false, code: "timeout", message: `the machine did not answer within ${Math.round(timeoutMs / 1000)} s` });
      }, timeoutMs);
      connection.pending.set(id, {
        resolve: (message) => {
          clearTimeout(timer);
          resolve({ ok: true, value: message });
        },
        reject: (reason) => {
          clearTimeout(timer);
          resolve({ ok: false, code: reason.code, message: reason.message });
        },
      });
      const sent = connection.ws.send(JSON.stringify(make(id)));
      if (sent === 0) {
        connection.pending.get(id)?.reject({ code: "disconnected", message: "the machine's tunnel closed before the call was sent" });
        connection.pending.delete(id);
      }
    });
  }

  #open(ws: ServerWebSocket<TunnelSocketData>): void {
    const now = this.#now();
    const connection: Connection = {
      node: ws.data.node,
      ws,
      openedAt: now,
      onlineSince: null,
      lastSeen: now,
      lastWritten: 0,
      version: null,
      gpus: [],
      tools: null,
      pending: new Map(),
    };
    ws.data.connection = connection;
  }

  async #message(connection: Connection, raw: string | Buffer): Promise<void> {
    this.#seen(connection);
    let message: EngineMessage;
    try {
      const parsed = JSON.parse(typeof raw === "string" ? raw : raw.toString("utf8"));
      if (!Value.Check(EngineMessage, parsed)) throw new Error("not an engine message");
      message = parsed;
    } catch (error) {
      this.#o.log.warn(
        { node_id: connection.node.id, err: (error as Error).message },
        "relay: an engine sent an unreadable message; closing its tunnel",
      );
      connection.ws.close(TUNNEL_CLOSE.protocolError, "unreadable message");
      return;
    }
    switch (message.type) {
      case "hello":
        await this.#hello(connection, message);
        return;
      case "report":
        connection.gpus = message.gpus;
        await this.#o.nodes
          .recordGpus(connection.node.id, message.gpus, this.#now())
          .catch((error) => this.#writeFailed(connection, error));
        return;
      default: {
        const pending = connection.pending.get(message.id);
        if (!pending) return;
        connection.pending.delete(message.id);
        pending.resolve(message);
      }
    }
  }

  async #hello(connection: Connection, hello: TunnelHello): Promise<void> {
    const { node } = connection;
    if (hello.protocol !== TUNNEL_PROTOCOL) {
      connection.ws.close(TUNNEL_CLOSE.protocolError, `tunnel protocol ${hello.protocol} is not ${TUNNEL_PROTOCOL}`);
      return;
    }
    if (connection.onlineSince !== null) return;
    const now = this.#now();
    try {
      await this.#o.nodes.recordHello(node.id, hello, now);
    } catch (error) {
      this.#writeFailed(connection, error);
    }
    if (connection.ws.readyState !== 1) return;
    const previous = this.#byNode.get(node.id);
    if (previous && previous !== connection) {
      this.#drop(previous, { code: "disconnected", message: "the machine opened a newer tunnel" });
      previous.ws.close(TUNNEL_CLOSE.replaced, "replaced by a newer tunnel of the same node");
    }
    connection.onlineSince = now;
    connection.lastWritten = now;
    connection.version = hello.version;
    connection.gpus = hello.gpus;
    connection.tools = hello.tools;
    this.#byNode.set(node.id, connection);
    connection.ws.send(JSON.stringify({ type: "welcome", node_id: node.id, slug: node.slug, account_id: node.accountId }));
    this.#o.log.info({ node_id: node.id, account_id: node.accountId, slug: node.slug, version: hello.version }, "relay: node connected");
  }

  #seen(connection: Connection | undefined): void {
    if (!connection) return;
    const now = this.#now();
    connection.lastSeen = now;
    if (connection.onlineSince !== null && now - connection.lastWritten >= LAST_SEEN_FLUSH_MS) {
      connection.lastWritten = now;
      void this.#o.nodes.touch(connection.node.id, now).catch((error) => this.#writeFailed(connection, error));
    }
  }

  #closed(connection: Connection, code: number, reason: string): void {
    const wasOnline = this.#byNode.get(connection.node.id) === connection;
    this.#drop(connection, { code: "disconnected", message: "the machine's tunnel closed during the call" });
    if (!wasOnline) return;
    const now = this.#now();
    void this.#o.nodes.touch(connection.node.id, now).catch((error) => this.#writeFailed(connection, error));
    this.#o.log.info({ node_id: connection.node.id, code, reason }, "relay: node disconnected");
  }

  /** #drop takes a connection out of the registry and fails its calls in flight. */
  #drop(connection: Connection, reason: { code: string; message: string }): void {
    if (this.#byNode.get(connection.node.id) === connection) this.#byNode.delete(connection.node.id);
    for (const pending of connection.pending.values()) pending.reject(reason);
    connection.pending.clear();
  }

  #sweep(deadAfterMs: number): void {
    const cutoff = this.#now() - deadAfterMs;
    for (const connection of this.#byNode.values()) {
      if (connection.lastSeen >= cutoff) continue;
      this.#o.log.warn({ node_id: connection.node.id }, "relay: no heartbeat from the node; closing its tunnel");
      this.#drop(connection, { code: "disconnected", message: "the machine stopped answering" });
      void this.#o.nodes.touch(connection.node.id, connection.lastSeen).catch(() => undefined);
      try {
        connection.ws.terminate();
      } catch {
        // already closed
      }
    }
  }

  #writeFailed(connection: Connection, error: unknown): void {
    this.#o.log.warn({ node_id: connection.node.id, err: (error as Error).message }, "relay: cannot record the node's report");
  }
}

function refusal(status: number, code: string, message: string, headers: Record<string, string> = {}): Response {
  return Response.json({ error: { code, message, request_id: randomUUID() } }, { status, headers });
}
