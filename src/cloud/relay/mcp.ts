import {
  type AuthInfo,
  type CallToolResult,
  createMcpHandler,
  fromJsonSchema,
  isJsonContentType,
  isLegacyRequest,
  type McpHttpHandler,
  McpServer,
  readRequestBody,
  type ScopeChallengeHandler,
  type ServerContext,
  type StandardSchemaWithJSON,
} from "@modelcontextprotocol/server";
import { type Static, Type as t } from "@sinclair/typebox";
import type { RelayAssertion, RelayTool } from "../../contract/relay";
import type { Logger } from "../../lib/logger";
import { bearerChallenge, jsonRpcError, LegacySessions, metadataResponse } from "../../lib/mcp-http";
import type { Node, NodeStore } from "../nodes";
import { type AccessTokenVerifier, ASSISTANT_SCOPES, type AssistantGrant } from "../oauth/grant";
import type { RelayHub } from "./hub";

/** CONSOLE_MCP_PATH is where assistants reach the account's machines: the console's own origin. */
export const CONSOLE_MCP_PATH = "/mcp";
/** RESOURCE_METADATA_PATHS serve RFC 9728 metadata: path-inserted for /mcp (§3.1), and at the root. */
export const RESOURCE_METADATA_PATHS = ["/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"];
/** OPERATE_SCOPE is what a tool that changes a machine needs; `engine:read` reaches only reading tools. */
export const OPERATE_SCOPE = "engine:operate";

/** MAX_BODY_BYTES bounds a POST to /mcp as the engine bounds its own. */
const MAX_BODY_BYTES = 1024 * 1024;
/** SESSION_IDLE_MS ends a 2025-11-25 session nobody used for this long. */
const SESSION_IDLE_MS = 30 * 60_000;
/** MAX_SESSIONS bounds the 2025-11-25 sessions held; the least recently used goes first. */
const MAX_SESSIONS = 1024;
/** NODE_ARGUMENT is the argument the console adds to every engine tool: which machine to run it on. */
const NODE_ARGUMENT = "node";

const INSTRUCTIONS =
  "This server reaches the GPU workstations (machines) linked to one engine cloud account, through the console. Call list_machines to see them and whether each is online. Every other tool runs on one machine: name it with the `node` argument (its name or id), which may be left out when the account's consent reaches a single machine. When a service misbehaves, call diagnose first. What a call may do is what the account's owner granted this assistant: engine:read reads, engine:operate also deploys and operates services.";

/** MachineView is one machine as list_machines answers it. */
const MachineView = t.Object({
  id: t.String(),
  name: t.String({ description: "The machine's slug: what the node argument takes" }),
  hostname: t.String({ description: "As the machine reported it (unverified)" }),
  online: t.Boolean(),
  online_since: t.Union([t.String(), t.Null()]),
  last_seen_at: t.Union([t.String(), t.Null()], {
    description: "When the console last heard from it; for an offline machine, since when it is offline",
  }),
  version: t.String({ description: "The engine's version, as it reported it" }),
  gpus: t.Array(
    t.Object({
      index: t.Integer(),
      name: t.String(),
      memory_total_mb: t.Integer(),
      mig_profile: t.Union([t.String(), t.Null()]),
    }),
  ),
});
const ListMachinesOutput = t.Object({ machines: t.Array(MachineView) });
type ListMachinesOutput = Static<typeof ListMachinesOutput>;

export interface ConsoleMcpOptions {
  /** verifier checks an assistant's token; read at each request, so the composition root can swap it. */
  verifier: () => AccessTokenVerifier;
  hub: RelayHub;
  nodes: NodeStore;
  /** publicUrl is the console's public origin: the resource is `<publicUrl>/mcp`. */
  publicUrl: () => string;
  log: Logger;
  version: string;
  now?: () => number;
}

interface RelayedTool {
  tool: RelayTool;
  input: StandardSchemaWithJSON;
  output: StandardSchemaWithJSON | undefined;
  readOnly: boolean;
}

/** GrantedNodes are the account's nodes, and those of them a grant reaches. */
interface GrantedNodes {
  all: Node[];
  granted: Node[];
}

