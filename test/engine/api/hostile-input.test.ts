import { Database } from "bun:sqlite";
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { connect } from "node:net";
import { join } from "node:path";
import { startTestEngine, type TestEngine, tempDir } from "../../helpers";

/** DEEP is the body that overflowed the 422 serializer's stack: 50,000 nested arrays. */
const DEEP = `{"name":${"[".repeat(50_000)}${"]".repeat(50_000)}}`;

/** Every route of the engine that takes a body, with a path that reaches its handler. */
const BODY_ROUTES: [string, string][] = [
  ["POST", "/api/tokens"],
  ["POST", "/api/services"],
  ["POST", "/api/services/web/domains"],
  ["POST", "/api/databases/db/restore"],
  ["POST", "/api/daemon/restart"],
  ["PUT", "/api/link/vcs-token"],
  ["POST", "/ui/session"],
];

/** expectNoLeak fails on an answer that is not JSON or that shows a source path or a stack. */
function expectNoLeak(response: Response, text: string): void {
  expect(response.headers.get("content-type") ?? "").toStartWith("application/json");
  expect(text).not.toContain("/work/");
  expect(text).not.toMatch(/\.ts:\d+|at \w+ \(|<html/i);
}

/** rawRequest writes bytes to the engine's port as they are (fetch refuses to send a bad header) and reads the answer. */
function rawRequest(url: string, bytes: Buffer): Promise<{ status: number; head: string; body: string }> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, () => socket.write(bytes));
    let out = "";
    socket.setEncoding("latin1");
    socket.on("data", (chunk) => {
      out += chunk;
    });
    socket.on("error", reject);
    socket.on("close", () => {
      const split = out.indexOf("\r\n\r\n");
      resolve({ status: Number(out.split(" ")[1]), head: out.slice(0, split), body: out.slice(split + 4) });
    });
  });
}

/** headerRequest is a GET of /api/tokens with one extra header line, written byte for byte. */
const headerRequest = (line: string) =>
  Buffer.concat([
    Buffer.from("GET /api/tokens HTTP/1.1\r\nHost: x\r\n"),
    Buffer.from(line, "latin1"),
    Buffer.from("\r\nConnection: close\r\n\r\n"),
  ]);

let engine: TestEngine;
beforeAll(async () => {
  engine = await startTestEngine();
});
afterAll(async () => {
  await engine?.close();
});

