import type { Socket, SocketHandler } from "bun";
import {
  type BodyFraming,
  ChunkedDecoder,
  type Forwarding,
  fieldValue,
  headBuffer,
  isIdempotent,
  type LocalAnswer,
  MAX_HEAD_BYTES,
  parseRequestHead,
  parseResponseHead,
  type RequestHead,
  type ResponseHead,
  responseFramingKind,
  serializeAnswer,
  serializeResponseHead,
  writeRequestHead,
} from "./http1";
import { ProxyMeter } from "./meter";
import { hostOf } from "./names";
import { type Bytes, join, Outbox, wire } from "./outbox";
import { errorPage } from "./pages";
import { Router } from "./router";
import type { RouteEntry } from "./snapshot";
import { type UpstreamConnection, type UpstreamOwner, UpstreamPool, upstreamTarget } from "./upstream-pool";

const CHALLENGE_PREFIX = "/.well-known/acme-challenge/";

/** CLIENT_IDLE_MS closes a client connection that has no request in flight for that long (as Bun.serve's idleTimeout did). */
const CLIENT_IDLE_MS = 120_000;
/** CLOSING_GRACE_MS is how long a connection the proxy is closing may take to read its last bytes. */
const CLOSING_GRACE_MS = 30_000;
/** CONNECT_TIMEOUT_MS bounds a connect to an upstream (504 beyond it). */
export const CONNECT_TIMEOUT_MS = 10_000;
/**
 * HEADER_TIMEOUT_MS bounds the wait for a response head once the request is sent (504 beyond
 * it). It is long because a model may think for minutes before its first byte; once the head
 * has come, a response may stay quiet for as long as it likes (SSE, token streams).
 */
export const HEADER_TIMEOUT_MS = 300_000;
/**
 * STOPPING_IDLE_MS is how long a kept-alive connection may sit idle once its proxy process is
 * retired (a restart's new processes serve the port). Closing an idle connection at once races
 * a client that sends its next request on it at that moment, which then fails; meanwhile the
 * next request is answered with `Connection: close` instead, and the client's following one
 * opens a connection to a new process (docs/decisions.md 367).
 */
const STOPPING_IDLE_MS = 1000;
/** SWEEP_MS is the resolution of the timeouts above. */
const SWEEP_MS = 1000;

const CONTINUE = Buffer.from("HTTP/1.1 100 Continue\r\n\r\n", "latin1");

export type Scheme = "http" | "https";

/** ForwarderOptions is what the forwarder needs from its listener. */
export interface ForwarderOptions {
  /** maxBodyBytes bounds a request body: a larger Content-Length, or a chunked body growing past it, answers 413. */
  maxBodyBytes: number;
  /** httpsPort is where plain HTTP requests are redirected. */
  httpsPort: () => number;
  /** connectTimeoutMs overrides CONNECT_TIMEOUT_MS (tests). */
  connectTimeoutMs?: number;
  /** headerTimeoutMs overrides HEADER_TIMEOUT_MS (tests). */
  headerTimeoutMs?: number;
}

/** Decision is what the proxy does with a request: answer it itself (for a route, or none), or forward it on a route. */
type Decision = { kind: "answer"; answer: LocalAnswer; route?: RouteEntry } | { kind: "forward"; route: RouteEntry };

/** JOIN_BODY_BYTES is the most body bytes sent in one write with a request's head. */
const JOIN_BODY_BYTES = 16 * 1024;

/** EMPTY stands for forwarding fields not written yet. */
const EMPTY = Buffer.alloc(0);

/**
 * Forwarder is the proxy's HTTP/1.1 engine over raw sockets: it reads requests from client
 * connections, answers those it owns (ACME challenges, redirects, error pages) and forwards the
 * rest on pooled keep-alive upstream connections, streaming bodies both ways with backpressure
 * and turning a websocket handshake the upstream accepts into a byte tunnel. The listener binds
 * the ports and hands each accepted socket to `clientHandlers`.
 */
export class Forwarder {
  private router = new Router([]);
  private challenges: Record<string, string> = {};
  /** forwards holds one forward decision per route, so a forwarded request allocates none. */
  private forwards = new WeakMap<RouteEntry, Decision>();
  private readonly clients = new Set<ClientConnection>();
  private readonly sweeper: ReturnType<typeof setInterval>;
  private drained: (() => void) | null = null;
  readonly pool = new UpstreamPool({ maxIdlePerUpstream: 256, idleTimeoutMs: 4000 });
  /** meter counts every answered request for the daemon's /metrics (docs/decisions.md 335). */
  readonly meter = new ProxyMeter();
  /** now is a clock that ticks with the sweeper: timeouts need seconds, not a syscall per event. */
  now = Date.now();
  stopping = false;
  /** stoppingSince is when a graceful stop began: idle connections get STOPPING_IDLE_MS from then. */
  stoppingSince = 0;

