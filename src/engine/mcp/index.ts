/**
 * The engine's MCP server. This entry loads none of the MCP SDK: the daemon imports it at start,
 * and the SDK (its schemas, AJV) loads with the first MCP request (decision 515). `./server`
 * (the tools' MCP server) and `./stdio` (`engine mcp`) load it, and are imported where needed.
 */
export { type ApiAnswer, ApiFailure, type ApiTransport, ToolError } from "./context";
export { FilterError, filtersFromQuery, type McpFilters, NO_FILTERS, parseToolsets, selectTools } from "./filters";
export { MCP_PATH, McpEndpoint, type McpEndpointOptions, PROTECTED_RESOURCE_PATHS, type RelayAnswer, type RelayedCaller } from "./http";
export { type LogShape, parseLogTime, parseSince, shapeLogs, TRUNCATION_MARK } from "./logs";
export { Operation, OperationBook } from "./operations";
export { accessOf, causeOf, checkToolTable, DEFAULT_LOG_BYTES, TOOLS, TOOLSETS, type ToolSpec, type Toolset } from "./tools";
