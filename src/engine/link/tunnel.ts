import { Value } from "@sinclair/typebox/value";
import {
  ConsoleMessage,
  type RelayAssertion,
  type RelayTool,
  type ReportedGpu,
  TUNNEL_CLOSE,
  TUNNEL_PATH,
  TUNNEL_PROTOCOL,
  type TunnelCall,
  type TunnelCallResult,
  type TunnelHello,
  type TunnelVcsToken,
} from "../../contract/relay";
import { type Clock, iso, systemClock } from "../../lib/clock";
import type { Logger } from "../../lib/logger";
import { VERSION } from "../../lib/version";
import type { Principal } from "../auth";
import type { IdentityStore, LinkedNode } from "./identity";

/** TUNNEL_HEARTBEAT_MS is how often a connected engine pings its console. */
export const TUNNEL_HEARTBEAT_MS = 15_000;
/** TUNNEL_DEAD_AFTER_MS is how long without any frame from the console (a pong, a message) before the tunnel is given up as dead. */
export const TUNNEL_DEAD_AFTER_MS = 45_000;
/** TUNNEL_BACKOFF bounds the wait between attempts: doubling from baseMs up to maxMs, jittered. */
export const TUNNEL_BACKOFF = { baseMs: 1_000, maxMs: 60_000 } as const;
/** TUNNEL_STABLE_MS is how long a tunnel must have been up for the next failure to start the backoff over. */
export const TUNNEL_STABLE_MS = 30_000;
/** TUNNEL_UNLINKED_POLL_MS is how often an unlinked engine looks for an identity (`engine link` writes it while the daemon runs). */
export const TUNNEL_UNLINKED_POLL_MS = 5_000;
/** MAX_CONCURRENT_CALLS bounds the relayed calls one tunnel runs at once; more are refused as busy. */
const MAX_CONCURRENT_CALLS = 32;

/**
 * TunnelState is where the tunnel is (docs/state-machines.md): `not_linked` (no identity),
 * `connecting` (the socket is opening, or the hello is unanswered), `connected` (the console
 * welcomed this node), `disconnected` (waiting out the backoff before the next attempt),
 * `stopped` (the daemon is stopping).
 */
export type TunnelState = "not_linked" | "connecting" | "connected" | "disconnected" | "stopped";

/** TunnelStatus is what `engine link status`, GET /api/link/status and the UI show of the tunnel. */
export interface TunnelStatus {
  state: TunnelState;
  /** since is when the tunnel entered this state. */
  since: string;
  /** url is the console's tunnel endpoint; null when not linked. */
  url: string | null;
  /** connected_at is when the current tunnel was welcomed; null unless connected. */
  connected_at: string | null;
  last_error: string | null;
  last_error_at: string | null;
  /** next_attempt_at is when a disconnected tunnel tries again. */
  next_attempt_at: string | null;
  /** failures counts the attempts that failed since the tunnel was last stable. */
  failures: number;
}

/** TunnelHandlers are what the daemon answers over the tunnel with; the link module itself knows no MCP and no API. */
export interface TunnelHandlers {
  /** tools lists the engine's MCP tools, as its MCP server lists them. */
  tools(): Promise<RelayTool[]>;
  /** gpus summarizes the GPU inventory for the console's node list. */
  gpus(): ReportedGpu[];
  /** call runs one relayed tool call for the node `node`; it answers the tool's result or why it did not run. */
  call(node: LinkedNode, message: TunnelCall): Promise<Omit<TunnelCallResult, "type" | "id">>;
  /** vcsToken applies a pushed code-host token as PUT /api/link/vcs-token would, and answers that route's status and body. */
  vcsToken(message: TunnelVcsToken): Promise<{ status: number; body: unknown }>;
}

/** TunnelSocket is the part of the WebSocket the client uses (Bun's client; tests may replace it). */
export type TunnelSocket = Pick<WebSocket, "send" | "close" | "readyState" | "addEventListener"> & {
  ping(data?: string): void;
  terminate(): void;
};

export interface TunnelClientOptions {
  identity: IdentityStore;
  handlers: TunnelHandlers;
  log: Logger;
  clock?: Clock;
  heartbeatMs?: number;
  deadAfterMs?: number;
  backoff?: { baseMs: number; maxMs: number };
  stableMs?: number;
  unlinkedPollMs?: number;
  /** random replaces Math.random for the jitter (tests). */
  random?: () => number;
  /** open replaces Bun's WebSocket client (tests). */
  open?: (url: string, headers: Record<string, string>) => TunnelSocket;
}