  constructor(readonly options: ForwarderOptions) {
    this.sweeper = setInterval(() => this.sweep(), SWEEP_MS);
    this.sweeper.unref?.();
  }

  /** update takes a snapshot's routes and ACME answers; requests already forwarded keep their route. */
  update(router: Router, challenges: Record<string, string>): void {
    this.router = router;
    this.challenges = challenges;
  }

  /** clientHandlers are the socket handlers of one listener; every accepted socket gets a ClientConnection. */
  clientHandlers(scheme: Scheme): SocketHandler<ClientConnection> {
    return {
      open: (socket) => {
        const client = new ClientConnection(socket, this, scheme);
        socket.data = client;
        // One accepted while stopping (it was in the listener's queue) is served, and closed after its response.
        this.clients.add(client);
      },
      data: (socket, data) => socket.data.onData(data),
      drain: (socket) => socket.data.onDrain(),
      close: (socket) => {
        const client = socket.data;
        if (!client) return;
        client.onClose();
        this.clients.delete(client);
        if (this.drained && this.clients.size === 0) this.drained();
      },
      error: (socket, error) => {
        // A broken TLS session ends here too, and is the client's business; anything else is a
        // handler that threw, a bug worth a line on stderr. Either way the connection goes.
        if (!/SSL|TLS|ECONNRESET|EPIPE/i.test(`${(error as { code?: string }).code ?? ""} ${error.message}`)) {
          console.error(`engine proxy: connection handler failed: ${error.stack ?? error.message}`);
        }
        socket.data?.destroy();
      },
    };
  }

  /**
   * decide routes a request: on plain HTTP, ACME http-01 answers and `.localhost` names (which
   * are loopback by definition, and a secure context to browsers) are served and every other
   * name is redirected to HTTPS with a 308 (which keeps the method and body); then a name no
   * service holds is a 404 page, a service that is starting a 503 with Retry-After, one that is
   * down a 502, and the rest is forwarded.
   */
  decide(head: RequestHead, scheme: Scheme): Decision {
    const host = hostOf(head.host);
    const path = head.target;
    if (scheme === "http") {
      if (path.startsWith(CHALLENGE_PREFIX)) {
        const answer = this.challenges[path.slice(CHALLENGE_PREFIX.length)];
        return {
          kind: "answer",
          answer:
            answer === undefined
              ? { status: 404, headers: { "content-type": "text/plain;charset=utf-8" }, body: "no such ACME challenge\n" }
              : { status: 200, headers: { "content-type": "application/octet-stream" }, body: answer },
        };
      }
      if (!(host === "localhost" || host.endsWith(".localhost"))) {
        const httpsPort = this.options.httpsPort();
        const port = httpsPort === 443 ? "" : `:${httpsPort}`;
        return {
          kind: "answer",
          answer: { status: 308, headers: { location: `https://${host || "localhost"}${port}${path}` }, body: "" },
        };
      }
    }
    const route = this.router.match(host, path);
    if (!route) {
      return {
        kind: "answer",
        answer: errorPage(
          acceptOf(head),
          404,
          "No service here",
          `No service is routed at ${host || "this address"}. Check the name, or add it as a domain of a service.`,
        ),
      };
    }
    if (route.state === "starting") {
      return {
        kind: "answer",
        route,
        answer: errorPage(acceptOf(head), 503, "Service starting", `${route.service} is ${route.status}; try again in a few seconds.`, {
          "retry-after": String(route.retryAfterS),
        }),
      };
    }
    if (route.state === "down") {
      return {
        kind: "answer",
        route,
        answer: errorPage(
          acceptOf(head),
          502,
          "Service down",
          `${route.service} is ${route.status}. Start it, or see \`engine diagnose ${route.service}\`.`,
        ),
      };
    }
    let forward = this.forwards.get(route);
    if (forward === undefined) {
      forward = { kind: "forward", route };
      this.forwards.set(route, forward);
    }
    return forward;
  }

