/**
 * What the MCP endpoint (http.ts) loads on its first request: the SDK's HTTP handler and header
 * checks, and the tools' server. Nothing imports this module statically on the daemon's way
 * (decision 515).
 */
export { createMcpHandler, isLegacyRequest, validateHostHeader, validateOriginHeader } from "@modelcontextprotocol/server";
export { buildMcpServer } from "./server";
