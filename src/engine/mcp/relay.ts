import type { AuthInfo, JSONRPCMessage, McpServer, Transport } from "@modelcontextprotocol/server";

/** RelayAnswer is what a relayed request came to: the JSON-RPC result, or the JSON-RPC error. */
export type RelayAnswer = { result: Record<string, unknown> } | { error: { code: string; message: string } };

/** RELAY_SESSION_PROTOCOL is the revision the relay's session negotiates: the sessionful one. */
const RELAY_SESSION_PROTOCOL = "2025-11-25";

interface Waiting {
  resolve(message: JSONRPCMessage): void;
}

/**
 * LoopbackTransport hands JSON-RPC messages to a server in-process, as objects: a request goes in
 * with the caller's AuthInfo (what an HTTP transport attaches from its bearer check), and the
 * server's response comes back to the promise that sent it. Notifications the server sends are
 * dropped (no engine tool sends any while relayed); so are requests it would send the client
 * (the engine never samples or elicits).
 */
class LoopbackTransport implements Transport {
  onclose?: () => void;
  onerror?: (error: Error) => void;
  onmessage?: Transport["onmessage"];
  readonly #waiting = new Map<number, Waiting>();
  #nextId = 0;
  #closed = false;

  async start(): Promise<void> {}

  async send(message: JSONRPCMessage): Promise<void> {
    if (!("id" in message) || message.id === null || !("result" in message || "error" in message)) return;
    const waiting = this.#waiting.get(message.id as number);
    if (!waiting) return;
    this.#waiting.delete(message.id as number);
    waiting.resolve(message);
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    for (const [id, waiting] of this.#waiting) {
      waiting.resolve({ jsonrpc: "2.0", id, error: { code: -32000, message: "the engine's MCP server stopped" } });
    }
    this.#waiting.clear();
    this.onclose?.();
  }

  /** request sends one request to the server and waits for its response. */
  request(method: string, params: Record<string, unknown>, authInfo?: AuthInfo): Promise<JSONRPCMessage> {
    if (this.#closed) {
      return Promise.resolve({ jsonrpc: "2.0", id: 0, error: { code: -32000, message: "the engine's MCP server stopped" } });
    }
    this.#nextId += 1;
    const id = this.#nextId;
    return new Promise((resolve) => {
      this.#waiting.set(id, { resolve });
      this.onmessage?.({ jsonrpc: "2.0", id, method, params }, authInfo ? { authInfo } : undefined);
    });
  }

  /** notify sends one notification to the server. */
  notify(method: string): void {
    this.onmessage?.({ jsonrpc: "2.0", method });
  }
}

/**
 * RelaySession is the one MCP session that serves every call relayed from the console: the
 * engine's own McpServer (the same tool table, input and output checks as `/mcp`), connected
 * once to a loopback transport and initialized like any 2025-11-25 session. Each request carries
 * its caller as AuthInfo, which the tools read as they do over HTTP (`ctx.http.authInfo`), so one
 * session serves every grant's calls, each as its own principal. Nothing is serialized on the way:
 * a relayed call costs the tool and its checks, not an HTTP request built and parsed in-process.
 */
export class RelaySession {
  readonly #transport = new LoopbackTransport();
  readonly #ready: Promise<void>;

  constructor(server: McpServer, version: string) {
    this.#ready = (async () => {
      await server.connect(this.#transport);
      const answer = await this.#transport.request("initialize", {
        protocolVersion: RELAY_SESSION_PROTOCOL,
        capabilities: {},
        clientInfo: { name: "engine-cloud relay", version },
      });
      if ("error" in answer) throw new Error(`the engine's MCP server refused the relay's session: ${answer.error.message}`);
      this.#transport.notify("notifications/initialized");
    })();
    // A session that failed to open answers each request with the reason (below), not an unhandled rejection.
    this.#ready.catch(() => undefined);
  }

  /** request serves one relayed request as `authInfo`'s caller. */
  async request(method: string, params: Record<string, unknown>, authInfo: AuthInfo): Promise<RelayAnswer> {
    try {
      await this.#ready;
    } catch (error) {
      return { error: { code: "internal", message: (error as Error).message } };
    }
    const message = (await this.#transport.request(method, params, authInfo)) as {
      result?: Record<string, unknown>;
      error?: { code?: number; message?: string };
    };
    if (message.result && typeof message.result === "object") return { result: message.result };
    return {
      error: {
        code: `jsonrpc_${message.error?.code ?? -32603}`,
        message: message.error?.message ?? "the engine's MCP server answered neither a result nor an error",
      },
    };
  }

  /** close ends the session; requests still waiting are answered with an error. */
  close(): Promise<void> {
    return this.#transport.close();
  }
}