  private sweep(): void {
    const now = Date.now();
    this.now = now;
    for (const client of this.clients) client.checkTimeouts(now);
    this.pool.sweep(now);
  }

  /**
   * stop ends every client connection. Graceful: each request from now on is answered with
   * `Connection: close` and its connection closed after the response, a connection idle for
   * STOPPING_IDLE_MS closes, tunnels (websockets) run on until the process's own deadline; the
   * promise resolves when none is left. Otherwise every connection is closed at once.
   */
  stop(graceful: boolean): Promise<void> {
    this.stopping = true;
    this.stoppingSince = Date.now();
    if (!graceful) {
      clearInterval(this.sweeper);
      for (const client of [...this.clients]) client.destroy();
      this.pool.closeAll();
      return Promise.resolve();
    }
    this.pool.drain();
    if (this.clients.size === 0) return Promise.resolve();
    return new Promise((resolve) => {
      this.drained = resolve;
    });
  }
}

/** acceptOf is the request's Accept value, which chooses between an HTML and a text error page. */
function acceptOf(head: RequestHead): string | null {
  return fieldValue(head.text, "accept");
}

/**
 * ClientConnection is one connection from a client. It parses requests in order (a pipelined
 * request waits, buffered, until the response before it is written), runs one Exchange at a
 * time, and becomes a Tunnel after a websocket handshake.
 */
export class ClientConnection {
  /** input holds received bytes not yet consumed: a partial head, body bytes waiting for the upstream, pipelined requests. */
  input: Buffer | null = null;
  exchange: Exchange | null = null;
  tunnel: Tunnel | null = null;
  readonly out = new Outbox();
  /** closing is set once the connection is to close after what it is writing; no further request is read. */
  closing = false;
  closed = false;
  private paused = false;
  private closingSince = 0;
  lastActive: number;
  /** address is the client's IP address, read once: the socket's getter makes a new string each time. */
  readonly address: string;
  /** forwarding is what the requests of this connection are forwarded with (one object per connection, not per request). */
  readonly forwarding: Forwarding;

  constructor(
    readonly socket: Socket<ClientConnection>,
    readonly forwarder: Forwarder,
    readonly scheme: Scheme,
  ) {
    this.lastActive = forwarder.now;
    this.address = socket.remoteAddress;
    this.forwarding = { clientAddress: this.address, scheme, fields: { host: null, bytes: EMPTY } };
  }

  /** idle is true between requests: nothing in flight, nothing half-received. */
  get idle(): boolean {
    return this.exchange === null && this.tunnel === null && this.input === null;
  }

  onData(data: Buffer): void {
    this.lastActive = this.forwarder.now;
    if (this.tunnel) {
      this.tunnel.fromClient(data);
      return;
    }
    if (this.closing) return;
    this.input = this.input === null ? data : Buffer.concat([this.input, data]);
    this.pump();
  }

  /** pump reads what `input` holds: request heads, then body bytes for the exchange in flight. */
  pump(): void {
    while (this.input !== null && !this.closing) {
      const exchange = this.exchange;
      if (exchange !== null) {
        if (!exchange.requestDone) {
          exchange.pullBody();
          if (!exchange.requestDone || this.exchange !== exchange) return;
          continue;
        }
        // A pipelined request waits for the response before it; bound what is read meanwhile.
        if (this.input.length > MAX_HEAD_BYTES) this.pauseReading();
        return;
      }
      const parsed = parseRequestHead(this.input);
      if (parsed === null) return;
      if (!parsed.ok) {
        this.refuse(parsed.status, parsed.reason);
        return;
      }
      this.consume(parsed.length);
      this.begin(parsed, parsed.length);
    }
  }

  /** consume drops `length` bytes from the front of `input`. */
  consume(length: number): void {
    const input = this.input;
    if (input === null) return;
    this.input = length >= input.length ? null : input.subarray(length);
  }

  private begin(head: RequestHead, headBytes: number): void {
    const startedAt = performance.now();
    const decision = this.forwarder.decide(head, this.scheme);
    if (decision.kind === "answer") {
      this.answer(head, decision.answer, false, decision.route ?? null, headBytes, startedAt);
      return;
    }
    const max = this.forwarder.options.maxBodyBytes;
    if (head.framing.kind === "length" && head.framing.length > max) {
      this.answer(head, bodyTooLarge(head, max), true, decision.route, headBytes, startedAt);
      return;
    }
    const exchange = new Exchange(this, head, decision.route, headBytes, startedAt);
    this.exchange = exchange;
    exchange.start();
  }

