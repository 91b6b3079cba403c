import { createSecureContext, type SecureContext } from "node:tls";
import type { SocketHandler, TCPSocketListener, TCPSocketListenOptions } from "bun";
import { acceptQueueLength, listenersOnPort, listeningTcpFd, steerTo, steerToSocket, UNSTEERED } from "../../lib/sockets";
import { type ClientConnection, Forwarder, type ForwarderOptions } from "./forwarder";
import type { ProxyMeter } from "./meter";
import { Router } from "./router";
import type { ListenerConfig, ProxySnapshot, SnapshotCertificate } from "./snapshot";

/**
 * SniHandlers are socket handlers with `serverName`, which `Bun.listen` calls with the SNI name
 * of each TLS handshake and which returns the native secure context to use (or undefined for
 * the listener's default). Bun's own `node:tls` server is built on it (its SNICallback and
 * addContext); it is not in bun-types, hence this declaration. test/engine/proxy/proxy.test.ts
 * checks that each name gets its own certificate and that a renewed one is served.
 */
type SniHandlers = SocketHandler<ClientConnection> & {
  serverName: (listenerData: unknown, serverName: string) => unknown;
};

/** NativeContext is the handle inside a `node:tls` SecureContext that Bun's TLS layer takes. */
type NativeContext = unknown;

/**
 * ProxyListener is one proxy process's pair of listeners, raw sockets handed to the forwarder:
 * HTTPS, whose certificate is chosen per SNI name from the snapshot, and HTTP (ACME http-01
 * answers, `.localhost` names, a redirect for the rest). Both bind with SO_REUSEPORT so several
 * processes, and the next daemon's, share the ports.
 *
 * Certificates change in place: each name's secure context is looked up at every handshake, so
 * a renewed certificate is served to the next connection without re-binding, and connections
 * already open are not touched. Only the default certificate (the first, the apex name's, for
 * clients that send no SNI) is fixed at bind time; when it changes the HTTPS port is bound
 * again beside the old listener, which then stops accepting (its connections go on).
 */
export class ProxyListener {
  private https: TCPSocketListener<unknown> | null = null;
  private http: TCPSocketListener<unknown> | null = null;
  private readonly forwarder: Forwarder;
  /** contexts maps a server name to its secure context; it is replaced whole, never edited, so a handshake sees one snapshot. */
  private contexts = new Map<string, { cert: string; context: NativeContext }>();
  private defaultCertificate: SnapshotCertificate | null = null;
  generation = -1;
  rebinds = 0;
  /** steeredBy is how `steer` picked this process for every new connection: by its socket, by index, or null (not asked, or refused). */
  steeredBy: "socket" | "index" | null = null;
  httpsPort = 0;
  httpPort = 0;

  /** `timeouts` shortens the forwarder's upstream timeouts, for tests. */
  constructor(
    private readonly config: ListenerConfig,
    timeouts: Pick<ForwarderOptions, "connectTimeoutMs" | "headerTimeoutMs"> = {},
  ) {
    this.forwarder = new Forwarder({ ...timeouts, maxBodyBytes: config.maxBodyBytes, httpsPort: () => this.httpsPort });
  }

  /** meter holds the counts of what this process answered. */
  get meter(): ProxyMeter {
    return this.forwarder.meter;
  }

  /** start binds both ports with the first snapshot; a taken port throws EADDRINUSE. */
  start(snapshot: ProxySnapshot): void {
    this.apply(snapshot);
    const http = listenShared({
      hostname: this.config.host,
      port: this.config.httpPort,
      socket: this.forwarder.clientHandlers("http") as SocketHandler<unknown>,
    });
    this.http = http;
    this.httpPort = http.port;
    if (this.config.steer) this.steer();
  }

  /**
   * steer sends every new connection on both ports to this process while the processes of the
   * generation it replaces retire (decisions 443, 529), so that they get no new connection and
   * drain their accept queues before they close: the kernel resets what a closing listener
   * still holds. Where the kernel loads the program (root), it picks this process's socket by
   * reference, however the old ones close. Elsewhere it picks by index: this process is the
   * first of its generation, so its sockets are the newest of their reuseport groups, right
   * after the old ones, and stay at that index while the old ones close (a closing socket's slot
   * takes the group's last, a newer one) as long as its generation is no smaller than theirs.
   */
  private steer(): void {
    for (const port of [this.httpsPort, this.httpPort]) {
      const fd = listeningTcpFd(port);
      if (fd === null) continue;
      if (steerToSocket(fd)) {
        this.steeredBy = "socket"; // its own socket is the right pick however many others the group holds
        continue;
      }
      // Only the index needs the group's size: one kernel dump a port, on this path alone.
      const index = listenersOnPort(port) - 1;
      this.steeredBy = index > 0 && steerTo(fd, index) ? "index" : null;
    }
  }

