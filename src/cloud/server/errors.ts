import type { CloudErrorCode } from "../../lib/errors";

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
  config_invalid: 500,
  data_dir_unwritable: 500,
  port_in_use: 500,
  internal: 500,
};