  /**
   * answer writes a response the proxy makes itself. A request with a body is answered and the
   * connection closed, rather than reading a body nobody wants.
   */
  answer(
    head: RequestHead,
    answer: LocalAnswer,
    forceClose: boolean,
    route: RouteEntry | null,
    headBytes: number,
    startedAt: number,
  ): void {
    const close = forceClose || !head.keepAlive || head.framing.kind !== "none" || this.forwarder.stopping;
    const bytes = serializeAnswer(answer, { head: head.method === "HEAD", close });
    this.write(bytes);
    this.forwarder.meter.record(route, answer.status, headBytes, bytes.length, (performance.now() - startedAt) / 1000);
    if (close) this.closeAfterFlush();
  }

  /** refuse answers a request that could not be parsed, and closes: the stream can no longer be framed. */
  private refuse(status: number, reason: string): void {
    const answer: LocalAnswer = {
      status,
      headers: { "content-type": "text/plain; charset=utf-8", "cache-control": "no-store" },
      body: `${status} ${reason}\n`,
    };
    const bytes = serializeAnswer(answer, { head: false, close: true });
    this.write(bytes);
    this.forwarder.meter.record(null, status, this.input?.length ?? 0, bytes.length, 0);
    this.closeAfterFlush();
  }

  /** exchangeDone runs when a response has been written (or given up): the next pipelined request may start. */
  exchangeDone(close: boolean): void {
    this.exchange = null;
    if (close || this.forwarder.stopping) {
      this.closeAfterFlush();
      return;
    }
    this.resumeReading();
    this.pump();
  }

  /** becomeTunnel switches the connection to a byte tunnel after a 101. */
  becomeTunnel(tunnel: Tunnel): void {
    this.exchange = null;
    this.tunnel = tunnel;
    this.resumeReading();
    const pending = this.input;
    this.input = null;
    if (pending !== null) tunnel.fromClient(pending);
  }

  /** write sends bytes to the client; false means they wait in the outbox. */
  write(bytes: Bytes): boolean {
    if (this.closed) return false;
    return this.out.send(this.socket, bytes);
  }

  pauseReading(): void {
    if (this.paused || this.closed) return;
    this.paused = true;
    this.socket.pause();
  }

  resumeReading(): void {
    if (!this.paused || this.closed) return;
    this.paused = false;
    this.socket.resume();
  }

  onDrain(): void {
    if (!this.out.flush(this.socket)) return;
    if (this.closing) {
      this.socket.end();
      return;
    }
    if (this.exchange) this.exchange.onClientDrain();
    else if (this.tunnel) this.tunnel.onClientDrain();
  }

  /** closeAfterFlush closes the connection once everything written so far has been sent. */
  closeAfterFlush(): void {
    if (this.closed) return;
    if (!this.closing) {
      this.closing = true;
      this.closingSince = this.forwarder.now;
      this.input = null;
    }
    if (this.out.empty) this.socket.end();
  }

  /** destroy closes the connection at once. */
  destroy(): void {
    if (this.closed) return;
    this.socket.terminate();
    this.onClose();
  }

  onClose(): void {
    if (this.closed) return;
    this.closed = true;
    this.out.clear();
    this.input = null;
    this.exchange?.abort();
    this.exchange = null;
    this.tunnel?.onClientClose();
    this.tunnel = null;
  }

  checkTimeouts(now: number): void {
    if (this.closing) {
      if (now - this.closingSince > CLOSING_GRACE_MS) this.destroy();
      return;
    }
    const exchange = this.exchange;
    if (exchange) {
      // A client that stops sending its request body holds an upstream connection: it gets the idle timeout too.
      if (!exchange.requestDone && !this.paused && now - this.lastActive > CLIENT_IDLE_MS) this.destroy();
      else exchange.checkTimeouts(now);
    } else if (this.tunnel === null && now - this.lastActive > CLIENT_IDLE_MS) this.closeAfterFlush();
    else if (
      this.tunnel === null &&
      this.forwarder.stopping &&
      now - Math.max(this.lastActive, this.forwarder.stoppingSince) > STOPPING_IDLE_MS
    ) {
      this.closeAfterFlush();
    }
  }
}

function bodyTooLarge(head: RequestHead, max: number): LocalAnswer {
  return errorPage(
    acceptOf(head),
    413,
    "Request body too large",
    `Request bodies are limited to ${Math.floor(max / (1024 * 1024))} MiB (ENGINE_PROXY_MAX_BODY_MB).`,
  );
}

