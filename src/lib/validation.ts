import type { TSchema } from "@sinclair/typebox";
import { ValueErrorType } from "@sinclair/typebox/errors";
import { Value } from "@sinclair/typebox/value";

/** ValidationDetail is one entry of the 422 body's `detail` array. */
export interface ValidationDetail {
  loc: (string | number)[];
  msg: string;
  type: string;
  input: unknown;
  ctx: Record<string, unknown>;
}

/**
 * InputError is thrown by modules for input that is well-formed but unacceptable (an
 * expiry in the past, say). It answers 422 with the same body as schema failures.
 */
export class InputError extends Error {
  readonly detail: ValidationDetail[];

  constructor(detail: (Omit<ValidationDetail, "ctx"> & { ctx?: Record<string, unknown> })[]) {
    super(detail.map((d) => `${d.loc.join(".")}: ${d.msg}`).join("; "));
    this.name = "InputError";
    this.detail = detail.map((d) => ({ ...d, ctx: d.ctx ?? {} }));
  }
}

/**
 * VALIDATION_TYPES is every `type` a 422 entry may carry (docs/decisions.md 10 and 145): the
 * pydantic v2 names the schema mapping below emits, and the codes modules give their own
 * refusals. Clients branch on these; add one only with its decision.
 */
export const VALIDATION_TYPES = [
  // schema checks (describeIssue)
  "missing",
  "extra_forbidden",
  "int_type",
  "number_type",
  "string_type",
  "bool_type",
  "list_type",
  "dict_type",
  "none_required",
  "greater_than_equal",
  "less_than_equal",
  "string_too_short",
  "string_too_long",
  "string_pattern_mismatch",
  "string_format",
  "datetime_parsing",
  "too_long",
  "too_short",
  "unique_items",
  "enum",
  "union_type",
  "json_invalid",
  "value_error",
  // modules' refusals
  "command_not_found",
  "binding_cycle",
  "dump_unreadable",
  "dump_unrecognized",
  "dump_unsupported",
  "restore_failed",
] as const;

/** MAX_DETAIL_ENTRIES bounds the entries of one 422 body: a list of 100,000 bad items is not 100,000 entries. */
export const MAX_DETAIL_ENTRIES = 50;
/** MAX_ECHO_CHARS is how much of a string `input` a 422 echoes; the rest is counted, not sent. */
export const MAX_ECHO_CHARS = 256;
/** Arrays and objects in `input` are echoed to this depth and this many entries, then summarized. */
const MAX_ECHO_DEPTH = 3;
const MAX_ECHO_ENTRIES = 20;

/**
 * SECRET_FIELD is a field name whose value a 422 never echoes, wherever it appears in `loc` or
 * inside an echoed object: the vcs `token`, link codes, device codes and user codes, preauth
 * keys, passwords, a deploy's `secrets` map. Schemas mark the same fields `writeOnly` (sent,
 * never returned), which toValidationDetail honours; this name rule is the backstop for maps
 * whose keys are the caller's own and for an object that holds one.
 */
const SECRET_FIELD = /^(token|secrets?|password|passphrase|code|key|credential)$|_(token|secret|password|key|code|credential)$/i;

/** isSecretField says whether a field of this name carries a secret (see SECRET_FIELD). */
export function isSecretField(name: string | number): boolean {
  return typeof name === "string" && SECRET_FIELD.test(name);
}

/**
 * echoInput is the bounded form of an input a 422 sends back: long strings cut with a marker
 * that says how much was left out, arrays and objects shown to a few levels and entries, and
 * a secret field's value replaced. It never recurses past MAX_ECHO_DEPTH, whatever it is given.
 */
export function echoInput(value: unknown, depth = 0): unknown {
  if (typeof value === "string") {
    return value.length > MAX_ECHO_CHARS ? `${value.slice(0, MAX_ECHO_CHARS)}…[${value.length - MAX_ECHO_CHARS} more characters]` : value;
  }
  if (value === null || typeof value !== "object") return typeof value === "bigint" ? String(value) : (value ?? null);
  if (Array.isArray(value)) {
    if (depth >= MAX_ECHO_DEPTH) return `[a list of ${value.length} items]`;
    const shown: unknown[] = value.slice(0, MAX_ECHO_ENTRIES).map((item) => echoInput(item, depth + 1));
    if (value.length > MAX_ECHO_ENTRIES) shown.push(`…[${value.length - MAX_ECHO_ENTRIES} more items]`);
    return shown;
  }
  const keys = Object.keys(value);
  if (depth >= MAX_ECHO_DEPTH) return `[an object of ${keys.length} fields]`;
  const shown: Record<string, unknown> = {};
  for (const key of keys.slice(0, MAX_ECHO_ENTRIES)) {
    shown[echoInput(key) as string] = isSecretField(key) ? "[secret]" : echoInput((value as Record<string, unknown>)[key], depth + 1);
  }
  if (keys.length > MAX_ECHO_ENTRIES) shown["…"] = `[${keys.length - MAX_ECHO_ENTRIES} more fields]`;
  return shown;
}

