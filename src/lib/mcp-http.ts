import type { HandleRequestOptions, WebStandardStreamableHTTPServerTransport } from "@modelcontextprotocol/server";

/**
 * What the engine's `/mcp` and the console's `/mcp` serve alike over Streamable HTTP: the
 * JSON-RPC shape of a transport-level refusal, the 2025-11-25 sessions (opened by `initialize`,
 * bound to who opened them, ended when idle or for room), the protected-resource metadata's
 * CORS and method answers, and the RFC 9728 bearer challenge.
 */

/** jsonRpcError is a transport-level refusal in the JSON-RPC shape MCP clients read. */
export function jsonRpcError(status: number, code: number, message: string): Response {
  return Response.json({ jsonrpc: "2.0", error: { code, message }, id: null }, { status });
}

export interface LegacySessionsOptions {
  /** max bounds the sessions held; the least recently used goes first. */
  max: number;
  /** idleMs ends a session nobody used for this long. */
  idleMs: number;
  /** maxBodyBytes bounds a POST, as the endpoint bounds its modern requests. */
  maxBodyBytes: number;
  now: () => number;
}

interface LegacySession {
  transport: WebStandardStreamableHTTPServerTransport;
  owner: string;
  lastSeen: number;
}

/**
 * LegacySessions serves 2025-era traffic with sessions: `initialize` without Mcp-Session-Id opens
 * one (its own server and transport), later requests name it. A session is bound to the owner
 * that opened it; another owner naming it is told the session does not exist.
 */
export class LegacySessions {
  readonly #o: LegacySessionsOptions;
  readonly #sessions = new Map<string, LegacySession>();
  #sweeper: ReturnType<typeof setInterval> | undefined;

  constructor(options: LegacySessionsOptions) {
    this.#o = options;
  }

  /** start begins ending idle sessions. */
  start(): void {
    this.#sweeper = setInterval(() => this.#sweep(), 60_000);
    this.#sweeper.unref?.();
  }

  /** stop ends every session; it is safe before start() and twice. */
  async stop(): Promise<void> {
    if (this.#sweeper) clearInterval(this.#sweeper);
    this.#sweeper = undefined;
    const sessions = [...this.#sessions.values()];
    this.#sessions.clear();
    await Promise.all(sessions.map((session) => session.transport.close().catch(() => undefined)));
  }

  /**
   * handle serves one request as `owner`: in the session it names, or, naming none, with a new
   * transport that `connect` gives a server of its own (kept when the request opened a session).
   */
  async handle(
    request: Request,
    owner: string,
    options: HandleRequestOptions,
    connect: (transport: WebStandardStreamableHTTPServerTransport) => Promise<void>,
  ): Promise<Response> {
    const id = request.headers.get("mcp-session-id");
    if (id !== null) {
      const session = this.#sessions.get(id);
      if (!session || session.owner !== owner) return jsonRpcError(404, -32001, "Session not found");
      session.lastSeen = this.#o.now();
      return session.transport.handleRequest(request, options);
    }
    // The SDK loads with the first request that needs it, not with the process (decision 515).
    const { WebStandardStreamableHTTPServerTransport: Transport } = await import("@modelcontextprotocol/server");
    const transport: WebStandardStreamableHTTPServerTransport = new Transport({
      sessionIdGenerator: () => crypto.randomUUID(),
      maxRequestBodySize: this.#o.maxBodyBytes,
      onsessioninitialized: (sessionId) => {
        this.#evictForRoom();
        this.#sessions.set(sessionId, { transport, owner, lastSeen: this.#o.now() });
      },
      onsessionclosed: (sessionId) => {
        this.#sessions.delete(sessionId);
      },
    });
    await connect(transport);
    const response = await transport.handleRequest(request, options);
    // Anything but an initialize opened no session: nothing holds this transport, so close it.
    if (transport.sessionId === undefined) await transport.close().catch(() => undefined);
    return response;
  }

  #evictForRoom(): void {
    while (this.#sessions.size >= this.#o.max) {
      let oldest: [string, LegacySession] | undefined;
      for (const entry of this.#sessions) if (!oldest || entry[1].lastSeen < oldest[1].lastSeen) oldest = entry;
      if (!oldest) return;
      this.#sessions.delete(oldest[0]);
      void oldest[1].transport.close().catch(() => undefined);
    }
  }

  #sweep(): void {
    const cutoff = this.#o.now() - this.#o.idleMs;
    for (const [id, session] of this.#sessions) {
      if (session.lastSeen >= cutoff) continue;
      this.#sessions.delete(id);
      void session.transport.close().catch(() => undefined);
    }
  }
}

/** METADATA_CORS lets a browser-based client read the protected-resource metadata. */
const METADATA_CORS = { "access-control-allow-origin": "*", "access-control-allow-methods": "GET, OPTIONS" };

/**
 * metadataResponse answers a request for RFC 9728 protected-resource metadata: the preflight
 * (204), another method than GET or HEAD (405), else the document `body()` makes.
 */
export function metadataResponse(request: Request, body: () => Record<string, unknown>): Response {
  if (request.method === "OPTIONS") return new Response(null, { status: 204, headers: METADATA_CORS });
  if (request.method !== "GET" && request.method !== "HEAD") {
    return new Response(null, { status: 405, headers: { ...METADATA_CORS, allow: "GET, OPTIONS" } });
  }
  return Response.json(body(), { headers: { ...METADATA_CORS, "cache-control": "max-age=300" } });
}

/**
 * bearerChallenge answers a request without a usable token: 401 with `WWW-Authenticate: Bearer
 * resource_metadata="…"` (RFC 9728 §5.1), plus `error="invalid_token"` when a credential was
 * sent (RFC 6750 §3.1: no error code when none was). `extra` adds fields to the JSON body.
 */
export function bearerChallenge(
  metadataUrl: string,
  presented: boolean,
  description: string,
  quote: (description: string) => string,
  extra: Record<string, unknown> = {},
): Response {
  const parameters = [`resource_metadata="${metadataUrl}"`];
  if (presented) parameters.push(`error="invalid_token"`, `error_description="${quote(description)}"`);
  return Response.json(
    { error: presented ? "invalid_token" : "unauthorized", error_description: description, ...extra },
    { status: 401, headers: { "www-authenticate": `Bearer ${parameters.join(", ")}` } },
  );
}
