import { expect, test } from "bun:test";
import { cookieValue, jsonDepthExceeds, lastResortResponse, readBoundedText } from "../../src/lib/http";
import type { Logger } from "../../src/lib/logger";

test.each([
  ["a=1; engine_session=ecs_x; b=2", "ecs_x"],
  ["engine_session=ecs%5Fy", "ecs_y"],
  ["  engine_session =  spaced  ", "spaced"],
  ["other=1", null],
  ["engine_sessionx=1", null],
  ["engine_session=%E0%A4%A", null],
  ["", null],
])("cookieValue(%p) is %p", (header, value) => {
  expect(cookieValue(header, "engine_session")).toBe(value);
});

test.each([
  ["{}", 1, false],
  ["[[]]", 1, true],
  ["[[]]", 2, false],
  ['{"a":"[[[[[[["}', 1, false],
  ['{"a":"\\"[[[["}', 1, false],
  ['{"a":[{"b":[1]}]}', 3, true],
  ['{"a":[{"b":[1]}]}', 4, false],
  [`${"[".repeat(100_000)}${"]".repeat(100_000)}`, 32, true],
])("jsonDepthExceeds(%p, %p) is %p", (text, depth, exceeds) => {
  expect(jsonDepthExceeds(text, depth)).toBe(exceeds);
});

test.each([
  ["under the bound", "x".repeat(10), 16, "x".repeat(10)],
  ["at the bound", "x".repeat(16), 16, "x".repeat(16)],
  ["over the bound", "x".repeat(17), 16, null],
])("readBoundedText %s", async (_name, body, max, expected) => {
  const stream = new ReadableStream({
    start(controller) {
      controller.enqueue(new TextEncoder().encode(body));
      controller.close();
    },
  });
  expect(await readBoundedText(new Request("http://x/", { method: "POST", body: stream }), max)).toBe(expected);
  expect(await readBoundedText(new Request("http://x/", { method: "POST", body }), max)).toBe(expected);
});

test.each([
  ["under the bound", "x".repeat(10), "10", 16, "x".repeat(10)],
  ["at the bound, in UTF-8 bytes", "é".repeat(8), "16", 16, "é".repeat(8)],
  ["declared over the bound", "x".repeat(17), "17", 16, null],
  // A Request made in this process has no framing: what it holds is measured, whatever it declares.
  ["declared under the bound, holding more", "x".repeat(17), "3", 16, null],
  ["not a number: read as a stream", "x".repeat(10), "ten", 16, "x".repeat(10)],
])("readBoundedText with a Content-Length: %s", async (_name, body, length, max, expected) => {
  const request = new Request("http://x/", { method: "POST", body, headers: { "content-length": length } });
  expect(await readBoundedText(request, max)).toBe(expected);
});

test("lastResortResponse is the 500 envelope: JSON, a request id, no message or stack of the error", async () => {
  const logged: unknown[] = [];
  const log = { error: (fields: unknown) => logged.push(fields) } as unknown as Logger;
  const response = lastResortResponse(log, new Error("at /work/secret/path.ts:12"));
  expect(response.status).toBe(500);
  expect(response.headers.get("content-type")).toBe("application/json");
  const text = await response.text();
  expect(text).not.toContain("/work/");
  const body = JSON.parse(text);
  expect(body.error.code).toBe("internal");
  expect(body.error.request_id).toBe(response.headers.get("x-request-id"));
  expect(logged).toHaveLength(1);
});
