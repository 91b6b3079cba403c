import { expect } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { REPO_ROOT } from "./helpers";

/**
 * The official MCP conformance suite (`@modelcontextprotocol/conformance`), as the tests run it:
 * its CLI under the Bun that runs the test (it needs Node ≥ 22), each check it writes compared
 * with a committed per-check baseline, and a loopback proxy that adds a bearer token (its
 * `--url` takes no header). Shared by the engine's /mcp, the console's /mcp and the console's
 * authorization server tests. Decisions 268–272 and 280 onwards.
 */

/** CONFORMANCE_CLI is the pinned release (0.1.x): its `server` scenarios speak 2025-11-25. */
export const CONFORMANCE_CLI = join(REPO_ROOT, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js");
/**
 * CONFORMANCE_ALPHA_CLI is the 0.2.0 alpha, pinned under an npm alias beside the release: the
 * first version with an `authorization` command (scenarios that test an authorization server;
 * 0.1.x's `auth/*` scenarios test an OAuth client). Decision 283.
 */
export const CONFORMANCE_ALPHA_CLI = join(REPO_ROOT, "node_modules", "mcp-conformance-alpha", "dist", "index.js");

/** SUITE_DEADLINE_MS bounds one run of the suite's CLI (a server run takes about 2 s; its slowest scenario waits 10 s on a stream). */
export const SUITE_DEADLINE_MS = 120_000;

export type Status = "SUCCESS" | "WARNING" | "FAILURE" | "SKIPPED" | "INFO";

/** Check is a check as the suite writes it to `<scenario dir>/checks.json`. */
export interface Check {
  id: string;
  status: Status;
  errorMessage?: string;
}

/** Expected is a check's recorded outcome: its status, and for one that fails, text its error must contain. */
export type Expected = Status | { status: Status; error?: string };

export interface ScenarioBaseline {
  applicable: boolean;
  why?: string;
  checks: Record<string, Expected>;
}

export interface Baseline {
  suite: string;
  scenarios: Record<string, ScenarioBaseline>;
}

/** Difference is one way a run departs from the baseline: `worse` fails the test, `better` is reported. */
export interface Difference {
  kind: "worse" | "better";
  scenario: string;
  check: string;
  message: string;
}

/**
 * keyedChecks names a scenario's scored checks (INFO entries are its log) by id; an id the
 * scenario reports again is `id#2`, `id#3`, … so each occurrence is compared on its own.
 */
export function keyedChecks(checks: Check[]): Map<string, Check> {
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
 * another reason (the server's answer changed), a recorded check the run lacks (the scenario
 * stopped early), a check or scenario the baseline does not know that does not succeed.
 * Better: a check that now succeeds where the baseline records less, or one not recorded
 * that succeeds. A baseline scenario the run lacks is worse.
 */
export function compareWithBaseline(baseline: Baseline, run: Map<string, Check[]>): Difference[] {
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

/** suiteName is how a baseline names the suite a CLI belongs to: its package name and version. */
export function suiteName(cli: string): string {
  const pkg = JSON.parse(readFileSync(join(cli, "..", "..", "package.json"), "utf8")) as { name: string; version: string };
  return `${pkg.name} ${pkg.version}`;
}

/**
 * readResults reads the checks of each scenario a run wrote: `<dir>/<kind>-<scenario>-<timestamp>/checks.json`,
 * where kind is `server` (the `server` command) or `authorization-server` (the `authorization` command).
 */
export function readResults(dir: string, kind: "server" | "authorization-server"): Map<string, Check[]> {
  const results = new Map<string, Check[]>();
  const pattern = new RegExp(`^${kind}-(.+)-\\d{4}-\\d\\d-\\d\\dT[\\d-]+Z$`);
  for (const entry of readdirSync(dir)) {
    const scenario = pattern.exec(entry)?.[1];
    if (!scenario) throw new Error(`the suite wrote ${entry}, which names no ${kind} scenario`);
    results.set(scenario, JSON.parse(readFileSync(join(dir, entry, "checks.json"), "utf8")));
  }
  return results;
}

/** SuiteRun is what one run of the CLI printed and how it ended. */
export interface SuiteRun {
  stdout: string;
  stderr: string;
  exitCode: number | null;
}

/**
 * runSuite runs the suite's CLI with `args` under this Bun, in `cwd`, killed after
 * SUITE_DEADLINE_MS. `onLine` sees each line of its stdout as it comes (the authorization
 * scenario prints the URL a person would open). The suite exits 1 when any check fails (the
 * not-applicable ones do), so a run counts as finished when its summary was printed.
 */
export async function runSuite(cli: string, args: string[], cwd: string, onLine?: (line: string) => void): Promise<SuiteRun> {
  const suite = Bun.spawn([process.execPath, cli, ...args], {
    cwd,
    stdout: "pipe",
    stderr: "pipe",
    timeout: SUITE_DEADLINE_MS,
    env: { ...process.env, NO_COLOR: "1" },
  });
  const readStdout = async () => {
    let text = "";
    let pending = "";
    const decoder = new TextDecoder();
    const reader = suite.stdout.getReader();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      const piece = decoder.decode(value, { stream: true });
      text += piece;
      pending += piece;
      let newline = pending.indexOf("\n");
      while (newline >= 0) {
        onLine?.(pending.slice(0, newline));
        pending = pending.slice(newline + 1);
        newline = pending.indexOf("\n");
      }
    }
    return text;
  };
  const [stdout, stderr, exitCode] = await Promise.all([readStdout(), new Response(suite.stderr).text(), suite.exited]);
  if (!stdout.includes("=== SUMMARY ===")) {
    throw new Error(
      `the suite did not finish (exit ${exitCode}, signal ${suite.signalCode}):\n${stdout.slice(-3000)}\n${stderr.slice(-3000)}`,
    );
  }
  return { stdout, stderr, exitCode };
}

/**
 * judgeRun prints one line per scenario of a run (passed, failed, warnings; `n/a` where the
 * baseline says it does not apply), warns about each check that does better than
 * `baselineFile` records, and answers the ways it does worse (the test expects none).
 */
export function judgeRun(baseline: Baseline, baselineFile: string, run: Map<string, Check[]>): string[] {
  const order = Object.keys(baseline.scenarios);
  const rank = (scenario: string) => (order.includes(scenario) ? order.indexOf(scenario) : order.length);
  const lines = [...run]
    .sort((a, b) => rank(a[0]) - rank(b[0]))
    .map(([scenario, checks]) => {
      const scored = [...keyedChecks(checks).values()];
      const count = (status: Status) => scored.filter((check) => check.status === status).length;
      const applicable = baseline.scenarios[scenario]?.applicable === false ? "n/a" : "";
      return `${scenario.padEnd(40)} ${count("SUCCESS")} passed, ${count("FAILURE")} failed, ${count("WARNING")} warnings ${applicable}`;
    });
  console.log(`${baseline.suite}, ${run.size} scenarios:\n${lines.join("\n")}`);
  const differences = compareWithBaseline(baseline, run);
  const better = differences.filter((d) => d.kind === "better");
  if (better.length > 0) {
    console.warn(
      `Better than the baseline: tighten ${baselineFile}\n${better.map((d) => `  ${d.scenario} / ${d.check}: ${d.message}`).join("\n")}`,
    );
  }
  return differences.filter((d) => d.kind === "worse").map((d) => `${d.scenario} / ${d.check}: ${d.message}`);
}

/**
 * expectServerScenarios runs every `server` scenario of the pinned release against `url` (its
 * output in `outputDir`) and expects the run to do no worse than the baseline at `baselineFile`
 * (a path from the repository root), which must be that release's.
 */
export async function expectServerScenarios(url: string, baselineFile: string, outputDir: string): Promise<void> {
  const baseline = JSON.parse(readFileSync(join(REPO_ROOT, baselineFile), "utf8")) as Baseline;
  expect(baseline.suite).toBe(suiteName(CONFORMANCE_CLI));
  await runSuite(CONFORMANCE_CLI, ["server", "--url", url, "--suite", "all", "--output-dir", outputDir], outputDir);
  expect(judgeRun(baseline, baselineFile, readResults(outputDir, "server"))).toEqual([]);
}

/**
 * startTokenProxy serves loopback on a port of its own and forwards every request to
 * `target()` as it came (method, path, query, headers, body), with `Authorization: Bearer
 * <token()>` added: the suite's client has no way to send a header. Answers stream back
 * unbuffered (SSE), and a client that goes away ends the upstream request. Target and token are
 * read at each request, so a test can start the proxy first (the console's public URL is the
 * proxy's) and fill them in later.
 */
export function startTokenProxy(target: string | (() => string), token: string | (() => string)): ReturnType<typeof Bun.serve> {
  const targetOf = typeof target === "string" ? () => target : target;
  const tokenOf = typeof token === "string" ? () => token : token;
  return Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    idleTimeout: 0,
    async fetch(request) {
      const url = new URL(request.url);
      const headers = new Headers(request.headers);
      headers.set("authorization", `Bearer ${tokenOf()}`);
      const hasBody = request.method !== "GET" && request.method !== "HEAD";
      const upstream = await fetch(`${targetOf()}${url.pathname}${url.search}`, {
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