describe("bodies are bounded before they are parsed", () => {
  test.each(BODY_ROUTES)("%s %s: 50,000 nested arrays are a 422 in shape, not a stack overflow", async (method, path) => {
    const response = await engine.call(method, path, { raw: DEEP });
    const text = await response.text();
    expect(response.status).toBe(422);
    expectNoLeak(response, text);
    expect(JSON.parse(text).detail[0]).toMatchObject({ loc: ["body"], type: "value_error", ctx: { max_depth: 32 } });
  });

  test("a route that takes no body ignores a hostile one", async () => {
    const response = await engine.call("POST", "/api/services/nothing-here/stop", { raw: DEEP });
    expect(response.status).toBe(404);
    expect((await response.json()).error.code).toBe("service_not_found");
  });

  test("a body nested exactly to the bound is parsed and judged by the schema", async () => {
    const body = `{"name":${"[".repeat(31)}${"]".repeat(31)}}`;
    const response = await engine.json<{ detail: { loc: unknown[]; type: string }[] }>("POST", "/api/tokens", { raw: body } as never);
    expect(response.status).toBe(422);
    expect(response.body.detail[0]).toMatchObject({ loc: ["body", "name"], type: "string_type" });
  });

  test("brackets inside strings do not count as nesting", async () => {
    const response = await engine.call("POST", "/api/tokens", { body: { name: "[".repeat(1000) } });
    expect(response.status).toBe(422);
    expect((await response.json()).detail[0]).toMatchObject({ loc: ["body", "name"], type: "string_too_long" });
  });

  test.each([
    ["with Content-Length", false],
    ["chunked, with no Content-Length", true],
  ])("a body over 1 MiB (%s) is a 413 in the error envelope", async (_name, chunked) => {
    const big = JSON.stringify({ name: "a".repeat(2 * 1024 * 1024) });
    const body = chunked
      ? new ReadableStream({
          start(controller) {
            controller.enqueue(new TextEncoder().encode(big));
            controller.close();
          },
        })
      : big;
    const response = await fetch(`${engine.url}/api/tokens`, {
      method: "POST",
      headers: { authorization: `Bearer ${engine.adminToken}`, "content-type": "application/json" },
      body,
    });
    const text = await response.text();
    expect(response.status).toBe(413);
    expectNoLeak(response, text);
    expect(JSON.parse(text).error).toMatchObject({ code: "body_too_large" });
  });

  test("a body that is not JSON on a JSON route is a 422, whatever its content type says", async () => {
    for (const type of ["text/plain", "application/x-www-form-urlencoded"]) {
      const response = await fetch(`${engine.url}/api/tokens`, {
        method: "POST",
        headers: { authorization: `Bearer ${engine.adminToken}`, "content-type": type },
        body: "name=ci",
      });
      expect(response.status).toBe(422);
      expect((await response.json()).detail).toEqual([expect.objectContaining({ loc: ["body"], type: "dict_type", input: null })]);
    }
  });

  test("the media type is matched without regard to case", async () => {
    const response = await fetch(`${engine.url}/api/tokens`, {
      method: "POST",
      headers: { authorization: `Bearer ${engine.adminToken}`, "content-type": "Application/JSON; charset=UTF-8" },
      body: JSON.stringify({ name: "case-blind" }),
    });
    expect(response.status).toBe(201);
  });

  test("the engine still answers at once after the hostile bodies", async () => {
    expect((await engine.call("GET", "/api/health")).status).toBe(200);
  });
});

describe("headers", () => {
  test.each([
    ["a DEL in a bearer token", "Authorization: Bearer \x7f"],
    ["a Latin-1 byte in a bearer token", "Authorization: Bearer \xe9"],
    ["a DEL in the session cookie", "Cookie: engine_session=\x7f\x7f"],
    ["a DEL in X-Request-Id", "X-Request-Id: \x7fabc"],
    ["a 12 KiB header", `X-Padding: ${"a".repeat(12 * 1024)}`],
  ])("%s reaches the engine and gets the error envelope", async (_name, line) => {
    const answer = await rawRequest(engine.url, headerRequest(line));
    expect(answer.status).toBe(401);
    expect(answer.head.toLowerCase()).toContain("content-type: application/json");
    expect(JSON.parse(answer.body).error.request_id).toBeString();
  });

  // Decision 146: Bun's HTTP parser refuses these before any JavaScript runs (neither `fetch`
  // nor the `error` handler is called), so no envelope can be sent. This pins what was measured
  // on Bun 1.4.5; if it starts failing, Bun lets the app answer and decision 146 needs revisiting.
  test.each([
    ["a control character in a value", "X-A: a\x01b", 400],
    ["a bare LF in a value", "X-A: a\nb", 400],
    ["a space in a name", "X A: b", 400],
    ["a header block over 16 KiB", `X-A: ${"a".repeat(17 * 1024)}`, 431],
    ["200 header lines", Array.from({ length: 200 }, (_, i) => `X-${i}: v`).join("\r\n"), 431],
  ])("%s: Bun answers %p itself, with no body", async (_name, line, status) => {
    const answer = await rawRequest(engine.url, headerRequest(line as string));
    expect(answer.status).toBe(status as number);
    expect(answer.body).toBe("");
  });
});

