import { randomBytes } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { CloudConfigInput } from "../../../src/cloud/config";
import type { Dialect } from "../../../src/cloud/db";
import { assistantRoutes, s256 } from "../../../src/cloud/oauth";
import { consolePages } from "../../../src/cloud/ui";
import { createLogger } from "../../../src/lib/logger";
import { tempDir } from "../../helpers";
import { removeAfterRun } from "../../run-dirs";
import { startTestCloud, type TestCloud } from "../helpers";

/** ManualClock is time that moves only when a test moves it. */
export class ManualClock {
  #now = Date.now();
  readonly read = (): number => this.#now;
  advance(ms: number): void {
    this.#now += ms;
  }
}

/** Pkce is a verifier and its S256 challenge. */
export interface Pkce {
  verifier: string;
  challenge: string;
}

export function pkce(): Pkce {
  const verifier = randomBytes(32).toString("base64url");
  return { verifier, challenge: s256(verifier) };
}

/** Answer is a raw HTTP answer: status, Location, body text, headers. */
export interface Answer {
  status: number;
  location: string | null;
  text: string;
  headers: Headers;
  // biome-ignore lint/suspicious/noExplicitAny: tests read whichever fields they assert on.
  json: any;
}

async function answerOf(response: Response): Promise<Answer> {
  const text = await response.text();
  let json: unknown = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    // not JSON
  }
  return { status: response.status, location: response.headers.get("location"), text, headers: response.headers, json };
}

/** AssistantDriver drives a console's authorization server as an assistant would. */
export interface AssistantDriver {
  cloud: TestCloud;
  /** mcpUrl is the console's MCP URL: the resource its tokens are issued for. */
  mcpUrl: string;
  /** source returns a fresh client address, so tests do not share rate-limit buckets. */
  source(): string;
  /** authorize sends GET /oauth/authorize with these parameters (no redirect followed). */
  authorize(params: Record<string, string | string[]>): Promise<Answer>;
  /** form posts a form to an OAuth endpoint. */
  form(path: string, fields: Record<string, string | string[]>, headers?: Record<string, string>): Promise<Answer>;
  /** registerClient registers a client dynamically and returns its id. */
  registerClient(body: Record<string, unknown>): Promise<Answer>;
}

/** AssistantCloud is a console with the authorization server on a manual clock, and helpers to drive it as an assistant would. */
export interface AssistantCloud extends AssistantDriver {
  clock: ManualClock;
  /** logDir holds the console's log file (written at debug level). */
  logDir: string;
  /** logText is everything the console logged so far. */
  logText(): string;
  close(): Promise<void>;
}

let sources = 0;

/**
 * startAssistantCloud starts a console with the authorization server on a manual clock, metadata
 * documents admitted from loopback (ENGINE_CLOUD_CIMD_ALLOW_LOOPBACK's setting), logs at debug
 * level in a file the test can read, and 127.0.0.1 trusted as a proxy so each test can speak
 * from its own address.
 */
export async function startAssistantCloud(dialect: Dialect, input: CloudConfigInput = {}): Promise<AssistantCloud> {
  const clock = new ManualClock();
  const logDir = removeAfterRun(tempDir("engine-oauth-log-"));
  const { log } = createLogger({ level: "debug", dataDir: logDir, stdout: false, fileName: "cloud.log" });
  const cloud = await startTestCloud(
    dialect,
    { trustedProxies: "127.0.0.1", cimdAllowLoopback: true, ...input },
    { log, modules: [(deps) => assistantRoutes(deps, { clock: clock.read }), consolePages] },
  );
  return {
    ...assistantDriver(cloud),
    clock,
    logDir,
    logText() {
      return readdirSync(logDir)
        .map((name) => readFileSync(join(logDir, name), "utf8"))
        .join("\n");
    },
    async close() {
      await cloud.close();
    },
  };
}

/**
 * assistantDriver drives any test console's authorization server as an assistant would. Each
 * request says it comes from an address of its own (X-Forwarded-For, believed where the console
 * trusts 127.0.0.1 as a proxy), so tests do not share rate-limit buckets.
 */
export function assistantDriver(cloud: TestCloud): AssistantDriver {
  const source = () => {
    sources += 1;
    return `10.77.${(sources >> 8) & 255}.${sources & 255}`;
  };
  const toQuery = (params: Record<string, string | string[]>) => {
    const query = new URLSearchParams();
    for (const [name, value] of Object.entries(params)) for (const one of Array.isArray(value) ? value : [value]) query.append(name, one);
    return query;
  };
  return {
    cloud,
    mcpUrl: `${cloud.deps.site.publicUrl}/mcp`,
    source,
    async authorize(params) {
      return answerOf(
        await fetch(`${cloud.url}/oauth/authorize?${toQuery(params)}`, { redirect: "manual", headers: { "x-forwarded-for": source() } }),
      );
    },
    async form(path, fields, headers = {}) {
      return answerOf(
        await fetch(`${cloud.url}${path}`, {
          method: "POST",
          redirect: "manual",
          headers: { "content-type": "application/x-www-form-urlencoded", "x-forwarded-for": source(), ...headers },
          body: toQuery(fields).toString(),
        }),
      );
    },
    async registerClient(body) {
      return answerOf(
        await fetch(`${cloud.url}/oauth/register`, {
          method: "POST",
          headers: { "content-type": "application/json", "x-forwarded-for": source() },
          body: JSON.stringify(body),
        }),
      );
    },
  };
}

