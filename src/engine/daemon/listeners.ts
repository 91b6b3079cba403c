import { chmodSync } from "node:fs";
import type { Server } from "bun";
import { randomId } from "../../lib/crypto";
import { AppError } from "../../lib/errors";
import { errorResponse, lastResortResponse } from "../../lib/http";
import type { Logger } from "../../lib/logger";
import {
  acceptQueueLength,
  bindUnixPrivately,
  listeningTcpFd,
  ownsPath,
  removeIfOwned,
  steerToNewest,
  type UnixSocketName,
} from "../../lib/sockets";

/** Handler answers one request of a listener. */
export type Handler = (request: Request, server: Server<undefined>) => Response | Promise<Response>;

/**
 * RETIRE_GRACE_MS is how long a retiring listener still accepts after its successor bound (and
 * renamed its unix socket over the path), at least. New connections go to the successor from
 * then on; one already in this listener's queue is accepted and answered on the event loop's
 * next turns rather than reset when the listener closes, and a TCP handshake this listener had
 * begun completes within a round trip. Loopback and LAN round trips fit inside it; it is
 * short because requests wait for it (the successor cannot serve before this daemon has
 * released its work): measured in bench/restart.ts. Past it, the TCP listener still waits
 * while its accept queue is not empty (a busy event loop accepts late), up to
 * RETIRE_QUEUE_MAX_MS (decision 442).
 */
export const RETIRE_GRACE_MS = 2;
/** RETIRE_QUEUE_MAX_MS bounds the wait for a retiring TCP listener's accept queue to empty. */
const RETIRE_QUEUE_MAX_MS = 200;

/** IDLE_TIMEOUT_S closes a keep-alive connection that says nothing for this long (SSE streams send keep-alives). */
const IDLE_TIMEOUT_S = 120;

export interface ApiListenerOptions {
  host: string;
  port: number;
  socketPath: string;
  log: Logger;
}

/**
 * ApiListeners are the daemon's two API listeners: TCP (the API, the web UI and MCP) and the
 * unix socket (the local CLI, counted as admin). They bind before the daemon can answer and
 * hold requests until `serve` gives them their handlers, so a successor can take the ports
 * over from its predecessor while that one finishes its work: new connections wait in this
 * process for the moment its modules are up instead of finding no one listening.
 */
export class ApiListeners {
  readonly tcp: Server<undefined>;
  private unix: Server<undefined>;
  readonly port: number;
  /** steered says whether new connections go to a successor the moment it binds (sockets.ts). */
  readonly steered: boolean;
  /** tcpFd is the TCP listener's descriptor, found in /proc/self/fd; null when it was not. */
  private readonly tcpFd: number | null;
  private unixName: UnixSocketName;
  private readonly options: ApiListenerOptions;
  private handlers: { tcp: Handler; unix: Handler } | null = null;
  private waiting: (() => void)[] = [];
  private closed = false;
  private answered: { promise: Promise<void>; resolve: () => void } = Promise.withResolvers<void>();

  private constructor(options: ApiListenerOptions) {
    this.options = options;
    // The unix socket is made first, at its private name where no client finds it: making it
    // may take milliseconds, and a successor's TCP listener takes new connections (which wait
    // until it serves) from its bind on. So the TCP port is bound and steered last, then the
    // unix socket is renamed over its path (decision 483).
    const unix = this.bindUnixPrivately();
    let tcp: Server<undefined> | null = null;
    try {
      tcp = bindTcp(options, {
        ...this.safety(),
        idleTimeout: IDLE_TIMEOUT_S,
        fetch: (request, server) => this.dispatch("tcp", request, server),
      });
      this.port = tcp.port ?? options.port;
      const fd = listeningTcpFd(this.port);
      this.tcpFd = fd;
      this.steered = fd !== null && steerToNewest(fd);
      this.unixName = unix.publish();
    } catch (error) {
      tcp?.stop(true);
      unix.server.stop(true);
      unix.discard();
      throw error;
    }
    this.tcp = tcp;
    this.unix = unix.server;
    if (!this.steered) {
      options.log.warn(
        { port: this.port },
        "cannot steer the API port's new connections to a successor (no SO_ATTACH_REUSEPORT_CBPF): a restart may reset a connection that arrives as it hands over",
      );
    }
  }

  /** safety are the options both listeners take: never Bun's development error page, and the error envelope for what escapes the app (decision 142). */
  private safety() {
    return { development: false, error: (error: Error) => lastResortResponse(this.options.log, error) } as const;
  }

  private bindUnixPrivately() {
    // The socket counts as admin and the data dir may be 0711 (root): a umask of 077 makes it
    // private from the moment it exists, before the chmod that states its mode.
    const umask = process.umask(0o077);
    try {
      return bindUnixPrivately(this.options.socketPath, (privatePath) => {
        const server = Bun.serve({ ...this.safety(), unix: privatePath, fetch: (request, srv) => this.dispatch("unix", request, srv) });
        chmodSync(privatePath, 0o600);
        return server as Server<undefined>;
      });
    } finally {
      process.umask(umask);
    }
  }

  /**
   * reclaim binds the unix socket again when a successor renamed its own over the path and then
   * went away (a restart that did not go through): the path names this process's socket again.
   */
  reclaim(): void {
    if (this.closed || ownsPath(this.unixName)) return;
    const bound = this.bindUnixPrivately();
    this.unixName = bound.publish();
    this.unix.stop(true);
    this.unix = bound.server;
  }

