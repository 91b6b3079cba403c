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
      return { type: "extra_forbidden", msg: "Extra inputs are not permitted", ctx: {} };
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
      return { type: "string_pattern_mismatch", msg: `String should match pattern '${s.pattern}'`, ctx: { pattern: s.pattern } };
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
    detail.push({ loc: [part, ...pathSegments(issue.path)], msg, type, input: issue.value ?? null, ctx });
  }
  return detail;
}