/**
 * safeDetail is the form of a 422 entry that may leave the process: a bounded `input`, none at
 * all under a secret field, and a bounded `msg`. validationResponse applies it to every entry,
 * whoever built it (schema checks, modules' InputErrors, AppErrors mapped to 422).
 */
export function safeDetail(detail: ValidationDetail): ValidationDetail {
  const secret = detail.loc.some(isSecretField);
  const msg = detail.msg.length > 1024 ? `${detail.msg.slice(0, 1024)}…` : detail.msg;
  return { loc: detail.loc.slice(0, 16), msg, type: detail.type, input: secret ? null : echoInput(detail.input), ctx: detail.ctx };
}

/** SchemaIssue is the part of a TypeBox ValueError this mapping reads. */
export interface SchemaIssue {
  type: number;
  path: string;
  value?: unknown;
  message: string;
  schema: Record<string, unknown>;
}

function pathSegments(path: string): (string | number)[] {
  if (path === "" || path === "/") return [];
  return path
    .slice(1)
    .split("/")
    .map((segment) => segment.replace(/~1/g, "/").replace(/~0/g, "~"))
    .map((segment) => (/^\d+$/.test(segment) ? Number(segment) : segment));
}

function literalChoices(schema: Record<string, unknown>): unknown[] | undefined {
  const options = (schema.anyOf ?? schema.oneOf) as Record<string, unknown>[] | undefined;
  if (!Array.isArray(options)) return undefined;
  const values = options.filter((o) => "const" in o).map((o) => o.const);
  return values.length === options.length ? values : undefined;
}

function quoteList(values: unknown[]): string {
  const quoted = values.map((v) => (typeof v === "string" ? `'${v}'` : String(v)));
  return quoted.length <= 1 ? (quoted[0] ?? "") : `${quoted.slice(0, -1).join(", ")} or ${quoted.at(-1)}`;
}

/**
 * expandNullable reports a value that fails the non-null branch of a `T | null` union by that
 * branch's own errors ("greater than or equal to 0") instead of "one of: integer, null".
 */
function expandNullable(issue: SchemaIssue): SchemaIssue[] {
  if (issue.type !== ValueErrorType.Union || issue.value === null || issue.value === undefined) return [issue];
  const options = issue.schema.anyOf as TSchema[] | undefined;
  if (!Array.isArray(options) || options.length !== 2) return [issue];
  const nonNull = options.filter((option) => option.type !== "null");
  if (nonNull.length !== 1 || !nonNull[0]) return [issue];
  const nested = [...Value.Errors(nonNull[0], issue.value)];
  if (nested.length === 0) return [issue];
  return nested.map((error) => ({
    type: error.type,
    path: issue.path + error.path,
    value: error.value,
    message: error.message,
    schema: error.schema as unknown as Record<string, unknown>,
  }));
}

/**
 * PATTERN_MESSAGES say in words what a pattern of the contracts accepts, for the `msg` of a
 * `string_pattern_mismatch` (a user reads "a name is lowercase letters…", not the regular
 * expression, which `ctx.pattern` still carries). Keyed by the pattern's exact text; a test
 * holds each key to the schema constant it describes.
 */
export const PATTERN_MESSAGES: Readonly<Record<string, string>> = {
  // NAME_PATTERN (src/contract/engine.ts): service and template names, DNS labels.
  "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$":
    "a name is lowercase letters, digits and dashes, up to 63 characters, starting and ending with a letter or digit",
  // cwd and a health probe's path.
  "^/": "should start with / (an absolute path)",
  // EnvName: the keys of env and secrets.
  "^[A-Za-z_][A-Za-z0-9_]*$": "a variable name is letters, digits and _, not starting with a digit",
};

/** keyRule is what a map's keys must match, in words, when the map allows only keys of one pattern (env, secrets). */
function keyRule(schema: Record<string, unknown>): string | undefined {
  const patterns = Object.keys((schema.patternProperties as Record<string, unknown> | undefined) ?? {});
  return patterns.length === 1 ? PATTERN_MESSAGES[patterns[0] as string] : undefined;
}

