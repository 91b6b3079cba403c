import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { eventually, startTestEngine, type TestEngine } from "../../helpers";

let engine: TestEngine;
beforeAll(async () => {
  // A directory whose lookup breaks the way a bug would: a plain Error with a stack.
  engine = await startTestEngine(
    {},
    {
      decorateServices: (services) =>
        Object.assign(Object.create(services), {
          serviceName: (ident: string) => ident,
          diagnose: () => {
            throw new Error("database handle was closed (internal detail)");
          },
        }),
    },
  );
});
afterAll(() => engine.close());

describe("unexpected errors", () => {
  test("answer 500 with the envelope and a request id, no stack or internal detail, logged once", async () => {
    const response = await engine.call("GET", "/api/services/web/diagnose");
    expect(response.status).toBe(500);
    const body = (await response.json()) as { error: { code: string; message: string; request_id: string } };
    expect(body.error.code).toBe("internal");
    expect(body.error.message).not.toContain("database handle");
    expect(JSON.stringify(body)).not.toContain("    at ");
    const requestId = body.error.request_id;
    expect(response.headers.get("x-request-id")).toBe(requestId);
    const log = await eventually(() => {
      const text = readFileSync(join(engine.dataDir, "engine.log"), "utf8");
      return text.includes(requestId) ? text : "";
    });
    const lines = log.split("\n").filter((line) => line.includes(requestId));
    expect(lines.length).toBe(1);
    expect(lines[0]).toContain("database handle was closed");
  });
});
