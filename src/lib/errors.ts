/**
 * AppError is the one error type modules throw for conditions a caller can act on.
 * It carries a stable machine code and a human message, never an HTTP status: each app
 * maps codes to statuses in one place (see src/engine/api/errors.ts).
 */
export class AppError extends Error {
  readonly code: ErrorCode;
  readonly details?: Record<string, unknown>;

  constructor(code: ErrorCode, message: string, details?: Record<string, unknown>) {
    super(message);
    this.name = "AppError";
    this.code = code;
    this.details = details;
  }
}

/** The stable error codes of the engine. Clients branch on these; never rename one, only add. */
export const EngineErrorCodes = {
  // requests: a body over the size bound, refused before it is read to the end (decision 141)
  body_too_large: "body_too_large",
  // authentication and authorization
  unauthenticated: "unauthenticated",
  invalid_token: "invalid_token",
  token_revoked: "token_revoked",
  token_expired: "token_expired",
  forbidden: "forbidden",
  out_of_scope: "out_of_scope",
  // resources
  not_found: "not_found",
  token_not_found: "token_not_found",
  template_not_found: "template_not_found",
  service_not_found: "service_not_found",
  database_not_found: "database_not_found",
  token_name_taken: "token_name_taken",
  last_admin_token: "last_admin_token",
  // services: deploy and control
  invalid_transition: "invalid_transition",
  gpu_request_impossible: "gpu_request_impossible",
  cap_exceeded: "cap_exceeded",
  build_failed: "build_failed",
  // proxy, domains and certificates
  invalid_domain: "invalid_domain",
  domain_in_use: "domain_in_use",
  no_port: "no_port",
  acme_failed: "acme_failed",
  ca_failed: "ca_failed",
  trust_failed: "trust_failed",
  // host facilities
  gpu_inventory_failed: "gpu_inventory_failed",
  shim_unavailable: "shim_unavailable",
  // databases and restore
  not_a_database: "not_a_database",
  database_engine_unavailable: "database_engine_unavailable",
  database_tools_missing: "database_tools_missing",
  database_not_running: "database_not_running",
  restore_in_progress: "restore_in_progress",
  dump_engine_mismatch: "dump_engine_mismatch",
  restore_timed_out: "restore_timed_out",
  port_taken: "port_taken",
  // daemon state
  draining: "draining",
  disk_full: "disk_full",
  // upgrades: a new binary that cannot be one, or that does not know this data dir's store schema
  binary_invalid: "binary_invalid",
  schema_downgrade: "schema_downgrade",
  // configuration and start-up
  config_invalid: "config_invalid",
  data_dir_unwritable: "data_dir_unwritable",
  port_in_use: "port_in_use",
  daemon_not_running: "daemon_not_running",
  not_supported: "not_supported",
  internal: "internal",
} as const;
export type EngineErrorCode = keyof typeof EngineErrorCodes;

/**
 * The stable error codes of the cloud console. The four the contract names (`slow_down`,
 * `entitlement_required`, `trial_quota_used`, `trial_boxes_busy`) keep exactly those names.
 */
export const CloudErrorCodes = {
  unauthenticated: "unauthenticated",
  invalid_session: "invalid_session",
  forbidden: "forbidden",
  account_suspended: "account_suspended",
  entitlement_required: "entitlement_required",
  node_limit_reached: "node_limit_reached",
  trial_quota_used: "trial_quota_used",
  trial_boxes_busy: "trial_boxes_busy",
  not_found: "not_found",
  account_not_found: "account_not_found",
  link_code_not_found: "link_code_not_found",
  link_code_used: "link_code_used",
  link_code_expired: "link_code_expired",
  device_request_not_found: "device_request_not_found",
  invalid_device_credential: "invalid_device_credential",
  slow_down: "slow_down",
  access_denied: "access_denied",
  expired_token: "expired_token",
  already_consumed: "already_consumed",
  user_code_attempts_exhausted: "user_code_attempts_exhausted",
  preauth_key_invalid: "preauth_key_invalid",
  preauth_key_exhausted: "preauth_key_exhausted",
  preauth_key_limit_reached: "preauth_key_limit_reached",
  invalid_request: "invalid_request",
  invalid_return_to: "invalid_return_to",
  csrf_rejected: "csrf_rejected",
  login_failed: "login_failed",
  provider_not_configured: "provider_not_configured",
  social_provider_not_configured: "social_provider_not_configured",
  rate_limited: "rate_limited",
  sign_in_rate_limited: "sign_in_rate_limited",
  conflict: "conflict",
  not_supported: "not_supported",
  config_invalid: "config_invalid",
  data_dir_unwritable: "data_dir_unwritable",
  port_in_use: "port_in_use",
  database_unavailable: "database_unavailable",
  disk_full: "disk_full",
  identity_provider_unavailable: "identity_provider_unavailable",
  // hosted machines (src/cloud/managed)
  managed_not_offered: "managed_not_offered",
  allocation_not_found: "allocation_not_found",
  no_ready_box: "no_ready_box",
  no_launch_place: "no_launch_place",
  start_budget_spent: "start_budget_spent",
  start_stuck: "start_stuck",
  update_too_soon: "update_too_soon",
  box_offline: "box_offline",
  box_busy: "box_busy",
  up_to_date: "up_to_date",
  version_not_offered: "version_not_offered",
  downgrade_refused: "downgrade_refused",
  backup_running: "backup_running",
  box_not_running: "box_not_running",
  box_unreachable: "box_unreachable",
  invoice_not_found: "invoice_not_found",
  // the provider's own failures (the provisioner records them; they reach no route)
  box_absent: "box_absent",
  box_running: "box_running",
  box_start_failed: "box_start_failed",
  version_unknown: "version_unknown",
  provider_failed: "provider_failed",
  operation_hung: "operation_hung",
  internal: "internal",
} as const;
export type CloudErrorCode = keyof typeof CloudErrorCodes;

/** ErrorCodes is every stable code of both binaries; each app maps its own set to statuses. */
export const ErrorCodes = { ...EngineErrorCodes, ...CloudErrorCodes } as const;
export type ErrorCode = EngineErrorCode | CloudErrorCode;

export function isAppError(error: unknown): error is AppError {
  return error instanceof AppError;
}

/**
 * DISK_FULL_CODES are the failures that mean "no space left to store this": ENOSPC and EDQUOT
 * from file writes, SQLITE_FULL from bun:sqlite (the database or its journal could not grow).
 */
const DISK_FULL_CODES = new Set(["ENOSPC", "EDQUOT", "SQLITE_FULL"]);

/** isDiskFull says whether an error (or its cause) is a write refused for lack of space. */
export function isDiskFull(error: unknown): boolean {
  for (let current = error, depth = 0; current && depth < 4; current = (current as { cause?: unknown }).cause, depth++) {
    if (current instanceof AppError) return current.code === "disk_full";
    const code = (current as { code?: unknown }).code;
    if (typeof code === "string" && DISK_FULL_CODES.has(code)) return true;
  }
  return false;
}

/**
 * diskFullError turns a write refused for lack of space into the one typed error for it
 * (issue 13: a full disk answers `disk_full`, not `internal`); any other error gives undefined.
 */
export function diskFullError(error: unknown): AppError | undefined {
  if (!isDiskFull(error)) return undefined;
  if (error instanceof AppError) return error;
  return new AppError("disk_full", "the disk holding the data dir is full: the change was not stored; free some space and try again", {
    cause: (error as { code?: string }).code ?? "ENOSPC",
  });
}
