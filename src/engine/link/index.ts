export { loadSecretKey } from "../../lib/files";
export {
  abortableSleep,
  CloudLinkClient,
  type CloudLinkClientOptions,
  DEFAULT_CLOUD_URL,
  type DeviceLinkResponse,
  type LinkClaimResponse,
  LinkError,
  type MetadataAnswer,
  normalizeCloudUrl,
  type PollEvent,
  type PollOptions,
  type ReportedMachine,
  reportedMachine,
} from "./client";
export { IDENTITY_FILE, IdentityStore, LINK_DIR, type LinkClaim, type LinkedNode, type NodeIdentity } from "./identity";
export { METADATA_REFRESH_MS, METADATA_RETRY_MS, MetadataRefresher, type RefreshOutcome } from "./refresh";
export { type LinkRouteDeps, linkRoutes } from "./routes";
export {
  type AssertionRefusal,
  assistantPrincipal,
  assistantRoleOf,
  backoffDelay,
  checkAssertion,
  describeHandshakeFailure,
  openTunnelSocket,
  TUNNEL_BACKOFF,
  TUNNEL_DEAD_AFTER_MS,
  TUNNEL_HEARTBEAT_MS,
  TunnelClient,
  type TunnelClientOptions,
  type TunnelHandlers,
  type TunnelSocket,
  type TunnelState,
  type TunnelStatus,
  tunnelUrl,
} from "./tunnel";
export { type VcsCredential, VcsTokenStore } from "./vcs-token";
