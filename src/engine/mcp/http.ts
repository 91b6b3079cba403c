import { isIP } from "node:net";
import type { AuthInfo, McpHttpHandler, ServerContext } from "@modelcontextprotocol/server";
import type { Clock } from "../../lib/clock";
import { isAppError } from "../../lib/errors";
import type { Logger } from "../../lib/logger";
import { bearerChallenge, jsonRpcError, LegacySessions, metadataResponse } from "../../lib/mcp-http";
import type { Principal, TokenStore } from "../auth";
import type { ApiTransport } from "./context";
import { FilterError, filtersFromQuery, type McpFilters } from "./filters";
import { OperationBook } from "./operations";
import { type RelayAnswer, RelaySession } from "./relay";
import type { Caller } from "./server";

export type { RelayAnswer } from "./relay";

/** MCP_PATH is where the engine serves MCP over Streamable HTTP. */
export const MCP_PATH = "/mcp";
/** PROTECTED_RESOURCE_PATHS serve RFC 9728 metadata: path-inserted for /mcp (§3.1), and at the root. */
export const PROTECTED_RESOURCE_PATHS = ["/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"];

/**
 * runtime loads the MCP SDK and the tools' server on the first request that needs them. A
 * daemon that answers no MCP request never evaluates the SDK's modules (its schemas, AJV): they
 * were a fifth of a start's CPU once the validators compiled lazily (decision 515).
 */
type McpRuntime = typeof import("./runtime");
let loaded: Promise<McpRuntime> | undefined;
function runtime(): Promise<McpRuntime> {
  loaded ??= import("./runtime");
  return loaded;
}

/** MAX_BODY_BYTES bounds a POST to /mcp as the API bounds its bodies (decision 141). */
const MAX_BODY_BYTES = 1024 * 1024;
/** SESSION_IDLE_MS ends a 2025-11-25 session nobody used for this long. */
const SESSION_IDLE_MS = 30 * 60_000;
/** MAX_SESSIONS bounds the 2025-11-25 sessions held; the least recently used goes first. */
const MAX_SESSIONS = 256;

export interface McpEndpointOptions {
  tokens: Pick<TokenStore, "authenticate">;
  /**
   * dispatch hands a request to the engine's API app in-process (api.app.handle); with a
   * principal (a relayed call) the request runs as that principal (api.actAs) instead of an
   * Authorization header.
   */
  dispatch: (request: Request, principal?: Principal) => Response | Promise<Response>;
  log: Logger;
  clock: Clock;
  version: string;
  /** hostname is the machine's short name: `<hostname>` and `<hostname>.local` are allowed hosts. */
  hostname: string;
  /** listenHost is the API's listen address; a name (not a wildcard) is an allowed host too. */
  listenHost: string;
  /** allowedHosts are further names the endpoint answers to (ENGINE_MCP_ALLOWED_HOSTS). */
  allowedHosts: readonly string[];
}

/**
 * CallerInfo rides in AuthInfo.extra from the bearer check to the tool call: the request's own
 * Authorization header, or, for a call relayed from the console, the principal the engine made
 * of the console's assertion (the assistant's token never reaches the engine).
 */
type CallerInfo = { authorization: string; owner: string } | { principal: Principal; owner: string };

/** RelayedCaller is who a relayed call runs as: its principal, and the owner its operations are filed under. */
export interface RelayedCaller {
  principal: Principal;
  owner: string;
}

/**
 * McpEndpoint serves `/mcp` on the API's port, and the protected-resource metadata beside it.
 *
 * A request is checked in this order: its Host (a name this machine answers to, or an IP
 * literal: DNS rebinding needs a name) and its Origin (none, this engine's own, or a local
 * one), then its bearer token (the engine's own tokens; 401 with the RFC 9728 challenge).
 * Then it is served in the era it speaks: 2026-07-28 (a `_meta` envelope on every request,
 * stateless) by the SDK's per-request handler, 2025-11-25 (initialize, then Mcp-Session-Id)
 * by a session of its own, bound to the token that opened it. Every tool call runs as the
 * token of the request that carries it, through the API app in-process.
 *
 * start() and stop() follow the modules' lifecycle: stop() ends every session.
 */
