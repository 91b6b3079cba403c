import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { REPO_ROOT, startTestEngine, type TestEngine, tempDir } from "../../helpers";

/**
 * The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned in
 * package.json) run against the engine's `/mcp`, every server scenario it has, each check
 * compared with conformance-baseline.json. The suite's CLI needs Node ≥ 22 (it imports
 * `fs.globSync`), so it runs under the Bun that runs this test. It speaks 2025-11-25 (its
 * client is the 1.x SDK) and takes a URL but no header, so it talks to a loopback proxy
 * that adds the engine token and forwards the request as it came (Host and Origin too: the
 * DNS-rebinding scenario sets them). Decisions 268–272.
 */

const CLI = join(REPO_ROOT, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js");
const BASELINE_FILE = join(import.meta.dir, "conformance-baseline.json");
/** SUITE_DEADLINE_MS bounds the suite's run (about 2 s here; its slowest scenario waits 10 s on a stream). */
const SUITE_DEADLINE_MS = 120_000;

type Status = "SUCCESS" | "WARNING" | "FAILURE" | "SKIPPED" | "INFO";

/** A check as the suite writes it to `<scenario dir>/checks.json`. */
interface Check {
  id: string;
  status: Status;
  errorMessage?: string;
}

/** Expected is a check's recorded outcome: its status, and for one that fails, text its error must contain. */
type Expected = Status | { status: Status; error?: string };

interface ScenarioBaseline {
  applicable: boolean;
  why?: string;
  checks: Record<string, Expected>;
}

interface Baseline {
  suite: string;
  scenarios: Record<string, ScenarioBaseline>;
}

/** Difference is one way a run departs from the baseline: `worse` fails the test, `better` is reported. */
interface Difference {
  kind: "worse" | "better";
  scenario: string;
  check: string;
  message: string;
}

/**
 * keyedChecks names a scenario's scored checks (INFO entries are its log) by id; an id the
 * scenario reports again is `id#2`, `id#3`, … so each occurrence is compared on its own.
 */
function keyedChecks(checks: Check[]): Map<string, Check> {
  const keyed = new Map<string, Check>();
  const seen = new Map<string, number>();
  for (const check of checks) {
    if (check.status === "INFO") continue;
    const count = (seen.get(check.id) ?? 0) + 1;
    seen.set(check.id, count);
    keyed.set(count === 1 ? check.id : `${check.id}#${count}`, check);
  }
  return keyed;
}

/**
 * compareWithBaseline answers how a run differs from the baseline. Worse: a check that does
 * not answer its recorded status (unless it now succeeds), a recorded failure that fails for
 * another reason (the engine's answer changed), a recorded check the run lacks (the scenario
 * stopped early), a check or scenario the baseline does not know that does not succeed.
 * Better: a check that now succeeds where the baseline records less, or one not recorded
 * that succeeds. A baseline scenario the run lacks is worse.
 */
function compareWithBaseline(baseline: Baseline, run: Map<string, Check[]>): Difference[] {
  const differences: Difference[] = [];
  for (const [scenario, recorded] of Object.entries(baseline.scenarios)) {
    const checks = run.get(scenario);
    if (!checks) {
      differences.push({ kind: "worse", scenario, check: "*", message: "the scenario did not run" });
      continue;
    }
    const actual = keyedChecks(checks);
    for (const [key, expectedEntry] of Object.entries(recorded.checks)) {
      const expected = typeof expectedEntry === "string" ? { status: expectedEntry } : expectedEntry;
      const check = actual.get(key);
      if (!check) {
        differences.push({ kind: "worse", scenario, check: key, message: `expected ${expected.status}, but the check was not reported` });
        continue;
      }
      const said = check.errorMessage ? `: ${check.errorMessage}` : "";
      if (check.status !== expected.status) {
        const kind = check.status === "SUCCESS" ? "better" : "worse";
        differences.push({ kind, scenario, check: key, message: `expected ${expected.status}, got ${check.status}${said}` });
      } else if (expected.error !== undefined && !(check.errorMessage ?? "").includes(expected.error)) {
        differences.push({
          kind: "worse",
          scenario,
          check: key,
          message: `${check.status} as recorded, but for another reason: expected "${expected.error}"${said || " (no message)"}`,
        });
      }
    }
    for (const [key, check] of actual) {
      if (key in recorded.checks) continue;
      const said = check.errorMessage ? `: ${check.errorMessage}` : "";
      const kind = check.status === "SUCCESS" ? "better" : "worse";
      differences.push({ kind, scenario, check: key, message: `not in the baseline, ${check.status}${said}` });
    }
  }
  for (const [scenario, checks] of run) {
    if (scenario in baseline.scenarios) continue;
    for (const [key, check] of keyedChecks(checks)) {
      const kind = check.status === "SUCCESS" ? "better" : "worse";
      differences.push({ kind, scenario, check: key, message: `a scenario the baseline does not know, ${check.status}` });
    }
  }
  return differences;
}

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

/**
 * startTokenProxy serves loopback on a port of its own and forwards every request to the
 * engine as it came (method, path, query, headers, body), with `Authorization: Bearer
 * <token>` added: the suite's client has no way to send a header. Answers stream back
 * unbuffered (SSE), and a client that goes away ends the upstream request.
 */
function startTokenProxy(target: string, token: string): ReturnType<typeof Bun.serve> {
  return Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    idleTimeout: 0,
    async fetch(request) {
      const url = new URL(request.url);
      const headers = new Headers(request.headers);
      headers.set("authorization", `Bearer ${token}`);
      const hasBody = request.method !== "GET" && request.method !== "HEAD";
      const upstream = await fetch(`${target}${url.pathname}${url.search}`, {
        method: request.method,
        headers,
        body: hasBody ? await request.arrayBuffer() : undefined,
        redirect: "manual",
        signal: request.signal,
      });
      const answer = new Headers(upstream.headers);
      // fetch has decoded the body, so its original encoding and length no longer describe it.
      answer.delete("content-encoding");
      answer.delete("content-length");
      return new Response(upstream.body, { status: upstream.status, headers: answer });
    },
  });
}

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

