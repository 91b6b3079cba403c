import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startTestEngine, type TestEngine } from "../../helpers";

let engine: TestEngine;
beforeAll(async () => {
  engine = await startTestEngine();
});
afterAll(() => engine.close());

const future = new Date(Date.now() + 3600_000).toISOString();
const now = new Date().toISOString();
const push = { installation_id: 7, token: "ghs_x", expires_at: future, issued_at: now, repos: [] };

interface BadInput {
  name: string;
  method: string;
  path: string;
  body?: unknown;
  raw?: string;
  loc: (string | number)[];
  type: string;
}

/** BAD_INPUTS: one or more bad inputs for every route with a body or path parameters. */
const BAD_INPUTS: BadInput[] = [
  { name: "token: malformed JSON", method: "POST", path: "/api/tokens", raw: "{", loc: ["body"], type: "json_invalid" },
  { name: "token: name missing", method: "POST", path: "/api/tokens", body: {}, loc: ["body", "name"], type: "missing" },
  { name: "token: name empty", method: "POST", path: "/api/tokens", body: { name: "" }, loc: ["body", "name"], type: "string_too_short" },
  { name: "token: name not a string", method: "POST", path: "/api/tokens", body: { name: 5 }, loc: ["body", "name"], type: "string_type" },
  {
    name: "token: unknown role",
    method: "POST",
    path: "/api/tokens",
    body: { name: "a", role: "root" },
    loc: ["body", "role"],
    type: "enum",
  },
  {
    name: "token: negative max_gpus",
    method: "POST",
    path: "/api/tokens",
    body: { name: "a", max_gpus: -1 },
    loc: ["body", "max_gpus"],
    type: "greater_than_equal",
  },
  {
    name: "token: fractional caps",
    method: "POST",
    path: "/api/tokens",
    body: { name: "a", max_concurrent_jobs: 1.5 },
    loc: ["body", "max_concurrent_jobs"],
    type: "int_type",
  },
  {
    name: "token: zero jobs",
    method: "POST",
    path: "/api/tokens",
    body: { name: "a", max_concurrent_jobs: 0 },
    loc: ["body", "max_concurrent_jobs"],
    type: "greater_than_equal",
  },
  {
    name: "token: bad expiry",
    method: "POST",
    path: "/api/tokens",
    body: { name: "a", expires_at: "tomorrow" },
    loc: ["body", "expires_at"],
    type: "datetime_parsing",
  },
  {
    name: "token: bad scope item",
    method: "POST",
    path: "/api/tokens",
    body: { name: "a", scope_services: ["Web App"] },
    loc: ["body", "scope_services", 0],
    type: "string_pattern_mismatch",
  },
  {
    name: "token: scope not a list",
    method: "POST",
    path: "/api/tokens",
    body: { name: "a", scope_services: "web" },
    loc: ["body", "scope_services"],
    type: "list_type",
  },
  { name: "token: body not an object", method: "POST", path: "/api/tokens", body: [1], loc: ["body"], type: "dict_type" },
  {
    name: "template: bad id",
    method: "GET",
    path: "/api/app-templates/Not_An_Id",
    loc: ["path", "template_id"],
    type: "string_pattern_mismatch",
  },
  {
    name: "domains: bad service name",
    method: "DELETE",
    path: "/api/services/Web!/domains/a.com",
    loc: ["path", "name"],
    type: "string_pattern_mismatch",
  },
  {
    name: "domains: bad domain",
    method: "DELETE",
    path: "/api/services/web/domains/a_b..",
    loc: ["path", "domain"],
    type: "string_pattern_mismatch",
  },
  {
    name: "restore: missing body fields",
    method: "POST",
    path: "/api/databases/db/restore",
    body: {},
    loc: ["body", "dump"],
    type: "missing",
  },
  {
    name: "restore: timeout not integer",
    method: "POST",
    path: "/api/databases/db/restore",
    body: { dump: "/d", timeout_s: "10" },
    loc: ["body", "timeout_s"],
    type: "int_type",
  },
  {
    name: "restore: timeout zero",
    method: "POST",
    path: "/api/databases/db/restore",
    body: { dump: "/d", timeout_s: 0 },
    loc: ["body", "timeout_s"],
    type: "greater_than_equal",
  },
  { name: "restore: malformed JSON", method: "POST", path: "/api/databases/db/restore", raw: "[", loc: ["body"], type: "json_invalid" },
  {
    name: "restore: bad name",
    method: "POST",
    path: "/api/databases/DB/restore",
    body: { dump: "/d", timeout_s: 1 },
    loc: ["path", "name"],
    type: "string_pattern_mismatch",
  },
  {
    name: "restart: missing drain",
    method: "POST",
    path: "/api/daemon/restart",
    body: {},
    loc: ["body", "drain_timeout_s"],
    type: "missing",
  },
  {
    name: "restart: negative drain",
    method: "POST",
    path: "/api/daemon/restart",
    body: { drain_timeout_s: -5 },
    loc: ["body", "drain_timeout_s"],
    type: "greater_than_equal",
  },
  { name: "restart: malformed JSON", method: "POST", path: "/api/daemon/restart", raw: "nope", loc: ["body"], type: "json_invalid" },
  {
    name: "vcs: missing token",
    method: "PUT",
    path: "/api/link/vcs-token",
    body: { ...push, token: undefined },
    loc: ["body", "token"],
    type: "missing",
  },
  {
    name: "vcs: bad installation",
    method: "PUT",
    path: "/api/link/vcs-token",
    body: { ...push, installation_id: "7" },
    loc: ["body", "installation_id"],
    type: "int_type",
  },
  {
    name: "vcs: bad issued_at",
    method: "PUT",
    path: "/api/link/vcs-token",
    body: { ...push, issued_at: "yesterday" },
    loc: ["body", "issued_at"],
    type: "datetime_parsing",
  },
  {
    name: "vcs: repos not a list",
    method: "PUT",
    path: "/api/link/vcs-token",
    body: { ...push, repos: "a/b" },
    loc: ["body", "repos"],
    type: "list_type",
  },
  {
    name: "vcs: expiry before issue",
    method: "PUT",
    path: "/api/link/vcs-token",
    body: { ...push, expires_at: "2000-01-01T00:00:00Z" },
    loc: ["body", "expires_at"],
    type: "value_error",
  },
  { name: "vcs: malformed JSON", method: "PUT", path: "/api/link/vcs-token", raw: '{"token":', loc: ["body"], type: "json_invalid" },
];

