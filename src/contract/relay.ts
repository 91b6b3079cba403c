/**
 * The relay's tunnel: the messages a linked engine and its console exchange over the one
 * WebSocket the engine keeps open to `<cloud>/link/tunnel` (docs/decisions.md, 240 onwards).
 * Both ends check every message they receive with these schemas, so a peer that drifts is a
 * protocol error, never half-read.
 *
 * Each message is one JSON text frame with a `type`. Liveness is WebSocket ping and pong, not a
 * message. The engine speaks first (`hello`); the console answers `welcome`, then sends `call`
 * and `vcs_token` requests, each with an `id` the engine's `*_result` answer repeats.
 */
import { type Static, Type as t } from "@sinclair/typebox";

/** TUNNEL_PATH is where a linked engine opens its tunnel on the console (outside /api: it is a WebSocket, not a JSON route). */
export const TUNNEL_PATH = "/link/tunnel";
/** TUNNEL_PROTOCOL is the version of these messages; a console refuses a hello that names another. */
export const TUNNEL_PROTOCOL = 1;

/** TUNNEL_CLOSE names the close codes either end uses besides the standard 1000 and 1001. */
export const TUNNEL_CLOSE = {
  /** replaced: the same node opened a newer tunnel; this one is closed. */
  replaced: 4000,
  /** protocolError: a message did not match these schemas. */
  protocolError: 4002,
  /** unlinked: the engine's identity changed (unlinked or linked anew) while the tunnel was open. */
  unlinked: 4004,
} as const;

const Id = t.String({ minLength: 1, maxLength: 64 });

/** ReportedGpu is one GPU as the engine reports it to the console (unverified, like every reported field). */
export const ReportedGpu = t.Object({
  index: t.Integer({ minimum: 0, maximum: 1023 }),
  name: t.String({ maxLength: 128 }),
  memory_total_mb: t.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER }),
  mig_profile: t.Union([t.String({ maxLength: 32 }), t.Null()]),
});
export type ReportedGpu = Static<typeof ReportedGpu>;

/** MAX_REPORTED_GPUS bounds the GPUs one hello carries. */
export const MAX_REPORTED_GPUS = 64;

/**
 * RelayTool is one tool as the engine's MCP server lists it (`tools/list`): the console lists
 * the engine's own definitions, so assistants see exactly what the engine serves.
 */
export const RelayTool = t.Object(
  {
    name: t.String({ minLength: 1, maxLength: 64 }),
    title: t.Optional(t.String()),
    description: t.Optional(t.String()),
    inputSchema: t.Record(t.String(), t.Unknown()),
    outputSchema: t.Optional(t.Record(t.String(), t.Unknown())),
    annotations: t.Optional(t.Record(t.String(), t.Unknown())),
  },
  { additionalProperties: true },
);
export type RelayTool = Static<typeof RelayTool>;

/** Hello is the engine's first message: who it is beyond its credential (version, GPUs) and its MCP tools. */
export const TunnelHello = t.Object({
  type: t.Literal("hello"),
  protocol: t.Integer(),
  version: t.String({ maxLength: 64 }),
  gpus: t.Array(ReportedGpu, { maxItems: MAX_REPORTED_GPUS }),
  tools: t.Array(RelayTool, { maxItems: 256 }),
});
export type TunnelHello = Static<typeof TunnelHello>;

/** Report updates what the engine told in its hello (its GPUs changed). */
export const TunnelReport = t.Object({
  type: t.Literal("report"),
  gpus: t.Array(ReportedGpu, { maxItems: MAX_REPORTED_GPUS }),
});
export type TunnelReport = Static<typeof TunnelReport>;

/**
 * RelayAssertion is what the console asserts about one relayed call: the consent it rides on.
 * The assistant's token never crosses the tunnel; the engine maps these scopes to a principal
 * (`engine:read` → readonly, `engine:operate` → submitter) and checks that the account and the
 * node are its own.
 */
export const RelayAssertion = t.Object({
  account_id: t.String({ minLength: 1, maxLength: 128 }),
  node_id: t.String({ minLength: 1, maxLength: 128 }),
  client_id: t.String({ minLength: 1, maxLength: 2048 }),
  grant_id: t.String({ minLength: 1, maxLength: 128 }),
  scopes: t.Array(t.String({ maxLength: 64 }), { minItems: 1, maxItems: 8 }),
  /** expires_at is when the assistant's token expires (RFC 3339); the engine refuses an assertion past it. */
  expires_at: t.String({ maxLength: 40 }),
});
export type RelayAssertion = Static<typeof RelayAssertion>;

/** Welcome is the console's answer to a hello: the node it authenticated. */
export const TunnelWelcome = t.Object({
  type: t.Literal("welcome"),
  node_id: t.String(),
  slug: t.String(),
  account_id: t.String(),
});
export type TunnelWelcome = Static<typeof TunnelWelcome>;

/** Call asks the engine to run one MCP tool as the assertion's principal. */
export const TunnelCall = t.Object({
  type: t.Literal("call"),
  id: Id,
  assertion: RelayAssertion,
  tool: t.String({ minLength: 1, maxLength: 64 }),
  arguments: t.Record(t.String(), t.Unknown()),
});
export type TunnelCall = Static<typeof TunnelCall>;

/** RelayError is a call the engine did not run (a refused assertion, an unknown tool, a JSON-RPC error). */
export const RelayError = t.Object({ code: t.String({ maxLength: 64 }), message: t.String({ maxLength: 4096 }) });
export type RelayError = Static<typeof RelayError>;

/** CallResult answers a call: the tool's result (`CallToolResult`, possibly `isError`), or why it did not run. */
export const TunnelCallResult = t.Object({
  type: t.Literal("call_result"),
  id: Id,
  result: t.Optional(t.Record(t.String(), t.Unknown())),
  error: t.Optional(RelayError),
});
export type TunnelCallResult = Static<typeof TunnelCallResult>;

/** VcsToken pushes a code-host installation token (the body of the engine's `PUT /api/link/vcs-token`). */
export const TunnelVcsToken = t.Object({
  type: t.Literal("vcs_token"),
  id: Id,
  push: t.Unknown(),
});
export type TunnelVcsToken = Static<typeof TunnelVcsToken>;

/** VcsTokenResult is the engine's answer to a push: the status and body its API route answered. */
export const TunnelVcsTokenResult = t.Object({
  type: t.Literal("vcs_token_result"),
  id: Id,
  status: t.Integer({ minimum: 100, maximum: 599 }),
  body: t.Unknown(),
});
export type TunnelVcsTokenResult = Static<typeof TunnelVcsTokenResult>;

/** EngineMessage is any message an engine sends; ConsoleMessage any the console sends. */
export const EngineMessage = t.Union([TunnelHello, TunnelReport, TunnelCallResult, TunnelVcsTokenResult]);
export type EngineMessage = Static<typeof EngineMessage>;
export const ConsoleMessage = t.Union([TunnelWelcome, TunnelCall, TunnelVcsToken]);
export type ConsoleMessage = Static<typeof ConsoleMessage>;