describe("every input is checked as sent, before anything is written", () => {
  test.each([
    ["env as a list of lists", { env: [["x"]] }, ["body", "env"], "dict_type"],
    ["env as a list", { env: ["x"] }, ["body", "env"], "dict_type"],
    ["env as an empty list", { env: [] }, ["body", "env"], "dict_type"],
    ["env with a key that is no variable name", { env: { "0": "x" } }, ["body", "env", 0], "extra_forbidden"],
    ["env with a value that is not a string", { env: { A: ["x"] } }, ["body", "env", "A"], "string_type"],
    ["secrets as a list", { secrets: ["x"] }, ["body", "secrets"], "dict_type"],
    ["restart as a string", { restart: "always" }, ["body", "restart"], "dict_type"],
    ["restart as an empty list", { restart: [] }, ["body", "restart"], "dict_type"],
    ["health as a list", { health: [] }, ["body", "health"], null],
    [
      "an env variable named __proto__ holding an object",
      JSON.parse('{"env":{"__proto__":{"A":"1"}}}'),
      ["body", "env", "__proto__"],
      "string_type",
    ],
  ])("deploy with %s: 422 and no service", async (_name, extra, loc, type) => {
    const name = `hostile-${Math.random().toString(36).slice(2, 8)}`;
    const response = await engine.json<{ detail: { loc: unknown[]; type: string }[] }>("POST", "/api/services", {
      body: { name, kind: "batch", command: ["true"], ...extra },
    });
    expect(response.status).toBe(422);
    expect(response.body.detail[0]?.loc).toEqual(loc);
    if (type) expect(response.body.detail[0]?.type).toBe(type);
    expect((await engine.call("GET", `/api/services/${name}`)).status).toBe(404);
    expect((await engine.call("GET", "/api/services")).status).toBe(200);
  });

  test.each([
    ["1e308", "less_than_equal"],
    ["9007199254740993", "less_than_equal"],
    ["0", "greater_than_equal"],
    ["1.5", "int_type"],
  ])("vcs-token installation_id %s is a 422 (%s), never a 500 or a rounded id", async (id, type) => {
    const raw = `{"installation_id":${id},"token":"ghs_secret","expires_at":"2030-01-01T00:00:00Z","issued_at":"2029-12-31T23:00:00Z","repos":[]}`;
    const response = await engine.json<{ detail: { loc: unknown[]; type: string }[] }>("PUT", "/api/link/vcs-token", { raw } as never);
    expect(response.status).toBe(422);
    expect(response.body.detail[0]).toMatchObject({ loc: ["body", "installation_id"], type });
  });
});

describe("422 answers", () => {
  test("echo a bounded input: a 1 MB string comes back as a few hundred characters and a count", async () => {
    const response = await engine.call("POST", "/api/tokens", { body: { name: "a".repeat(1_000_000) } });
    const text = await response.text();
    expect(response.status).toBe(422);
    expect(text.length).toBeLessThan(2000);
    const input = JSON.parse(text).detail[0].input as string;
    expect(input).toStartWith("a".repeat(256));
    expect(input).toContain("999744 more characters");
  });

  test("a list of 100,000 bad items is at most 50 entries", async () => {
    const response = await engine.json<{ detail: unknown[] }>("POST", "/api/tokens", {
      body: { name: "ok", scope_services: Array.from({ length: 100_000 }, () => 1) },
    });
    expect(response.status).toBe(422);
    expect(response.body.detail.length).toBeLessThanOrEqual(50);
  });

  test.each([
    ["PUT", "/api/link/vcs-token", { installation_id: 1, token: 12345, expires_at: "x", issued_at: "y", repos: [] }, "12345"],
    [
      "PUT",
      "/api/link/vcs-token",
      { installation_id: 1, token: "ghs_".padEnd(5000, "z"), expires_at: "x", issued_at: "y", repos: [] },
      "ghs_zzz",
    ],
    ["POST", "/api/services", { name: "s1", command: ["true"], secrets: { "bad-name": "hunter2-value" } }, "hunter2"],
    ["POST", "/api/services", { name: "s1", command: ["true"], secrets: { GOOD: 42424242 } }, "42424242"],
    ["POST", "/ui/session", { token: 987654321 }, "987654321"],
    ["POST", "/ui/session", { token: "eng_".padEnd(600, "q") }, "eng_qqq"],
  ])("%s %s never echoes the secret it was sent", async (method, path, body, secret) => {
    const response = await engine.call(method, path, { body });
    const text = await response.text();
    expect(response.status).toBe(422);
    expect(text).not.toContain(secret);
  });

  test("malformed JSON does not quote the body back", async () => {
    const response = await engine.call("PUT", "/api/link/vcs-token", { raw: '{"installation_id":1,"token":ghs_hunter2}' });
    const text = await response.text();
    expect(response.status).toBe(422);
    expect(text).not.toContain("hunter2");
    expect(JSON.parse(text).detail[0]).toMatchObject({ loc: ["body"], type: "json_invalid" });
  });
});

