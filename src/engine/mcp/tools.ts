import { type Static, type TSchema, Type as t } from "@sinclair/typebox";
import {
  AppTemplate,
  BuildSpec,
  Diagnosis,
  GpuInventoryRecord,
  LogLine,
  NAME_PATTERN,
  ProxyStatus,
  type RestoreResult,
  ServiceDeploy,
  ServiceName,
  ServiceRecord,
} from "../../contract/engine";
import { type Access, ROUTE_ACCESS } from "../auth";
import { ApiFailure, assertRoutesExist, type ToolApi, ToolError } from "./context";
import { parseSince, shapeLogs } from "./logs";
import { Operation, type OperationBook, type OperationOutcome } from "./operations";

/** Toolset groups tools for `--toolsets`, as github-mcp-server's toolsets do. */
export type Toolset = "services" | "logs" | "gpu" | "templates" | "db";
export const TOOLSETS: readonly Toolset[] = ["services", "logs", "gpu", "templates", "db"];

/** ToolContext is what a tool's handler gets: the API as the caller, and the caller's operations. */
export interface ToolContext {
  api: ToolApi;
  operations: OperationBook;
  /** owner keys the caller's operations: its token, or the one `engine mcp` process. */
  owner: string;
  now(): number;
}

/** ToolOutput is a tool's structured answer, and the text an assistant reads when it shows no structure. */
export interface ToolOutput<O> {
  structured: O;
  text?: string;
}

/**
 * ToolSpec is one row of the tool table. The row drives everything about its tool: its name,
 * its annotations, which `--toolsets`, `--read-only` and `--disable-destructive` keep it, and
 * which API routes it may call. Who may call it is the route matrix's answer for those routes
 * (src/engine/auth/policy.ts), enforced by the API itself on every call.
 */
export interface ToolSpec<I extends TSchema = TSchema, O extends TSchema = TSchema> {
  name: string;
  title: string;
  description: string;
  /** toolset is null for get_operation, which is listed whenever a listed tool starts operations. */
  toolset: Toolset | null;
  /** routes are the ROUTE_ACCESS keys the tool calls, and the only ones it may call. */
  routes: readonly string[];
  readOnly: boolean;
  destructive: boolean;
  idempotent: boolean;
  /** openWorld: the tool reaches outside this machine (a git remote, an https:// dump). */
  openWorld: boolean;
  /** startsOperations: the tool may answer with an Operation handle to poll with get_operation. */
  startsOperations?: boolean;
  input: I;
  output: O;
  run(args: Static<I>, ctx: ToolContext): Promise<ToolOutput<Static<O>>>;
}

const ACCESS_ORDER: Access[] = ["public", "read", "write", "admin"];

/** accessOf is the access a tool needs: the highest of its routes'. */
export function accessOf(tool: Pick<ToolSpec, "routes">): Access {
  let highest: Access = "public";
  for (const route of tool.routes) {
    const access = ROUTE_ACCESS[route] ?? "admin";
    if (ACCESS_ORDER.indexOf(access) > ACCESS_ORDER.indexOf(highest)) highest = access;
  }
  return highest;
}

/** TOOL_NAME is what the MCP spec allows a tool's name to be, narrowed to snake_case; at most 64 characters. */
const TOOL_NAME = /^[a-z][a-z0-9_]{0,63}$/;

function tool<I extends TSchema, O extends TSchema>(spec: ToolSpec<I, O>): ToolSpec {
  return spec as unknown as ToolSpec;
}

/** READS are the annotations every read tool has: it changes nothing, so it is safe to repeat. */
const READS = { readOnly: true, destructive: false, idempotent: true, openWorld: false } as const;

const json = (value: unknown) => JSON.stringify(value, null, 2);
const ServiceArg = t.String({ minLength: 1, maxLength: 128, description: "The service's name or id" });
const ServiceOnly = t.Object({ service: ServiceArg }, { additionalProperties: false });
const NoArgs = t.Object({}, { additionalProperties: false });

