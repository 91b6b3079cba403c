import type { TSchema } from "@sinclair/typebox";
import { type TypeCheck, TypeCompiler } from "@sinclair/typebox/compiler";
import { Value } from "@sinclair/typebox/value";
import { Elysia, ValidationError } from "elysia";
import { randomId } from "./crypto";
import { AppError, isAppError } from "./errors";
import type { Logger } from "./logger";
import { InputError, MAX_DETAIL_ENTRIES, type SchemaIssue, safeDetail, toValidationDetail, type ValidationDetail } from "./validation";

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

/**
 * validationResponse writes the 422 body (`{detail: [...]}`) shared by schema and module checks.
 * Every entry goes through safeDetail first: `input` is cut to a bounded summary and a secret's
 * value is never echoed, whoever built the entry.
 */
export function validationResponse(detail: ValidationDetail[], requestId: string): Response {
  const safe = detail.slice(0, MAX_DETAIL_ENTRIES).map(safeDetail);
  return new Response(JSON.stringify({ detail: safe }), { status: 422, headers: { ...JSON_HEADERS, "x-request-id": requestId } });
}

/**
 * lastResortResponse is what a server answers when an error escapes the app entirely (Bun.serve's
 * `error` handler): the error envelope, never Bun's HTML page, a stack or a source path.
 */
export function lastResortResponse(log: Logger, error: unknown): Response {
  const requestId = `req_${randomId("x").slice(2, 14)}`;
  log.error({ request_id: requestId, err: error }, "error outside the request pipeline");
  return errorResponse(500, "internal", "internal error; the server log has the details under this request id", requestId);
}

/** BodyLimits bound a request body before it is parsed (decision 141). */
export interface BodyLimits {
  /** maxBytes refuses a body whose Content-Length says more, or that grows past it while read. */
  maxBytes: number;
  /** maxDepth refuses JSON nested deeper than this many arrays and objects, found by a scan of the raw text. */
  maxDepth: number;
}

/** DEFAULT_BODY_LIMITS are the engine's: a deploy with 256 env values of 1 KiB fits with room to spare. */
export const DEFAULT_BODY_LIMITS: BodyLimits = { maxBytes: 1024 * 1024, maxDepth: 32 };

/**
 * jsonDepthExceeds says whether JSON text nests arrays and objects deeper than `maxDepth`. It
 * reads the text once and keeps no stack (brackets inside strings do not count), so a hostile
 * body is refused before JSON.parse, a schema check or a serializer recurses into it.
 */
export function jsonDepthExceeds(text: string, maxDepth: number): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 92)
        i++; // a backslash escapes the next character, a quote included
      else if (c === 34) inString = false;
    } else if (c === 34) inString = true;
    else if (c === 91 || c === 123) {
      if (++depth > maxDepth) return true;
    } else if (c === 93 || c === 125) depth--;
  }
  return false;
}

/** UTF8 decodes a whole body at once (no stream state kept between calls). */
const UTF8 = new TextDecoder();

/** readBoundedText reads a body as UTF-8 text, or null once it is past `maxBytes` (the rest is not read). */
export async function readBoundedText(request: Request, maxBytes: number): Promise<string | null> {
  const length = request.headers.get("content-length");
  const declared = Number(length ?? "0");
  if (declared > maxBytes) return null;
  // A body framed by its Content-Length is that long and no longer (the server reads no more of
  // it): read at once, without a stream reader's promise a chunk, and still measured (a Request
  // made in this process has no framing). A chunked one is counted as it comes, a Content-Length
  // beside it or not.
  if (length !== null && /^\d+$/.test(length) && !request.headers.has("transfer-encoding")) {
    const bytes = await request.bytes();
    return bytes.byteLength > maxBytes ? null : UTF8.decode(bytes);
  }
  return readBoundedStream(request.body, maxBytes);
}

/** readBoundedStream reads a body stream as UTF-8 text, or null once it is past `maxBytes` (the rest is cancelled, not read). */
export async function readBoundedStream(body: ReadableStream<Uint8Array> | null, maxBytes: number): Promise<string | null> {
  if (!body) return "";
  const reader = body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > maxBytes) {
      await reader.cancel().catch(() => undefined);
      return null;
    }
    chunks.push(value);
  }
  return UTF8.decode(Buffer.concat(chunks));
}

/**
 * BodySchemas holds every route's body schema, learnt from the built app, so a body is checked
 * as it arrived. Elysia normalizes a body before its own check (it mirrors the schema's shape:
 * an array or a string where an object or a map belongs becomes an object), so its check alone
 * let `"env":[["x"]]` through; this one runs on the raw value.
 */
export class BodySchemas {
  readonly #routes: { method: string; pattern: RegExp; check: TypeCheck<TSchema>; schema: TSchema }[] = [];

