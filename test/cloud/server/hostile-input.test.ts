import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startTestCloud, type TestCloud } from "../helpers";

/** DEEP nests 20,000 arrays (50,000 overflowed the 422 serializer's stack; this one fits under the size bound). */
const DEEP = `{"code":${"[".repeat(20_000)}${"]".repeat(20_000)}}`;

/** Every console route that takes a body: the contract lists 422 for each, and no 400/413/415 for most. */
const BODY_ROUTES = [
  "/api/link/claim",
  "/api/link/device",
  "/api/link/device/poll",
  "/api/link/codes",
  "/api/link/preauth",
  "/api/preauth-keys",
  "/api/nodes/device-approvals/lookup",
  "/api/nodes/device-approvals/approve",
  "/api/nodes/device-approvals/deny",
];

let cloud: TestCloud;
let token: string;
/** send posts a raw body with a session (every request from loopback: the tests stay inside each route's burst). */
async function send(path: string, body: string | ReadableStream, type = "application/json", to: TestCloud = cloud) {
  const response = await fetch(`${to.url}${path}`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": type },
    body,
  });
  const text = await response.text();
  return { response, text, status: response.status };
}

function expectValidationShape(text: string): void {
  const body = JSON.parse(text);
  expect(Object.keys(body)).toEqual(["detail"]);
  for (const entry of body.detail) expect(Object.keys(entry).sort()).toEqual(["ctx", "input", "loc", "msg", "type"]);
}

beforeAll(async () => {
  cloud = await startTestCloud("sqlite");
  ({ token } = await cloud.signIn("hostile@example.com"));
});
afterAll(async () => {
  await cloud?.close();
});

describe("console bodies are bounded before they are parsed", () => {
  test.each(BODY_ROUTES)("%s: 50,000 nested arrays are a 422 HTTPValidationError, JSON, no source path", async (path) => {
    const { response, text, status } = await send(path, DEEP);
    expect(status).toBe(422);
    expect(response.headers.get("content-type") ?? "").toStartWith("application/json");
    expect(text).not.toContain("/work/");
    expect(text).not.toMatch(/\.ts:\d+|<html/i);
    expectValidationShape(text);
    expect(JSON.parse(text).detail[0]).toMatchObject({ loc: ["body"], type: "value_error", ctx: { max_depth: 32 } });
  });

  test("a body over 64 KiB is a 422 too (the routes list no 413), read no further than the bound", async () => {
    const big = JSON.stringify({ hostname: "h".repeat(200_000) });
    const stream = new ReadableStream({
      start(controller) {
        controller.enqueue(new TextEncoder().encode(big));
        controller.close();
      },
    });
    for (const body of [big, stream]) {
      const { text, status } = await send("/api/link/device", body);
      expect(status).toBe(422);
      expectValidationShape(text);
      expect(JSON.parse(text).detail[0]).toMatchObject({ loc: ["body"], type: "value_error", ctx: { max_bytes: 65536 } });
    }
  });

  test("a refused body still charges the route's limit first: the device route's 11th from one source is 429", async () => {
    // A console of its own: this test spends the whole per-source bucket.
    const fresh = await startTestCloud("sqlite");
    try {
      const statuses: number[] = [];
      for (let i = 0; i < 11; i++) statuses.push((await send("/api/link/device", DEEP, "application/json", fresh)).status);
      expect(statuses.slice(0, 10)).toEqual(Array(10).fill(422));
      expect(statuses[10]).toBe(429);
      // A readable body from the same source is refused by the same bucket.
      const readable = await send("/api/link/device", JSON.stringify({ hostname: "box" }), "application/json", fresh);
      expect(readable.status).toBe(429);
      expect(JSON.parse(readable.text).error.code).toBe("rate_limited");
    } finally {
      await fresh.close();
    }
  });

  test("a route that takes no body ignores a hostile one and answers from its own list", async () => {
    // Another account's sessions: this file's own session must outlive the logouts.
    const post = async (path: string, body: string) => {
      const { token: other } = await cloud.signIn("other@example.com");
      const headers = { authorization: `Bearer ${other}`, "content-type": "application/json" };
      return (await fetch(`${cloud.url}${path}`, { method: "POST", headers, body })).status;
    };
    expect(await post("/api/auth/logout", DEEP)).toBe(204);
    expect(await post("/api/auth/logout", "")).toBe(204);
    expect(await post("/api/auth/logout-all", DEEP)).toBe(200);
  });

  test("a form post to a JSON route is a 422, not a parsed object", async () => {
    const { text, status } = await send("/api/link/device", "hostname=box", "application/x-www-form-urlencoded");
    expect(status).toBe(422);
    expect(JSON.parse(text).detail[0]).toMatchObject({ loc: ["body"], type: "dict_type" });
  });
});

describe("console 422 answers never echo a secret", () => {
  test.each([
    ["/api/link/claim", { code: `NL-${"S".repeat(200)}`, hostname: "box" }, "SSSSSSSS"],
    ["/api/link/claim", { code: 73737373, hostname: "box" }, "73737373"],
    ["/api/link/device/poll", { device_code: `dev_${"D".repeat(300)}` }, "DDDDDDDD"],
    ["/api/link/device/poll", { device_code: 64646464 }, "64646464"],
    ["/api/link/preauth", { key: `pak_${"K".repeat(300)}`, hostname: "box" }, "KKKKKKKK"],
    ["/api/nodes/device-approvals/lookup", { user_code: "U".repeat(40) }, "UUUUUUUU"],
    ["/api/nodes/device-approvals/approve", { user_code: 52525252 }, "52525252"],
  ])("%s", async (path, body, secret) => {
    const { text, status } = await send(path, JSON.stringify(body));
    expect(status).toBe(422);
    expectValidationShape(text);
    expect(text).not.toContain(secret);
  });
});
