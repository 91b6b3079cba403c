import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { ACCESS_ROLES, ROUTE_ACCESS } from "../../../src/engine/auth";
import { createToken, REPO_ROOT, startTestEngine, type TestEngine } from "../../helpers";
import { sampleRequests } from "./routes";

let engine: TestEngine;
const secrets: Record<string, string> = {};
let counter = 0;

beforeAll(async () => {
  engine = await startTestEngine();
  secrets.admin = engine.adminToken;
  secrets.submitter = (await createToken(engine, { name: "sub", role: "submitter" })).secret;
  secrets.readonly = (await createToken(engine, { name: "ro", role: "readonly" })).secret;
  secrets.scoped = (await createToken(engine, { name: "scoped", role: "submitter", scope_services: ["web"] })).secret;
  const revoked = await createToken(engine, { name: "gone", role: "admin" });
  await engine.call("DELETE", `/api/tokens/${revoked.id}`);
  secrets.revoked = revoked.secret;
  secrets.expiring = (
    await createToken(engine, { name: "short", role: "admin", expires_at: new Date(Date.now() + 60_000).toISOString() })
  ).secret;
});
afterAll(() => engine.close());

const throwaway = async () => (await createToken(engine, { name: `throwaway-${++counter}`, role: "readonly" })).id;

async function send(key: string, token: string | null) {
  const id = key === "DELETE /api/tokens/:id" ? await throwaway() : "unused";
  const sample = sampleRequests(
    () => id,
    () => `matrix-${++counter}`,
  ).find((s) => s.key === key);
  if (!sample) throw new Error(`no sample for ${key}`);
  const response = await engine.call(sample.method, sample.path, { token, body: sample.body });
  return { sample, status: response.status, body: (await response.json()) as { error?: { code: string } } };
}

const protectedRoutes = Object.entries(ROUTE_ACCESS).filter(([, access]) => access !== "public");

describe("role matrix", () => {
  test("every route of the API is in the matrix and has a sample request", () => {
    const keys = sampleRequests(
      () => "x",
      () => "y",
    ).map((s) => s.key);
    expect(protectedRoutes.map(([key]) => key).sort()).toEqual(keys.sort());
  });

  test.each(protectedRoutes)("%s (%s)", async (key, access) => {
    for (const role of ["admin", "submitter", "readonly"] as const) {
      const allowed = ACCESS_ROLES[access as "read"].includes(role);
      const sample = sampleRequests(
        () => "x",
        () => "y",
      ).find((s) => s.key === key);
      if (allowed && sample?.mutates) continue; // the restart itself is tested in daemon tests
      const { status, body, sample: sent } = await send(key, secrets[role] ?? "");
      if (allowed) expect({ role, status }).toEqual({ role, status: sent.adminStatus });
      else expect({ role, status, code: body.error?.code }).toEqual({ role, status: 403, code: "forbidden" });
    }
    for (const [who, code] of [
      ["none", "unauthenticated"],
      ["revoked", "token_revoked"],
      ["unknown", "invalid_token"],
    ] as const) {
      const token = who === "none" ? null : who === "unknown" ? "eng_notARealTokenAtAll0123456789" : (secrets[who] ?? "");
      const { status, body } = await send(key, token);
      expect({ who, status, code: body.error?.code }).toEqual({ who, status: 401, code });
    }
  });

  test("a malformed Authorization header is 401 invalid_token with a WWW-Authenticate challenge", async () => {
    for (const header of ["Basic dXNlcjpwYXNz", "Bearer", "Bearer two words", `Bearer ${"x".repeat(600)}`]) {
      const response = await fetch(`${engine.url}/api/tokens`, { headers: { authorization: header } });
      expect(response.status).toBe(401);
      expect(response.headers.get("www-authenticate")).toContain("Bearer");
      expect(((await response.json()) as { error: { code: string } }).error.code).toBe("invalid_token");
    }
  });

  test("an expired token is 401 token_expired on every protected route", async () => {
    engine.clock.advance(120_000);
    try {
      for (const [key] of protectedRoutes) {
        const { status, body } = await send(key, secrets.expiring ?? "");
        expect({ key, status, code: body.error?.code }).toEqual({ key, status: 401, code: "token_expired" });
      }
    } finally {
      engine.clock.advance(-120_000);
    }
  });

  test("a scoped token may touch only its services", async () => {
    const outside = await engine.call("DELETE", "/api/services/db/domains/db.example.com", { token: secrets.scoped ?? "" });
    expect(outside.status).toBe(403);
    expect(((await outside.json()) as { error: { code: string } }).error.code).toBe("out_of_scope");
    const restoreOutside = await engine.call("POST", "/api/databases/db/restore", {
      token: secrets.scoped ?? "",
      body: { dump: "/x", timeout_s: 5 },
    });
    expect(restoreOutside.status).toBe(403);
    // Inside its scope the request reaches the module, which finds no such service.
    const inside = await engine.call("DELETE", "/api/services/web/domains/web.example.com", { token: secrets.scoped ?? "" });
    expect(inside.status).toBe(404);
  });

  test("authentication runs before the body is parsed: no credential and bad JSON is 401, not 422", async () => {
    const response = await engine.call("POST", "/api/tokens", { token: null, raw: "{not json" });
    expect(response.status).toBe(401);
  });

  test("the unix socket counts as admin without a token", async () => {
    const response = await fetch("http://engine/api/tokens", { unix: engine.daemon.socketPath });
    expect(response.status).toBe(200);
    const short = await fetch("http://x/api/tokens", { unix: engine.daemon.socketPath });
    expect(short.status).toBe(200);
  });

  test("docs/roles.md lists every route with the access the code enforces", () => {
    const doc = readFileSync(join(REPO_ROOT, "docs", "roles.md"), "utf8");
    for (const [key, access] of Object.entries(ROUTE_ACCESS)) {
      const [method, path] = key.split(" ");
      const cells = doc
        .split("\n")
        .map((l) => l.split("|").map((c) => c.trim()))
        .find((c) => c[1] === method && c[2] === `\`${path}\``);
      expect({ key, listed: cells !== undefined }).toEqual({ key, listed: true });
      expect({ key, access: cells?.[3] }).toEqual({ key, access });
    }
  });
});