/** readResults reads the checks of each scenario the suite wrote: `<dir>/server-<scenario>-<timestamp>/checks.json`. */
function readResults(dir: string): Map<string, Check[]> {
  const results = new Map<string, Check[]>();
  for (const entry of readdirSync(dir)) {
    const scenario = /^server-(.+)-\d{4}-\d\d-\d\dT[\d-]+Z$/.exec(entry)?.[1];
    if (!scenario) throw new Error(`the suite wrote ${entry}, which names no scenario`);
    results.set(scenario, JSON.parse(readFileSync(join(dir, entry, "checks.json"), "utf8")));
  }
  return results;
}

describe("the MCP conformance suite against /mcp", () => {
  test("/mcp wants the token the proxy adds", async () => {
    const direct = await fetch(`${engine.url}/mcp`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    expect(direct.status).toBe(401);
    await direct.body?.cancel();
  });

  test("every server scenario answers what the baseline records", async () => {
    const baseline = JSON.parse(readFileSync(BASELINE_FILE, "utf8")) as Baseline;
    expect(baseline.suite).toBe(
      `@modelcontextprotocol/conformance ${JSON.parse(readFileSync(join(CLI, "..", "..", "package.json"), "utf8")).version}`,
    );
    const suite = Bun.spawn(
      [process.execPath, CLI, "server", "--url", `http://127.0.0.1:${proxy.port}/mcp`, "--suite", "all", "--output-dir", outputDir],
      { cwd: outputDir, stdout: "pipe", stderr: "pipe", timeout: SUITE_DEADLINE_MS, env: { ...process.env, NO_COLOR: "1" } },
    );
    const [stdout, stderr, exitCode] = await Promise.all([
      new Response(suite.stdout).text(),
      new Response(suite.stderr).text(),
      suite.exited,
    ]);
    // The suite exits 1 when any check fails, and the not-applicable ones do: its summary says it finished.
    if (!stdout.includes("=== SUMMARY ===")) {
      throw new Error(
        `the suite did not finish (exit ${exitCode}, signal ${suite.signalCode}):\n${stdout.slice(-3000)}\n${stderr.slice(-3000)}`,
      );
    }
    const run = readResults(outputDir);

    const order = Object.keys(baseline.scenarios);
    const rank = (scenario: string) => (order.includes(scenario) ? order.indexOf(scenario) : order.length);
    const lines = [...run]
      .sort((a, b) => rank(a[0]) - rank(b[0]))
      .map(([scenario, checks]) => {
        const scored = [...keyedChecks(checks).values()];
        const count = (status: Status) => scored.filter((check) => check.status === status).length;
        const applicable = baseline.scenarios[scenario]?.applicable === false ? "n/a" : "";
        return `${scenario.padEnd(32)} ${count("SUCCESS")} passed, ${count("FAILURE")} failed, ${count("WARNING")} warnings ${applicable}`;
      });
    console.log(`${baseline.suite}, ${run.size} server scenarios:\n${lines.join("\n")}`);

    const differences = compareWithBaseline(baseline, run);
    const better = differences.filter((d) => d.kind === "better");
    if (better.length > 0) {
      console.warn(
        `Better than the baseline: tighten test/engine/mcp/conformance-baseline.json\n${better.map((d) => `  ${d.scenario} / ${d.check}: ${d.message}`).join("\n")}`,
      );
    }
    const worse = differences.filter((d) => d.kind === "worse").map((d) => `${d.scenario} / ${d.check}: ${d.message}`);
    expect(worse).toEqual([]);
  }, 150_000);
});
