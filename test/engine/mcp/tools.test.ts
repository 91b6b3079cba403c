import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { Diagnosis, LogLine } from "../../../src/contract/engine";
import { ACCESS_ROLES, ROUTE_ACCESS } from "../../../src/engine/auth";
import {
  accessOf,
  causeOf,
  checkToolTable,
  FilterError,
  filtersFromQuery,
  NO_FILTERS,
  parseLogTime,
  parseSince,
  parseToolsets,
  selectTools,
  shapeLogs,
  TOOLS,
  TRUNCATION_MARK,
} from "../../../src/engine/mcp";
import { compiledTools } from "../../../src/engine/mcp/server";
import { REPO_ROOT } from "../../helpers";

const names = (filters = NO_FILTERS) => selectTools(TOOLS, filters).map((tool) => tool.name);

describe("the tool table", () => {
  test("passes its own checks: snake_case names of at most 64 characters, unique, routes of the API, read-only exactly when every route reads", () => {
    expect(() => checkToolTable(TOOLS)).not.toThrow();
    for (const tool of TOOLS) {
      expect(tool.name.length).toBeLessThanOrEqual(64);
      for (const route of tool.routes)
        expect({ tool: tool.name, route, known: route in ROUTE_ACCESS }).toEqual({ tool: tool.name, route, known: true });
      expect({ tool: tool.name, readOnly: tool.readOnly }).toEqual({ tool: tool.name, readOnly: accessOf(tool) === "read" });
    }
  });

  test("refuses a tool that calls a writing route but says it is read-only, a long name, a duplicate, an unknown route", () => {
    const base = TOOLS[0];
    if (!base) throw new Error("empty table");
    expect(() => checkToolTable([{ ...base, routes: ["POST /api/services"] }])).toThrow(/marked read-only/);
    expect(() => checkToolTable([{ ...base, name: "x".repeat(65) }])).toThrow(/at most 64/);
    expect(() => checkToolTable([base, base])).toThrow(/twice/);
    expect(() => checkToolTable([{ ...base, routes: ["GET /api/nothing"] }])).toThrow(/not a route/);
  });

  test("lists reading tools first, then writing ones, in a fixed order", () => {
    expect(names()).toEqual([
      "list_services",
      "show_service",
      "diagnose",
      "logs",
      "list_templates",
      "show_template",
      "gpus",
      "proxy_status",
      "get_operation",
      "deploy_service",
      "deploy_template",
      "start_service",
      "stop_service",
      "restart_service",
      "pause_service",
      "resume_service",
      "remove_service",
      "restore_database",
    ]);
    const firstWriter = TOOLS.findIndex((tool) => !tool.readOnly);
    expect(TOOLS.slice(firstWriter).every((tool) => !tool.readOnly)).toBe(true);
  });

  test("every input and output schema is a JSON object schema", () => {
    for (const tool of TOOLS) {
      expect({ tool: tool.name, input: tool.input.type, output: tool.output.type }).toEqual({
        tool: tool.name,
        input: "object",
        output: "object",
      });
    }
  });

  test("every schema's validator compiles on its first check and refuses what is not an object", async () => {
    const tools = compiledTools();
    expect(tools.map((tool) => tool.spec.name)).toEqual(TOOLS.map((tool) => tool.name));
    for (const { spec, input, output } of tools) {
      for (const [which, schema] of [
        ["input", input],
        ["output", output],
      ] as const) {
        const result = await schema["~standard"].validate(42);
        expect({ tool: spec.name, which, refused: "issues" in result && (result.issues?.length ?? 0) > 0 }).toEqual({
          tool: spec.name,
          which,
          refused: true,
        });
      }
    }
  });
});