describe("422 validation body", () => {
  test.each(BAD_INPUTS)("$name", async ({ method, path, body, raw, loc, type }) => {
    const response = await engine.call(method, path, { body, raw });
    expect(response.status).toBe(422);
    expect(response.headers.get("x-request-id")).toMatch(/^req_/);
    const payload = (await response.json()) as { detail: Record<string, unknown>[] };
    expect(Object.keys(payload)).toEqual(["detail"]);
    expect(payload.detail.length).toBeGreaterThan(0);
    for (const item of payload.detail) {
      expect(Object.keys(item).sort()).toEqual(["ctx", "input", "loc", "msg", "type"]);
      expect(Array.isArray(item.loc)).toBe(true);
      expect(typeof item.msg).toBe("string");
      expect(typeof item.ctx).toBe("object");
    }
    expect(payload.detail).toContainEqual(expect.objectContaining({ loc, type }));
  });

  test("the detail carries the offending input and the constraint in ctx", async () => {
    const { body } = await engine.json<{ detail: { input: unknown; ctx: Record<string, unknown> }[] }>("POST", "/api/tokens", {
      body: { name: "a", max_gpus: -3 },
    });
    expect(body.detail[0]).toMatchObject({ input: -3, ctx: { ge: 0 } });
  });

  test("nothing is created by a rejected request", async () => {
    const before = (await engine.json<unknown[]>("GET", "/api/tokens")).body.length;
    await engine.call("POST", "/api/tokens", { body: { name: "x", role: "root" } });
    await engine.call("POST", "/api/tokens", { raw: "{" });
    expect((await engine.json<unknown[]>("GET", "/api/tokens")).body.length).toBe(before);
  });

  test("errors other than 422 share one envelope with a request id", async () => {
    for (const [path, status, code] of [
      ["/api/nope", 404, "not_found"],
      ["/api/app-templates/does-not-exist", 404, "template_not_found"],
      ["/api/services/ghost/diagnose", 404, "service_not_found"],
    ] as const) {
      const response = await engine.call("GET", path);
      expect(response.status).toBe(status);
      const body = (await response.json()) as { error: { code: string; message: string; request_id: string } };
      expect(Object.keys(body)).toEqual(["error"]);
      expect(body.error.code).toBe(code);
      expect(body.error.message.length).toBeGreaterThan(0);
      expect(body.error.request_id).toBe(response.headers.get("x-request-id") ?? "");
    }
  });
});