/**
 * Exchange is one request and its response: it sends the request head and streams the body to
 * an upstream connection, then relays the response (1xx, head, body) to the client, and gives
 * the connection back to the pool when the response was complete and both sides may go on.
 */
class Exchange implements UpstreamOwner {
  private upstream: UpstreamConnection | null = null;
  /** requestDone is true once every byte of the request body has been taken from the client. */
  requestDone: boolean;
  private requestRemaining = 0;
  private readonly requestChunks: ChunkedDecoder | null = null;
  private continueSent = false;
  private retried = false;
  /** responseStarted is true once any byte came back on the current connection. */
  private responseStarted = false;
  private responseInput: Buffer | null = null;
  private response: ResponseHead | null = null;
  /** responseKind is how the response's body ends (its length, for "length", counts down in responseRemaining). */
  private responseKind: BodyFraming["kind"] = "none";
  private responseRemaining = 0;
  private responseChunks: ChunkedDecoder | null = null;
  /** dechunk is true when the client (HTTP/1.0) gets a chunked body's data without the coding. */
  private dechunk = false;
  /** bodyDone is true once the whole response body has been read from the upstream. */
  private bodyDone = false;
  /** leftover is true when the upstream sent bytes past the response: its connection cannot be reused. */
  private leftover = false;
  private closeClient = false;
  private deadline = 0;
  private deadlineWhat: "connect" | "header" = "connect";
  private deadlineMs = 0;
  private finished = false;
  /** requestBytes and responseBytes are what this exchange took from and wrote to the client, for the meter. */
  private requestBytes: number;
  private responseBytes = 0;

  constructor(
    private readonly client: ClientConnection,
    private readonly head: RequestHead,
    private readonly route: RouteEntry,
    headBytes: number,
    private readonly startedAt: number,
  ) {
    this.requestBytes = headBytes;
    const framing = head.framing;
    this.requestDone = framing.kind === "none";
    if (framing.kind === "length") this.requestRemaining = framing.length;
    else if (framing.kind === "chunked") this.requestChunks = new ChunkedDecoder();
  }

  start(): void {
    this.connect(false);
  }

  /** toClient writes bytes of the answer to the client, counting them. */
  private toClient(bytes: Bytes): boolean {
    this.responseBytes += typeof bytes === "string" ? bytes.length : bytes.byteLength;
    return this.client.write(bytes);
  }

  /** count records the finished exchange in the process's meter; `status` is what the client was answered. */
  private count(status: number): void {
    this.client.forwarder.meter.record(
      this.route,
      status,
      this.requestBytes,
      this.responseBytes,
      (performance.now() - this.startedAt) / 1000,
    );
  }

  private connect(fresh: boolean): void {
    this.responseStarted = false;
    const connection = this.client.forwarder.pool.acquire(upstreamTarget(this.route.upstream), this, fresh);
    this.upstream = connection;
    if (connection.connected) this.onUpstreamOpen(connection);
    else this.setDeadline("connect", this.client.forwarder.options.connectTimeoutMs ?? CONNECT_TIMEOUT_MS);
  }

  /**
   * setDeadline counts a deadline from the sweeper's clock, which is up to one sweep old, plus
   * that sweep: it never fires early, at most one sweep late (the sweep is the timeouts'
   * resolution either way), and costs no clock read per request.
   */
  private setDeadline(what: "connect" | "header", ms: number): void {
    this.deadlineWhat = what;
    this.deadlineMs = ms;
    this.deadline = this.client.forwarder.now + SWEEP_MS + ms;
  }

  onUpstreamOpen(connection: UpstreamConnection): void {
    if (connection !== this.upstream) return;
    this.setDeadline("header", this.client.forwarder.options.headerTimeoutMs ?? HEADER_TIMEOUT_MS);
    // RFC 9110 §10.1.1: the proxy answers 100-continue itself once it is ready for the body,
    // and does not pass Expect on (a client whose request is refused never sends the body).
    if (this.head.expectContinue && !this.requestDone && !this.continueSent && this.head.minor === 1) {
      this.continueSent = true;
      this.client.write(CONTINUE);
    }
    // The head and the body bytes already received go out in one write. takeBody takes all
    // the input holds, so nothing of this request is left waiting after it.
    let body: Uint8Array | null = null;
    if (!this.requestDone) {
      const taken = this.takeBody();
      if (taken === undefined) return;
      body = taken;
    }
    // A large body goes in a write of its own rather than through the head's buffer.
    const joined = body !== null && body.length <= JOIN_BODY_BYTES ? body : null;
    let length = writeRequestHead(this.head, this.client.forwarding, joined?.length ?? 0);
    const buffer = headBuffer();
    if (joined !== null) {
      buffer.set(joined, length);
      length += joined.length;
    }
    let sent = connection.sendCopy(buffer, length);
    if (body !== null && joined === null) sent = connection.send(body) && sent;
    if (sent) this.client.resumeReading();
    else this.client.pauseReading();
  }