describe("filters", () => {
  test.each([
    [
      "read_only",
      { ...NO_FILTERS, readOnly: true },
      ["list_services", "show_service", "diagnose", "logs", "list_templates", "show_template", "gpus", "proxy_status"],
    ],
    ["toolsets logs,gpu", { ...NO_FILTERS, toolsets: ["logs", "gpu"] as const }, ["logs", "gpus"]],
    ["toolsets db keeps the poller of its operations", { ...NO_FILTERS, toolsets: ["db"] as const }, ["get_operation", "restore_database"]],
    [
      "disable_destructive",
      { ...NO_FILTERS, disableDestructive: true },
      [
        "list_services",
        "show_service",
        "diagnose",
        "logs",
        "list_templates",
        "show_template",
        "gpus",
        "proxy_status",
        "start_service",
        "pause_service",
        "resume_service",
      ],
    ],
    [
      "toolsets templates without destructive tools",
      { ...NO_FILTERS, toolsets: ["templates"] as const, disableDestructive: true },
      ["list_templates", "show_template"],
    ],
  ])("%s", (_label, filters, expected) => {
    expect(names(filters)).toEqual(expected);
  });

  test("toolsets are parsed strictly; all means every toolset", () => {
    expect(parseToolsets("Logs, gpu")).toEqual(["logs", "gpu"]);
    expect(parseToolsets("all")).toBeNull();
    expect(() => parseToolsets("logs,containers")).toThrow(FilterError);
    expect(() => parseToolsets(",")).toThrow(FilterError);
  });

  test("query parameters give the same choices", () => {
    expect(filtersFromQuery(new URLSearchParams("read_only=true&toolsets=services,db&disable_destructive=1"))).toEqual({
      readOnly: true,
      toolsets: ["services", "db"],
      disableDestructive: true,
    });
    expect(filtersFromQuery(new URLSearchParams("other=x"))).toEqual(NO_FILTERS);
    expect(() => filtersFromQuery(new URLSearchParams("read_only=maybe"))).toThrow(FilterError);
  });
});

const line = (ts: string, text: string, stream = "stdout"): LogLine => ({ ts, stream, line: text });

describe("log shaping", () => {
  const lines = Array.from({ length: 50 }, (_, i) => line(`2026-01-01T00:00:${String(i).padStart(2, "0")}.123456789Z`, `line-${i}`));

  test("tail keeps the latest lines, in order", () => {
    const shaped = shapeLogs(lines, { tail: 3, maxBytes: 1 << 20 });
    expect(shaped.lines.map((l) => l.line)).toEqual(["line-47", "line-48", "line-49"]);
    expect(shaped.truncated).toBe(false);
  });

  test("the byte cap drops lines from the START, so the end of the output is kept", () => {
    const rendered = `${lines[49]?.ts} stdout line-49`;
    const shaped = shapeLogs(lines, { tail: 50, maxBytes: rendered.length * 3 + 2 });
    expect(shaped.lines.map((l) => l.line)).toEqual(["line-47", "line-48", "line-49"]);
    expect(shaped.truncated).toBe(true);
    expect(shaped.omitted_lines).toBe(47);
    expect(shaped.bytes).toBeLessThanOrEqual(rendered.length * 3 + 2);
    expect(shaped.text.endsWith("line-49")).toBe(true);
  });

  test("a last line longer than the cap keeps its end, cut on a character boundary and marked", () => {
    const long = line("2026-01-01T00:00:00Z", `start-${"é".repeat(500)}-the-end`);
    const shaped = shapeLogs([long], { tail: 10, maxBytes: 300 });
    expect(shaped.lines).toHaveLength(1);
    expect(shaped.lines[0]?.line.startsWith(TRUNCATION_MARK)).toBe(true);
    expect(shaped.lines[0]?.line.endsWith("-the-end")).toBe(true);
    expect(shaped.lines[0]?.line).not.toContain("\uFFFD");
    expect(shaped.bytes).toBeLessThanOrEqual(300);
    expect(shaped.truncated).toBe(true);
  });

  test("since and grep filter before tail", () => {
    const since = parseLogTime("2026-01-01T00:00:40Z") ?? 0;
    const shaped = shapeLogs(lines, { tail: 2, since, grep: "LINE-4", ignoreCase: true, maxBytes: 1 << 20 });
    expect(shaped.lines.map((l) => l.line)).toEqual(["line-48", "line-49"]);
    expect(shaped.matched).toBe(10);
    expect(shapeLogs(lines, { tail: 5, grep: "LINE", maxBytes: 1 << 20 }).lines).toEqual([]);
  });

  test.each([
    ["2026-01-01T00:00:05.123456789Z", Date.parse("2026-01-01T00:00:05.123Z")],
    ["2026-01-01T02:00:05+02:00", Date.parse("2026-01-01T00:00:05Z")],
    ["", null],
    ["yesterday", null],
  ])("parseLogTime(%p)", (input, expected) => {
    expect(parseLogTime(input)).toBe(expected);
  });

  test.each([
    ["90s", 90_000],
    ["15m", 900_000],
    ["2h", 7_200_000],
    ["1d", 86_400_000],
  ])("since %s is that long ago", (input, ago) => {
    expect(parseSince(input, 1_000_000_000)).toBe(1_000_000_000 - ago);
  });

  test("since takes an RFC 3339 time and refuses anything else", () => {
    expect(parseSince("2026-01-01T00:00:00Z", 0)).toBe(Date.parse("2026-01-01T00:00:00Z"));
    expect(parseSince("soon", 0)).toBeNull();
    expect(parseSince("5 minutes", 0)).toBeNull();
  });
});

