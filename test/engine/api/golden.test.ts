import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { expectGolden } from "../../golden";
import { createToken, startTestEngine, type TestEngine } from "../../helpers";

let engine: TestEngine;
beforeAll(async () => {
  // The proxy runs (on free ports, without mDNS) so its status is the real one.
  engine = await startTestEngine({ proxy: true, httpsPort: 0, httpPort: 0, proxyProcesses: 2, mdns: "off" });
});
afterAll(() => engine.close());

async function golden(name: string, method: string, path: string, expectedStatus: number, body?: unknown) {
  const response = await engine.call(method, path, { body });
  expect(response.status).toBe(expectedStatus);
  expect(response.headers.get("x-request-id")).toMatch(/^req_[a-z0-9]+$/);
  expect(response.headers.get("content-type")).toStartWith("application/json");
  const parsed: unknown = await response.json();
  expectGolden(name, response.status, parsed);
  return parsed;
}

describe("golden responses, one per route", () => {
  test("GET /api/health", () => golden("health", "GET", "/api/health", 200));

  test("POST /api/tokens, GET /api/tokens, DELETE /api/tokens/{id}", async () => {
    const created = (await golden("tokens-create", "POST", "/api/tokens", 201, {
      name: "golden",
      role: "submitter",
      max_gpus: 1,
      max_concurrent_jobs: 2,
      scope_services: ["web"],
      expires_at: new Date(Date.now() + 86400_000).toISOString(),
    })) as { id: string };
    await golden("tokens-list", "GET", "/api/tokens", 200);
    await golden("tokens-revoke", "DELETE", `/api/tokens/${created.id}`, 200);
  });

  test("GET /api/app-templates and /api/app-templates/{template_id}", async () => {
    await golden("app-templates-list", "GET", "/api/app-templates", 200);
    await golden("app-templates-get", "GET", "/api/app-templates/vllm", 200);
    await golden("app-templates-missing", "GET", "/api/app-templates/no-such-template", 404);
  });

  test("GET /api/proxy/status", () => golden("proxy-status", "GET", "/api/proxy/status", 200));

  test("service routes on an engine with no services", async () => {
    await golden("diagnose-missing", "GET", "/api/services/web/diagnose", 404);
    await golden("domain-remove-missing", "DELETE", "/api/services/web/domains/web.example.com", 404);
    await golden("restore-missing", "POST", "/api/databases/pg/restore", 404, { dump: "/tmp/pg.dump", timeout_s: 60 });
  });

  test("PUT /api/link/vcs-token", async () => {
    await golden("vcs-token-push", "PUT", "/api/link/vcs-token", 200, {
      installation_id: 1234,
      token: "ghs_goldenSecret0000000000000000",
      issued_at: new Date().toISOString(),
      expires_at: new Date(Date.now() + 3600_000).toISOString(),
      repos: ["acme/api", "acme/web"],
    });
  });

  test("422 body", () => golden("validation-error", "POST", "/api/tokens", 422, { name: "", role: "root", max_gpus: -1 }));

  test("401 and 403 bodies", async () => {
    const reader = await createToken(engine, { name: "golden-reader", role: "readonly" });
    const unauthenticated = await engine.json("GET", "/api/tokens", { token: null });
    expect(unauthenticated.status).toBe(401);
    expectGolden("unauthenticated", unauthenticated.status, unauthenticated.body);
    const forbidden = await engine.json("POST", "/api/tokens", { token: reader.secret, body: { name: "x" } });
    expect(forbidden.status).toBe(403);
    expectGolden("forbidden", forbidden.status, forbidden.body);
  });

  test("GET /api/openapi.json lists every route of the spec with its statuses", async () => {
    const response = await engine.json<{ openapi: string; paths: Record<string, Record<string, { responses: Record<string, unknown> }>> }>(
      "GET",
      "/api/openapi.json",
    );
    expect(response.status).toBe(200);
    expect(response.body.openapi).toStartWith("3.1");
    const summary = Object.fromEntries(
      Object.entries(response.body.paths).map(([path, ops]) => [
        path,
        Object.fromEntries(Object.entries(ops).map(([method, op]) => [method, Object.keys(op.responses ?? {}).sort()])),
      ]),
    );
    expectGolden("openapi-paths", response.status, summary);
  });

  // Last: the restart drains and closes this engine (the test replaces the re-exec with a no-op).
  test("POST /api/daemon/restart", () => golden("daemon-restart", "POST", "/api/daemon/restart", 202, { drain_timeout_s: 0 }));
});
