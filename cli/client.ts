import { existsSync } from "node:fs";
import { join } from "node:path";
import { readAdminTokenFile } from "../src/engine/auth";
import { defaultDataDir } from "../src/lib/config";

/** CliError is a user-facing failure: printed as one line, never with a stack trace. */
export class CliError extends Error {
  constructor(
    message: string,
    readonly code = "error",
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
    const headers: Record<string, string> = { accept: "application/json" };
    if (body !== undefined) headers["content-type"] = "application/json";
    let response: Response;
    try {
      if (this.#target.kind === "unix") {
        response = await fetch(`http://engine${path}`, {
          method,
          headers,
          body: body === undefined ? undefined : JSON.stringify(body),
          unix: this.#target.socket,
        });
      } else {
        if (this.#target.token) headers.authorization = `Bearer ${this.#target.token}`;
        response = await fetch(`${this.#target.base}${path}`, {
          method,
          headers,
          body: body === undefined ? undefined : JSON.stringify(body),
        });
      }
    } catch (error) {
      throw new CliError(
        `cannot reach the engine at ${this.describe()}: is \`engine serve\` running? (${(error as Error).message})`,
        "daemon_not_running",
      );
    }
    const text = await response.text();
    let parsed: unknown;
    try {
      parsed = text.length > 0 ? JSON.parse(text) : undefined;
    } catch {
      throw new CliError(`the engine answered ${response.status} with a body that is not JSON`);
    }
    if (response.ok) return parsed as T;
    const envelope = parsed as { error?: { code: string; message: string }; detail?: { loc: unknown[]; msg: string }[] };
    if (envelope?.error) throw new CliError(envelope.error.message, envelope.error.code);
    if (envelope?.detail) {
      throw new CliError(envelope.detail.map((d) => `${d.loc.slice(1).join(".") || d.loc.join(".")}: ${d.msg}`).join("; "), "validation");
    }
    throw new CliError(`the engine answered ${response.status}`);
  }
}