/** DEFAULT_LOG_BYTES is the logs tool's default byte cap: enough for a crash's story, small for a context window. */
export const DEFAULT_LOG_BYTES = 16 * 1024;
/** LOG_SCAN_LINES is how many of the latest lines `since` and `grep` look through. */
export const LOG_SCAN_LINES = 20_000;
/** RESTORE_WAIT_S is how long restore_database waits for the restore before it answers with the handle. */
const RESTORE_WAIT_S = 20;

const DeployOutput = t.Object({
  service: ServiceRecord,
  operation: t.Union([Operation, t.Null()], { description: "Set while a build runs: poll it with get_operation" }),
});

const DiagnoseOutput = t.Object({
  cause: t.String({ description: "What is wrong, in one line (or that nothing is)" }),
  remediation: t.Union([t.Object({ code: t.String(), detail: t.String() }), t.Null()]),
  service: t.String(),
  status: t.String(),
  diagnosis: Diagnosis,
});

/**
 * causeOf says in one line what a diagnosis points at, most decisive first: the recorded error,
 * then the kernel's and the GPU's verdicts, a failed build, missing bindings, a failing probe.
 */
export function causeOf(d: Diagnosis): string {
  if (d.error) return `${d.error.class}: ${d.error.message}`;
  if (d.forensics.oom_killed) return "the kernel's OOM killer ended the workload (memory limit reached)";
  if (d.forensics.gpu_oom) return "the workload ran out of GPU memory";
  if (d.build.last_result === "failed") return `build of version ${d.build.version} failed${d.build.reason ? `: ${d.build.reason}` : ""}`;
  if (d.bindings.waiting) return `waiting for its bindings: ${d.bindings.messages.join("; ")}`;
  const probe = d.health.probe as { ok?: boolean; detail?: string } | null;
  if (probe && probe.ok === false) return `its health probe fails: ${probe.detail ?? "no detail"}`;
  if (d.forensics.last_exit_code !== null && d.forensics.last_exit_code !== 0 && d.status !== "running") {
    return `its last run exited with code ${d.forensics.last_exit_code}`;
  }
  return `${d.status}: nothing wrong found`;
}

/**
 * buildProbe reports on a deploy's build through diagnose: the build of `version` runs,
 * succeeded or failed, or a later deploy replaced it.
 */
function buildProbe(service: string, version: number) {
  return async (api: ToolApi): Promise<OperationOutcome> => {
    let d: Diagnosis;
    try {
      d = await api<Diagnosis>("GET /api/services/:ident/diagnose", { ident: service });
    } catch (error) {
      if (error instanceof ApiFailure)
        return { state: "failed", error: { status: error.status, code: error.code, message: error.message } };
      throw error;
    }
    if (d.build.version > version) {
      return { state: "failed", error: { status: null, code: "superseded", message: `version ${d.build.version} was deployed since` } };
    }
    if (d.build.last_result === "succeeded") {
      return { state: "succeeded", result: { service, version, status: d.status, build: d.build } };
    }
    if (d.build.last_result === "failed") {
      return { state: "failed", error: { status: null, code: "build_failed", message: d.build.reason ?? "the build failed" } };
    }
    return { state: "running" };
  };
}

/**
 * deployed answers a deploy: the record, and an operation to poll while its build runs. The
 * build's version is read from the diagnosis (a redeploy's record still shows the running version).
 */
async function deployed(record: ServiceRecord, building: boolean, ctx: ToolContext): Promise<ToolOutput<Static<typeof DeployOutput>>> {
  let operation: Operation | null = null;
  if (building) {
    // The deploy is done whatever this read answers: a failure here only leaves out the handle.
    const d = await ctx.api<Diagnosis>("GET /api/services/:ident/diagnose", { ident: record.name }).catch((error: unknown) => {
      if (error instanceof ApiFailure) return null;
      throw error;
    });
    if (d?.build.last_result === "running") {
      operation = ctx.operations.watch(ctx.owner, "build", record.name, buildProbe(record.name, d.build.version));
    }
  }
  const structured = { service: record, operation };
  return { structured, text: json(structured) };
}

const control = (action: "start" | "stop" | "restart" | "pause" | "resume") => async (args: { service: string }, ctx: ToolContext) => {
  const record = await ctx.api<ServiceRecord>("POST /api/services/:ident/:action", { ident: args.service, action });
  return { structured: record, text: json(record) };
};