/**
 * backoffDelay is the wait before attempt `failures + 1`: `baseMs · 2^(failures-1)`, capped at
 * `maxMs`, then jittered into its upper half ("equal jitter"), so engines that lost the same
 * console at once do not come back in step, and none waits less than half the step.
 */
export function backoffDelay(failures: number, backoff: { baseMs: number; maxMs: number }, random: () => number): number {
  const step = Math.min(backoff.maxMs, backoff.baseMs * 2 ** Math.max(0, failures - 1));
  return Math.round(step / 2 + (step / 2) * Math.min(1, Math.max(0, random())));
}

/** tunnelUrl is the console's tunnel endpoint for a cloud URL: ws(s) for http(s), the same host and path prefix. */
export function tunnelUrl(cloudUrl: string): string {
  return `${cloudUrl.replace(/^http/, "ws")}${TUNNEL_PATH}`;
}

/**
 * describeHandshakeFailure turns a failed WebSocket handshake into the reason a user acts on.
 * Bun's client reports the console's HTTP status in the error's message ("Expected 101 status
 * code: 401").
 */
export function describeHandshakeFailure(message: string, cloudUrl: string): string {
  const status = /status code: (\d{3})/.exec(message)?.[1];
  if (status === "401" || status === "403") {
    return `the console at ${cloudUrl} refused this machine's node credential (${status}): the node was removed there or linked again from another machine; run \`engine link --force\` to link this one again`;
  }
  if (status === "404") return `the console at ${cloudUrl} has no tunnel endpoint (404): it predates the relay`;
  if (status) return `the console at ${cloudUrl} answered ${status} instead of opening the tunnel`;
  return `cannot reach the console at ${cloudUrl}${message ? ` (${message})` : ""}`;
}

/** describeClose says why an open tunnel closed, from its close code. */
function describeClose(code: number, reason: string): string {
  switch (code) {
    case TUNNEL_CLOSE.replaced:
      return "the console closed this tunnel: the same node opened another one (is this identity copied to another machine?)";
    case TUNNEL_CLOSE.protocolError:
      return `the console closed this tunnel: protocol error${reason ? ` (${reason})` : ""}`;
    case 1001:
      return "the console went away (restarting or stopping)";
    case 1000:
      return `the console closed the tunnel${reason ? `: ${reason}` : ""}`;
    default:
      return `the tunnel closed (${code}${reason ? `: ${reason}` : ""})`;
  }
}

/** openTunnelSocket opens the tunnel's WebSocket with Bun's client, which takes headers (the browser's API does not). */
export function openTunnelSocket(url: string, headers: Record<string, string>): TunnelSocket {
  return new WebSocket(url, { headers } as unknown as string[]) as unknown as TunnelSocket;
}

interface Attempt {
  welcomedAt: number | null;
  error: string;
}

/**
 * TunnelClient keeps a linked engine's one outbound WebSocket to its console (the relay,
 * docs/decisions.md 240 onwards). It authenticates with the node credential (`Authorization:
 * Bearer enc_…` on the upgrade), says hello (version, GPUs, MCP tools), then serves the
 * console's requests: relayed tool calls and code-host token pushes.
 *
 * Liveness: a WebSocket ping every `heartbeatMs`; any frame from the console (its pong
 * included) proves it alive, and none for `deadAfterMs` ends the tunnel as dead, since a
 * console that vanished without a FIN would otherwise look connected for hours. Every attempt
 * that fails or ends waits `backoffDelay(failures)` (1 s doubling to 60 s, jittered); a tunnel
 * that stayed up `stableMs` starts the count over. The identity is read at each attempt and each
 * heartbeat, so `engine link` and `engine unlink` take effect while the daemon runs.
 *
 * start() and stop() follow the modules' lifecycle; stop() closes the tunnel with 1001.
 */
export class TunnelClient {
  readonly #o: Required<Omit<TunnelClientOptions, "open" | "clock">> & Pick<TunnelClientOptions, "open">;
  readonly #clock: Clock;
  #status: TunnelStatus;
  #stopped = true;
  #loop: Promise<void> | undefined;
  #wake: (() => void) | undefined;
  #endAttempt: ((error: string) => void) | undefined;
  #inFlight = 0;
  #tools: RelayTool[] | undefined;

