import { TOOLSETS, type ToolSpec, type Toolset } from "./tools";

/**
 * McpFilters narrow the tools one MCP server lists, as github-mcp-server's and
 * kubernetes-mcp-server's flags do. They are the user's choice of what an assistant is shown,
 * not a security boundary: the token's role, caps and scope are, and they apply to every call.
 */
export interface McpFilters {
  /** readOnly keeps only the tools that change nothing. */
  readOnly: boolean;
  /** toolsets keeps only the tools of these groups; null keeps all. */
  toolsets: readonly Toolset[] | null;
  /** disableDestructive drops the tools whose destructiveHint is true (stop, restart, remove, deploy, restore). */
  disableDestructive: boolean;
}

export const NO_FILTERS: McpFilters = Object.freeze({ readOnly: false, toolsets: null, disableDestructive: false });

/** FilterError is a filter value that names nothing: the CLI prints it, `/mcp` answers 400 with it. */
export class FilterError extends Error {}

/** parseToolsets reads `services,logs,...` (or `all`), refusing a name that is no toolset. */
export function parseToolsets(value: string): readonly Toolset[] | null {
  const names = value
    .split(",")
    .map((name) => name.trim().toLowerCase())
    .filter((name) => name !== "");
  if (names.length === 0) throw new FilterError(`toolsets takes a comma-separated list of ${TOOLSETS.join(", ")} (or all)`);
  if (names.includes("all")) return null;
  for (const name of names) {
    if (!TOOLSETS.includes(name as Toolset)) {
      throw new FilterError(`unknown toolset ${JSON.stringify(name)}: choose from ${TOOLSETS.join(", ")} (or all)`);
    }
  }
  return TOOLSETS.filter((name) => names.includes(name));
}

function flag(name: string, value: string | null): boolean {
  if (value === null) return false;
  const lower = value.toLowerCase();
  if (["", "1", "true", "yes", "on"].includes(lower)) return true;
  if (["0", "false", "no", "off"].includes(lower)) return false;
  throw new FilterError(`${name} takes true or false (got ${JSON.stringify(value)})`);
}

/**
 * filtersFromQuery reads the filters of a `/mcp` URL: `?read_only=true&toolsets=services,logs&
 * disable_destructive=true`. The URL is what a user configures in the assistant, so the same
 * choices the CLI flags give are one URL away. Other parameters are ignored.
 */
export function filtersFromQuery(params: URLSearchParams): McpFilters {
  const toolsets = params.get("toolsets");
  return {
    readOnly: flag("read_only", params.get("read_only")),
    toolsets: toolsets === null ? null : parseToolsets(toolsets),
    disableDestructive: flag("disable_destructive", params.get("disable_destructive")),
  };
}

/**
 * selectTools answers the tools the filters keep, in table order. get_operation (no toolset)
 * is kept exactly when a kept tool can start an operation, so a handle is never unpollable
 * and a read-only server does not list it for nothing.
 */
export function selectTools(tools: readonly ToolSpec[], filters: McpFilters): ToolSpec[] {
  const kept = tools.filter((spec) => {
    if (spec.toolset === null) return false;
    if (filters.toolsets && !filters.toolsets.includes(spec.toolset)) return false;
    if (filters.readOnly && !spec.readOnly) return false;
    if (filters.disableDestructive && spec.destructive) return false;
    return true;
  });
  const polling = kept.some((spec) => spec.startsOperations);
  return tools.filter((spec) => kept.includes(spec) || (spec.toolset === null && polling));
}
