import { type CallToolResult, Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

/** ERAS are the two protocol revisions the engine serves, as the SDK client speaks them. */
export const ERAS = ["2025-11-25", "2026-07-28"] as const;
export type Era = (typeof ERAS)[number];

/** McpSession is an SDK v2 client connected to an engine's /mcp. */
export interface McpSession {
  client: Client;
  transport: StreamableHTTPClientTransport;
  close(): Promise<void>;
}

/**
 * connectHttp connects the SDK v2 client to `<base>/mcp<query>` with a bearer token: with the
 * 2025-11-25 handshake (initialize, then Mcp-Session-Id), or pinned to 2026-07-28 (stateless,
 * `server/discover`, Mcp-Method headers).
 */
export async function connectHttp(base: string, token: string, era: Era, query = ""): Promise<McpSession> {
  const client = new Client(
    { name: "engine-test", version: "1.0.0" },
    era === "2026-07-28" ? { versionNegotiation: { mode: { pin: "2026-07-28" } } } : {},
  );
  const transport = new StreamableHTTPClientTransport(new URL(`${base}/mcp${query}`), {
    requestInit: { headers: { authorization: `Bearer ${token}` } },
  });
  await client.connect(transport);
  return { client, transport, close: () => client.close() };
}

/** toolError reads the JSON a failed tool call carries: the API's own answer with its status. */
export function toolError(result: CallToolResult): { status?: number; error?: { code: string; message: string }; detail?: unknown[] } {
  if (!result.isError) throw new Error(`the tool call did not fail: ${JSON.stringify(result).slice(0, 300)}`);
  const first = result.content[0];
  if (first?.type !== "text") throw new Error("a tool error carries text");
  return JSON.parse(first.text);
}

/** structured reads a successful call's structured content. */
export function structured<T>(result: CallToolResult): T {
  if (result.isError) throw new Error(`the tool call failed: ${JSON.stringify(result.content).slice(0, 500)}`);
  return result.structuredContent as T;
}