/** describeIssue turns a TypeBox error into the contract's `type`, `msg` and `ctx`. */
function describeIssue(issue: SchemaIssue): Pick<ValidationDetail, "type" | "msg" | "ctx"> {
  const s = issue.schema;
  // An absent property fails its type check with no value; report it as missing, once.
  if (issue.value === undefined && issue.path !== "" && issue.type !== ValueErrorType.ObjectAdditionalProperties) {
    return { type: "missing", msg: "Field required", ctx: {} };
  }
  switch (issue.type) {
    case ValueErrorType.ObjectRequiredProperty:
      return { type: "missing", msg: "Field required", ctx: {} };
    case ValueErrorType.ObjectAdditionalProperties:
      return { type: "extra_forbidden", msg: keyRule(s) ?? "Extra inputs are not permitted", ctx: {} };
    case ValueErrorType.Integer:
      return { type: "int_type", msg: "Input should be a valid integer", ctx: {} };
    case ValueErrorType.Number:
      return { type: "number_type", msg: "Input should be a valid number", ctx: {} };
    case ValueErrorType.String:
      return { type: "string_type", msg: "Input should be a valid string", ctx: {} };
    case ValueErrorType.Boolean:
      return { type: "bool_type", msg: "Input should be a valid boolean", ctx: {} };
    case ValueErrorType.Array:
      return { type: "list_type", msg: "Input should be a valid list", ctx: {} };
    case ValueErrorType.Object:
      return { type: "dict_type", msg: "Input should be a valid object", ctx: {} };
    case ValueErrorType.Null:
      return { type: "none_required", msg: "Input should be null", ctx: {} };
    case ValueErrorType.IntegerMinimum:
    case ValueErrorType.NumberMinimum:
      return { type: "greater_than_equal", msg: `Input should be greater than or equal to ${s.minimum}`, ctx: { ge: s.minimum } };
    case ValueErrorType.IntegerMaximum:
    case ValueErrorType.NumberMaximum:
      return { type: "less_than_equal", msg: `Input should be less than or equal to ${s.maximum}`, ctx: { le: s.maximum } };
    case ValueErrorType.StringMinLength:
      return {
        type: "string_too_short",
        msg: `String should have at least ${s.minLength} character${s.minLength === 1 ? "" : "s"}`,
        ctx: { min_length: s.minLength },
      };
    case ValueErrorType.StringMaxLength:
      return { type: "string_too_long", msg: `String should have at most ${s.maxLength} characters`, ctx: { max_length: s.maxLength } };
    case ValueErrorType.StringPattern:
      return {
        type: "string_pattern_mismatch",
        msg: PATTERN_MESSAGES[s.pattern as string] ?? `String should match pattern '${s.pattern}'`,
        ctx: { pattern: s.pattern },
      };
    case ValueErrorType.StringFormat:
      if (s.format === "date-time") {
        return { type: "datetime_parsing", msg: "Input should be a valid RFC 3339 date-time", ctx: { format: "date-time" } };
      }
      return { type: "string_format", msg: `Input should be a valid ${s.format}`, ctx: { format: s.format } };
    case ValueErrorType.ArrayMaxItems:
      return { type: "too_long", msg: `List should have at most ${s.maxItems} items`, ctx: { max_length: s.maxItems } };
    case ValueErrorType.ArrayMinItems:
      return { type: "too_short", msg: `List should have at least ${s.minItems} items`, ctx: { min_length: s.minItems } };
    case ValueErrorType.ArrayUniqueItems:
      return { type: "unique_items", msg: "List items should be unique", ctx: {} };
    case ValueErrorType.Union: {
      const choices = literalChoices(s);
      if (choices) return { type: "enum", msg: `Input should be ${quoteList(choices)}`, ctx: { expected: quoteList(choices) } };
      const types = ((s.anyOf as Record<string, unknown>[] | undefined) ?? []).map((o) => o.type).filter(Boolean);
      return { type: "union_type", msg: `Input should be one of: ${types.join(", ")}`, ctx: { expected: types } };
    }
    default:
      return { type: "value_error", msg: issue.message, ctx: {} };
  }
}

/**
 * toValidationDetail maps TypeBox errors for one part of a request (`body`, `path`, `query`,
 * `header`) to the 422 body's entries. A missing field is reported once, as `missing`,
 * not again as "expected string" for the same location.
 */
export function toValidationDetail(part: string, issues: SchemaIssue[]): ValidationDetail[] {
  issues = issues.flatMap(expandNullable);
  const isMissing = (i: SchemaIssue) => i.type === ValueErrorType.ObjectRequiredProperty || (i.value === undefined && i.path !== "");
  const missing = new Set(issues.filter(isMissing).map((i) => i.path));
  const seen = new Set<string>();
  const detail: ValidationDetail[] = [];
  for (const issue of issues) {
    const key = missing.has(issue.path) ? `${issue.path}\u0000missing` : `${issue.path}\u0000${issue.type}`;
    if (seen.has(key)) continue;
    seen.add(key);
    const { type, msg, ctx } = describeIssue(issue);
    // A field the schema marks writeOnly (a secret: sent, never returned) is never echoed.
    const input = issue.schema.writeOnly === true ? null : (issue.value ?? null);
    detail.push({ loc: [part, ...pathSegments(issue.path)], msg, type, input, ctx });
  }
  return detail;
}