export class McpEndpoint {
  readonly #o: McpEndpointOptions;
  readonly #operations: OperationBook;
  readonly #sessions = new LegacySessions({
    max: MAX_SESSIONS,
    idleMs: SESSION_IDLE_MS,
    maxBodyBytes: MAX_BODY_BYTES,
    now: () => Date.now(),
  });
  readonly #namedHosts: string[];
  #modern: McpHttpHandler | undefined;
  #started = false;
  /** #relaySession serves the calls relayed from the console, opened at the first one. */
  #relaySession: RelaySession | undefined;

  constructor(options: McpEndpointOptions) {
    this.#o = options;
    this.#operations = new OperationBook(options.clock);
    const listen = options.listenHost.replace(/^\[|\]$/g, "");
    this.#namedHosts = [
      "localhost",
      "127.0.0.1",
      "[::1]",
      options.hostname,
      `${options.hostname}.local`,
      // A name the API listens on (an IP literal is allowed anyway: #checkHost takes any).
      ...(isIP(listen) ? [] : [listen]),
      ...options.allowedHosts,
    ].map((host) => host.toLowerCase());
    this.#namedHosts = [...new Set(this.#namedHosts)];
  }

  /** start begins ending idle sessions; the SDK and the tools' server load with the first request. */
  start(): void {
    this.#started = true;
    this.#sessions.start();
  }

  /** #load loads the runtime (once per process) and makes the modern era's handler. */
  async #load(): Promise<{ sdk: McpRuntime; modern: McpHttpHandler } | undefined> {
    const sdk = await runtime();
    if (!this.#started) return undefined; // stopped while it loaded
    this.#modern ??= sdk.createMcpHandler((ctx) => this.#server(sdk, ctx.requestInfo, "modern"), {
      legacy: "reject",
      maxRequestBodySize: MAX_BODY_BYTES,
      onerror: (error) => this.#o.log.debug({ err: error.message }, "MCP request refused"),
    });
    return { sdk, modern: this.#modern };
  }

  /** stop ends every session and in-flight exchange; it is safe after a partial start and twice. */
  async stop(): Promise<void> {
    this.#started = false;
    await this.#sessions.stop();
    await this.#relaySession?.close();
    this.#relaySession = undefined;
    await this.#modern?.close().catch(() => undefined);
    this.#modern = undefined;
  }

  /** handles says whether a request is this endpoint's: `/mcp` and the metadata documents. */
  handles(path: string): boolean {
    return path === MCP_PATH || PROTECTED_RESOURCE_PATHS.includes(path);
  }

  async fetch(request: Request): Promise<Response> {
    const url = new URL(request.url);
    const sdk = await runtime();
    const refused = this.#checkHost(sdk, request) ?? this.#checkOrigin(sdk, request);
    if (refused) return refused;
    if (url.pathname !== MCP_PATH) return this.#metadata(request, url);
    const loaded = this.#started ? await this.#load() : undefined;
    if (!loaded) return jsonRpcError(503, -32603, "the MCP endpoint is not started");

    let principal: Principal;
    try {
      principal = this.#o.tokens.authenticate(request.headers.get("authorization"));
    } catch (error) {
      return this.#challenge(url, request.headers.get("authorization") !== null, error);
    }
    let filters: McpFilters;
    try {
      filters = filtersFromQuery(url.searchParams);
    } catch (error) {
      if (error instanceof FilterError) return jsonRpcError(400, -32602, error.message);
      throw error;
    }
    const caller: CallerInfo = {
      authorization: request.headers.get("authorization") ?? "",
      owner: principal.tokenId ?? principal.name,
    };
    const authInfo: AuthInfo = { token: "", clientId: caller.owner, scopes: [], extra: { caller } };
    if (await loaded.sdk.isLegacyRequest(request, undefined, { maxRequestBodySize: MAX_BODY_BYTES })) {
      return this.#legacy(loaded.sdk, request, authInfo, caller.owner, filters);
    }
    return loaded.modern.fetch(request, { authInfo });
  }

  /** #server builds the server for one modern request, or one legacy session, with the URL's filters. */
  #server(sdk: McpRuntime, request: Request | undefined, era: "modern" | "legacy", filters?: McpFilters) {
    return sdk.buildMcpServer({
      version: this.#o.version,
      filters: filters ?? filtersFromQuery(new URL(request?.url ?? "http://localhost/").searchParams),
      operations: this.#operations,
      callerOf: (ctx) => this.#callerOf(ctx, era),
      now: () => this.#o.clock.now().getTime(),
      log: this.#o.log,
    });
  }

  /**
   * relay serves one MCP request that arrived over the cloud link's tunnel (`tools/list`, or a
   * `tools/call` as `caller`). It goes to one long-lived session of the engine's own MCP server
   * (the same tools, input and output checks as a session on `/mcp`), in-process and unserialized,
   * with the relayed principal in place of a bearer token; the tools then call the API in-process
   * as that principal. The Host, Origin and bearer checks of `/mcp` do not apply: the request
   * never came from a listener.
   */
  async relay(method: "tools/list" | "tools/call", params: Record<string, unknown>, caller: RelayedCaller): Promise<RelayAnswer> {
    const loaded = this.#started ? await this.#load() : undefined;
    if (!loaded) return { error: { code: "engine_stopping", message: "the engine's MCP server is not running" } };
    this.#relaySession ??= new RelaySession(
      this.#server(loaded.sdk, undefined, "legacy", filtersFromQuery(new URLSearchParams())),
      this.#o.version,
    );
    const info: CallerInfo = { principal: caller.principal, owner: caller.owner };
    const authInfo: AuthInfo = { token: "", clientId: caller.owner, scopes: [], extra: { caller: info } };
    return this.#relaySession.request(method, params, authInfo);
  }

  /** #callerOf reads who calls from the request's auth info: the token of each request, not of the session's first. */
  #callerOf(ctx: ServerContext, era: string): Caller {
    const info = ctx.http?.authInfo?.extra?.caller as CallerInfo | undefined;
    if (!info) throw new Error(`an MCP ${era} call arrived without its caller`);
    return { transport: this.#transportFor(info), owner: info.owner };
  }

  /**
   * #transportFor sends the tool's API calls into the API app as the caller: with its own
   * Authorization header, or, relayed, as the principal made of the console's assertion.
   */
  #transportFor(info: CallerInfo): ApiTransport {
    return async (method, path, body) => {
      const headers: Record<string, string> = { accept: "application/json" };
      if ("authorization" in info) headers.authorization = info.authorization;
      if (body !== undefined) headers["content-type"] = "application/json";
      const response = await this.#o.dispatch(
        new Request(`http://localhost${path}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) }),
        "principal" in info ? info.principal : undefined,
      );
      const text = await response.text();
      let parsed: unknown;
      try {
        parsed = text === "" ? undefined : JSON.parse(text);
      } catch {
        parsed = { error: { code: "internal", message: `the API answered ${response.status} with a body that is not JSON` } };
      }
      return { status: response.status, body: parsed };
    };
  }

  /**
   * #legacy serves 2025-era traffic with sessions: `initialize` without Mcp-Session-Id opens
   * one (its own server and transport), later requests name it. A session is bound to the token
   * that opened it; another token naming it is told the session does not exist.
   */
  async #legacy(sdk: McpRuntime, request: Request, authInfo: AuthInfo, owner: string, filters: McpFilters): Promise<Response> {
    return this.#sessions.handle(request, owner, { authInfo }, (transport) =>
      this.#server(sdk, request, "legacy", filters).connect(transport),
    );
  }

  /**
   * #checkHost refuses a Host this machine does not answer to (DNS rebinding: a page on
   * evil.example whose name now resolves to 127.0.0.1 sends `Host: evil.example`). An IP
   * literal is allowed: no name, no rebinding.
   */
  #checkHost(sdk: McpRuntime, request: Request): Response | undefined {
    const header = request.headers.get("host");
    const result = sdk.validateHostHeader(header, this.#namedHosts);
    if (result.ok) return undefined;
    if (result.errorCode === "invalid_host" && result.hostname && isIP(result.hostname.replace(/^\[|\]$/g, "")) !== 0) return undefined;
    return jsonRpcError(
      403,
      -32000,
      `${result.message}: this engine answers to ${this.#namedHosts.join(", ")} or an IP address (ENGINE_MCP_ALLOWED_HOSTS adds names)`,
    );
  }

  /**
   * #checkOrigin refuses a browser page of another site: an Origin must be absent (assistants
   * are not browsers), this engine's own origin, or a local name.
   */
  #checkOrigin(sdk: McpRuntime, request: Request): Response | undefined {
    const origin = request.headers.get("origin");
    if (origin === null || origin === "") return undefined;
    const host = request.headers.get("host");
    try {
      if (host !== null && new URL(origin).host === host.toLowerCase()) return undefined;
    } catch {
      // unparsable: validateOriginHeader says so below
    }
    const result = sdk.validateOriginHeader(origin, this.#namedHosts);
    if (result.ok) return undefined;
    return jsonRpcError(403, -32000, `${result.message}: a browser page of another site may not call this engine`);
  }

  /** #resourceOf is this endpoint's URL as the client reached it (its Host was checked above). */
  #resourceOf(url: URL): string {
    return `${url.protocol}//${url.host}${MCP_PATH}`;
  }

  /**
   * #metadata serves RFC 9728 protected-resource metadata. It names no authorization server:
   * the engine's tokens are made by its admin (`engine tokens create`), not issued by OAuth;
   * an assistant is configured with one as a bearer token.
   */
  #metadata(request: Request, url: URL): Response {
    return metadataResponse(request, () => ({
      resource: this.#resourceOf(url),
      bearer_methods_supported: ["header"],
      resource_name: `engine on ${this.#o.hostname}`,
      resource_documentation: `${url.protocol}//${url.host}/api/docs`,
    }));
  }

  /**
   * #challenge answers a request without a usable token: 401 with `WWW-Authenticate: Bearer
   * resource_metadata="…"` (RFC 9728 §5.1), and `error="invalid_token"` when a credential was
   * sent but is not valid (RFC 6750 §3.1: no error code when none was sent).
   */
  #challenge(url: URL, presented: boolean, error: unknown): Response {
    const metadata = `${url.protocol}//${url.host}${PROTECTED_RESOURCE_PATHS[0]}`;
    const code = isAppError(error) ? error.code : "invalid_token";
    const message = error instanceof Error ? error.message : "the bearer token is not valid";
    return bearerChallenge(metadata, presented, message, (text) => text.replaceAll('"', "'"), { code });
  }
}