  /** pullBody forwards body bytes the client has sent, as fast as the upstream takes them. */
  pullBody(): void {
    const connection = this.upstream;
    if (connection === null || !connection.connected || !connection.out.empty) {
      // Not connected yet, or the upstream is slower than the client: read no more until it drains.
      if (connection?.connected || (this.client.input?.length ?? 0) > MAX_HEAD_BYTES) this.client.pauseReading();
      return;
    }
    const body = this.takeBody();
    if (body === undefined || body === null) return;
    if (!connection.send(body)) this.client.pauseReading();
  }

  /**
   * takeBody takes the body bytes that `input` holds, following the request's framing; it
   * returns them (null for none), or undefined after it refused the body (bad chunked coding,
   * or past the body limit) and ended the exchange.
   */
  private takeBody(): Uint8Array | null | undefined {
    const input = this.client.input;
    if (input === null || this.requestDone) return null;
    if (this.requestChunks === null) {
      const take = Math.min(this.requestRemaining, input.length);
      this.requestRemaining -= take;
      this.requestBytes += take;
      this.client.consume(take);
      if (this.requestRemaining === 0) this.requestDone = true;
      return take === input.length ? input : input.subarray(0, take);
    }
    const decoder = this.requestChunks;
    const used = decoder.feed(input);
    if (used < 0) {
      this.failRequest(
        errorPage(acceptOf(this.head), 400, "Bad request body", `The chunked request body is malformed (${decoder.error}).`),
      );
      return undefined;
    }
    const max = this.client.forwarder.options.maxBodyBytes;
    if (decoder.dataBytes > max) {
      this.failRequest(bodyTooLarge(this.head, max));
      return undefined;
    }
    this.client.consume(used);
    this.requestBytes += used;
    if (decoder.done) this.requestDone = true;
    return used === input.length ? input : input.subarray(0, used);
  }

  onUpstreamDrain(): void {
    if (this.requestDone) return;
    this.client.resumeReading();
    this.client.pump();
  }

  onClientDrain(): void {
    this.upstream?.resume();
  }

  onUpstreamData(connection: UpstreamConnection, data: Buffer): void {
    if (connection !== this.upstream) return;
    this.responseStarted = true;
    if (this.response !== null) {
      const used = this.bodyBytes(data);
      if (used < 0) return;
      if (used > 0 && !this.dechunk) this.toClient(used === data.length ? data : data.subarray(0, used));
      this.afterBody();
      return;
    }
    let input = this.responseInput === null ? data : Buffer.concat([this.responseInput, data]);
    for (;;) {
      const parsed = parseResponseHead(input);
      if (parsed === null) {
        this.responseInput = input;
        return;
      }
      if (!parsed.ok) {
        this.failUpstream(502, "Bad gateway", `${this.route.service} sent an invalid HTTP response (${parsed.reason}).`);
        return;
      }
      const head = parsed;
      if (head.status === 101) {
        if (this.head.upgrade === null) {
          this.failUpstream(502, "Bad gateway", `${this.route.service} switched protocols without being asked to.`);
          return;
        }
        this.beginTunnel(connection, head, input.subarray(parsed.length));
        return;
      }
      if (head.status >= 200) {
        this.responseInput = null;
        this.beginResponse(head, input, parsed.length);
        return;
      }
      // 1xx informational responses (103 Early Hints) go on to an HTTP/1.1 client; 100 does
      // not, because the proxy answered the client's Expect itself.
      if (head.status !== 100 && this.head.minor === 1) {
        this.toClient(wire(serializeResponseHead(head, { chunked: false, close: false, upgrade: null })));
      }
      input = input.subarray(parsed.length);
      if (input.length === 0) {
        this.responseInput = null;
        return;
      }
    }
  }