/**
 * CallerGrant rides in AuthInfo.extra from the bearer check to the tool call, one per HTTP
 * request: the grant, and the request's one read of the account's nodes (made when the tool
 * list or the call first needs it, so a request reads them once, and the next request afresh).
 */
interface CallerGrant {
  grant: AssistantGrant;
  nodes?: Promise<GrantedNodes>;
}

/**
 * relayedSchema presents an engine tool's JSON Schema to the SDK without checking anything
 * against it: the engine checks every call's arguments and its own answer with that same schema
 * (decision 203), so the console lists the schema and leaves the checking to the engine, rather
 * than compile it and run it a second time on every call (decision 246).
 */
function relayedSchema(schema: Record<string, unknown>): StandardSchemaWithJSON {
  return {
    "~standard": {
      version: 1,
      vendor: "engine-relay",
      validate: (value: unknown) => ({ value }),
      jsonSchema: { input: () => schema, output: () => schema },
    },
  } as StandardSchemaWithJSON;
}

/**
 * withNodeArgument adds the `node` argument to an engine tool's input schema: which machine the
 * call runs on (its slug or id), optional when the consent reaches exactly one.
 */
function withNodeArgument(schema: Record<string, unknown>): Record<string, unknown> {
  const properties = (schema.properties ?? {}) as Record<string, unknown>;
  return {
    ...schema,
    type: "object",
    properties: {
      ...properties,
      [NODE_ARGUMENT]: {
        type: "string",
        minLength: 1,
        maxLength: 128,
        description:
          "The machine to run on: its name or id, as list_machines shows them. May be left out when this assistant may reach exactly one machine.",
      },
    },
  };
}

/**
 * ConsoleMcpEndpoint serves `/mcp` on the console's origin, the resource server for
 * assistants (docs/decisions.md 240 onwards), and the RFC 9728 metadata that names the console
 * as its authorization server.
 *
 * Each request's bearer token is checked with the verifier for the audience `<public>/mcp`
 * (401 with the RFC 9728 challenge otherwise); the token itself goes no further. The tools are
 * `list_machines` (answered here) and the engine's own tools as a linked engine listed them over
 * its tunnel, each with a `node` argument; a call is forwarded over the chosen node's tunnel with
 * an assertion of the grant (account, client, grant, scopes, node), never the token. A tool that
 * changes a machine needs `engine:operate`: with `engine:read` alone the call is answered 403
 * `insufficient_scope` with the step-up challenge, before anything is forwarded. Both protocol
 * eras are served, as on the engine: 2026-07-28 statelessly, 2025-11-25 with sessions bound to
 * the grant that opened them.
 */
export class ConsoleMcpEndpoint {
  readonly #o: ConsoleMcpOptions;
  readonly #now: () => number;
  readonly #sessions: LegacySessions;
  /** #prepared holds tool lists read from node rows, by a hash of their JSON (a console restart, an offline machine). */
  readonly #prepared = new Map<string, RelayedTool[]>();
  /** #preparedLive holds the tool list each connected engine sent in its hello, by that list itself. */
  readonly #preparedLive = new WeakMap<RelayTool[], RelayedTool[]>();
  readonly #listMachinesOutput = fromJsonSchema(JSON.parse(JSON.stringify(ListMachinesOutput)));
  readonly #noInput = fromJsonSchema({ type: "object", properties: {}, additionalProperties: false });
  #modern: McpHttpHandler | undefined;

  constructor(options: ConsoleMcpOptions) {
    this.#o = options;
    this.#now = options.now ?? Date.now;
    this.#sessions = new LegacySessions({ max: MAX_SESSIONS, idleMs: SESSION_IDLE_MS, maxBodyBytes: MAX_BODY_BYTES, now: this.#now });
  }

