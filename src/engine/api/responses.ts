import { ErrorBody, ValidationErrorBody } from "../../contract/engine";

/** errorResponses documents, for OpenAPI, the error statuses a route can answer. */
export function errorResponses(...statuses: number[]) {
  const out: Record<number, typeof ErrorBody | typeof ValidationErrorBody> = {};
  for (const status of statuses) out[status] = status === 422 ? ValidationErrorBody : ErrorBody;
  return out;
}

/** AUTHED are the statuses every authenticated route can answer. */
export const AUTHED = [401, 403] as const;
