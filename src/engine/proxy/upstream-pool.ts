import type { Socket, SocketHandler } from "bun";
import { type Bytes, Outbox } from "./outbox";

/** UpstreamTarget is where a route's requests go: `http://127.0.0.1:<port>` taken apart once. */
export interface UpstreamTarget {
  /** key names the pool of connections: "host:port". */
  key: string;
  hostname: string;
  port: number;
}

const targets = new Map<string, UpstreamTarget>();

/** upstreamTarget parses a route's `upstream` URL (http only: services are reached on loopback in clear), cached. */
export function upstreamTarget(upstream: string): UpstreamTarget {
  let target = targets.get(upstream);
  if (!target) {
    const url = new URL(upstream);
    const hostname = url.hostname.replace(/^\[|\]$/g, "");
    const port = Number(url.port || 80);
    target = { key: `${hostname}:${port}`, hostname, port };
    if (targets.size > 10_000) targets.clear();
    targets.set(upstream, target);
  }
  return target;
}

/**
 * UpstreamOwner is what holds an upstream connection for a while (an exchange, then maybe a
 * tunnel): it receives the connection's events. A connection without an owner is idle in the pool.
 */
export interface UpstreamOwner {
  onUpstreamOpen(connection: UpstreamConnection): void;
  onUpstreamData(connection: UpstreamConnection, data: Buffer): void;
  onUpstreamDrain(connection: UpstreamConnection): void;
  /** onUpstreamClose reports the end of the connection; `error` is set for a failed connect or a reset. */
  onUpstreamClose(connection: UpstreamConnection, error: Error | null): void;
}

/**
 * UpstreamConnection is one keep-alive connection to an upstream. It is reused only after a
 * complete response (the owner decides, and releases it to the pool), so a new request never
 * meets bytes of an old one.
 */
export class UpstreamConnection {
  socket: Socket<UpstreamConnection> | null = null;
  owner: UpstreamOwner | null = null;
  readonly out = new Outbox();
  /** connected is true once the TCP connection is established. */
  connected = false;
  closed = false;
  /**
   * reused is true once the connection has waited idle in the pool: if it then fails before any
   * byte of an answer, the upstream most likely closed it while idle, and an idempotent request
   * may be sent again on a new connection.
   */
  reused = false;
  /** paused is true while reading is paused because the client is slower than the upstream. */
  paused = false;
  /** endWhenFlushed closes the connection once its outbox is written. */
  endWhenFlushed = false;
  idleSince = 0;

  constructor(
    readonly pool: UpstreamPool,
    readonly target: UpstreamTarget,
  ) {}

  /** send writes bytes to the upstream; false means some wait in the outbox (backpressure). */
  send(bytes: Bytes): boolean {
    if (!this.socket || this.closed) return false;
    return this.out.send(this.socket, bytes);
  }

  /** sendCopy writes the first `length` bytes of a buffer its caller reuses (a copy waits, if any must). */
  sendCopy(buffer: Uint8Array, length: number): boolean {
    if (!this.socket || this.closed) return false;
    return this.out.sendCopy(this.socket, buffer, length);
  }

  /** pause stops reading from the upstream until `resume`. */
  pause(): void {
    if (this.paused || !this.socket) return;
    this.paused = true;
    this.socket.pause();
  }

  resume(): void {
    if (!this.paused || !this.socket) return;
    this.paused = false;
    this.socket.resume();
  }

  /** destroy closes the connection at once; its owner, if any, is not told (it asked). */
  destroy(): void {
    this.owner = null;
    if (this.closed) return;
    this.closed = true;
    this.out.clear();
    this.pool.forget(this);
    this.socket?.terminate();
  }

  /** end closes the connection once the bytes already given to it are written (the end of a tunnel). */
  end(): void {
    if (this.closed || !this.socket) {
      this.destroy();
      return;
    }
    if (this.out.empty) this.socket.end();
    else this.endWhenFlushed = true;
  }
}