/** Authorized is a completed consent: the tokens and what led to them. */
export interface Authorized {
  rid: string;
  code: string;
  redirectTo: string;
  pkce: Pkce;
  // biome-ignore lint/suspicious/noExplicitAny: the token endpoint's answer, read loosely.
  tokens: any;
}

/**
 * ridOf reads the pending request's rid from the authorization endpoint's redirect to the
 * consent page, failing loudly on anything else.
 */
export function ridOf(answer: Answer): string {
  if (answer.status !== 302 || !answer.location?.startsWith("/oauth/authorize?rid=")) {
    throw new Error(`expected a redirect to the consent page, got ${answer.status} ${answer.location} ${answer.text.slice(0, 300)}`);
  }
  return new URL(answer.location, "http://x").searchParams.get("rid") as string;
}

/** Flow drives one authorization as a client and a person would, step by step. */
export interface FlowOptions {
  clientId: string;
  redirectUri: string;
  scope?: string;
  /** decision is what the person sends (rid added); default approve with read. */
  decision?: Record<string, unknown>;
  state?: string;
}

/** consent starts an authorization, approves (or decides) it as `token`'s account, and returns the code. */
export async function consent(
  ac: AssistantDriver,
  sessionToken: string,
  options: FlowOptions,
): Promise<{ rid: string; code: string | null; redirectTo: string; pkce: Pkce }> {
  const p = pkce();
  const rid = ridOf(
    await ac.authorize({
      response_type: "code",
      client_id: options.clientId,
      redirect_uri: options.redirectUri,
      code_challenge: p.challenge,
      code_challenge_method: "S256",
      state: options.state ?? "st-1",
      resource: ac.mcpUrl,
      ...(options.scope ? { scope: options.scope } : {}),
    }),
  );
  const decided = await ac.cloud.api("POST", "/api/oauth/authorize/decision", {
    token: sessionToken,
    body: { rid, approve: true, ...options.decision },
  });
  if (decided.status !== 200) throw new Error(`decision answered ${decided.status}: ${JSON.stringify(decided.body)}`);
  const redirectTo = decided.body.redirect_to as string;
  return { rid, code: new URL(redirectTo).searchParams.get("code"), redirectTo, pkce: p };
}

/** authorized runs consent and exchanges the code, returning the token answer. */
export async function authorized(ac: AssistantDriver, sessionToken: string, options: FlowOptions): Promise<Authorized> {
  const { rid, code, redirectTo, pkce: p } = await consent(ac, sessionToken, options);
  const exchanged = await ac.form("/oauth/token", {
    grant_type: "authorization_code",
    code: code as string,
    code_verifier: p.verifier,
    client_id: options.clientId,
    redirect_uri: options.redirectUri,
    resource: ac.mcpUrl,
  });
  if (exchanged.status !== 200) throw new Error(`token answered ${exchanged.status}: ${exchanged.text}`);
  return { rid, code: code as string, redirectTo, pkce: p, tokens: exchanged.json };
}

/** CLAUDE is the pre-registered Claude client and its callback. */
export const CLAUDE = { clientId: "engine-claude", redirectUri: "https://claude.ai/api/mcp/auth_callback" };

/** DocumentServer serves client metadata documents on loopback, counting fetches per path. */
export interface DocumentServer {
  url(path: string): string;
  /** serve sets what a path answers: a body (an object is JSON) and headers. */
  serve(path: string, body: unknown, init?: { status?: number; headers?: Record<string, string> }): void;
  hits(path: string): number;
  close(): void;
}

export function startDocumentServer(): DocumentServer {
  const routes = new Map<string, { body: string; status: number; headers: Record<string, string> }>();
  const hits = new Map<string, number>();
  const server = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    fetch(request) {
      const path = new URL(request.url).pathname;
      hits.set(path, (hits.get(path) ?? 0) + 1);
      const route = routes.get(path);
      if (!route) return new Response("not found", { status: 404 });
      return new Response(route.body, { status: route.status, headers: route.headers });
    },
  });
  return {
    url: (path) => `http://127.0.0.1:${server.port}${path}`,
    serve(path, body, init = {}) {
      routes.set(path, {
        body: typeof body === "string" ? body : JSON.stringify(body),
        status: init.status ?? 200,
        headers: { "content-type": "application/json", ...init.headers },
      });
    },
    hits: (path) => hits.get(path) ?? 0,
    close: () => server.stop(true),
  };
}
