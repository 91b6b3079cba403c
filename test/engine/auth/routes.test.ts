import { Database } from "bun:sqlite";
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { createToken, eventually, startTestEngine, type TestEngine } from "../../helpers";

let engine: TestEngine;
beforeAll(async () => {
  engine = await startTestEngine({ lastUsedFlushMs: 50 });
});
afterAll(() => engine.close());

describe("tokens", () => {
  test("creation returns the secret once; the store keeps only its digest", async () => {
    const { status, body } = await engine.json<Record<string, unknown>>("POST", "/api/tokens", {
      body: { name: "ci-runner", role: "submitter", max_gpus: 2, max_concurrent_jobs: 3, scope_services: ["web", "db"] },
    });
    expect(status).toBe(201);
    expect(body).toMatchObject({ name: "ci-runner", role: "submitter", max_gpus: 2, max_concurrent_jobs: 3, revoked: false });
    expect(body.scope_services).toEqual(["web", "db"]);
    const secret = body.token as string;
    expect(secret).toMatch(/^eng_[A-Za-z0-9_-]{43}$/);

    const listed = (await engine.json<Record<string, unknown>[]>("GET", "/api/tokens")).body;
    expect(JSON.stringify(listed)).not.toContain(secret);
    const db = new Database(join(engine.dataDir, "engine.db"), { readonly: true });
    try {
      const dump = JSON.stringify(db.query("SELECT * FROM tokens").all());
      expect(dump).not.toContain(secret);
      expect(dump).toContain(new Bun.CryptoHasher("sha256").update(secret).digest("hex"));
    } finally {
      db.close();
    }
    await eventually(() => readFileSync(join(engine.dataDir, "engine.log"), "utf8").includes("token created"));
    expect(readFileSync(join(engine.dataDir, "engine.log"), "utf8")).not.toContain(secret);
  });

  test("the role defaults to readonly, least privilege", async () => {
    const { body } = await engine.json<{ role: string }>("POST", "/api/tokens", { body: { name: "defaulted" } });
    expect(body.role).toBe("readonly");
  });

  test("two active tokens cannot share a name; a revoked one frees it", async () => {
    const first = await createToken(engine, { name: "dup" });
    const again = await engine.json<{ error: { code: string } }>("POST", "/api/tokens", { body: { name: "dup" } });
    expect(again.status).toBe(409);
    expect(again.body.error.code).toBe("token_name_taken");
    await engine.call("DELETE", `/api/tokens/${first.id}`);
    expect((await engine.call("POST", "/api/tokens", { body: { name: "dup" } })).status).toBe(201);
  });

  test("revocation is idempotent and takes effect at once", async () => {
    const token = await createToken(engine, { name: "short-lived", role: "readonly" });
    expect((await engine.call("GET", "/api/app-templates", { token: token.secret })).status).toBe(200);
    const revoked = await engine.json<{ revoked: boolean }>("DELETE", `/api/tokens/${token.id}`);
    expect(revoked).toEqual({ status: 200, body: expect.objectContaining({ revoked: true }) });
    expect((await engine.call("DELETE", `/api/tokens/${token.id}`)).status).toBe(200);
    expect((await engine.call("GET", "/api/app-templates", { token: token.secret })).status).toBe(401);
  });

  test("unknown token id is 404 token_not_found", async () => {
    const { status, body } = await engine.json<{ error: { code: string } }>("DELETE", "/api/tokens/tok_doesnotexist");
    expect(status).toBe(404);
    expect(body.error.code).toBe("token_not_found");
  });

  test("the last active admin token cannot be revoked over HTTP", async () => {
    const tokens = (await engine.json<{ id: string; role: string; revoked: boolean }[]>("GET", "/api/tokens")).body;
    const admins = tokens.filter((t) => t.role === "admin" && !t.revoked);
    expect(admins.length).toBe(1);
    const { status, body } = await engine.json<{ error: { code: string } }>("DELETE", `/api/tokens/${admins[0]?.id}`);
    expect(status).toBe(409);
    expect(body.error.code).toBe("last_admin_token");
  });

  test("non-admin roles list only their own token", async () => {
    const reader = await createToken(engine, { name: "reader", role: "readonly" });
    const { status, body } = await engine.json<{ id: string }[]>("GET", "/api/tokens", { token: reader.secret });
    expect(status).toBe(200);
    expect(body.map((t) => t.id)).toEqual([reader.id]);
  });

  test("last_used_at is recorded, coalesced and written to the store", async () => {
    const user = await createToken(engine, { name: "busy", role: "readonly" });
    const before = Date.now();
    await Promise.all(Array.from({ length: 50 }, () => engine.call("GET", "/api/proxy/status", { token: user.secret })));
    const listed = (await engine.json<{ id: string; last_used_at: string | null }[]>("GET", "/api/tokens")).body;
    const seen = listed.find((t) => t.id === user.id)?.last_used_at;
    expect(seen).not.toBeNull();
    expect(Date.parse(seen ?? "")).toBeGreaterThanOrEqual(before - 5);
    await eventually(() => {
      const db = new Database(join(engine.dataDir, "engine.db"), { readonly: true });
      try {
        return db.query<{ last_used_at: string | null }, [string]>("SELECT last_used_at FROM tokens WHERE id = ?").get(user.id)
          ?.last_used_at;
      } finally {
        db.close();
      }
    });
  });

  test("an expiry in the past is refused with a 422 naming the field", async () => {
    const { status, body } = await engine.json<{ detail: { loc: unknown[]; type: string }[] }>("POST", "/api/tokens", {
      body: { name: "late", expires_at: "2020-01-01T00:00:00Z" },
    });
    expect(status).toBe(422);
    expect(body.detail[0]).toMatchObject({ loc: ["body", "expires_at"], type: "value_error" });
    const names = (await engine.json<{ name: string }[]>("GET", "/api/tokens")).body.map((t) => t.name);
    expect(names).not.toContain("late");
  });
});