  /** bind opens both listeners; a TCP port another program holds is `port_in_use`. */
  static bind(options: ApiListenerOptions): ApiListeners {
    return new ApiListeners(options);
  }

  /** serve gives the listeners their handlers; requests that waited for them go on now. */
  serve(tcp: Handler, unix: Handler): void {
    this.handlers = { tcp, unix };
    const waiting = this.waiting;
    this.waiting = [];
    for (const resume of waiting) resume();
  }

  private async dispatch(which: "tcp" | "unix", request: Request, server: Server<undefined>): Promise<Response> {
    if (!this.handlers) {
      if (this.closed) return notServing();
      await new Promise<void>((resume) => this.waiting.push(resume));
      if (!this.handlers) return notServing();
    }
    const response = await (this.handlers as { tcp: Handler; unix: Handler })[which](request, server);
    this.answered.resolve();
    return response;
  }

  /** firstAnswer resolves once a handler has answered a request (its head; the body may still stream). */
  firstAnswer(): Promise<void> {
    return this.answered.promise;
  }

  /** inFlight counts the requests both listeners are still answering. */
  inFlight(): number {
    return this.tcp.pendingRequests + this.unix.pendingRequests;
  }

  /**
   * retire hands the ports to a successor that has bound them: it keeps accepting for
   * RETIRE_GRACE_MS and until its TCP accept queue is empty (what was already queued), stops accepting, and waits for the requests in
   * flight until `deadline` (ms since the epoch), then closes what is left. The unix path is
   * the successor's by then and is left alone.
   */
  async retire(deadline: number): Promise<void> {
    await Bun.sleep(RETIRE_GRACE_MS);
    const queueDeadline = Date.now() + RETIRE_QUEUE_MAX_MS;
    while (this.tcpFd !== null && (acceptQueueLength(this.tcpFd) ?? 0) > 0 && Date.now() < queueDeadline) await Bun.sleep(1);
    this.tcp.stop(false);
    this.unix.stop(false);
    while (this.inFlight() > 0 && Date.now() < deadline) await Bun.sleep(5);
    this.close();
  }

  /** close stops both listeners at once and removes the unix path while it is still this process's. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.tcp.stop(true);
    this.unix.stop(true);
    removeIfOwned(this.unixName);
    const waiting = this.waiting;
    this.waiting = [];
    for (const resume of waiting) resume();
  }
}

/** notServing answers a request that reached a listener whose daemon never got going. */
function notServing(): Response {
  return errorResponse(503, "draining", "the engine is restarting; try again in a moment", `req_${randomId("x").slice(2, 14)}`);
}

/** bindTcp binds the API's TCP port with SO_REUSEPORT, so that a successor can bind it beside this one. */
function bindTcp(options: ApiListenerOptions, serve: Omit<Parameters<typeof Bun.serve>[0], "port" | "hostname">): Server<undefined> {
  try {
    return Bun.serve({ ...(serve as object), hostname: options.host, port: options.port, reusePort: true } as Parameters<
      typeof Bun.serve
    >[0]) as Server<undefined>;
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "EADDRINUSE") {
      throw new AppError(
        "port_in_use",
        `port ${options.port} on ${options.host} is already in use (another engine?): choose another with --port or ENGINE_PORT`,
      );
    }
    throw new AppError("config_invalid", `cannot listen on ${options.host}:${options.port}: ${(error as Error).message}`);
  }
}

/** WARM_ROUNDS is how many times each warm-up request runs: enough for the code it takes to be compiled, not optimized. */
const WARM_ROUNDS = 20;
/** WARM_RESTART_BODY is a restart request its schema refuses (drain_timeout_s is an integer): it is validated, never run. */
export const WARM_RESTART_BODY = JSON.stringify({ drain_timeout_s: "warm-up" });

/**
 * warmHandlers sends a successor's handlers, in-process and before the switch, the requests
 * its first clients will send (decision 441): the health check on both listeners, a refused
 * credential, and the next restart's request with a body its schema refuses (decision 505), so
 * the router, the routes' compiled handlers, the authentication, the body validation and the
 * error envelope are compiled before requests wait for them. It reads nothing the predecessor
 * owns: a refused token is looked up and not found, and no route it calls changes anything
 * (the restart's body is not an integer, so it is answered 422 before the route runs).
 */
export async function warmHandlers(
  tcp: (request: Request) => Response | Promise<Response>,
  unix: (request: Request) => Response | Promise<Response>,
  port: number,
): Promise<void> {
  const origin = `http://127.0.0.1:${port}`;
  for (let round = 0; round < WARM_ROUNDS; round++) {
    const answers = [
      tcp(new Request(`${origin}/api/health`)),
      tcp(new Request(`${origin}/api/services`, { headers: { authorization: "Bearer eng_warm-up" } })),
      unix(new Request("http://localhost/api/health")),
      unix(
        new Request("http://localhost/api/daemon/restart", {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: WARM_RESTART_BODY,
        }),
      ),
    ];
    for (const answer of answers) {
      try {
        await (await answer).arrayBuffer();
      } catch {
        // a warm-up answer is thrown away, whatever it is
      }
    }
  }
}