  start(): void {
    this.#modern = createMcpHandler((ctx) => this.#server(ctx.authInfo), {
      legacy: "reject",
      maxRequestBodySize: MAX_BODY_BYTES,
      onerror: (error) => this.#o.log.debug({ err: error.message }, "console MCP request refused"),
    });
    this.#sessions.start();
  }

  async stop(): Promise<void> {
    await this.#sessions.stop();
    await this.#modern?.close().catch(() => undefined);
    this.#modern = undefined;
  }

  /** handles says whether a request is this endpoint's: `/mcp` and the metadata documents. */
  handles(path: string): boolean {
    return path === CONSOLE_MCP_PATH || RESOURCE_METADATA_PATHS.includes(path);
  }

  /** resource is the console's MCP URL: the audience its tokens are issued for (RFC 8707). */
  resource(): string {
    return `${this.#o.publicUrl()}${CONSOLE_MCP_PATH}`;
  }

  async fetch(request: Request): Promise<Response> {
    const url = new URL(request.url);
    if (url.pathname !== CONSOLE_MCP_PATH) return this.#metadata(request);
    const refused = this.#checkOrigin(request);
    if (refused) return refused;
    if (!this.#modern) return jsonRpcError(503, -32603, "the MCP endpoint is not started");

    const header = request.headers.get("authorization");
    const token = header === null ? undefined : /^Bearer +([\x21-\x7e]+) *$/i.exec(header)?.[1];
    if (!token) return this.#challenge(header !== null, "this endpoint needs an access token: connect the assistant through the console");
    let verdict: Awaited<ReturnType<AccessTokenVerifier>>;
    try {
      verdict = await this.#o.verifier()(token, this.resource());
    } catch (error) {
      this.#o.log.error({ err: error }, "console MCP: the access token verifier failed");
      return jsonRpcError(503, -32603, "the console cannot check access tokens right now; try again");
    }
    if (!verdict.ok) return this.#challenge(true, verdict.description);
    const { grant } = verdict;
    if (grant.expiresAt.getTime() <= this.#now()) return this.#challenge(true, "the access token has expired");
    const authInfo: AuthInfo = {
      token: "",
      clientId: grant.clientId,
      scopes: [...grant.scopes],
      expiresAt: Math.floor(grant.expiresAt.getTime() / 1000),
      resource: new URL(this.resource()),
      resourceMetadataUrl: this.#metadataUrl(),
      extra: { caller: { grant } satisfies CallerGrant },
    };
    const body = await readJsonBody(request);
    // Answered as the SDK's handler answers them.
    if (body.kind === "too_large")
      return jsonRpcError(413, -32000, `Payload Too Large: Request body must not exceed ${MAX_BODY_BYTES} bytes`);
    if (body.kind === "unreadable") return jsonRpcError(400, -32700, "Parse error: the request body could not be read");
    const { parsedBody } = body;
    const forwarded = body.kind === "unparsed" ? body.request : request;
    if (await isLegacyRequest(forwarded, parsedBody, { maxRequestBodySize: MAX_BODY_BYTES })) {
      return this.#legacy(forwarded, authInfo, grant, parsedBody);
    }
    return this.#modern.fetch(forwarded, { authInfo, ...(parsedBody === undefined ? {} : { parsedBody }) });
  }

  /** #server builds the server for one modern request or one legacy session: list_machines and the engine's tools. */
  async #server(authInfo: AuthInfo | undefined): Promise<McpServer> {
    const caller = authInfo?.extra?.caller as CallerGrant | undefined;
    const server = new McpServer(
      { name: "engine-cloud", title: "engine cloud console", version: this.#o.version },
      { instructions: INSTRUCTIONS },
    );
    server.registerTool(
      "list_machines",
      {
        title: "List machines",
        description:
          "The machines this assistant may reach: name (what the node argument takes), whether each is online (or since when it is offline), its engine version and GPUs.",
        inputSchema: this.#noInput,
        outputSchema: this.#listMachinesOutput,
        annotations: { title: "List machines", readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
      },
      async (_args: unknown, ctx: ServerContext): Promise<CallToolResult> => {
        const machines = await this.#machines(this.#callerOf(ctx));
        return { content: [{ type: "text", text: JSON.stringify(machines) }], structuredContent: machines };
      },
    );
    if (!caller) return server;
    for (const relayed of await this.#catalog(caller)) {
      const { tool } = relayed;
      server.registerTool(
        tool.name,
        {
          title: tool.title,
          description: tool.description,
          inputSchema: relayed.input,
          outputSchema: relayed.output,
          annotations: tool.annotations as never,
          scopeChallenge: relayed.readOnly ? undefined : operateChallenge(tool.name),
        },
        async (args: unknown, ctx: ServerContext): Promise<CallToolResult> =>
          this.#forward(this.#callerOf(ctx), tool.name, (args ?? {}) as Record<string, unknown>),
      );
    }
    return server;
  }

  #callerOf(ctx: ServerContext): CallerGrant {
    const caller = ctx.http?.authInfo?.extra?.caller as CallerGrant | undefined;
    if (!caller) throw new Error("an MCP call arrived without its grant");
    return caller;
  }

  /**
   * #grantedNodes are the account's nodes the grant reaches (all of them when its nodeIds is
   * null), read once per request: the tool list and the call of one request share the read.
   */
  #grantedNodes(caller: CallerGrant): Promise<GrantedNodes> {
    caller.nodes ??= this.#o.nodes.list(caller.grant.accountId).then((all) => {
      const allowed = caller.grant.nodeIds === null ? null : new Set(caller.grant.nodeIds);
      return { all, granted: allowed === null ? all : all.filter((node) => allowed.has(node.id)) };
    });
    return caller.nodes;
  }

  /**
   * #catalog lists the engine tools to offer: those an online granted node listed in its hello,
   * else those the most recently seen granted node listed last (stored on its row), else none
   * (only list_machines) until one of them connects.
   */
  async #catalog(caller: CallerGrant): Promise<RelayedTool[]> {
    const { granted } = await this.#grantedNodes(caller);
    for (const node of granted) {
      const live = this.#o.hub.toolsOf(node.id);
      if (!live) continue;
      let prepared = this.#preparedLive.get(live);
      if (!prepared) {
        prepared = this.#prepare(live);
        this.#preparedLive.set(live, prepared);
      }
      return prepared;
    }
    const stored = await this.#o.nodes.toolsOf(
      caller.grant.accountId,
      granted.map((node) => node.id),
    );
    if (!stored) return [];
    // A list read from a row is a new array each time: it is known by its content.
    const key = String(Bun.hash(JSON.stringify(stored)));
    let prepared = this.#prepared.get(key);
    if (!prepared) {
      prepared = this.#prepare(stored);
      if (this.#prepared.size >= 8) this.#prepared.delete(this.#prepared.keys().next().value as string);
      this.#prepared.set(key, prepared);
    }
    return prepared;
  }

  /**
   * #prepare prepares a tool list for the SDK once (the same engine lists the same tools for
   * as long as its tunnel is up; the same version lists the same tools after a restart).
   */
  #prepare(tools: RelayTool[]): RelayedTool[] {
    const prepared: RelayedTool[] = [];
    for (const tool of tools) {
      if (tool.name === "list_machines" || (tool.inputSchema.properties as Record<string, unknown> | undefined)?.[NODE_ARGUMENT]) {
        this.#o.log.warn({ tool: tool.name }, "console MCP: an engine tool clashes with the console's own names; not offered");
        continue;
      }
      prepared.push({
        tool,
        input: relayedSchema(withNodeArgument(tool.inputSchema)),
        output: tool.outputSchema ? relayedSchema(tool.outputSchema) : undefined,
        readOnly: (tool.annotations as { readOnlyHint?: boolean } | undefined)?.readOnlyHint === true,
      });
    }
    return prepared;
  }

  async #machines(caller: CallerGrant): Promise<ListMachinesOutput> {
    const { granted } = await this.#grantedNodes(caller);
    return {
      machines: granted.map((node) => {
        const now = this.#o.hub.nodeNow(node);
        return {
          id: node.id,
          name: node.slug,
          hostname: node.hostname,
          online: now.online,
          online_since: now.online_since,
          last_seen_at: now.last_seen_at,
          version: now.version,
          gpus: now.gpus ?? [],
        };
      }),
    };
  }

  /**
   * #forward runs one engine tool on the chosen node: the `node` argument (slug or id), or the
   * grant's only node. A node outside the grant, an offline node, or an engine that did not run
   * the call is a tool error the assistant can read; the engine's own answer is returned as it is.
   */
  async #forward(caller: CallerGrant, tool: string, args: Record<string, unknown>): Promise<CallToolResult> {
    const { grant } = caller;
    const { [NODE_ARGUMENT]: named, ...rest } = args;
    if (named !== undefined && (typeof named !== "string" || named.trim() === "" || named.length > 128)) {
      return toolError("invalid_argument", "node must be a machine's name or id, as list_machines shows them");
    }
    const { all, granted } = await this.#grantedNodes(caller);
    let target: Node | undefined;
    if (typeof named === "string") {
      const wanted = named.trim().toLowerCase();
      target = all.find((node) => node.id === named.trim() || node.slug === wanted);
      if (!target)
        return toolError(
          "machine_not_found",
          `no machine named ${JSON.stringify(named)} in this account; list_machines lists the ones this assistant may reach`,
        );
      if (!granted.includes(target)) {
        return toolError(
          "machine_not_granted",
          `this assistant was not granted access to ${target.slug}; the account's owner can grant it by authorizing the assistant again in the console`,
        );
      }
    } else if (granted.length === 1) {
      target = granted[0];
    } else if (granted.length === 0) {
      return toolError(
        "no_machines",
        "this assistant may reach no machine: link one with `engine link`, or authorize the assistant for one in the console",
      );
    } else {
      return toolError(
        "machine_required",
        `this assistant may reach ${granted.length} machines (${granted.map((node) => node.slug).join(", ")}): name one with the node argument`,
      );
    }
    if (!target) return toolError("machine_not_found", "no machine was chosen");
    const presence = this.#o.hub.presence(target.id);
    if (!presence.online) return toolError("machine_offline", offlineMessage(target));
    const assertion: RelayAssertion = {
      account_id: grant.accountId,
      node_id: target.id,
      client_id: grant.clientId,
      grant_id: grant.grantId,
      scopes: [...grant.scopes],
      expires_at: grant.expiresAt.toISOString(),
    };
    const outcome = await this.#o.hub.call(target.id, assertion, tool, rest);
    if (!outcome.ok) {
      if (outcome.code === "offline" || outcome.code === "disconnected") {
        const stored = await this.#o.nodes.get(target.accountId, target.id);
        return toolError("machine_offline", `${offlineMessage(stored ?? target)} (${outcome.message})`);
      }
      return toolError(outcome.code, `${target.slug}: ${outcome.message}`);
    }
    const { content, structuredContent, isError } = outcome.value as CallToolResult;
    return { content: content ?? [], ...(structuredContent === undefined ? {} : { structuredContent }), ...(isError ? { isError } : {}) };
  }

  /**
   * #legacy serves 2025-era traffic with sessions: `initialize` without Mcp-Session-Id opens
   * one, later requests name it. A session is bound to the grant that opened it; another grant
   * naming it is told the session does not exist. Each request still carries its own token,
   * checked above, so a revoked grant stops at its next request.
   */
  async #legacy(request: Request, authInfo: AuthInfo, grant: AssistantGrant, parsedBody: unknown): Promise<Response> {
    const options = { authInfo, ...(parsedBody === undefined ? {} : { parsedBody }) };
    return this.#sessions.handle(request, grant.grantId, options, async (transport) => (await this.#server(authInfo)).connect(transport));
  }

  /** #checkOrigin refuses a browser page of another site: an Origin must be absent (assistants are not browsers) or the console's own. */
  #checkOrigin(request: Request): Response | undefined {
    const origin = request.headers.get("origin");
    if (origin === null || origin === "") return undefined;
    if (origin === new URL(this.#o.publicUrl()).origin) return undefined;
    return jsonRpcError(
      403,
      -32000,
      `the Origin ${origin} may not call this endpoint: a browser page of another site may not reach the account's machines`,
    );
  }

  #metadataUrl(): string {
    return `${this.#o.publicUrl()}${RESOURCE_METADATA_PATHS[0]}`;
  }

  /**
   * #metadata serves RFC 9728 protected-resource metadata: the resource `<public>/mcp`, the
   * console itself as its authorization server (same origin: assistants ignore one on another
   * host), and the scopes an assistant may be granted.
   */
  #metadata(request: Request): Response {
    return metadataResponse(request, () => {
      const publicUrl = this.#o.publicUrl();
      return {
        resource: this.resource(),
        authorization_servers: [publicUrl],
        scopes_supported: [...ASSISTANT_SCOPES],
        bearer_methods_supported: ["header"],
        resource_name: "engine cloud: your linked machines",
        resource_documentation: `${publicUrl}/nodes`,
      };
    });
  }

  /**
   * #challenge answers a request without a usable token: 401 with `WWW-Authenticate: Bearer
   * resource_metadata="…"` (RFC 9728 §5.1), plus `error="invalid_token"` when a credential was
   * sent (RFC 6750 §3.1: no error code when none was).
   */
  #challenge(presented: boolean, description: string): Response {
    return bearerChallenge(this.#metadataUrl(), presented, description, (text) =>
      text.replaceAll(/[\\"]/g, "'").replaceAll(/[^\x20-\x7e]/g, " "),
    );
  }
}

