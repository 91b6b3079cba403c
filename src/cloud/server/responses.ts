import { ErrorEnvelope, HTTPValidationError } from "../../contract/cloud";

/**
 * errorResponses documents, for OpenAPI, the error statuses a route can answer: 422 with the
 * validation body, every other status with the error envelope.
 */
export function errorResponses(...statuses: number[]) {
  const out: Record<number, typeof ErrorEnvelope | typeof HTTPValidationError> = {};
  for (const status of statuses) out[status] = status === 422 ? HTTPValidationError : ErrorEnvelope;
  return out;
}