  constructor(options: TunnelClientOptions) {
    this.#o = {
      heartbeatMs: TUNNEL_HEARTBEAT_MS,
      deadAfterMs: TUNNEL_DEAD_AFTER_MS,
      backoff: TUNNEL_BACKOFF,
      stableMs: TUNNEL_STABLE_MS,
      unlinkedPollMs: TUNNEL_UNLINKED_POLL_MS,
      random: Math.random,
      ...options,
    };
    this.#clock = options.clock ?? systemClock;
    this.#status = this.#fresh("not_linked", null);
  }

  /** status is the tunnel's state now. */
  status(): TunnelStatus {
    return { ...this.#status };
  }

  /** start begins connecting (in the background) and returns at once. */
  start(): void {
    if (!this.#stopped) return;
    this.#stopped = false;
    this.#loop = this.#run();
  }

  /** stop closes the tunnel (1001, going away) and ends the loop; it is safe after a partial start and twice. */
  async stop(): Promise<void> {
    this.#stopped = true;
    this.#endAttempt?.("the engine is stopping");
    this.#wake?.();
    await this.#loop;
    this.#loop = undefined;
    this.#set({ state: "stopped" });
  }

  /** reconnectNow ends the wait before the next attempt (a test, or `engine link` having just written an identity). */
  reconnectNow(): void {
    this.#wake?.();
  }

  async #run(): Promise<void> {
    while (!this.#stopped) {
      let node: LinkedNode | null;
      try {
        node = this.#o.identity.readLinked();
      } catch (error) {
        this.#fail((error as Error).message, 0);
        await this.#sleep(this.#o.unlinkedPollMs);
        continue;
      }
      if (!node) {
        if (this.#status.state !== "not_linked") this.#status = this.#fresh("not_linked", null);
        await this.#sleep(this.#o.unlinkedPollMs);
        continue;
      }
      const url = tunnelUrl(node.cloud_url);
      this.#set({ state: "connecting", url, connected_at: null, next_attempt_at: null });
      const attempt = await this.#attempt(node, url);
      if (this.#stopped) break;
      const stable = attempt.welcomedAt !== null && Date.now() - attempt.welcomedAt >= this.#o.stableMs;
      const failures = stable ? 1 : this.#status.failures + 1;
      const delay = backoffDelay(failures, this.#o.backoff, this.#o.random);
      this.#fail(attempt.error, delay, failures);
      this.#o.log.warn(
        { cloud_url: node.cloud_url, node_id: node.node_id, retry_in_ms: delay, failures },
        `link tunnel: ${attempt.error}; retrying`,
      );
      await this.#sleep(delay);
    }
  }

  /** #attempt opens one tunnel and resolves when it ends, with why it ended. */
  #attempt(node: LinkedNode, url: string): Promise<Attempt> {
    return new Promise<Attempt>((resolve) => {
      let welcomedAt: number | null = null;
      let lastFrame = Date.now();
      let error: string | undefined;
      let heartbeat: ReturnType<typeof setInterval> | undefined;
      let handshake: ReturnType<typeof setTimeout> | undefined;
      let ended = false;
      let lastGpus = "";
      const end = (reason: string, close?: { code: number; reason: string }) => {
        if (ended) return;
        ended = true;
        if (heartbeat) clearInterval(heartbeat);
        if (handshake) clearTimeout(handshake);
        this.#endAttempt = undefined;
        try {
          if (close) socket?.close(close.code, close.reason);
          else socket?.terminate();
        } catch {
          // already closed
        }
        resolve({ welcomedAt, error: error ?? reason });
      };
      let socket: TunnelSocket | undefined;
      try {
        socket = (this.#o.open ?? openTunnelSocket)(url, {
          authorization: `Bearer ${node.node_credential}`,
          "user-agent": `engine/${VERSION}`,
        });
      } catch (failure) {
        end(`cannot open the tunnel to ${url}: ${(failure as Error).message}`);
        return;
      }
      this.#endAttempt = (reason) => end(reason, { code: 1001, reason });
      // A handshake nobody answers (a partition after the TCP connect: the upgrade's answer never
      // comes, and neither does an error or a close) is given up as a silent tunnel is, after
      // deadAfterMs, and the next attempt follows the backoff; without it the client waited for ever.
      handshake = setTimeout(() => {
        error ??= `no answer from the console to the tunnel's handshake in ${Math.round(this.#o.deadAfterMs / 1000)} s`;
        end(error);
      }, this.#o.deadAfterMs);
      const send = (message: object) => {
        if (!ended && socket?.readyState === 1) socket.send(JSON.stringify(message));
      };
      socket.addEventListener("open", () => {
        clearTimeout(handshake);
        lastFrame = Date.now();
        void (async () => {
          let tools: RelayTool[] = [];
          try {
            this.#tools ??= await this.#o.handlers.tools();
            tools = this.#tools;
          } catch (failure) {
            this.#o.log.warn({ err: (failure as Error).message }, "link tunnel: cannot list the MCP tools; saying hello without them");
          }
          const gpus = this.#o.handlers.gpus();
          lastGpus = JSON.stringify(gpus);
          const hello: TunnelHello = { type: "hello", protocol: TUNNEL_PROTOCOL, version: VERSION, gpus, tools };
          send(hello);
        })();
        heartbeat = setInterval(() => {
          if (Date.now() - lastFrame > this.#o.deadAfterMs) {
            error = `no answer from the console for ${Math.round((Date.now() - lastFrame) / 1000)} s (heartbeats unanswered)`;
            end(error);
            return;
          }
          if (!this.#sameNode(node)) {
            end("the node identity changed (unlinked or linked anew)", { code: TUNNEL_CLOSE.unlinked, reason: "identity changed" });
            return;
          }
          try {
            socket?.ping();
          } catch {
            // the close event follows
          }
          if (welcomedAt !== null) {
            const gpus = this.#o.handlers.gpus();
            const now = JSON.stringify(gpus);
            if (now !== lastGpus) {
              lastGpus = now;
              send({ type: "report", gpus });
            }
          }
        }, this.#o.heartbeatMs);
      });
      socket.addEventListener("pong", () => {
        lastFrame = Date.now();
      });
      socket.addEventListener("ping", () => {
        lastFrame = Date.now();
      });
      socket.addEventListener("message", (event: MessageEvent) => {
        lastFrame = Date.now();
        let message: ConsoleMessage;
        try {
          const parsed = JSON.parse(String(event.data));
          if (!Value.Check(ConsoleMessage, parsed)) throw new Error("not a console message");
          message = parsed;
        } catch (failure) {
          error = `the console sent a message this engine does not understand (${(failure as Error).message})`;
          end(error, { code: TUNNEL_CLOSE.protocolError, reason: "unreadable message" });
          return;
        }
        if (message.type === "welcome") {
          if (message.node_id !== node.node_id) {
            error = `the console welcomed node ${message.node_id}, not this machine's ${node.node_id}`;
            end(error, { code: TUNNEL_CLOSE.protocolError, reason: "wrong node" });
            return;
          }
          welcomedAt = Date.now();
          this.#set({ state: "connected", url, connected_at: iso(this.#clock.now()), failures: this.#status.failures });
          this.#o.log.info({ cloud_url: node.cloud_url, node_id: node.node_id, slug: node.slug }, "link tunnel: connected");
          return;
        }
        if (message.type === "call") {
          void this.#serveCall(node, message, send);
          return;
        }
        void this.#o.handlers
          .vcsToken(message)
          .catch((failure) => ({ status: 500, body: { error: { code: "internal", message: (failure as Error).message } } }))
          .then((answer) => send({ type: "vcs_token_result", id: message.id, status: answer.status, body: answer.body }));
      });
      socket.addEventListener("error", (event: Event) => {
        const message = (event as ErrorEvent).message ?? "";
        error ??= welcomedAt === null ? describeHandshakeFailure(message, node.cloud_url) : `the tunnel failed: ${message}`;
      });
      socket.addEventListener("close", (event: CloseEvent) => {
        end(describeClose(event.code, event.reason));
      });
    });
  }

  async #serveCall(node: LinkedNode, message: TunnelCall, send: (message: object) => void): Promise<void> {
    if (this.#inFlight >= MAX_CONCURRENT_CALLS) {
      send({
        type: "call_result",
        id: message.id,
        error: { code: "busy", message: `the machine is already running ${MAX_CONCURRENT_CALLS} relayed calls; try again` },
      });
      return;
    }
    this.#inFlight += 1;
    try {
      const answer = await this.#o.handlers.call(node, message);
      send({ type: "call_result", id: message.id, ...answer });
    } catch (failure) {
      this.#o.log.error({ err: failure, tool: message.tool }, "link tunnel: a relayed call failed");
      send({ type: "call_result", id: message.id, error: { code: "internal", message: (failure as Error).message } });
    } finally {
      this.#inFlight -= 1;
    }
  }

  /** #sameNode says whether the identity on disk is still the node this tunnel authenticated as. */
  #sameNode(node: LinkedNode): boolean {
    try {
      return this.#o.identity.read()?.node_id === node.node_id;
    } catch {
      return false;
    }
  }

  #sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      if (this.#stopped) return resolve();
      const timer = setTimeout(() => {
        this.#wake = undefined;
        resolve();
      }, ms);
      this.#wake = () => {
        clearTimeout(timer);
        this.#wake = undefined;
        resolve();
      };
    });
  }

  #fail(error: string, delayMs: number, failures = this.#status.failures): void {
    const now = this.#clock.now();
    this.#set({
      state: "disconnected",
      connected_at: null,
      last_error: error,
      last_error_at: iso(now),
      next_attempt_at: iso(new Date(now.getTime() + delayMs)),
      failures,
    });
  }

  #set(changes: Partial<TunnelStatus>): void {
    const state = changes.state ?? this.#status.state;
    const since = state === this.#status.state ? this.#status.since : iso(this.#clock.now());
    this.#status = { ...this.#status, ...changes, state, since };
  }

  #fresh(state: TunnelState, url: string | null): TunnelStatus {
    return {
      state,
      since: iso(this.#clock.now()),
      url,
      connected_at: null,
      last_error: null,
      last_error_at: null,
      next_attempt_at: null,
      failures: 0,
    };
  }
}