/** operateChallenge asks for `engine:operate` before a tool that changes a machine runs (403 insufficient_scope). */
function operateChallenge(tool: string): ScopeChallengeHandler {
  return ({ authInfo }) => {
    if (authInfo === undefined || authInfo.scopes.includes(OPERATE_SCOPE)) return undefined;
    return {
      scopes: [OPERATE_SCOPE],
      errorDescription: `${tool} changes the machine: it needs ${OPERATE_SCOPE}, and this assistant was granted only ${authInfo.scopes.join(" ")}`,
    };
  };
}

function offlineMessage(node: Node): string {
  return node.lastSeenAt === null
    ? `machine ${node.slug} is offline: it has never connected to the console (is its engine running, and linked?)`
    : `machine ${node.slug} is offline since ${new Date(node.lastSeenAt).toISOString()}`;
}

/** toolError is a refusal the assistant reads: `{ error: { code, message } }`, as the engine's tools answer theirs. */
function toolError(code: string, message: string): CallToolResult {
  return { isError: true, content: [{ type: "text", text: JSON.stringify({ error: { code, message } }) }] };
}

/**
 * JsonBody is a request's body read once, for both the era check and the handler that serves it:
 * parsed JSON, or, when the body is not JSON (the SDK answers that), a copy of the request
 * carrying the text read.
 */
