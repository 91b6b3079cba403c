import type { OpenApiDocument, OpenApiOperation } from "../openapi";
import type { RawRequest } from "./http";

/**
 * The fuzz cases: for every operation of an OpenAPI document, at least CASES_PER_OPERATION
 * hostile requests built from the operation's own schemas — wrong types, missing and extra
 * fields, huge strings and numbers, deep nesting, control characters, path tricks, bad JSON,
 * wrong content types and bad headers. A seeded PRNG picks the random part, so a seed names
 * one exact run.
 */

export const CASES_PER_OPERATION = 100;

/** Rng is mulberry32: small, fast and the same on every machine for one seed. */
export class Rng {
  #state: number;
  constructor(seed: number) {
    this.#state = seed >>> 0;
  }
  next(): number {
    this.#state = (this.#state + 0x6d2b79f5) >>> 0;
    let t = this.#state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
  int(max: number): number {
    return Math.floor(this.next() * max);
  }
  pick<T>(items: readonly T[]): T {
    return items[this.int(items.length)] as T;
  }
}

type Schema = Record<string, unknown>;

/** FuzzCase is one request and what kind of hostility it carries. */
export interface FuzzCase {
  kind: string;
  label: string;
  request: RawRequest;
  /** routed is false where the path no longer names this operation (a raw `/` or dot segment in a parameter). */
  routed: boolean;
}

/** OperationContext says how to reach an operation: its credential and the base values of its path parameters. */
export interface OperationContext {
  method: string;
  path: string;
  operation: OpenApiOperation;
  document: OpenApiDocument;
  /** auth returns the headers that authenticate one request (a fresh session where a case may end it). */
  auth: () => [string, string][];
  pathValues: Record<string, string>;
  /** mayDeliver says whether a body may be sent as is (false for a valid body with a real effect). */
  mayDeliver: (body: unknown) => boolean;
  /** mayQuery says whether a query value may be sent (false where it opens a documented stream). */
  mayQuery: (name: string, value: string) => boolean;
}

// Nothing here names the repository, a source file or node_modules: an answer that echoes an
// input must not look like a leaked source path to the suite's own check.
/**
 * UNSAFE_INTEGER stands for 2^53 + 1, which no JavaScript number holds (it would be sent as
 * 2^53): json() writes its exact digits into the body text.
 */
const UNSAFE_INTEGER = "\u0000unsafe-integer\u0000";
const UNSAFE_DIGITS = "9007199254740993";

/** json writes a case's body, with the exact digits wherever UNSAFE_INTEGER stands. */
function json(value: unknown): string {
  return JSON.stringify(value).replaceAll(JSON.stringify(UNSAFE_INTEGER), UNSAFE_DIGITS);
}

/** text writes a value for a path or query string. */
function text(value: unknown): string {
  return value === UNSAFE_INTEGER ? UNSAFE_DIGITS : String(value);
}

const CONTROL = "a\u0000b\u0001c\u001fd\u007fe\u0085f\u2028g";
const HUGE_STRING_BYTES = 1_048_576;
const BAD_SCALARS: readonly unknown[] = [
  null,
  true,
  false,
  0,
  -1,
  1.5,
  -0.000001,
  1e308,
  -1e308,
  UNSAFE_INTEGER,
  -9007199254740991,
  2147483648,
  "",
  " ",
  "s",
  "1",
  "true",
  "null",
  CONTROL,
  "../../../../etc/passwd",
  "..\\..\\windows",
  "%00",
  "a\u0000",
  "\ud800",
  "😀".repeat(50),
  "<script>alert(1)</script>",
  "' OR '1'='1",
  // biome-ignore lint/suspicious/noTemplateCurlyInString: a template-injection probe, sent as text.
  "${7*7}{{7*7}}",
  "A".repeat(5000),
  [],
  [1],
  [null],
  [[["x"]]],
  ["x"],
  {},
  { a: 1 },
  { "": "" },
  { __proto__: { polluted: true } },
];

/** resolve follows a `$ref` into the document's components. */
function resolve(schema: Schema | undefined, document: OpenApiDocument): Schema {
  let current = schema ?? {};
  for (let hops = 0; typeof current.$ref === "string" && hops < 10; hops++) {
    const name = decodeURIComponent(current.$ref.replace("#/components/schemas/", ""));
    current = document.components.schemas[name] ?? {};
  }
  return current;
}

const PATTERN_CANDIDATES = ["fuzz", "f", "a1", "/fuzz", "fuzz-1", "NL-ABCD-EFGH", "BCDF-GHJK", "123", "fuzz.localhost"];

/** sample returns a value the schema accepts (or close to it): only required fields, the least that passes. */
export function sample(schema: Schema | undefined, document: OpenApiDocument, rng: Rng, depth = 0): unknown {
  const s = resolve(schema, document);
  if (depth > 8) return null;
  if (s.default !== undefined) return s.default;
  if (s.const !== undefined) return s.const;
  if (Array.isArray(s.enum)) return s.enum[0];
  const union = (s.anyOf ?? s.oneOf) as Schema[] | undefined;
  if (union) return sample(union.find((u) => resolve(u, document).type !== "null") ?? union[0], document, rng, depth + 1);
  const type = Array.isArray(s.type) ? (s.type as string[]).find((t) => t !== "null") : (s.type as string | undefined);
  switch (type) {
    case "object": {
      const out: Record<string, unknown> = {};
      const properties = (s.properties ?? {}) as Record<string, Schema>;
      for (const name of (s.required ?? []) as string[]) out[name] = sample(properties[name], document, rng, depth + 1);
      return out;
    }
    case "array":
      return Array.from({ length: Number(s.minItems ?? 0) }, () => sample(s.items as Schema, document, rng, depth + 1));
    case "string": {
      if (s.format === "date-time") return new Date(Date.now() + 3_600_000).toISOString();
      if (s.format === "uuid") return "00000000-0000-4000-8000-000000000000";
      const pattern = typeof s.pattern === "string" ? new RegExp(s.pattern, "u") : null;
      const min = Number(s.minLength ?? 0);
      const fits = (value: string) => (!pattern || pattern.test(value)) && value.length >= min;
      return PATTERN_CANDIDATES.find(fits) ?? "fuzz".padEnd(Math.max(min, 4), "z");
    }
    case "integer":
    case "number":
      return typeof s.minimum === "number" ? s.minimum : 1;
    case "boolean":
      return false;
    default:
      return {};
  }
}

/** parsed reads a body as the server's JSON parser would, or undefined where it is not JSON. */
function parsed(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/** nested builds `depth` nested arrays (or objects) as JSON text without recursion. */
function nested(depth: number, kind: "array" | "object"): string {
  return kind === "array" ? `${"[".repeat(depth)}${"]".repeat(depth)}` : `${'{"a":'.repeat(depth)}1${"}".repeat(depth)}`;
}

/** percent encodes a value for a URL as UTF-8 bytes (a lone surrogate becomes U+FFFD rather than a throw). */
function percent(raw: string): string {
  return [...new TextEncoder().encode(raw)]
    .map((b) =>
      /[A-Za-z0-9._~-]/.test(String.fromCharCode(b)) ? String.fromCharCode(b) : `%${b.toString(16).toUpperCase().padStart(2, "0")}`,
    )
    .join("");
}

/** pathOf writes the operation's path with the given (already encoded) parameter values. */
function pathOf(template: string, values: Record<string, string>): string {
  return template.replace(/\{([^}]+)\}/g, (_, name: string) => values[name] ?? "x");
}

/** PATH_TRICKS are raw path-segment values: traversal, NUL, encodings, overlong ids. */
const PATH_TRICKS: readonly string[] = [
  "..",
  ".",
  "../..",
  "..%2F..%2Fetc%2Fpasswd",
  "%2e%2e",
  "%2E%2E%2F",
  ".%2e",
  "%00",
  "a%00b",
  "%2500",
  "%",
  "%zz",
  "%ff%fe",
  "%c0%ae%c0%ae",
  "%0d%0aX-Injected:%201",
  "%20",
  "%09",
  "~",
  "*",
  ";a=b",
  "%3Cscript%3E",
  percent("é😀"),
  "a".repeat(300),
  "a".repeat(5000),
  "1".repeat(40),
  "-1",
  "1e308",
  "null",
  "__proto__",
  "constructor",
];

/** routedBy says whether a raw segment value still names one path segment of the same route. */
function routedBy(value: string): boolean {
  if (value === "" || value.includes("/")) return false;
  let decoded = value.toLowerCase();
  for (const [from, to] of [
    ["%2e", "."],
    ["%2f", "/"],
  ] as const)
    decoded = decoded.replaceAll(from, to);
  return !decoded.includes("/") && decoded !== "." && decoded !== "..";
}

const BAD_JSON: readonly string[] = [
  "{",
  '{"a":}',
  "{'a':1}",
  '{"a":1,}',
  "NaN",
  "",
  " ",
  "\uFEFF{}",
  '{"a":1}{"b":2}',
  "null",
  "[]",
  "1",
  '"x"',
  "true",
  '{"a":"\\ud800"}',
  '{"a":1e999}',
  '{"a":-}',
  "{}}",
  '{"__proto__":{"polluted":true}}',
  '{"constructor":{"prototype":{"polluted":true}}}',
];

const CONTENT_TYPES: readonly string[] = [
  "text/plain",
  "application/x-www-form-urlencoded",
  "multipart/form-data; boundary=fuzz",
  "multipart/form-data",
  "application/xml",
  "application/json; charset=utf-16",
  "application/jsonx",
  "APPLICATION/JSON",
  "application/octet-stream",
  "*/*",
];

const QUERY_TRICKS: readonly string[] = [
  "?",
  "?&&&",
  "?%=1",
  "?%zz=%zz",
  "?a[b]=1",
  "?__proto__=x",
  "?constructor[prototype][x]=1",
  `?x=${"A".repeat(8000)}`,
  "?x=%00",
  "?x=%0d%0a",
  "?x=1&x=2&x=3",
];

/**
 * casesFor builds at least CASES_PER_OPERATION cases for one operation: a fixed part that
 * covers every class once, then random mutations from the seeded PRNG.
 */
export function casesFor(ctx: OperationContext, rng: Rng): FuzzCase[] {
  const { method, path, operation, document } = ctx;
  const cases: FuzzCase[] = [];
  const jsonHeaders = (): [string, string][] => [...ctx.auth(), ["Content-Type", "application/json"]];
  const basePath = pathOf(path, ctx.pathValues);
  const bodySchema = operation.requestBody?.content["application/json"]?.schema as Schema | undefined;
  const base = bodySchema ? sample(bodySchema, document, rng) : undefined;
  // carried is the body that cases about something else (headers, query, content types) carry:
  // the base where it may be delivered, else the base with a field spoiled so it cannot act.
  const carried = (() => {
    if (!bodySchema || ctx.mayDeliver(base)) return bodySchema ? JSON.stringify(base) : undefined;
    const record = (base ?? {}) as Record<string, unknown>;
    const field = Object.keys(record)[0] ?? "fuzz";
    const spoiled = { ...record, [field]: [["spoiled"]] };
    return ctx.mayDeliver(spoiled) ? JSON.stringify(spoiled) : undefined;
  })();
  const queryParams = (operation.parameters ?? []).filter((p) => p.in === "query");
  const pathParams = (operation.parameters ?? []).filter((p) => p.in === "path");
  const add = (kind: string, label: string, request: Partial<RawRequest> & { body?: string | Uint8Array }, routed = true) => {
    // Whatever the case, a JSON body that the guard refuses is never sent.
    if (typeof request.body === "string" && bodySchema && !ctx.mayDeliver(parsed(request.body))) return;
    cases.push({
      kind,
      label,
      routed,
      request: { method, target: request.target ?? basePath, headers: request.headers ?? jsonHeaders(), body: request.body },
    });
  };
  const addBody = (kind: string, label: string, body: unknown) => {
    if (!ctx.mayDeliver(body)) return;
    add(kind, label, { body: json(body) });
  };

  // The operation as documented, once (where that has no real effect).
  if (bodySchema) addBody("baseline", "a body the document accepts", base);
  else add("baseline", "no body", { headers: ctx.auth() });

  if (bodySchema && base && typeof base === "object" && !Array.isArray(base)) {
    const resolved = resolve(bodySchema, document);
    const properties = Object.keys((resolved.properties ?? {}) as Record<string, unknown>);
    const required = (resolved.required ?? []) as string[];
    const record = base as Record<string, unknown>;
    for (const field of required) {
      const { [field]: _, ...rest } = record;
      addBody("missing", `without ${field}`, rest);
    }
    addBody("missing", "an empty object", {});
    addBody("extra", "an unknown field", { ...record, fuzz_extra: 1 });
    addBody("extra", "a thousand unknown fields", {
      ...record,
      ...Object.fromEntries(Array.from({ length: 1000 }, (_, i) => [`f${i}`, i])),
    });
    add("extra", "__proto__ and constructor", {
      body: JSON.stringify(record).replace(/^\{/, '{"__proto__":{"admin":true},"constructor":{"prototype":{"x":1}},'),
    });
    for (const field of properties) {
      addBody("huge", `${field}: a 1 MB string`, { ...record, [field]: "A".repeat(HUGE_STRING_BYTES) });
      addBody("number", `${field}: 1e308`, { ...record, [field]: 1e308 });
      addBody("number", `${field}: 2^53+1`, { ...record, [field]: UNSAFE_INTEGER });
      addBody("control", `${field}: control characters`, { ...record, [field]: CONTROL });
      addBody("type", `${field}: nested arrays`, { ...record, [field]: [["x"]] });
    }
    const field = properties[0] ?? "a";
    add("nesting", `${field}: 50 000 nested arrays`, { body: `{"${field}":${nested(50_000, "array")}}` });
    add("nesting", `${field}: 50 000 nested objects`, { body: `{"${field}":${nested(50_000, "object")}}` });
    add("nesting", "a body of 50 000 nested arrays", { body: nested(50_000, "array") });
    add("huge", "a 4 MB body", { body: JSON.stringify({ ...record, fuzz_pad: "B".repeat(4 * HUGE_STRING_BYTES) }) });
    for (const bad of BAD_JSON) add("json", `bad JSON ${JSON.stringify(bad.slice(0, 40))}`, { body: bad });
    add("json", "invalid UTF-8", { body: new Uint8Array([0x7b, 0x22, 0x61, 0x22, 0x3a, 0x22, 0xff, 0xfe, 0x22, 0x7d]) });
    for (const type of CONTENT_TYPES) {
      add("content-type", `Content-Type ${type}`, { headers: [...ctx.auth(), ["Content-Type", type]], body: carried });
    }
    add("content-type", "no Content-Type", { headers: ctx.auth(), body: carried });
    add("content-type", "form fields", {
      headers: [...ctx.auth(), ["Content-Type", "application/x-www-form-urlencoded"]],
      body: Object.keys(record)
        .map((k) => `${encodeURIComponent(k)}=x`)
        .join("&"),
    });
  } else {
    // An operation without a body gets one anyway: it must be ignored or refused, never a crash.
    add("json", "an unexpected JSON body", { body: '{"fuzz":1}' });
    add("json", "an unexpected bad JSON body", { body: "{" });
    add("nesting", "an unexpected body of 50 000 nested arrays", { body: nested(50_000, "array") });
    add("content-type", "an unexpected form body", {
      headers: [...ctx.auth(), ["Content-Type", "multipart/form-data; boundary=x"]],
      body: "--x\r\n",
    });
  }

  for (const parameter of pathParams) {
    for (const trick of PATH_TRICKS) {
      add(
        "path",
        `${parameter.name} = ${trick.slice(0, 40)}`,
        { target: pathOf(path, { ...ctx.pathValues, [parameter.name]: trick }) },
        routedBy(trick),
      );
    }
  }
  for (const trick of QUERY_TRICKS) add("query", `query ${trick.slice(0, 40)}`, { target: `${basePath}${trick}` });
  for (const parameter of queryParams) {
    for (const value of ["", "abc", "-1", "1.5", "1e308", "9007199254740993", "9".repeat(5000), "%00", "%0a", "true%00", "[]", "{}"]) {
      if (ctx.mayQuery(parameter.name, decodeURIComponent(value))) {
        add("query", `${parameter.name}=${value.slice(0, 20)}`, { target: `${basePath}?${parameter.name}=${value}` });
      }
    }
    add("query", `${parameter.name} twice`, { target: `${basePath}?${parameter.name}=1&${parameter.name}=2` });
  }

  // Headers: control characters and oversized values where a server reads them.
  add("header", "a control character in a header value", { headers: [...jsonHeaders(), ["X-Fuzz", "a\u0001b"]], body: carried });
  add("header", "a 64 KB header", { headers: [...jsonHeaders(), ["X-Fuzz", "h".repeat(65_536)]], body: carried });
  add("header", "a malformed Authorization", {
    headers: [
      ["Authorization", "Bearer"],
      ["Content-Type", "application/json"],
    ],
    body: carried,
  });
  add("header", "an overlong bearer token", {
    headers: [
      ["Authorization", `Bearer ${"t".repeat(10_000)}`],
      ["Content-Type", "application/json"],
    ],
  });
  add("header", "Basic credentials", {
    headers: [
      ["Authorization", "Basic YWRtaW46YWRtaW4="],
      ["Content-Type", "application/json"],
    ],
  });
  add("header", "a malformed cookie", {
    headers: [
      ["Cookie", "engine_session=%zz; engine_cloud_session=%E0%A4%A"],
      ["Content-Type", "application/json"],
    ],
  });
  add("header", "a hostile X-Request-Id", { headers: [...jsonHeaders(), ["X-Request-Id", "../../etc/passwd"]], body: carried });
  add("header", "X-Forwarded-For junk", { headers: [...jsonHeaders(), ["X-Forwarded-For", "not-an-address, 999.1.1.1"]], body: carried });

  // The rest at random, from the seeded PRNG, until the operation has its share.
  const fields = bodySchema ? Object.keys((resolve(bodySchema, document).properties ?? {}) as Record<string, unknown>) : [];
  for (let tries = 0; cases.length < CASES_PER_OPERATION && tries < 10 * CASES_PER_OPERATION; tries++) {
    const roll = rng.int(3);
    if (roll === 0 && fields.length > 0 && base && typeof base === "object") {
      const field = rng.pick(fields);
      const value = rng.pick(BAD_SCALARS);
      addBody("type", `${field}: ${JSON.stringify(value)?.slice(0, 40)}`, { ...(base as Record<string, unknown>), [field]: value });
    } else if (roll === 1 && pathParams.length > 0) {
      const parameter = rng.pick(pathParams);
      const value = percent(text(rng.pick(BAD_SCALARS)));
      add(
        "path",
        `${parameter.name} = ${value.slice(0, 40)}`,
        { target: pathOf(path, { ...ctx.pathValues, [parameter.name]: value }) },
        routedBy(value),
      );
    } else {
      const name = queryParams.length > 0 && rng.int(2) === 0 ? rng.pick(queryParams).name : `q${rng.int(5)}`;
      const raw = text(rng.pick(BAD_SCALARS));
      const value = percent(raw);
      if (!ctx.mayQuery(name, raw)) continue;
      add("query", `${name}=${value.slice(0, 40)}`, { target: `${basePath}?${name}=${value}`, body: carried });
    }
  }
  return cases;
}