  /** unsteer spreads new connections by hash again, once the retired processes are gone. */
  unsteer(): void {
    for (const port of [this.httpsPort, this.httpPort]) {
      const fd = listeningTcpFd(port);
      if (fd !== null) steerTo(fd, UNSTEERED);
    }
  }

  /** apply takes a newer snapshot: routes, ACME answers and certificates change in place. */
  apply(snapshot: ProxySnapshot): void {
    if (snapshot.generation <= this.generation) return;
    this.generation = snapshot.generation;
    this.forwarder.update(new Router(snapshot.routes), snapshot.challenges);
    const contexts = new Map<string, { cert: string; context: NativeContext }>();
    for (const certificate of snapshot.certificates) {
      const held = this.contexts.get(certificate.serverName);
      contexts.set(
        certificate.serverName,
        held && held.cert === certificate.cert ? held : { cert: certificate.cert, context: nativeContext(certificate) },
      );
    }
    this.contexts = contexts;
    const first = snapshot.certificates[0] ?? null;
    if (this.https && first?.cert === this.defaultCertificate?.cert) return;
    const previous = this.https;
    this.defaultCertificate = first;
    this.https = this.bindHttps(previous?.port ?? this.config.httpsPort);
    this.httpsPort = this.https.port;
    if (previous) {
      this.rebinds += 1;
      previous.stop(false);
    }
  }

  private bindHttps(port: number): TCPSocketListener<unknown> {
    const handlers: SniHandlers = {
      ...this.forwarder.clientHandlers("https"),
      serverName: (_listenerData, serverName) => this.contexts.get(serverName.toLowerCase())?.context,
      // With a handshake handler Bun opens the connection at accept rather than after the
      // handshake, so a client that never finishes one meets the idle timeout like any other.
      handshake: () => {},
    };
    const certificate = this.defaultCertificate;
    return listenShared({
      hostname: this.config.host,
      port,
      // Without any certificate yet the port is bound in clear, as before the first one exists.
      ...(certificate ? { tls: { cert: certificate.cert, key: certificate.key } } : {}),
      socket: handlers as SocketHandler<unknown>,
    });
  }

  /**
   * stop closes both listeners, each once it has accepted what its queue holds (the kernel
   * resets a closing listener's queue; decision 443); graceful lets requests in flight finish.
   */
  async stop(graceful: boolean): Promise<void> {
    const fds = [this.httpsPort, this.httpPort].map((port) => (port > 0 ? listeningTcpFd(port) : null));
    await Bun.sleep(STOP_GRACE_MS);
    const deadline = Date.now() + STOP_QUEUE_MAX_MS;
    while (fds.some((fd) => fd !== null && (acceptQueueLength(fd) ?? 0) > 0) && Date.now() < deadline) await Bun.sleep(1);
    for (const listener of [this.https, this.http]) listener?.stop(false);
    this.https = null;
    this.http = null;
    await this.forwarder.stop(graceful);
  }
}

/** STOP_GRACE_MS is how long a stopping listener still accepts, at least: a handshake it had begun completes within a round trip. */
const STOP_GRACE_MS = 2;
/** STOP_QUEUE_MAX_MS bounds the wait for a stopping listener's accept queue to empty. */
const STOP_QUEUE_MAX_MS = 200;

/**
 * listenShared binds a TCP listener with SO_REUSEPORT (`reusePort`, which Bun.listen honours
 * though bun-types declare it only for connect): the proxy processes, and the next daemon's
 * during a drain restart, accept on the same port.
 */
function listenShared(options: TCPSocketListenOptions<unknown>): TCPSocketListener<unknown> {
  return Bun.listen<unknown>({ ...options, reusePort: true } as TCPSocketListenOptions<unknown>);
}

/** nativeContext builds the handle Bun's TLS layer uses for one name's certificate. */
function nativeContext(certificate: SnapshotCertificate): NativeContext {
  const secure = createSecureContext({ cert: certificate.cert, key: certificate.key }) as SecureContext & { context: NativeContext };
  return secure.context;
}
