import { ROUTE_ACCESS } from "../auth";

/** ApiAnswer is one answer of the engine's HTTP API: its status and its JSON body. */
export interface ApiAnswer {
  status: number;
  body: unknown;
}

/**
 * ApiTransport sends one request to the engine's HTTP API as the caller: in the daemon, into
 * the API app in-process with the caller's Authorization header; in `engine mcp`, over the unix
 * socket or HTTP as the CLI does. Every tool reaches the engine through it, so each call meets
 * exactly the checks an HTTP client meets (role, caps, scope, validation): one enforcement path.
 */
export type ApiTransport = (method: string, path: string, body?: unknown) => Promise<ApiAnswer>;

/** ApiFailure is a non-2xx answer of the API: the tool reports it as the API said it. */
export class ApiFailure extends Error {
  constructor(
    readonly status: number,
    readonly body: unknown,
  ) {
    super(describeFailure(status, body));
    this.name = "ApiFailure";
  }

  /** code is the error envelope's code, `validation` for a 422 detail list. */
  get code(): string {
    const envelope = this.body as { error?: { code?: string }; detail?: unknown } | undefined;
    if (envelope?.error?.code) return envelope.error.code;
    if (envelope?.detail) return "validation";
    return `http_${this.status}`;
  }
}

function describeFailure(status: number, body: unknown): string {
  const envelope = body as { error?: { code: string; message: string }; detail?: { loc: unknown[]; msg: string }[] } | undefined;
  if (envelope?.error) return `${envelope.error.code}: ${envelope.error.message}`;
  if (Array.isArray(envelope?.detail)) return `validation: ${envelope.detail.map((d) => `${d.loc.join(".")}: ${d.msg}`).join("; ")}`;
  return `the engine answered ${status}`;
}

/** ToolError is a refusal of the MCP layer itself (an unknown operation, a bad `since`), with a stable code. */
export class ToolError extends Error {
  constructor(
    readonly code: "operation_not_found" | "invalid_argument" | "engine_unreachable",
    message: string,
  ) {
    super(message);
    this.name = "ToolError";
  }
}

/** ToolApi calls one of the routes a tool declares, as the caller, and answers the body or throws ApiFailure. */
export type ToolApi = <T>(
  route: string,
  params?: Record<string, string>,
  options?: { body?: unknown; query?: Record<string, string> },
) => Promise<T>;

/**
 * boundApi gives a tool its ToolApi: it may call only the routes its table entry names (a
 * route outside them is a bug, refused before anything is sent), so the table says what each
 * tool can reach and the route matrix says who may.
 */
export function boundApi(tool: string, routes: readonly string[], transport: ApiTransport): ToolApi {
  return async <T>(
    route: string,
    params: Record<string, string> = {},
    options: { body?: unknown; query?: Record<string, string> } = {},
  ) => {
    if (!routes.includes(route)) throw new Error(`the tool ${tool} does not declare the route ${route}`);
    const [method = "", pattern = ""] = route.split(" ");
    const path = pattern
      .split("/")
      .map((segment) => {
        if (!segment.startsWith(":")) return segment;
        const value = params[segment.slice(1)];
        if (value === undefined) throw new Error(`the route ${route} needs ${segment}`);
        return encodeURIComponent(value);
      })
      .join("/");
    const query = options.query ? `?${new URLSearchParams(options.query).toString()}` : "";
    const answer = await transport(method, `${path}${query}`, options.body);
    if (answer.status >= 200 && answer.status < 300) return answer.body as T;
    throw new ApiFailure(answer.status, answer.body);
  };
}

/** assertRoutesExist fails start-up when a tool names a route the API does not have. */
export function assertRoutesExist(tool: string, routes: readonly string[]): void {
  for (const route of routes) {
    if (!(route in ROUTE_ACCESS)) throw new Error(`the MCP tool ${tool} names ${route}, which is not a route of the API`);
  }
}
