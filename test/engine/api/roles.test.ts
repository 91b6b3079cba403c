import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { ACCESS_ROLES, ROUTE_ACCESS } from "../../../src/engine/auth";
import { createToken, eventually, REPO_ROOT, startTestEngine, type TestEngine, workloadBun } from "../../helpers";
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
  // GET /metrics answers the Prometheus text format, every other route JSON.
  const json = response.headers.get("content-type")?.includes("json");
  return { sample, status: response.status, body: (json ? await response.json() : {}) as { error?: { code: string } } };
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

  test("a binding names a service too: outside the token's scope it is 403 out_of_scope, inside it is allowed", async () => {
    const outside = await engine.call("POST", "/api/services", {
      token: secrets.scoped ?? "",
      body: { name: "web", kind: "batch", command: ["true"], bindings: ["cache"] },
    });
    expect(outside.status).toBe(403);
    expect(((await outside.json()) as { error: { code: string } }).error.code).toBe("out_of_scope");
    expect((await engine.call("GET", "/api/services/web")).status).toBe(404); // nothing was created
    const pair = (await createToken(engine, { name: "pair", role: "submitter", scope_services: ["pair-a", "pair-b"] })).secret;
    const inside = await engine.call("POST", "/api/services", {
      token: pair,
      body: { name: "pair-a", kind: "batch", command: ["true"], bindings: ["pair-b"] },
    });
    expect(inside.status).toBe(201);
    expect((await engine.call("DELETE", "/api/services/pair-a")).status).toBe(200);
  });

  // The workload's view: roles and scopes are a boundary only if the code a submitter deploys
  // cannot read what makes an admin. As root the engine runs it as a user of its own.
  (process.geteuid?.() === 0 ? test : test.skip)(
    "a scoped submitter's workload cannot read the engine's secrets, its socket, or another service's data and logs",
    async () => {
      const dir = engine.dataDir;
      const victim = await engine.json<{ id: string }>("POST", "/api/services", {
        body: { name: "victim", command: 'echo victim-private > "$SERVICE_DATA_DIR/private"; echo victim-log-line; exec sleep 300' },
      });
      expect(victim.status).toBe(201);
      const victimLog = join(dir, "services", victim.body.id, "logs", "output.log");
      await eventually(
        () => existsSync(join(dir, "data", "victim", "private")) && readFileSync(victimLog, "utf8").includes("victim-log-line"),
      );
      // Each attempt prints "<name> <outcome>": the error code, or "ok".
      const probe = `
        const fs = require("node:fs");
        const attempt = async (name, fn) => {
          try { await fn(); console.log(name + " ok"); } catch (e) { console.log(name + " " + (e.code ?? e.name)); }
        };
        const dir = ${JSON.stringify(dir)};
        await attempt("admin.token", () => fs.readFileSync(dir + "/admin.token"));
        await attempt("secret.key", () => fs.readFileSync(dir + "/secret.key"));
        await attempt("engine.db", () => fs.readFileSync(dir + "/engine.db"));
        await attempt("engine.db-wal", () => fs.readFileSync(dir + "/engine.db-wal"));
        await attempt("engine.log", () => fs.readFileSync(dir + "/engine.log"));
        await attempt("list-data-dir", () => fs.readdirSync(dir));
        const connect = (path) => Bun.connect({ unix: path, socket: { data() {} } }).then((socket) => socket.end());
        await attempt("engine.sock", () => connect(dir + "/engine.sock"));
        await attempt("shim.sock", () => connect(dir + "/shim.sock"));
        await attempt("victim-data", () => fs.readFileSync(dir + "/data/victim/private"));
        await attempt("victim-log", () => fs.readFileSync(${JSON.stringify(victimLog)}));
        await attempt("own-data", () => fs.writeFileSync(process.env.SERVICE_DATA_DIR + "/mine", "x"));
        console.log("env-admin-token " + (Object.keys(process.env).some((k) => k.startsWith("ENGINE_ADMIN")) ? "present" : "absent"));
      `;
      const deployed = await engine.call("POST", "/api/services", {
        token: secrets.scoped ?? "",
        body: { name: "web", kind: "batch", command: [workloadBun(), "-e", probe] },
      });
      expect(deployed.status).toBe(201);
      const outcomes = await eventually(
        async () => {
          const lines = (await engine.json<{ line: string }[]>("GET", "/api/services/web/logs")).body.map((l) => l.line);
          return lines.some((line) => line.startsWith("env-admin-token")) ? Object.fromEntries(lines.map((line) => line.split(" "))) : null;
        },
        { timeoutMs: 15_000 },
      );
      expect(outcomes).toEqual({
        "admin.token": "EACCES",
        "secret.key": "EACCES",
        "engine.db": "EACCES",
        "engine.db-wal": "EACCES",
        "engine.log": "EACCES",
        "list-data-dir": "EACCES",
        "engine.sock": "EACCES",
        "shim.sock": "EACCES",
        "victim-data": "EACCES",
        "victim-log": "EACCES",
        "own-data": "ok",
        "env-admin-token": "absent",
      });
      expect(readFileSync(join(dir, "data", "web", "mine"), "utf8")).toBe("x");
      for (const name of ["web", "victim"]) expect((await engine.call("DELETE", `/api/services/${name}`)).status).toBe(200);
    },
    30_000,
  );

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
