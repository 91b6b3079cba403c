import type { Command } from "commander";
import { FilterError, type McpFilters, parseToolsets, ToolError } from "../../src/engine/mcp";
import { VERSION } from "../../src/lib/version";
import { CliError, type EngineClient } from "../client";

/**
 * registerMcp adds `engine mcp`: an MCP server on stdin/stdout for a desktop assistant
 * (Claude Desktop, Cursor, ...) that starts it as a subprocess. Its tools reach the daemon as
 * every other command does, over the unix socket (admin) or with --url/--token
 * (ENGINE_URL/ENGINE_TOKEN); nothing but the protocol is written to stdout.
 */
export function registerMcp(program: Command, client: () => EngineClient): void {
  program
    .command("mcp")
    .description("serve MCP over stdio for a desktop assistant (Claude Desktop, Cursor): the engine's tools, as this CLI's credential")
    .option("--read-only", "list only the tools that change nothing")
    .option("--toolsets <list>", "list only these groups: services, logs, gpu, templates, db (comma-separated, or all)", "all")
    .option("--disable-destructive", "leave out the tools that stop, restart, remove, deploy or restore")
    .action(async (options: { readOnly?: boolean; toolsets: string; disableDestructive?: boolean }) => {
      let filters: McpFilters;
      try {
        filters = {
          readOnly: options.readOnly === true,
          toolsets: parseToolsets(options.toolsets),
          disableDestructive: options.disableDestructive === true,
        };
      } catch (error) {
        if (error instanceof FilterError) throw new CliError(`--toolsets: ${error.message}`);
        throw error;
      }
      const api = client();
      // The MCP SDK loads with this command, not with every other one (decision 515).
      const { serveMcpStdio } = await import("../../src/engine/mcp/stdio");
      await serveMcpStdio({
        filters,
        version: VERSION,
        transport: async (method, path, body) => {
          try {
            return await api.exchange(method, path, body);
          } catch (error) {
            // The assistant reads this as the tool's error; the session stays up for the next call.
            throw new ToolError("engine_unreachable", (error as Error).message);
          }
        },
      });
    });
}