describe("listing survives a bad row", () => {
  test("a service stored with a malformed env by an older engine is left out, reported, and deletable", async () => {
    // The row is rewritten while no engine runs, as an older engine left it: the engine that
    // starts on the data dir meets it (a running engine is its store's only writer, and caches
    // what it read).
    const dataDir = tempDir();
    const older = await startTestEngine({ dataDir });
    const good = await older.json<{ name: string }>("POST", "/api/services", {
      body: { name: "listed-ok", kind: "batch", command: ["true"] },
    });
    expect(good.status).toBe(201);
    const bad = await older.json<{ id: string }>("POST", "/api/services", {
      body: { name: "listed-bad", kind: "batch", command: ["true"] },
    });
    expect(bad.status).toBe(201);
    await older.daemon.stop();
    // What the old engine stored for `"env":[["x"]]`: the normalized {"0":["x"]}, written straight into the row.
    const db = new Database(join(dataDir, "engine.db"));
    try {
      const rows = db.query("SELECT service_id, version, spec FROM service_versions WHERE service_id = ?").all(bad.body.id) as {
        service_id: string;
        version: number;
        spec: string;
      }[];
      expect(rows.length).toBeGreaterThan(0);
      for (const row of rows) {
        const spec = JSON.parse(row.spec);
        spec.env = { "0": ["x"] };
        db.query("UPDATE service_versions SET spec = ? WHERE service_id = ? AND version = ?").run(
          JSON.stringify(spec),
          row.service_id,
          row.version,
        );
      }
    } finally {
      db.close();
    }
    const current = await startTestEngine({ dataDir });
    try {
      const list = await current.call("GET", "/api/services");
      expect(list.status).toBe(200);
      expect(list.headers.get("x-engine-unlisted")).toBe("1");
      const names = ((await list.json()) as { name: string }[]).map((s) => s.name);
      expect(names).toContain("listed-ok");
      expect(names).not.toContain("listed-bad");
      expect((await current.call("DELETE", "/api/services/listed-bad")).status).toBe(200);
      const after = await current.call("GET", "/api/services");
      expect(after.status).toBe(200);
      expect(after.headers.get("x-engine-unlisted")).toBeNull();
    } finally {
      await current.close();
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
});

describe("a module's 422 (invalid_domain) has the contract's detail shape", () => {
  let proxied: TestEngine;
  beforeAll(async () => {
    proxied = await startTestEngine({ proxy: true, httpsPort: 0, httpPort: 0, proxyProcesses: 1, mdns: "off" });
  });
  afterAll(async () => {
    await proxied?.close();
  });

  test.each(["not a domain!", "-bad-.example.com", "a..b.example.com"])(
    "an invalid domain %p is a 422 with detail, not {error}",
    async (domain) => {
      const deployed = await proxied.call("POST", "/api/services", {
        body: { name: "web", kind: "service", command: ["sleep", "60"], port: 18080 },
      });
      expect([201]).toContain(deployed.status);
      const response = await proxied.json<{ detail: { loc: unknown[]; type: string; ctx: Record<string, unknown> }[] }>(
        "POST",
        "/api/services/web/domains",
        { body: { domain } },
      );
      expect(response.status).toBe(422);
      expect(Object.keys(response.body)).toEqual(["detail"]);
      expect(response.body.detail[0]).toMatchObject({ loc: ["body"], type: "value_error", ctx: { code: "invalid_domain" } });
    },
  );
});
