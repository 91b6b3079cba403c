/**
 * The relay between the console and linked engines (docs/decisions.md 240 onwards): the tunnel
 * each linked engine keeps open (`hub`), and the console's `/mcp`, the resource server through
 * which assistants reach those engines (`mcp`).
 */

export {
  type Presence,
  RELAY_CALL_TIMEOUT_MS,
  RELAY_DEAD_AFTER_MS,
  type RelayFailure,
  RelayHub,
  type RelayHubOptions,
  type RelayOutcome,
  type TunnelSocketData,
} from "./hub";
export { CONSOLE_MCP_PATH, ConsoleMcpEndpoint, type ConsoleMcpOptions, OPERATE_SCOPE, RESOURCE_METADATA_PATHS } from "./mcp";