  /** learn records the body schemas of an app's routes; call it once the routes are declared. */
  learn(routes: readonly { method: string; path: string; hooks: { body?: unknown } }[]): void {
    for (const route of routes) {
      const schema = route.hooks.body as TSchema | undefined;
      if (schema === undefined) continue;
      // A body this check cannot read (a model referenced by name) would go unchecked: refuse to start.
      if (typeof schema !== "object" || schema === null) {
        throw new Error(`${route.method} ${route.path}: its body schema is not an inline TypeBox schema, so BodySchemas cannot check it`);
      }
      const source = route.path
        .split("/")
        .map((segment) => (segment.startsWith(":") ? "[^/]+" : segment.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")))
        .join("/");
      this.#routes.push({ method: route.method, pattern: new RegExp(`^${source}/?$`), check: TypeCompiler.Compile(schema), schema });
    }
  }

  /** takesBody says whether the route a request goes to declares a body. */
  takesBody(method: string, path: string): boolean {
    return this.#routes.some((r) => r.method === method && r.pattern.test(path));
  }

  /** issues returns what is wrong with a raw body for the route it was sent to (none when the route takes no body). */
  issues(method: string, path: string, raw: unknown): SchemaIssue[] {
    if (raw === undefined) return [];
    const route = this.#routes.find((r) => r.method === method && r.pattern.test(path));
    if (!route) return [];
    // A body valid as sent is valid with the defaults added too (they fill absent fields with
    // values the schema allows): most bodies end here, without the copy below (0.3 ms a deploy).
    if (route.check.Check(raw)) return [];
    // Defaults are part of the schema (an absent `os` is ""); apply them to a copy, as Elysia does.
    // structuredClone keeps an own `__proto__` key as a key (Value.Clone would assign it, making
    // it the copy's prototype and hiding it from the check).
    const value = Value.Default(route.schema, structuredClone(raw));
    if (route.check.Check(value)) return [];
    const issues: SchemaIssue[] = [];
    for (const error of route.check.Errors(value)) {
      issues.push({ type: error.type, path: error.path, value: error.value, message: error.message, schema: error.schema as never });
      if (issues.length >= MAX_DETAIL_ENTRIES) break;
    }
    return issues;
  }
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

/**
 * appErrorDetail turns a module's AppError that maps to 422 (`invalid_domain`, `build_failed`,
 * `acme_failed`) into a `detail` entry: `loc` from its details (`loc`, else `["body"]`), the
 * code in `ctx.code` so clients can still branch on it.
 */
function appErrorDetail(error: AppError): ValidationDetail {
  const loc = Array.isArray(error.details?.loc) ? (error.details.loc as (string | number)[]) : ["body"];
  const input = error.details && "input" in error.details ? error.details.input : null;
  return { loc, msg: error.message, type: "value_error", input, ctx: { code: error.code } };
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
  /** bodySchemas checks each body as it arrived; the composition root teaches it the routes once they are built. */
  bodySchemas: BodySchemas;
  /** bodyLimits bound every body before it is parsed (DEFAULT_BODY_LIMITS when left out). */
  bodyLimits?: BodyLimits;
  /**
   * oversizeStatus is how a body over `maxBytes` is answered: 413 `body_too_large` in the error
   * envelope, or a 422 for an API whose routes list no 413 (the console's).
   */
  oversizeStatus: 413 | 422;
  /**
   * beforeRefusal runs before a body is refused unparsed (too large, too deep, not JSON), so a
   * rate-limited route charges its limit first, as it would for a parsed body; what it throws
   * (a 429) is the answer.
   */
  beforeRefusal?: (request: Request) => Promise<void>;
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
  const { bodySchemas } = options;
  const limits = options.bodyLimits ?? DEFAULT_BODY_LIMITS;
  // Elysia wraps whatever a parser throws into a bare PARSE error; the real reason waits here.
  const parseFailures = new WeakMap<Request, InputError | AppError>();
  // The body as it arrived, before Elysia normalizes it: BodySchemas checks this one.
  const rawBodies = new WeakMap<Request, unknown>();
  const refuseBody = async (request: Request, failure: InputError | AppError): Promise<never> => {
    try {
      await options.beforeRefusal?.(request);
    } catch (error) {
      if (isAppError(error)) failure = error;
      else throw error;
    }
    parseFailures.set(request, failure);
    throw failure;
  };
  const bodyFailure = (msg: string, ctx: Record<string, unknown>) =>
    new InputError([{ loc: ["body"], msg, type: "value_error", input: null, ctx }]);
  return new Elysia()
    .onParse({ as: "global" }, async ({ request, contentType }) => {
      // A route that declares no body ignores whatever is sent, unread (a logout with a stray
      // body answers as the contract lists, never a 422 about a body it does not take).
      if (!bodySchemas.takesBody(request.method, pathOf(request.url))) return null;
      // Every body is bounded before it is parsed, whatever its type: a size cap while reading,
      // then, for JSON, a depth cap by a scan of the text (decision 141).
      const text = await readBoundedText(request, limits.maxBytes);
      if (text === null) {
        const message = `the body is larger than ${limits.maxBytes} bytes`;
        await refuseBody(
          request,
          options.oversizeStatus === 413
            ? new AppError("body_too_large", message, { max_bytes: limits.maxBytes })
            : bodyFailure(message, { max_bytes: limits.maxBytes }),
        );
      }
      const body = text as string;
      if (!contentType?.toLowerCase().startsWith("application/json")) {
        // Only JSON is parsed: a route that takes a body refuses any other type (a form post included).
        if (body !== "") {
          await refuseBody(
            request,
            new InputError([
              { loc: ["body"], msg: "the body must be a JSON object (Content-Type: application/json)", type: "dict_type", input: null },
            ]),
          );
        }
        return contentType ? body : undefined;
      }
      if (jsonDepthExceeds(body, limits.maxDepth)) {
        await refuseBody(request, bodyFailure(`the body nests deeper than ${limits.maxDepth} levels`, { max_depth: limits.maxDepth }));
      }
      let value: unknown;
      try {
        value = JSON.parse(body);
      } catch (error) {
        // The parser's message quotes the body ("Unexpected identifier \"hunter2\""): it stays in the log.
        log.debug({ request_id: requestIds.of(request), err: (error as Error).message }, "body is not JSON");
        await refuseBody(request, new InputError([jsonInvalid({})]));
      }
      // Every body of these APIs is a JSON object; say so before field checks run on a coerced value.
      if (value === null || typeof value !== "object" || Array.isArray(value)) {
        await refuseBody(
          request,
          new InputError([{ loc: ["body"], msg: "Input should be a valid object", type: "dict_type", input: value }]),
        );
      }
      rawBodies.set(request, value);
      return value;
    })
    .onBeforeHandle({ as: "global" }, ({ request }) => {
      // Elysia's check passed on the normalized body; the body as sent must pass too.
      if (!rawBodies.has(request)) return;
      const issues = bodySchemas.issues(request.method, pathOf(request.url), rawBodies.get(request));
      if (issues.length > 0) throw new InputError(toValidationDetail("body", issues));
    })
    .onAfterHandle({ as: "global" }, ({ request, set }) => {
      set.headers["x-request-id"] = requestIds.of(request);
    })
    .onError({ as: "global" }, ({ code, error: thrown, request }) => {
      const requestId = requestIds.of(request);
      let error: unknown = thrown;
      if (code === "PARSE") {
        const failure = parseFailures.get(request);
        if (!failure) return validationResponse([jsonInvalid({})], requestId);
        error = failure;
      }
      if (error instanceof ValidationError) {
        if (error.type === "response") {
          log.error({ request_id: requestId, path: pathOf(request.url), issues: error.all }, "response failed its schema");
          return errorResponse(500, "internal", "internal error", requestId);
        }
        const part = PART_NAMES[error.type] ?? error.type;
        // A body is reported as it was sent, not as Elysia normalized it (an array shown as {"0":…}).
        const raw =
          part === "body" && rawBodies.has(request) ? bodySchemas.issues(request.method, pathOf(request.url), rawBodies.get(request)) : [];
        const issues = raw.length > 0 ? raw : (error.all as unknown as SchemaIssue[]).slice(0, MAX_DETAIL_ENTRIES);
        return validationResponse(toValidationDetail(part, issues), requestId);
      }
      if (error instanceof InputError) return validationResponse(error.detail, requestId);
      if (code === "NOT_FOUND") return errorResponse(404, "not_found", "no such route", requestId);
      const known = isAppError(error) ? error : options.translateError?.(error);
      if (known) {
        const status = statusByCode[known.code] ?? 500;
        // Every 422 has the contract's `detail` shape, a module's refusal (invalid_domain) included.
        if (status === 422) return validationResponse([appErrorDetail(known)], requestId);
        const headers = options.headersFor?.(status, known);
        if (status >= 500) log.error({ request_id: requestId, code: known.code, err: known.message }, "request failed");
        return errorResponse(status, known.code, known.message, requestId, headers, options.fieldsFor?.(known));
      }
      // Anything else is a bug: log it once with the request id, and tell the client only the id.
      log.error({ request_id: requestId, err: error, path: pathOf(request.url) }, "unhandled error");
      return errorResponse(500, "internal", "internal error; the server log has the details under this request id", requestId);
    });
}
