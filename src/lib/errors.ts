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

/** The stable error codes. Clients branch on these; never rename one, only add. */
export const ErrorCodes = {
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
  // daemon state
  draining: "draining",
  // configuration and start-up
  config_invalid: "config_invalid",
  data_dir_unwritable: "data_dir_unwritable",
  port_in_use: "port_in_use",
  daemon_not_running: "daemon_not_running",
  not_supported: "not_supported",
  internal: "internal",
} as const;
export type ErrorCode = keyof typeof ErrorCodes;

export function isAppError(error: unknown): error is AppError {
  return error instanceof AppError;
}