  /**
   * beginResponse relays a final response head and the body bytes that came with it (`input`
   * holds both; the head is its first `headLength` bytes). A `plain` head that the proxy
   * neither closes nor de-chunks goes on byte for byte, in the same write as its body, which is
   * the common case and costs no copy; any other is written again without its hop-by-hop fields.
   */
  private beginResponse(head: ResponseHead, input: Buffer, headLength: number): void {
    this.response = head;
    this.deadline = 0;
    const kind = responseFramingKind(this.head.method, head);
    this.responseKind = kind;
    // An HTTP/1.0 client cannot read chunked coding: it gets the data, and the close ends it.
    this.dechunk = kind === "chunked" && this.head.minor === 0;
    this.closeClient = !this.head.keepAlive || kind === "close" || !this.requestDone || this.client.forwarder.stopping || this.dechunk;
    if (kind === "length") this.responseRemaining = head.contentLength;
    else if (kind === "chunked") {
      this.responseChunks = new ChunkedDecoder(this.dechunk ? (data) => this.toClient(data) : undefined);
    }
    if (head.plain && !this.closeClient) {
      const used = this.bodyBytes(input, headLength);
      if (used < 0) return;
      const end = headLength + used;
      this.toClient(end === input.length ? input : input.subarray(0, end));
      this.afterBody();
      return;
    }
    const chunked = kind === "chunked" && !this.dechunk;
    const text = wire(serializeResponseHead(head, { chunked, close: this.closeClient, upgrade: null }));
    if (this.dechunk) {
      // The decoder writes the data itself, after this head.
      this.toClient(text);
      if (this.bodyBytes(input, headLength) >= 0) this.afterBody();
      return;
    }
    const used = this.bodyBytes(input, headLength);
    if (used < 0) return;
    this.toClient(used === 0 ? text : join(text, input.subarray(headLength, headLength + used)));
    this.afterBody();
  }

  /**
   * bodyBytes follows the response's framing over `data` and returns how many of its bytes
   * belong to the body (the rest would be bytes past the response, which make the connection
   * unfit for reuse). It sets `bodyDone` at the end of the body, and returns -1 after it ended
   * the exchange because the chunked coding was broken (the head is out by then: the client
   * learns of it by the connection closing early). Bytes before `from` (a head) are not looked at.
   */
  private bodyBytes(data: Buffer, from = 0): number {
    const available = data.length - from;
    const kind = this.responseKind;
    if (kind === "length") {
      const take = Math.min(this.responseRemaining, available);
      this.responseRemaining -= take;
      if (this.responseRemaining === 0) this.bodyDone = true;
      if (take < available) this.leftover = true;
      return take;
    }
    if (kind === "chunked") {
      const decoder = this.responseChunks as ChunkedDecoder;
      const used = decoder.feed(data, from);
      if (used < 0) {
        this.abortResponse();
        return -1;
      }
      if (decoder.done) this.bodyDone = true;
      if (used < available) this.leftover = true;
      return used;
    }
    if (kind === "close") return available;
    this.bodyDone = true;
    if (available > 0) this.leftover = true;
    return 0;
  }

  /** afterBody finishes a complete response, or pauses the upstream while the client is slower than it. */
  private afterBody(): void {
    if (this.bodyDone) this.finish();
    else if (!this.client.out.empty) this.upstream?.pause();
  }

  private beginTunnel(connection: UpstreamConnection, head: ResponseHead, rest: Buffer): void {
    this.finished = true;
    this.deadline = 0;
    this.upstream = null;
    const text = wire(serializeResponseHead(head, { chunked: false, close: false, upgrade: this.head.upgrade }));
    this.toClient(rest.length > 0 ? join(text, rest) : text);
    this.count(101);
    const tunnel = new Tunnel(this.client, connection);
    connection.owner = tunnel;
    this.client.becomeTunnel(tunnel);
  }

  /** finish ends a complete response: the upstream connection goes back to the pool if it can carry another. */
  private finish(): void {
    if (this.finished) return;
    this.finished = true;
    this.count(this.response?.status ?? 502);
    const connection = this.upstream;
    this.upstream = null;
    if (connection !== null) {
      const reusable = (this.response?.keepAlive ?? false) && this.responseKind !== "close" && this.requestDone && !this.leftover;
      if (reusable) this.client.forwarder.pool.release(connection, this.client.forwarder.now);
      else connection.destroy();
    }
    this.client.exchangeDone(this.closeClient);
  }