describe("causeOf", () => {
  const base: Diagnosis = {
    service_name: "x",
    kind: "service",
    status: "running",
    error: null,
    forensics: { last_exit_code: null, oom_killed: false, gpu_oom: false, priv_denied: false, last_crash_at: null },
    restarts: {
      max_restarts: 5,
      window_seconds: 60,
      policy: "always",
      count: 0,
      window_start: null,
      last_exit_at: null,
      backoff_s: 1,
      next_retry_in_s: null,
    },
    health: { spec: null, probe: null, observations: [] },
    bindings: { waiting: false, messages: [] },
    build: { last_result: null, version: 1, reason: null },
    injected_env_keys_source: "",
    remediation: null,
    desired_state: "running",
    last_deploy: null,
    last_run: null,
    last_dump: null,
    injected_env_keys: [],
    pending_env_keys: [],
    logs: [],
    user: null,
  };
  test.each([
    ["nothing wrong", base, "running: nothing wrong found"],
    [
      "a recorded error comes first",
      { ...base, error: { class: "oom", message: "killed" }, forensics: { ...base.forensics, gpu_oom: true } },
      "oom: killed",
    ],
    ["GPU OOM", { ...base, status: "failed", forensics: { ...base.forensics, gpu_oom: true } }, "the workload ran out of GPU memory"],
    ["a failed build", { ...base, build: { last_result: "failed", version: 2, reason: "exit 2" } }, "build of version 2 failed: exit 2"],
    [
      "waiting bindings",
      { ...base, bindings: { waiting: true, messages: ["db is not running"] } },
      "waiting for its bindings: db is not running",
    ],
    [
      "a failing probe",
      { ...base, health: { ...base.health, probe: { ok: false, detail: "HTTP 500" } } },
      "its health probe fails: HTTP 500",
    ],
  ] as [string, Diagnosis, string][])("%s", (_label, diagnosis, cause) => {
    expect(causeOf(diagnosis)).toBe(cause);
  });
});

describe("docs/roles.md", () => {
  test("its MCP matrix lists every tool with its toolset and the access its routes need", () => {
    const doc = readFileSync(join(REPO_ROOT, "docs", "roles.md"), "utf8");
    const rows = doc.split("\n").map((l) => l.split("|").map((c) => c.trim()));
    for (const tool of TOOLS) {
      const access = accessOf(tool);
      const cells = rows.find((c) => c[1] === `\`${tool.name}\``);
      const roles = (["admin", "submitter", "readonly"] as const).map((role) =>
        (ACCESS_ROLES[access as "read"] ?? []).includes(role) ? "✓" : "403",
      );
      expect({
        tool: tool.name,
        toolset: cells?.[2],
        access: cells?.[3],
        roles: cells?.slice(4, 7).map((c) => (c.startsWith("✓") ? "✓" : c)),
      }).toEqual({
        tool: tool.name,
        toolset: tool.toolset ?? "(any)",
        access,
        roles,
      });
    }
  });
});
