import type { ErrorCode } from "../../lib/errors";

/** STATUS_BY_CODE maps every domain error code to its HTTP status: the one place that does. */
export const STATUS_BY_CODE: Record<ErrorCode, number> = {
  unauthenticated: 401,
  invalid_token: 401,
  token_revoked: 401,
  token_expired: 401,
  forbidden: 403,
  out_of_scope: 403,
  not_found: 404,
  token_not_found: 404,
  template_not_found: 404,
  service_not_found: 404,
  database_not_found: 404,
  token_name_taken: 409,
  last_admin_token: 409,
  invalid_transition: 409,
  gpu_request_impossible: 409,
  cap_exceeded: 403,
  build_failed: 422,
  invalid_domain: 422,
  domain_in_use: 409,
  no_port: 409,
  acme_failed: 422,
  ca_failed: 500,
  trust_failed: 500,
  gpu_inventory_failed: 500,
  shim_unavailable: 500,
  draining: 503,
  config_invalid: 500,
  data_dir_unwritable: 500,
  port_in_use: 500,
  daemon_not_running: 503,
  not_supported: 501,
  internal: 500,
};

const JSON_HEADERS = { "content-type": "application/json" };

/** errorResponse writes the one error envelope every non-422 failure uses. */
export function errorResponse(
  status: number,
  code: string,
  message: string,
  requestId: string,
  extraHeaders?: Record<string, string>,
): Response {
  return new Response(JSON.stringify({ error: { code, message, request_id: requestId } }), {
    status,
    headers: { ...JSON_HEADERS, "x-request-id": requestId, ...extraHeaders },
  });
}

export function validationResponse(detail: unknown[], requestId: string): Response {
  return new Response(JSON.stringify({ detail }), { status: 422, headers: { ...JSON_HEADERS, "x-request-id": requestId } });
}
