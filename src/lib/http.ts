import { Elysia, ValidationError } from "elysia";
import { randomId } from "./crypto";
import { type AppError, isAppError } from "./errors";
import type { Logger } from "./logger";
import { InputError, type SchemaIssue, toValidationDetail } from "./validation";

const JSON_HEADERS = { "content-type": "application/json" };

/** errorResponse writes the one error envelope every non-422 failure uses. */
export function errorResponse(
  status: number,
  code: string,
  message: string,
  requestId: string,
  extraHeaders?: Record<string, string>,
  extraFields?: Record<string, unknown>,
): Response {
  return new Response(JSON.stringify({ error: { code, message, request_id: requestId, ...extraFields } }), {
    status,
    headers: { ...JSON_HEADERS, "x-request-id": requestId, ...extraHeaders },
  });
}

/** validationResponse writes the 422 body (`{detail: [...]}`) shared by schema and module checks. */
export function validationResponse(detail: unknown[], requestId: string): Response {
  return new Response(JSON.stringify({ detail }), { status: 422, headers: { ...JSON_HEADERS, "x-request-id": requestId } });
}

/**
 * cookieValue returns one cookie's value from a Cookie header, or null when it is absent or
 * not validly percent-encoded (a malformed cookie is no credential, never a 500).
 */
export function cookieValue(header: string | null, name: string): string | null {
  if (!header) return null;
  for (const part of header.split(";")) {
    const eq = part.indexOf("=");
    if (eq === -1 || part.slice(0, eq).trim() !== name) continue;
    try {
      return decodeURIComponent(part.slice(eq + 1).trim());
    } catch {
      return null;
    }
  }
  return null;
}

/** pathOf returns a URL's path without its query, without the cost of a URL object. */
export function pathOf(url: string): string {
  const start = url.indexOf("/", url.indexOf("//") + 2);
  if (start === -1) return "/";
  const query = url.indexOf("?", start);
  return url.slice(start, query === -1 ? undefined : query);
}

/** jsonInvalid is the 422 entry for a body that is not JSON at all. */
function jsonInvalid(ctx: Record<string, unknown>) {
  return { loc: ["body"], msg: "JSON decode error: the body is not valid JSON", type: "json_invalid", input: null, ctx };
}

/** PART_NAMES maps Elysia's validation targets to the `loc` roots of the 422 body. */
const PART_NAMES: Record<string, string> = { body: "body", params: "path", query: "query", headers: "header", cookie: "cookie" };

/**
 * RequestIds gives every request one id: a well-formed `X-Request-Id` from the client, else a
 * random per-process prefix and a counter (unique across restarts, and cheap).
 */
export class RequestIds {
  readonly #ids = new WeakMap<Request, string>();
  readonly #prefix = randomId("req").slice(4, 12);
  #counter = 0;

  of(request: Request): string {
    let id = this.#ids.get(request);
    if (!id) {
      const given = request.headers.get("x-request-id");
      id = given && /^[A-Za-z0-9._-]{1,64}$/.test(given) ? given : `req_${this.#prefix}${(++this.#counter).toString(36)}`;
      this.#ids.set(request, id);
    }
    return id;
  }
}

/** ApiBasicsOptions tell the shared hooks how this app names its statuses and where it logs. */
export interface ApiBasicsOptions {
  log: Logger;
  requestIds: RequestIds;
  /** statusByCode maps this app's error codes to statuses; an unknown code is a 500. */
  statusByCode: Record<string, number>;
  /** headersFor adds headers to an error answer (WWW-Authenticate on a 401, Retry-After on a 429). */
  headersFor?: (status: number, error: { code: string; details?: Record<string, unknown> }) => Record<string, string> | undefined;
  /** fieldsFor adds fields to the envelope's `error` object (the new `interval` of a `slow_down`). */
  fieldsFor?: (error: { code: string; details?: Record<string, unknown> }) => Record<string, unknown> | undefined;
  /**
   * translateError names an error thrown from below the modules (a database driver's "disk
   * full") with an app code, so it answers like the modules' own errors instead of a 500.
   */
  translateError?: (error: unknown) => AppError | undefined;
}

/**
 * apiBasics is the request plumbing both binaries' APIs share: every body is a JSON object or
 * a 422 that says why, every answer carries its request id, every failure becomes the one
 * error envelope (422 keeps the validation body), and an unexpected error is logged once
 * with the request id while the client learns only the id.
 */
export function apiBasics(options: ApiBasicsOptions) {
  const { log, requestIds, statusByCode } = options;
  // Elysia wraps whatever a parser throws into a bare PARSE error; the real reason waits here.
  const parseFailures = new WeakMap<Request, InputError>();
  const refuseBody = (request: Request, failure: InputError): never => {
    parseFailures.set(request, failure);
    throw failure;
  };
  return new Elysia()
    .onParse({ as: "global" }, async ({ request, contentType }) => {
      if (!contentType?.startsWith("application/json")) return;
      const text = await request.text();
      let value: unknown;
      try {
        value = JSON.parse(text);
      } catch (error) {
        refuseBody(request, new InputError([jsonInvalid({ error: (error as Error).message })]));
      }
      // Every body of these APIs is a JSON object; say so before field checks run on a coerced value.
      if (value === null || typeof value !== "object" || Array.isArray(value)) {
        refuseBody(request, new InputError([{ loc: ["body"], msg: "Input should be a valid object", type: "dict_type", input: value }]));
      }
      return value;
    })
    .onAfterHandle({ as: "global" }, ({ request, set }) => {
      set.headers["x-request-id"] = requestIds.of(request);
    })
    .onError({ as: "global" }, ({ code, error, request }) => {
      const requestId = requestIds.of(request);
      if (error instanceof ValidationError) {
        if (error.type === "response") {
          log.error({ request_id: requestId, path: pathOf(request.url), issues: error.all }, "response failed its schema");
          return errorResponse(500, "internal", "internal error", requestId);
        }
        const part = PART_NAMES[error.type] ?? error.type;
        const issues = error.all as unknown as SchemaIssue[];
        return validationResponse(toValidationDetail(part, issues), requestId);
      }
      if (error instanceof InputError) return validationResponse(error.detail, requestId);
      if (code === "PARSE") {
        const failure = parseFailures.get(request);
        if (failure) return validationResponse(failure.detail, requestId);
        return validationResponse([jsonInvalid({})], requestId);
      }
      if (code === "NOT_FOUND") return errorResponse(404, "not_found", "no such route", requestId);
      const known = isAppError(error) ? error : options.translateError?.(error);
      if (known) {
        const status = statusByCode[known.code] ?? 500;
        const headers = options.headersFor?.(status, known);
        if (status >= 500) log.error({ request_id: requestId, code: known.code, err: known.message }, "request failed");
        return errorResponse(status, known.code, known.message, requestId, headers, options.fieldsFor?.(known));
      }
      // Anything else is a bug: log it once with the request id, and tell the client only the id.
      log.error({ request_id: requestId, err: error, path: pathOf(request.url) }, "unhandled error");
      return errorResponse(500, "internal", "internal error; the server log has the details under this request id", requestId);
    });
}