type JsonBody =
  | { kind: "parsed"; parsedBody: unknown }
  | { kind: "unparsed"; parsedBody: undefined; request: Request }
  | { kind: "none"; parsedBody: undefined }
  | { kind: "too_large" }
  | { kind: "unreadable" };

/**
 * readJsonBody reads a JSON POST's body once (bounded as the SDK bounds it) so it is parsed once:
 * the SDK's era check (`isLegacyRequest`) and its handlers each read and parse a body they are
 * not given. A GET, a DELETE, or a POST the SDK refuses by its Content-Type (415) is left unread.
 */
async function readJsonBody(request: Request): Promise<JsonBody> {
  if (request.method !== "POST" || !isJsonContentType(request.headers.get("content-type"))) return { kind: "none", parsedBody: undefined };
  let text: string;
  try {
    const read = await readRequestBody(request, MAX_BODY_BYTES);
    if (read.tooLarge) return { kind: "too_large" };
    text = read.text;
  } catch {
    return { kind: "unreadable" };
  }
  try {
    if (text !== "") return { kind: "parsed", parsedBody: JSON.parse(text) };
  } catch {
    // not JSON: the SDK answers it, from a copy of what was read
  }
  return {
    kind: "unparsed",
    parsedBody: undefined,
    request: new Request(request.url, { method: request.method, headers: request.headers, body: text, signal: request.signal }),
  };
}
