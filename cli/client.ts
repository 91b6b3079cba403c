import { existsSync } from "node:fs";
import { join } from "node:path";
import { readAdminTokenFile } from "../src/engine/auth";
import { defaultDataDir } from "../src/engine/config";

/** ErrorDetail is one entry of the engine's 422 `detail`, as the CLI reads it. */
export interface ErrorDetail {
  loc: (string | number)[];
  msg: string;
  type?: string;
  input?: unknown;
}

/**
 * CliError is a user-facing failure: printed as one line, never with a stack trace. A 422 from
 * the engine keeps its `detail`, so a command can name the flags that set the fields.
 */
export class CliError extends Error {
  constructor(
    message: string,
    readonly code = "error",
    readonly detail?: ErrorDetail[],
  ) {
    super(message);
  }
}

export interface ClientOptions {
  url?: string;
  token?: string;
  dataDir?: string;
}

/**
 * EngineClient talks to a running engine. Without --url or a token it uses the unix socket
 * `<data-dir>/engine.sock`, which counts as admin; otherwise HTTP with a bearer token taken
 * from --token, ENGINE_TOKEN, or `<data-dir>/admin.token`.
 */
export class EngineClient {
  readonly #target: { kind: "unix"; socket: string } | { kind: "http"; base: string; token: string | undefined };

  constructor(options: ClientOptions, env: Record<string, string | undefined> = process.env) {
    const dataDir = options.dataDir ?? env.ENGINE_DATA_DIR ?? defaultDataDir(env);
    const socket = join(dataDir, "engine.sock");
    const explicitToken = options.token ?? env.ENGINE_TOKEN;
    const url = options.url ?? env.ENGINE_URL;
    if (!url && !explicitToken && existsSync(socket)) {
      this.#target = { kind: "unix", socket };
    } else {
      const base = (url ?? `http://127.0.0.1:${env.ENGINE_PORT ?? 9321}`).replace(/\/+$/, "");
      this.#target = { kind: "http", base, token: explicitToken ?? readAdminTokenFile(dataDir) };
    }
  }

  describe(): string {
    return this.#target.kind === "unix" ? this.#target.socket : this.#target.base;
  }

  async request<T>(method: string, path: string, body?: unknown): Promise<T> {
    return (await this.requestWithHeaders<T>(method, path, body)).body;
  }

  /** requestWithHeaders is request with the answer's headers (a service read's X-Engine-Index). */
  async requestWithHeaders<T>(method: string, path: string, body?: unknown): Promise<{ body: T; headers: Headers }> {
    const response = await this.#send(method, path, { body, accept: "application/json" });
    const text = await response.text();
    let parsed: unknown;
    try {
      parsed = text.length > 0 ? JSON.parse(text) : undefined;
    } catch {
      throw new CliError(`the engine answered ${response.status} with a body that is not JSON`);
    }
    if (response.ok) return { body: parsed as T, headers: response.headers };
    throw errorOf(response.status, parsed);
  }

  /**
   * exchange sends one request and answers its status and JSON body whatever the status, for
   * callers that report the engine's refusals themselves (`engine mcp` hands them to the
   * assistant as they are). It throws only when the engine cannot be reached.
   */
  async exchange(method: string, path: string, body?: unknown): Promise<{ status: number; body: unknown }> {
    const response = await this.#send(method, path, { body, accept: "application/json" });
    const text = await response.text();
    try {
      return { status: response.status, body: text.length > 0 ? JSON.parse(text) : undefined };
    } catch {
      throw new CliError(`the engine answered ${response.status} with a body that is not JSON`);
    }
  }

  /**
   * events reads a text/event-stream from `path` and yields its events until the engine closes
   * the stream or `signal` aborts; comments (keep-alives) are skipped. A non-2xx answer throws
   * the same CliError that request would. `lastEventId` resumes a stream after the event with
   * that id (the Last-Event-ID header of a reconnecting EventSource).
   */
  async *events(path: string, signal: AbortSignal, lastEventId?: string): AsyncGenerator<ServerSentEvent> {
    const response = await this.#send("GET", path, {
      accept: "text/event-stream",
      signal,
      headers: lastEventId === undefined ? {} : { "last-event-id": lastEventId },
    });
    if (!response.ok) {
      const text = await response.text();
      let parsed: unknown;
      try {
        parsed = JSON.parse(text);
      } catch {
        parsed = undefined;
      }
      throw errorOf(response.status, parsed);
    }
    if (!response.body) return;
    const decoder = new TextDecoder();
    let buffer = "";
    try {
      const reader = response.body.getReader();
      for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) {
        buffer += decoder.decode(chunk.value, { stream: true }).replace(/\r\n?/g, "\n");
        for (let end = buffer.indexOf("\n\n"); end >= 0; end = buffer.indexOf("\n\n")) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const event = parseEvent(block);
          if (event) yield event;
        }
      }
    } catch (error) {
      if (signal.aborted) return;
      throw new CliError(`the event stream from ${this.describe()} broke: ${(error as Error).message}`, "stream_broken");
    }
  }

  async #send(
    method: string,
    path: string,
    {
      body,
      accept,
      signal,
      headers: extra = {},
    }: { body?: unknown; accept: string; signal?: AbortSignal; headers?: Record<string, string> },
  ): Promise<Response> {
    const headers: Record<string, string> = { accept, ...extra };
    if (body !== undefined) headers["content-type"] = "application/json";
    const payload = body === undefined ? undefined : JSON.stringify(body);
    try {
      if (this.#target.kind === "unix") {
        return await fetch(`http://engine${path}`, { method, headers, body: payload, signal, unix: this.#target.socket });
      }
      if (this.#target.token) headers.authorization = `Bearer ${this.#target.token}`;
      return await fetch(`${this.#target.base}${path}`, { method, headers, body: payload, signal });
    } catch (error) {
      throw new CliError(
        `cannot reach the engine at ${this.describe()}: is \`engine serve\` running? (${(error as Error).message})`,
        "daemon_not_running",
      );
    }
  }
}

/** ServerSentEvent is one event of a text/event-stream: its name ("message" when unnamed), data and id, if it has one. */
export interface ServerSentEvent {
  event: string;
  data: string;
  id?: string;
}

/** parseEvent reads one event block; it returns null for a block of comments only. */
function parseEvent(block: string): ServerSentEvent | null {
  let event = "message";
  let id: string | undefined;
  const data: string[] = [];
  for (const line of block.split("\n")) {
    if (line === "" || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") event = value;
    else if (field === "data") data.push(value);
    else if (field === "id" && !value.includes("\0")) id = value;
  }
  if (data.length === 0) return null;
  return id === undefined ? { event, data: data.join("\n") } : { event, data: data.join("\n"), id };
}

/** errorOf turns an error answer (the error envelope or a 422 detail list) into a CliError. */
function errorOf(status: number, parsed: unknown): CliError {
  const envelope = parsed as { error?: { code: string; message: string }; detail?: ErrorDetail[] } | undefined;
  if (envelope?.error) return new CliError(envelope.error.message, envelope.error.code);
  if (envelope?.detail) {
    return new CliError(
      envelope.detail.map((d) => `${d.loc.slice(1).join(".") || d.loc.join(".")}: ${d.msg}`).join("; "),
      "validation",
      envelope.detail,
    );
  }
  return new CliError(`the engine answered ${status}`);
}