  onUpstreamClose(connection: UpstreamConnection, error: Error | null): void {
    if (connection !== this.upstream || this.finished) return;
    if (this.response === null) {
      // A kept-alive connection the upstream closed while it sat idle fails like this, before
      // any byte of an answer: an idempotent request without a body is safe to send again.
      const retry =
        !this.responseStarted && connection.reused && !this.retried && isIdempotent(this.head.method) && this.head.framing.kind === "none";
      if (retry) {
        this.retried = true;
        this.connect(true);
        return;
      }
      const code = (error as { code?: string } | null)?.code;
      const where = this.route.upstream.replace("http://", "");
      const detail = connection.connected
        ? `${this.route.service} closed the connection on ${where} before answering${code ? ` (${code})` : ""}.`
        : `${this.route.service} did not answer on ${where} (${code ?? error?.message ?? "connection failed"}).`;
      this.failUpstream(502, "Service unreachable", detail);
      return;
    }
    this.upstream = null;
    if (this.responseKind === "close") {
      this.finish();
      return;
    }
    // A response cut short: its head is out, so closing is the only way to tell the client.
    this.abortResponse();
  }

  /** failUpstream answers with an error page when no response head has gone out, else closes the client. */
  private failUpstream(status: number, title: string, detail: string): void {
    if (this.finished) return;
    this.finished = true;
    this.deadline = 0;
    this.upstream?.destroy();
    this.upstream = null;
    if (this.response !== null) {
      this.count(this.response.status);
      this.client.exchangeDone(true);
      return;
    }
    // The request body may be half-read: the connection cannot go on to the next request then.
    const close = !this.requestDone || !this.head.keepAlive;
    const page = errorPage(acceptOf(this.head), status, title, detail);
    this.toClient(serializeAnswer(page, { head: this.head.method === "HEAD", close }));
    this.count(status);
    this.client.exchangeDone(close);
  }

  /** failRequest refuses a request body (malformed, too large) and closes the client connection. */
  private failRequest(page: LocalAnswer): void {
    if (this.finished) return;
    this.finished = true;
    this.deadline = 0;
    this.upstream?.destroy();
    this.upstream = null;
    if (this.response === null) this.toClient(serializeAnswer(page, { head: this.head.method === "HEAD", close: true }));
    this.count(this.response?.status ?? page.status);
    this.client.exchangeDone(true);
  }

  private abortResponse(): void {
    if (this.finished) return;
    this.finished = true;
    if (this.response !== null) this.count(this.response.status);
    this.upstream?.destroy();
    this.upstream = null;
    this.client.exchangeDone(true);
  }

  /** abort ends the exchange because the client went away. */
  abort(): void {
    if (this.finished) return;
    this.finished = true;
    this.upstream?.destroy();
    this.upstream = null;
  }

  checkTimeouts(now: number): void {
    if (this.deadline === 0 || now < this.deadline) return;
    const where = this.route.upstream.replace("http://", "");
    const seconds = this.deadlineMs / 1000;
    const detail =
      this.deadlineWhat === "connect"
        ? `${this.route.service} did not accept a connection on ${where} within ${seconds} s.`
        : `${this.route.service} did not answer within ${seconds} s.`;
    this.failUpstream(504, "Service timed out", detail);
  }
}

/**
 * Tunnel copies bytes both ways between a client and an upstream after a websocket handshake
 * (101), with backpressure each way, until either side closes; then the other side is closed
 * once what it was sent has been written.
 */
class Tunnel implements UpstreamOwner {
  constructor(
    private readonly client: ClientConnection,
    private upstream: UpstreamConnection | null,
  ) {
    upstream?.socket?.setKeepAlive(true, 60_000);
    client.socket.setKeepAlive(true, 60_000);
  }

  fromClient(data: Buffer): void {
    if (this.upstream && !this.upstream.send(data)) this.client.pauseReading();
  }

  onUpstreamData(_connection: UpstreamConnection, data: Buffer): void {
    if (!this.client.write(data)) this.upstream?.pause();
  }

  onUpstreamDrain(): void {
    this.client.resumeReading();
  }

  onClientDrain(): void {
    this.upstream?.resume();
  }

  onUpstreamOpen(): void {}

  onUpstreamClose(): void {
    this.upstream = null;
    this.client.closeAfterFlush();
  }

  onClientClose(): void {
    const upstream = this.upstream;
    this.upstream = null;
    if (upstream) {
      upstream.owner = null;
      upstream.end();
    }
  }
}
