import {
  type CallToolResult,
  fromJsonSchema,
  type JsonSchemaType,
  type JsonSchemaValidator,
  type jsonSchemaValidator,
  McpServer,
  type ServerContext,
  type StandardSchemaWithJSON,
} from "@modelcontextprotocol/server";
import { AjvJsonSchemaValidator } from "@modelcontextprotocol/server/validators/ajv";
import type { TSchema } from "@sinclair/typebox";
import type { Logger } from "../../lib/logger";
import { ApiFailure, type ApiTransport, boundApi, ToolError } from "./context";
import { type McpFilters, selectTools } from "./filters";
import type { OperationBook } from "./operations";
import { checkToolTable, TOOLS, type ToolSpec } from "./tools";

/** Caller is who a tool call runs as: how it reaches the API, and whose operations it sees. */
export interface Caller {
  transport: ApiTransport;
  owner: string;
}

/** McpServerOptions are what every MCP server of the engine is built from, per request or per connection. */
export interface McpServerOptions {
  version: string;
  filters: McpFilters;
  operations: OperationBook;
  /** callerOf finds who makes a call: from the request's auth info over HTTP, fixed over stdio. */
  callerOf: (ctx: ServerContext) => Caller;
  now: () => number;
  log?: Logger;
}

const INSTRUCTIONS =
  "This server operates one GPU workstation run by `engine`: its services (batch jobs, services, models, databases), their logs and diagnoses, GPUs, app templates and database restores. When a service misbehaves, call diagnose first: it answers the cause and the remediation. Every call runs with the rights of the token the server was given (role, caps and service scope).";

/**
 * JsonSchemaOf converts a TypeBox schema into the JSON Schema MCP lists (the contract's own
 * schemas, so a tool takes and answers exactly what the API does) and a validator for it.
 * `$id`s are dropped: they name models in the OpenAPI document and mean nothing nested here.
 */
function withoutIds(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(withoutIds);
  if (value === null || typeof value !== "object") return value;
  const out: Record<string, unknown> = {};
  for (const [key, inner] of Object.entries(value)) if (key !== "$id") out[key] = withoutIds(inner);
  return out;
}

interface CompiledTool {
  spec: ToolSpec;
  input: StandardSchemaWithJSON;
  output: StandardSchemaWithJSON;
}

let compiled: CompiledTool[] | undefined;

/**
 * compileOnFirstUse is a validator provider that compiles a schema's validator (AJV, the SDK's
 * own default) the first time a value is checked against it, not when the tool is listed. The
 * 36 validators of the tool table were most of a daemon's start (250 ms of CPU on a 2-core
 * PVM guest, decision 515): every start paid them, a drain restart twice, though most daemons
 * never see an MCP call. A tool's first call pays its two (a few ms).
 */
const compileOnFirstUse: jsonSchemaValidator = {
  getValidator<T>(schema: JsonSchemaType): JsonSchemaValidator<T> {
    let check: JsonSchemaValidator<T> | undefined;
    return (input) => {
      check ??= ajv().getValidator<T>(schema);
      return check(input);
    };
  },
};

let ajvProvider: AjvJsonSchemaValidator | undefined;
function ajv(): AjvJsonSchemaValidator {
  ajvProvider ??= new AjvJsonSchemaValidator();
  return ajvProvider;
}

/**
 * compiledTools checks the table and prepares its schemas once per process: the modern HTTP
 * leg builds a server per request, which must not make (or compile) a validator each time.
 * Each validator is compiled on its first use (compileOnFirstUse).
 */
export function compiledTools(): CompiledTool[] {
  if (compiled) return compiled;
  checkToolTable(TOOLS);
  const schemaOf = (schema: TSchema) => fromJsonSchema(withoutIds(JSON.parse(JSON.stringify(schema))) as never, compileOnFirstUse);
  compiled = TOOLS.map((spec) => ({ spec, input: schemaOf(spec.input), output: schemaOf(spec.output) }));
  return compiled;
}

/** failureResult turns a refusal into the tool error an assistant reads: the API's own answer, verbatim. */
function failureResult(error: unknown, spec: ToolSpec, log: Logger | undefined): CallToolResult {
  let body: unknown;
  if (error instanceof ApiFailure) body = { status: error.status, ...(error.body as object) };
  else if (error instanceof ToolError) body = { error: { code: error.code, message: error.message } };
  else {
    log?.error({ err: error, tool: spec.name }, "MCP tool failed");
    body = { error: { code: "internal", message: `the tool ${spec.name} failed: ${(error as Error).message}` } };
  }
  return { isError: true, content: [{ type: "text", text: JSON.stringify(body) }] };
}

/**
 * buildMcpServer makes one McpServer with the tools the filters keep, in table order. Each
 * call runs as `callerOf(ctx)`: the API it reaches is the HTTP API, so roles, caps and scopes
 * are enforced where they always are.
 */
export function buildMcpServer(options: McpServerOptions): McpServer {
  const server = new McpServer({ name: "engine", title: "engine", version: options.version }, { instructions: INSTRUCTIONS });
  const kept = new Set(selectTools(TOOLS, options.filters));
  for (const { spec, input, output } of compiledTools()) {
    if (!kept.has(spec)) continue;
    server.registerTool(
      spec.name,
      {
        title: spec.title,
        description: spec.description,
        inputSchema: input,
        outputSchema: output,
        annotations: {
          title: spec.title,
          readOnlyHint: spec.readOnly,
          destructiveHint: spec.destructive,
          idempotentHint: spec.idempotent,
          openWorldHint: spec.openWorld,
        },
      },
      async (args: unknown, ctx: ServerContext): Promise<CallToolResult> => {
        try {
          const caller = options.callerOf(ctx);
          const result = await spec.run(args as never, {
            api: boundApi(spec.name, spec.routes, caller.transport),
            operations: options.operations,
            owner: caller.owner,
            now: options.now,
          });
          return {
            content: [{ type: "text", text: result.text ?? JSON.stringify(result.structured) }],
            structuredContent: result.structured as Record<string, unknown>,
          };
        } catch (error) {
          return failureResult(error, spec, options.log);
        }
      },
    );
  }
  return server;
}