/** assistantRoleOf maps granted scopes to the engine role a relayed call runs with: never admin. */
export function assistantRoleOf(scopes: readonly string[]): "submitter" | "readonly" {
  return scopes.includes("engine:operate") ? "submitter" : "readonly";
}

/**
 * assistantPrincipal is who a relayed call runs as: `engine:operate` → submitter (deploy and
 * operate services; never tokens, restarts of the daemon or other admin routes), `engine:read`
 * → readonly. No caps and no service scope: consent is per machine. Its name says which
 * assistant and which consent, and is what a deploy records as its owner.
 */
export function assistantPrincipal(assertion: RelayAssertion): Principal {
  let client = assertion.client_id;
  try {
    client = new URL(assertion.client_id).host || client;
  } catch {
    // a registered client id, not a URL: shown as it is
  }
  return {
    kind: "assistant",
    tokenId: null,
    name: `assistant ${client.slice(0, 100)} (grant ${assertion.grant_id.slice(0, 64)})`,
    role: assistantRoleOf(assertion.scopes),
    maxGpus: null,
    maxConcurrentJobs: null,
    scopeServices: [],
  };
}

/** AssertionRefusal says why the engine will not run a relayed call. */
export type AssertionRefusal = { code: "assertion_refused"; message: string };

/** KNOWN_SCOPES are the scopes an assertion may carry (the console's ASSISTANT_SCOPES). */
const KNOWN_SCOPES = new Set(["engine:read", "engine:operate"]);

/**
 * checkAssertion accepts a relayed call's assertion only when it names this engine's own
 * account and node, carries known scopes, and has not expired; a console (or a tunnel
 * reaching the wrong machine) cannot make an engine act for someone else's consent.
 */
export function checkAssertion(
  assertion: RelayAssertion,
  node: Pick<LinkedNode, "account_id" | "node_id">,
  now: Date,
): AssertionRefusal | null {
  if (assertion.account_id !== node.account_id) {
    return { code: "assertion_refused", message: `the call names account ${assertion.account_id}, not this machine's account` };
  }
  if (assertion.node_id !== node.node_id) {
    return { code: "assertion_refused", message: `the call names node ${assertion.node_id}, not this machine (${node.node_id})` };
  }
  const unknown = assertion.scopes.filter((scope) => !KNOWN_SCOPES.has(scope));
  if (unknown.length > 0) return { code: "assertion_refused", message: `unknown scopes: ${unknown.join(", ")}` };
  const expires = Date.parse(assertion.expires_at);
  if (Number.isNaN(expires) || expires <= now.getTime()) {
    return { code: "assertion_refused", message: "the assistant's authorization has expired" };
  }
  return null;
}
