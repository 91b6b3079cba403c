import type { AnyElysia } from "elysia";
import { ErrorEnvelope, HTTPValidationError } from "../contract/cloud";
import type { SecretBox } from "../lib/crypto";
import type { CloudErrorCode } from "../lib/errors";
import type { Logger } from "../lib/logger";
import type { AccountStore } from "./accounts";
import type { AuditLog } from "./audit";
import type { SessionStore } from "./auth/sessions";
import type { CloudConfig } from "./config";
import type { Database } from "./db";
import type { ManagedService } from "./managed/service";
import type { NodeStore } from "./nodes";
import type { AccessTokenVerifier } from "./oauth/grant";
import type { RateLimiter } from "./ratelimit";
import type { RelayHub } from "./relay";

/*
 * The console's context: what the composition root (src/cloud/server) hands every module's
 * routes, and the answers they share. Modules import it; it imports no module's code, only the
 * types of the stores it names (decision 410), so no module has to import the root and the
 * root imports them all without a cycle.
 */

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

/** CloudRoutes is a plugin a module contributes: one Elysia instance per resource. */
export type CloudRoutes = (deps: CloudDeps) => AnyElysia;

/**
 * CloudSweep is a module's own cleanup of the rows it owns that have expired, run by the
 * worker role each round: it deletes what `now` has made dead and answers how many rows of
 * each kind went.
 */
export type CloudSweep = (deps: CloudDeps, now: number) => Promise<Record<string, number>>;

/** STATUS_BY_CODE maps every console error code to its HTTP status: the one place that does. */
export const STATUS_BY_CODE: Record<CloudErrorCode, number> = {
  unauthenticated: 401,
  invalid_session: 401,
  login_failed: 401,
  forbidden: 403,
  account_suspended: 403,
  entitlement_required: 403,
  node_limit_reached: 403,
  trial_quota_used: 403,
  user_code_attempts_exhausted: 403,
  access_denied: 403,
  csrf_rejected: 403,
  not_found: 404,
  account_not_found: 404,
  link_code_not_found: 404,
  device_request_not_found: 404,
  preauth_key_invalid: 404,
  provider_not_configured: 404,
  link_code_used: 409,
  already_consumed: 409,
  preauth_key_exhausted: 409,
  preauth_key_limit_reached: 409,
  conflict: 409,
  trial_boxes_busy: 409,
  link_code_expired: 410,
  expired_token: 410,
  slow_down: 429,
  rate_limited: 429,
  // The sign-in starts list 400 ("refused request") and no 429 in the contract (decision 166).
  sign_in_rate_limited: 400,
  // A social provider the operator did not list: the contract's "refused request on social".
  social_provider_not_configured: 400,
  invalid_device_credential: 403,
  invalid_request: 400,
  invalid_return_to: 400,
  not_supported: 501,
  database_unavailable: 503,
  // 503 with Retry-After, not the engine's 507: the contract's status lists name only
  // client-caused outcomes, and a full disk is the server's condition (docs/decisions.md 162).
  disk_full: 503,
  identity_provider_unavailable: 503,
  managed_not_offered: 404,
  allocation_not_found: 404,
  no_ready_box: 404,
  invoice_not_found: 404,
  no_launch_place: 409,
  box_offline: 409,
  box_busy: 409,
  up_to_date: 409,
  version_not_offered: 409,
  downgrade_refused: 409,
  backup_running: 409,
  box_not_running: 409,
  start_budget_spent: 429,
  start_stuck: 429,
  update_too_soon: 429,
  // The box behind the console's proxy did not answer (outside /api: the contract lists no status there).
  box_unreachable: 502,
  box_absent: 503,
  box_running: 503,
  box_start_failed: 503,
  version_unknown: 503,
  provider_failed: 503,
  operation_hung: 503,
  config_invalid: 500,
  data_dir_unwritable: 500,
  port_in_use: 500,
  internal: 500,
};

/**
 * errorResponses documents, for OpenAPI, the error statuses a route can answer: 422 with the
 * validation body, every other status with the error envelope.
 */
export function errorResponses(...statuses: number[]) {
  const out: Record<number, typeof ErrorEnvelope | typeof HTTPValidationError> = {};
  for (const status of statuses) out[status] = status === 422 ? HTTPValidationError : ErrorEnvelope;
  return out;
}