const HANDLERS: SocketHandler<UpstreamConnection> = {
  open(socket) {
    const connection = socket.data;
    connection.socket = socket;
    connection.connected = true;
    if (connection.owner) connection.owner.onUpstreamOpen(connection);
    else connection.pool.release(connection);
  },
  data(socket, data) {
    const connection = socket.data;
    // Bytes on an idle connection belong to no request: it can no longer be trusted.
    if (connection.owner) connection.owner.onUpstreamData(connection, data);
    else connection.destroy();
  },
  drain(socket) {
    const connection = socket.data;
    if (!connection.out.flush(socket)) return;
    if (connection.endWhenFlushed) socket.end();
    connection.owner?.onUpstreamDrain(connection);
  },
  close(socket, error) {
    const connection = socket.data;
    if (connection.closed) return;
    connection.closed = true;
    connection.out.clear();
    connection.pool.forget(connection);
    const owner = connection.owner;
    connection.owner = null;
    owner?.onUpstreamClose(connection, error ?? null);
  },
  connectError(socket, error) {
    const connection = socket.data;
    if (connection.closed) return;
    connection.closed = true;
    connection.pool.forget(connection);
    const owner = connection.owner;
    connection.owner = null;
    owner?.onUpstreamClose(connection, error);
  },
  error(socket, error) {
    // A handler threw: the exchange is in an unknown state, so the connection goes.
    const connection = socket.data;
    const owner = connection.owner;
    connection.destroy();
    owner?.onUpstreamClose(connection, error);
  },
};

/** UpstreamPoolOptions bound the idle connections kept per upstream. */
export interface UpstreamPoolOptions {
  /** maxIdlePerUpstream is how many idle connections one upstream keeps; more are closed on release. */
  maxIdlePerUpstream: number;
  /**
   * idleTimeoutMs closes a connection idle that long. It is kept below the keep-alive timeouts
   * of common servers (Node 5 s, Bun 10 s), so the proxy usually closes first and seldom sends
   * a request on a connection the upstream is closing.
   */
  idleTimeoutMs: number;
}

/**
 * UpstreamPool keeps keep-alive connections per upstream, like nginx's `keepalive` directive:
 * a request takes the most recently used idle connection (the one least likely to have been
 * closed by the upstream) or opens a new one, and gives it back after a complete response.
 */
export class UpstreamPool {
  private readonly idle = new Map<string, UpstreamConnection[]>();
  private readonly open = new Set<UpstreamConnection>();
  private draining = false;

  constructor(private readonly options: UpstreamPoolOptions) {}

  /**
   * acquire gives `owner` a connection to `target`: an idle one, already `connected` (the owner
   * writes at once), or a new one whose owner hears `onUpstreamOpen` or `onUpstreamClose` with
   * the connect error. `fresh` skips idle connections (for a retry).
   */
  acquire(target: UpstreamTarget, owner: UpstreamOwner, fresh = false): UpstreamConnection {
    if (!fresh) {
      const list = this.idle.get(target.key);
      const connection = list?.pop();
      if (connection) {
        connection.owner = owner;
        return connection;
      }
    }
    const connection = new UpstreamConnection(this, target);
    connection.owner = owner;
    this.open.add(connection);
    Bun.connect<UpstreamConnection>({ hostname: target.hostname, port: target.port, socket: HANDLERS, data: connection }).catch(() => {
      // reported through connectError
    });
    return connection;
  }

  /**
   * release takes back a connection after a complete response, or closes it when the pool is
   * full. `now` stamps its idle time: the forwarder passes its sweeper's clock, which is precise
   * enough for a timeout of seconds and costs no clock read per request.
   */
  release(connection: UpstreamConnection, now = Date.now()): void {
    connection.owner = null;
    if (connection.closed) return;
    connection.resume();
    connection.reused = true;
    const list = this.idle.get(connection.target.key) ?? [];
    if (this.draining || list.length >= this.options.maxIdlePerUpstream) {
      connection.destroy();
      return;
    }
    connection.idleSince = now;
    list.push(connection);
    this.idle.set(connection.target.key, list);
  }

  /** forget drops a closed connection from the pool's lists. */
  forget(connection: UpstreamConnection): void {
    this.open.delete(connection);
    const list = this.idle.get(connection.target.key);
    if (!list) return;
    const index = list.indexOf(connection);
    if (index >= 0) list.splice(index, 1);
    if (list.length === 0) this.idle.delete(connection.target.key);
  }

  /** sweep closes connections idle longer than the idle timeout. */
  sweep(now: number): void {
    for (const list of [...this.idle.values()]) {
      // Oldest first: the list is ordered by release time.
      while (list.length > 0 && now - (list[0] as UpstreamConnection).idleSince > this.options.idleTimeoutMs) {
        (list[0] as UpstreamConnection).destroy();
      }
    }
  }

  /** idleCount is the number of idle connections (for tests and status). */
  idleCount(): number {
    let count = 0;
    for (const list of this.idle.values()) count += list.length;
    return count;
  }

  /** drain closes the idle connections and, from now on, every connection released (a graceful stop). */
  drain(): void {
    this.draining = true;
    for (const list of [...this.idle.values()]) for (const connection of [...list]) connection.destroy();
  }

  /** closeAll closes every connection, idle or not. */
  closeAll(): void {
    for (const connection of [...this.open]) connection.destroy();
    this.idle.clear();
  }
}
