import { StdioServerTransport, serveStdio } from "@modelcontextprotocol/server/stdio";
import { systemClock } from "../../lib/clock";
import type { ApiTransport } from "./context";
import type { McpFilters } from "./filters";
import { OperationBook } from "./operations";
import { buildMcpServer, compiledTools } from "./server";

/** StdioOptions are what `engine mcp` gives the stdio server: how it reaches the daemon, and its filters. */
export interface StdioOptions {
  transport: ApiTransport;
  filters: McpFilters;
  version: string;
  /** input and output default to the process's stdin and stdout. */
  input?: NodeJS.ReadableStream;
  output?: NodeJS.WritableStream;
}

/** ClosingStdioTransport is the SDK's stdio transport, with a promise that settles when it closes (stdin ended). */
class ClosingStdioTransport extends StdioServerTransport {
  readonly closed: Promise<void>;
  #resolve: () => void = () => undefined;

  constructor(input?: NodeJS.ReadableStream, output?: NodeJS.WritableStream) {
    super(input as never, output as never);
    this.closed = new Promise((resolve) => {
      this.#resolve = resolve;
    });
  }

  override async close(): Promise<void> {
    await super.close();
    this.#resolve();
  }
}

/**
 * serveMcpStdio serves MCP over stdin and stdout for a desktop assistant that starts
 * `engine mcp` itself, and resolves when the assistant closes stdin. Both eras are served
 * (the SDK's serveStdio picks the connection's era from its opening: `initialize` or a
 * 2026-07-28 request). There is no OAuth on stdio: every call reaches the daemon with the
 * CLI's credential (the unix socket, which is admin, or ENGINE_TOKEN), and the daemon's API
 * enforces that credential's role, caps and scope.
 */
export async function serveMcpStdio(options: StdioOptions): Promise<void> {
  compiledTools();
  const operations = new OperationBook(systemClock);
  const caller = { transport: options.transport, owner: "stdio" };
  const transport = new ClosingStdioTransport(options.input, options.output);
  const handle = serveStdio(
    () => buildMcpServer({ version: options.version, filters: options.filters, operations, callerOf: () => caller, now: () => Date.now() }),
    { transport, onerror: (error) => process.stderr.write(`engine mcp: ${error.message}\n`) },
  );
  await transport.closed;
  await handle.close().catch(() => undefined);
}
