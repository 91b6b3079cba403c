import { expect, test } from "bun:test";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { Type as t } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import { Value } from "@sinclair/typebox/value";
import { NAME_PATTERN, ServiceDeploy, ServicePatch } from "../../src/contract/engine";
import { echoInput, PATTERN_MESSAGES, type SchemaIssue, safeDetail, toValidationDetail, VALIDATION_TYPES } from "../../src/lib/validation";
import { REPO_ROOT } from "../helpers";

/** sourceFiles lists every .ts file under src. */
function sourceFiles(dir = join(REPO_ROOT, "src")): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? sourceFiles(path) : path.endsWith(".ts") ? [path] : [];
  });
}

test("every 422 type is documented in docs/decisions.md", () => {
  const decisions = readFileSync(join(REPO_ROOT, "docs", "decisions.md"), "utf8");
  const undocumented = VALIDATION_TYPES.filter((type) => !decisions.includes(`\`${type}\``));
  expect(undocumented).toEqual([]);
});

test("every type a module writes into a 422 entry is in the vocabulary", () => {
  const known = new Set<string>(VALIDATION_TYPES);
  const found = new Set<string>();
  for (const file of sourceFiles()) {
    const text = readFileSync(file, "utf8");
    if (!text.includes("InputError")) continue;
    // `type: "x"` inside an entry, and spec.ts's detail(loc, msg, "x", input) helper.
    for (const match of text.matchAll(/\btype: "([a-z_]+)"/g))
      if (match[1]?.includes("_") || known.has(match[1] ?? "")) found.add(match[1] ?? "");
    for (const match of text.matchAll(/detail\(\[[^\]]*\], [^;]*?, "([a-z_]+)", /g)) found.add(match[1] ?? "");
    for (const match of text.matchAll(/dumpInput\((?:`[^`]*`|"[^"]*"), "([a-z_]+)"/g)) found.add(match[1] ?? "");
  }
  expect([...found].filter((type) => !known.has(type))).toEqual([]);
});

test("the schema mapping emits only documented types", () => {
  const schema = t.Object({
    a: t.Integer({ minimum: 0, maximum: 9 }),
    b: t.String({ minLength: 2, maxLength: 3, pattern: "^x" }),
    c: t.Array(t.Integer(), { minItems: 1, maxItems: 1, uniqueItems: true }),
    d: t.Union([t.Literal("p"), t.Literal("q")]),
    e: t.Union([t.String(), t.Integer()]),
    f: t.Boolean(),
    g: t.Number(),
    h: t.Null(),
    i: t.String({ format: "date-time" }),
  });
  const check = TypeCompiler.Compile(schema);
  for (const value of [
    {},
    { a: -1, b: "", c: [], d: "z", e: [], f: 1, g: "x", h: 1, i: "x" },
    { a: 10, b: "yyyy", c: [1, 1], d: 1, e: {}, f: "x", g: [], h: "x", i: 1 },
  ]) {
    const issues = [...check.Errors(value)].map((e) => ({
      type: e.type,
      path: e.path,
      value: e.value,
      message: e.message,
      schema: e.schema,
    }));
    for (const entry of toValidationDetail("body", issues as unknown as SchemaIssue[])) {
      expect(VALIDATION_TYPES as readonly string[]).toContain(entry.type);
    }
  }
});

test.each([
  ["a short string", "abc", "abc"],
  ["a long string", "x".repeat(300), `${"x".repeat(256)}…[44 more characters]`],
  ["a secret field inside an object", { name: "n", token: "eng_secret" }, { name: "n", token: "[secret]" }],
  ["a deep list", [[[["deep"]]]], [[["[a list of 1 items]"]]]],
  ["a long list", Array.from({ length: 25 }, (_, i) => i), [...Array.from({ length: 20 }, (_, i) => i), "…[5 more items]"]],
])("echoInput bounds %s", (_name, input, echoed) => {
  expect(echoInput(input)).toEqual(echoed);
});

test.each([
  [["body", "token"], "eng_secret"],
  [["body", "secrets", "DB_PASSWORD"], "hunter2"],
  [["body", "device_code"], "dev_x.secret"],
  [["query", "code"], "login-code"],
])("safeDetail drops the input under %p", (loc, input) => {
  expect(safeDetail({ loc, msg: "m", type: "value_error", input, ctx: {} }).input).toBeNull();
});

test("every pattern described in words is a pattern of the contract", () => {
  const contract = readFileSync(join(REPO_ROOT, "src", "contract", "engine.ts"), "utf8");
  expect(PATTERN_MESSAGES[NAME_PATTERN]).toBeDefined();
  for (const pattern of Object.keys(PATTERN_MESSAGES)) {
    expect({ pattern, used: pattern === NAME_PATTERN || contract.includes(JSON.stringify(pattern)) }).toEqual({ pattern, used: true });
  }
});

test.each([
  [
    "a service name",
    ServiceDeploy,
    { name: "Bad_Name" },
    "name",
    "string_pattern_mismatch",
    "a name is lowercase letters, digits and dashes",
  ],
  ["a relative cwd", ServicePatch, { cwd: "here" }, "cwd", "string_pattern_mismatch", "should start with / (an absolute path)"],
  [
    "a bad variable name",
    ServicePatch,
    { env: { "1BAD": "x" } },
    "env.1BAD",
    "extra_forbidden",
    "a variable name is letters, digits and _",
  ],
  ["an unknown field", ServicePatch, { memroy_mb: 1 }, "memroy_mb", "extra_forbidden", "Extra inputs are not permitted"],
] as const)("%s is refused in words, with the type and ctx unchanged", (_label, schema, value, loc, type, msg) => {
  const issues = [...Value.Errors(schema, value)].map((error) => ({
    ...error,
    schema: error.schema as unknown as Record<string, unknown>,
  }));
  const detail = toValidationDetail("body", issues).find((entry) => entry.loc.slice(1).join(".") === loc);
  expect(detail?.type).toBe(type);
  expect(detail?.msg).toStartWith(msg);
});
