import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { type Baseline, type Check, compareWithBaseline, expectServerScenarios, startTokenProxy } from "../../conformance";
import { startTestEngine, type TestEngine, tempDir } from "../../helpers";

/**
 * The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned in
 * package.json) run against the engine's `/mcp`, every server scenario it has, each check
 * compared with conformance-baseline.json. The suite's CLI needs Node ≥ 22 (it imports
 * `fs.globSync`), so it runs under the Bun that runs this test. It speaks 2025-11-25 (its
 * client is the 1.x SDK) and takes a URL but no header, so it talks to a loopback proxy
 * that adds the engine token and forwards the request as it came (Host and Origin too: the
 * DNS-rebinding scenario sets them). The running and the comparison are test/conformance.ts,
 * shared with the console's conformance tests. Decisions 268–272.
 */

describe("compareWithBaseline", () => {
  const baseline: Baseline = {
    suite: "test",
    scenarios: {
      ping: { applicable: true, checks: { ping: "SUCCESS" } },
      "prompts-list": { applicable: false, checks: { "prompts-list": { status: "FAILURE", error: "Method not found" } } },
      polling: { applicable: true, checks: { priming: "WARNING" } },
    },
  };
  /** run is the recorded run with some scenarios' checks replaced (null: the scenario did not run). */
  const run = (overrides: Record<string, Check[] | null>) => {
    const recorded: Record<string, Check[] | null> = {
      ping: [{ id: "ping", status: "SUCCESS" }],
      "prompts-list": [{ id: "prompts-list", status: "FAILURE", errorMessage: "Failed: MCP error -32601: Method not found" }],
      polling: [
        { id: "log", status: "INFO" },
        { id: "priming", status: "WARNING" },
      ],
      ...overrides,
    };
    return new Map(Object.entries(recorded).filter((entry): entry is [string, Check[]] => entry[1] !== null));
  };
  test.each([
    ["the run as recorded", {}, []],
    ["a success that now fails", { ping: [{ id: "ping", status: "FAILURE", errorMessage: "timeout" }] }, ["worse ping/ping"]],
    ["a warning that now fails", { polling: [{ id: "priming", status: "FAILURE" }] }, ["worse polling/priming"]],
    ["a warning that now succeeds", { polling: [{ id: "priming", status: "SUCCESS" }] }, ["better polling/priming"]],
    [
      "a not-applicable failure for another reason",
      { "prompts-list": [{ id: "prompts-list", status: "FAILURE", errorMessage: "fetch failed" }] },
      ["worse prompts-list/prompts-list"],
    ],
    [
      "a not-applicable check that now passes",
      { "prompts-list": [{ id: "prompts-list", status: "SUCCESS" }] },
      ["better prompts-list/prompts-list"],
    ],
    ["a recorded check missing", { polling: [{ id: "log", status: "INFO" }] }, ["worse polling/priming"]],
    ["a scenario that did not run", { ping: null }, ["worse ping/*"]],
    [
      "a new check that fails, and one repeated",
      {
        ping: [
          { id: "ping", status: "SUCCESS" },
          { id: "ping", status: "FAILURE" },
          { id: "pong", status: "SUCCESS" },
        ],
      },
      ["worse ping/ping#2", "better ping/pong"],
    ],
    ["a new scenario", { fresh: [{ id: "fresh", status: "FAILURE" }] }, ["worse fresh/fresh"]],
  ] as [string, Record<string, Check[] | null>, string[]][])("%s", (_name, overrides, expected) => {
    const found = compareWithBaseline(baseline, run(overrides)).map((d) => `${d.kind} ${d.scenario}/${d.check}`);
    expect(found.sort()).toEqual(expected.sort());
  });
});

let engine: TestEngine;
let proxy: ReturnType<typeof Bun.serve>;
let outputDir: string;

beforeAll(async () => {
  engine = await startTestEngine();
  proxy = startTokenProxy(engine.url, engine.adminToken);
  outputDir = tempDir("engine-mcp-conformance-");
});

afterAll(async () => {
  proxy?.stop(true);
  await engine?.close();
  if (outputDir) rmSync(outputDir, { recursive: true, force: true });
});

describe("the MCP conformance suite against /mcp", () => {
  test("/mcp wants the token the proxy adds", async () => {
    const direct = await fetch(`${engine.url}/mcp`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    expect(direct.status).toBe(401);
    await direct.body?.cancel();
  });

  test("every server scenario answers what the baseline records", async () => {
    await expectServerScenarios(`http://127.0.0.1:${proxy.port}/mcp`, "test/engine/mcp/conformance-baseline.json", outputDir);
  }, 150_000);
});