/**
 * TOOLS is the one table of the engine's MCP tools, in the order `tools/list` answers: the
 * reading tools, then the writing ones. docs/roles.md shows it as the tool × role matrix, and a
 * test checks the two agree.
 */
export const TOOLS: readonly ToolSpec[] = [
  tool({
    name: "list_services",
    title: "List services",
    description: "List the services on this machine (a scoped token sees only its own): name, kind, status, version, GPUs, port, restarts.",
    toolset: "services",
    routes: ["GET /api/services"],
    ...READS,
    input: NoArgs,
    output: t.Object({ services: t.Array(ServiceRecord) }),
    async run(_args, ctx) {
      const services = await ctx.api<ServiceRecord[]>("GET /api/services");
      return { structured: { services }, text: json({ services }) };
    },
  }),
  tool({
    name: "show_service",
    title: "Show a service",
    description: "Read one service's record by name or id: its spec, status, run, GPUs and restarts.",
    toolset: "services",
    routes: ["GET /api/services/:ident"],
    ...READS,
    input: ServiceOnly,
    output: ServiceRecord,
    async run(args, ctx) {
      const record = await ctx.api<ServiceRecord>("GET /api/services/:ident", { ident: args.service });
      return { structured: record, text: json(record) };
    },
  }),
  tool({
    name: "diagnose",
    title: "Diagnose a service",
    description:
      "Explain what is wrong with a service: the cause and the remediation first, then the whole diagnosis record (forensics such as OOM and GPU OOM, restarts and backoff, health probes, bindings, build, the last run and the latest log lines).",
    toolset: "services",
    routes: ["GET /api/services/:ident/diagnose"],
    ...READS,
    input: ServiceOnly,
    output: DiagnoseOutput,
    async run(args, ctx) {
      const d = await ctx.api<Diagnosis>("GET /api/services/:ident/diagnose", { ident: args.service });
      const structured = { cause: causeOf(d), remediation: d.remediation, service: d.service_name, status: d.status, diagnosis: d };
      const lines = [`cause: ${structured.cause}`];
      lines.push(d.remediation ? `remediation (${d.remediation.code}): ${d.remediation.detail}` : "remediation: none needed or none known");
      return { structured, text: `${lines.join("\n")}\n\n${json(d)}` };
    },
  }),
  tool({
    name: "logs",
    title: "Read a service's logs",
    description:
      "Read a service's latest log lines (stdout and stderr). `tail` keeps the last N matching lines, `since` keeps lines from an RFC 3339 time or a duration ago (90s, 15m, 2h, 1d), `grep` keeps lines containing a fixed string. The output is capped at `max_bytes`: what is kept is its END, the latest lines.",
    toolset: "logs",
    routes: ["GET /api/services/:ident/logs"],
    ...READS,
    input: t.Object(
      {
        service: ServiceArg,
        tail: t.Optional(
          t.Integer({ minimum: 1, maximum: 10_000, default: 200, description: "How many of the latest matching lines (default 200)" }),
        ),
        since: t.Optional(t.String({ minLength: 1, maxLength: 64, description: "An RFC 3339 time, or a duration ago: 90s, 15m, 2h, 1d" })),
        grep: t.Optional(t.String({ minLength: 1, maxLength: 1024, description: "Keep lines containing this fixed string" })),
        ignore_case: t.Optional(t.Boolean({ description: "grep without regard to case" })),
        max_bytes: t.Optional(
          t.Integer({
            minimum: 256,
            maximum: 1_048_576,
            default: DEFAULT_LOG_BYTES,
            description: "Byte cap of the output, which keeps its end (default 16384)",
          }),
        ),
      },
      { additionalProperties: false },
    ),
    output: t.Object({
      service: t.String(),
      lines: t.Array(LogLine),
      matched: t.Integer({ description: "Lines that passed since and grep, before tail" }),
      omitted_lines: t.Integer({ description: "Lines of the tail dropped from the start to fit max_bytes" }),
      truncated: t.Boolean(),
      bytes: t.Integer(),
    }),
    async run(args, ctx) {
      const tail = args.tail ?? 200;
      let since: number | undefined;
      if (args.since !== undefined) {
        const parsed = parseSince(args.since, ctx.now());
        if (parsed === null)
          throw new ToolError(
            "invalid_argument",
            `since takes an RFC 3339 time or a duration such as 15m (got ${JSON.stringify(args.since)})`,
          );
        since = parsed;
      }
      const filtering = since !== undefined || args.grep !== undefined;
      const lines = await ctx.api<LogLine[]>(
        "GET /api/services/:ident/logs",
        { ident: args.service },
        { query: { tail: String(filtering ? Math.max(tail, LOG_SCAN_LINES) : tail) } },
      );
      const shaped = shapeLogs(lines, {
        tail,
        since,
        grep: args.grep,
        ignoreCase: args.ignore_case,
        maxBytes: args.max_bytes ?? DEFAULT_LOG_BYTES,
      });
      const structured = {
        service: args.service,
        lines: shaped.lines,
        matched: shaped.matched,
        omitted_lines: shaped.omitted_lines,
        truncated: shaped.truncated,
        bytes: shaped.bytes,
      };
      const note = shaped.truncated ? `[${shaped.omitted_lines} earlier lines left out to fit max_bytes]\n` : "";
      return { structured, text: shaped.lines.length === 0 ? "no matching log lines" : `${note}${shaped.text}` };
    },
  }),
  tool({
    name: "list_templates",
    title: "List app templates",
    description:
      "List the app templates a service can be deployed from (vLLM, Ollama, llama.cpp, ComfyUI, PostgreSQL, ...): defaults, the environment each takes (env_schema) and a hint for assistants.",
    toolset: "templates",
    routes: ["GET /api/app-templates"],
    ...READS,
    input: NoArgs,
    output: t.Object({ templates: t.Array(AppTemplate) }),
    async run(_args, ctx) {
      const templates = await ctx.api<AppTemplate[]>("GET /api/app-templates");
      return { structured: { templates }, text: json({ templates }) };
    },
  }),
  tool({
    name: "show_template",
    title: "Show an app template",
    description: "Read one app template: its defaults (port, GPUs, start command, health), its env_schema and its hint.",
    toolset: "templates",
    routes: ["GET /api/app-templates/:template_id"],
    ...READS,
    input: t.Object({ template_id: t.String({ pattern: NAME_PATTERN, maxLength: 63 }) }, { additionalProperties: false }),
    output: AppTemplate,
    async run(args, ctx) {
      const template = await ctx.api<AppTemplate>("GET /api/app-templates/:template_id", { template_id: args.template_id });
      return { structured: template, text: json(template) };
    },
  }),
  tool({
    name: "gpus",
    title: "GPU inventory",
    description:
      "The machine's GPUs (from nvidia-smi, or declared): memory, utilization, MIG profile, and which service holds which device.",
    toolset: "gpu",
    routes: ["GET /api/gpus"],
    ...READS,
    input: NoArgs,
    output: GpuInventoryRecord,
    async run(_args, ctx) {
      const inventory = await ctx.api<Static<typeof GpuInventoryRecord>>("GET /api/gpus");
      return { structured: inventory, text: json(inventory) };
    },
  }),
  tool({
    name: "proxy_status",
    title: "Reverse proxy status",
    description: "The reverse proxy: its listeners, routes, domains and their certificates, the local CA and mDNS names.",
    toolset: "services",
    routes: ["GET /api/proxy/status"],
    ...READS,
    input: NoArgs,
    output: ProxyStatus,
    async run(_args, ctx) {
      const status = await ctx.api<Static<typeof ProxyStatus>>("GET /api/proxy/status");
      return { structured: status, text: json(status) };
    },
  }),
  tool({
    name: "get_operation",
    title: "Poll an operation",
    description:
      "Report on work a tool started that can outlast one call (a deploy's build, a database restore): running, succeeded with its result, or failed with the error. Ask again after poll_after_s while it runs.",
    toolset: null,
    routes: ["GET /api/services/:ident/diagnose"],
    ...READS,
    input: t.Object({ operation_id: t.String({ minLength: 1, maxLength: 64 }) }, { additionalProperties: false }),
    output: Operation,
    async run(args, ctx) {
      const operation = await ctx.operations.get(ctx.owner, args.operation_id, ctx.api);
      if (!operation)
        throw new ToolError("operation_not_found", `no operation ${JSON.stringify(args.operation_id)} was started by this caller`);
      return { structured: operation, text: json(operation) };
    },
  }),
  tool({
    name: "deploy_service",
    title: "Deploy a service",
    description:
      "Deploy a service, or a new version of one with the same name (which replaces the running version): a command, a template_id or a database engine, with env, secrets, GPUs (whole `gpus` or a `gpu_memory_mb` share), port, health probe, restart policy, bindings and an optional build from a git repository. A build runs in the background: the answer then carries an operation to poll with get_operation.",
    toolset: "services",
    routes: ["POST /api/services", "GET /api/services/:ident/diagnose"],
    readOnly: false,
    destructive: true,
    idempotent: false,
    openWorld: true,
    startsOperations: true,
    input: ServiceDeploy,
    output: DeployOutput,
    async run(args, ctx) {
      const record = await ctx.api<ServiceRecord>("POST /api/services", {}, { body: args });
      return deployed(record, Boolean(args.build), ctx);
    },
  }),
  tool({
    name: "deploy_template",
    title: "Deploy an app template",
    description:
      "Deploy a service from an app template (see list_templates): the template's defaults apply unless given. `env` must satisfy the template's env_schema (every required name present; names it marks secret are kept as secrets); the engine checks it and answers which names are missing.",
    toolset: "templates",
    routes: ["POST /api/services", "GET /api/services/:ident/diagnose"],
    readOnly: false,
    destructive: true,
    idempotent: false,
    openWorld: true,
    startsOperations: true,
    input: t.Object(
      {
        template_id: t.String({ pattern: NAME_PATTERN, maxLength: 63 }),
        name: ServiceName,
        env: t.Optional(ServiceDeploy.properties.env),
        secrets: t.Optional(ServiceDeploy.properties.secrets),
        gpus: t.Optional(t.Integer({ minimum: 0, maximum: 64 })),
        gpu_memory_mb: t.Optional(t.Integer({ minimum: 1, maximum: 4194304 })),
        memory_mb: t.Optional(t.Integer({ minimum: 4, maximum: 16777216 })),
        port: t.Optional(t.Integer({ minimum: 1, maximum: 65535 })),
        bindings: t.Optional(t.Array(ServiceName, { maxItems: 64, uniqueItems: true })),
        build: t.Optional(BuildSpec),
      },
      { additionalProperties: false },
    ),
    output: DeployOutput,
    async run(args, ctx) {
      const record = await ctx.api<ServiceRecord>("POST /api/services", {}, { body: args });
      return deployed(record, Boolean(args.build), ctx);
    },
  }),
  tool({
    name: "start_service",
    title: "Start a service",
    description: "Start a stopped, completed or failed service (a running one is refused: use restart_service).",
    toolset: "services",
    routes: ["POST /api/services/:ident/:action"],
    readOnly: false,
    destructive: false,
    idempotent: true,
    openWorld: false,
    input: ServiceOnly,
    output: ServiceRecord,
    run: control("start"),
  }),
  tool({
    name: "stop_service",
    title: "Stop a service",
    description: "Stop a service and keep it stopped (its process is ended; a batch job is cancelled).",
    toolset: "services",
    routes: ["POST /api/services/:ident/:action"],
    readOnly: false,
    destructive: true,
    idempotent: true,
    openWorld: false,
    input: ServiceOnly,
    output: ServiceRecord,
    run: control("stop"),
  }),
  tool({
    name: "restart_service",
    title: "Restart a service",
    description: "End a service's process and start it again (not counted as a crash restart).",
    toolset: "services",
    routes: ["POST /api/services/:ident/:action"],
    readOnly: false,
    destructive: true,
    idempotent: false,
    openWorld: false,
    input: ServiceOnly,
    output: ServiceRecord,
    run: control("restart"),
  }),
  tool({
    name: "pause_service",
    title: "Pause a service",
    description: "Freeze a running service's processes (SIGSTOP); its memory and GPU stay held until resume_service.",
    toolset: "services",
    routes: ["POST /api/services/:ident/:action"],
    readOnly: false,
    destructive: false,
    idempotent: true,
    openWorld: false,
    input: ServiceOnly,
    output: ServiceRecord,
    run: control("pause"),
  }),
  tool({
    name: "resume_service",
    title: "Resume a service",
    description: "Let a paused service run again (SIGCONT).",
    toolset: "services",
    routes: ["POST /api/services/:ident/:action"],
    readOnly: false,
    destructive: false,
    idempotent: true,
    openWorld: false,
    input: ServiceOnly,
    output: ServiceRecord,
    run: control("resume"),
  }),
  tool({
    name: "remove_service",
    title: "Remove a service",
    description: "Stop a service and delete it (its data directory is kept on disk).",
    toolset: "services",
    routes: ["DELETE /api/services/:name"],
    readOnly: false,
    destructive: true,
    idempotent: true,
    openWorld: false,
    input: ServiceOnly,
    output: t.Object({ id: t.String(), name: t.String(), deleted: t.Boolean() }),
    async run(args, ctx) {
      const removed = await ctx.api<{ id: string; name: string; deleted: boolean }>("DELETE /api/services/:name", { name: args.service });
      return { structured: removed, text: json(removed) };
    },
  }),
  tool({
    name: "restore_database",
    title: "Restore a database",
    description:
      "Restore a dump into a running database service (PostgreSQL, MariaDB, Redis, SQLite), replacing its data; the database is left as it was if the restore fails or passes timeout_s. The dump is an absolute path on this machine, a file:// or an https:// URL. Answers with an operation: done if the restore finished within 20 s, else running (poll it with get_operation).",
    toolset: "db",
    routes: ["POST /api/databases/:name/restore"],
    readOnly: false,
    destructive: true,
    idempotent: false,
    openWorld: true,
    startsOperations: true,
    input: t.Object(
      {
        database: ServiceName,
        dump: t.String({ minLength: 1, maxLength: 4096, description: "An absolute path on this machine, a file:// or an https:// URL" }),
        timeout_s: t.Optional(
          t.Integer({
            minimum: 1,
            maximum: 86400,
            default: 3600,
            description: "Give up (and keep the database as it was) after this long",
          }),
        ),
      },
      { additionalProperties: false },
    ),
    output: Operation,
    async run(args, ctx) {
      const work = ctx.api<Static<typeof RestoreResult>>(
        "POST /api/databases/:name/restore",
        { name: args.database },
        { body: { dump: args.dump, timeout_s: args.timeout_s ?? 3600 } },
      );
      const started = ctx.operations.track(ctx.owner, "restore", args.database, work, (error) => ({
        state: "failed",
        error:
          error instanceof ApiFailure
            ? { status: error.status, code: error.code, message: error.message }
            : { status: null, code: "engine_unreachable", message: (error as Error).message },
      }));
      const operation = (await ctx.operations.settled(ctx.owner, started.id, RESTORE_WAIT_S * 1000, ctx.api)) ?? started;
      return { structured: operation, text: json(operation) };
    },
  }),
];

/** checkToolTable refuses a table that breaks its own rules; the MCP server runs it before it serves. */
export function checkToolTable(tools: readonly ToolSpec[]): void {
  const names = new Set<string>();
  for (const spec of tools) {
    if (!TOOL_NAME.test(spec.name)) throw new Error(`MCP tool name ${JSON.stringify(spec.name)} must be snake_case, at most 64 characters`);
    if (names.has(spec.name)) throw new Error(`MCP tool ${spec.name} is listed twice`);
    names.add(spec.name);
    assertRoutesExist(spec.name, spec.routes);
    const access = accessOf(spec);
    // A reading tool calls only reading routes, and a tool that calls none is no reading tool.
    if (spec.readOnly !== (access === "read")) {
      throw new Error(`MCP tool ${spec.name} is marked ${spec.readOnly ? "read-only" : "writing"} but its routes need ${access}`);
    }
    if (spec.readOnly && spec.destructive) throw new Error(`MCP tool ${spec.name} cannot be both read-only and destructive`);
  }
}
