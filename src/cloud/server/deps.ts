import type { SecretBox } from "../../lib/crypto";
import type { Logger } from "../../lib/logger";
import type { AccountStore } from "../accounts";
import type { AuditLog } from "../audit";
import type { SessionStore } from "../auth/sessions";
import type { CloudConfig } from "../config";
import type { Database } from "../db";
import type { ManagedService } from "../managed";
import type { NodeStore } from "../nodes";
import type { AccessTokenVerifier } from "../oauth/grant";
import type { RateLimiter } from "../ratelimit";
import type { RelayHub } from "../relay";

/**
 * CloudDeps are the modules the console's routes call, built once by the composition root.
 * Handlers are thin: validate, charge the rate limit, call the module, answer.
 */
export interface CloudDeps {
  config: CloudConfig;
  log: Logger;
  version: string;
  startedAt: number;
  db: Database;
  accounts: AccountStore;
  sessions: SessionStore;
  nodes: NodeStore;
  audit: AuditLog;
  /** managed runs the account's hosted machine (issue 15); its provider is null when none is offered. */
  managed: ManagedService;
  limiter: RateLimiter;
  /** secrets seals what must be read again (a PKCE verifier), under the data dir's key. */
  secrets: SecretBox;
  /**
   * deriveKey returns a 256-bit key for one purpose (HKDF-SHA256 over the console's secret
   * key, the purpose as info), so keyed digests never use the sealing key itself. Replicas
   * share the secret key (ENGINE_CLOUD_SECRET_KEY), hence the same derived keys.
   */
  deriveKey(purpose: string): Buffer;
  /**
   * readyChecks are the role's dependencies GET /api/ready reports, by name; a module adds its
   * own (the identity provider's discovery document) when it is mounted.
   */
  readyChecks: Record<string, () => Promise<boolean>>;
  /** site is where the console is reached, fixed once the port is bound. */
  site: { publicUrl: string; hostedBaseDomain: string };
  /** relay is the registry of linked engines' tunnels: who is online, and the way to reach them. */
  relay: RelayHub;
  /**
   * verifyAccessToken checks an assistant's bearer token on `/mcp` (the authorization server's
   * half of the grant seam, src/cloud/oauth/grant.ts). Until that server is wired it refuses
   * every token ("assistant authorization is not configured").
   */
  verifyAccessToken: AccessTokenVerifier;
  /** sourceOf is the client's network address: the socket's peer, or X-Forwarded-For's rightmost untrusted hop when the peer is a trusted proxy. */
  sourceOf(request: Request): string;
}
