export { type ApiAnswer, ApiFailure, type ApiTransport, ToolError } from "./context";
export { FilterError, filtersFromQuery, type McpFilters, NO_FILTERS, parseToolsets, selectTools } from "./filters";
export { MCP_PATH, McpEndpoint, type McpEndpointOptions, PROTECTED_RESOURCE_PATHS, type RelayAnswer, type RelayedCaller } from "./http";
export { type LogShape, parseLogTime, parseSince, shapeLogs, TRUNCATION_MARK } from "./logs";
export { Operation, OperationBook } from "./operations";
export { compiledTools } from "./server";
export { serveMcpStdio } from "./stdio";
export { accessOf, causeOf, checkToolTable, DEFAULT_LOG_BYTES, TOOLS, TOOLSETS, type ToolSpec, type Toolset } from "./tools";
