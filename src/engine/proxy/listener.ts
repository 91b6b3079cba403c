import type { Server, ServerWebSocket } from "bun";
import { hostOf } from "./names";
import { errorPage } from "./pages";
import { Router } from "./router";
import type { ListenerConfig, ProxySnapshot, RouteEntry } from "./snapshot";

/** HOP_BY_HOP are the headers that describe one connection (RFC 9110 §7.6.1), never forwarded. */
const HOP_BY_HOP = ["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"];

/** WS_FORWARDED are the client's handshake headers worth passing to an upstream websocket. */
const WS_FORWARDED = ["cookie", "authorization", "origin", "user-agent", "accept-language"];

const CHALLENGE_PREFIX = "/.well-known/acme-challenge/";

interface BridgeData {
  upstream: WebSocket;
}

/** closeCode maps an upstream close code to one a server may send (1005 and 1006 are reserved). */
function closeCode(code: number): number {
  return code === 1005 || code === 1006 || code < 1000 || code > 4999 ? 1011 : code;
}

/**
 * ProxyListener is one proxy process's pair of listeners: HTTPS (SNI over the snapshot's
 * certificates) and HTTP (ACME http-01 answers, `.localhost` names, a redirect for the rest).
 * Both bind with SO_REUSEPORT so several processes, and the next daemon's, share the ports.
 */
export class ProxyListener {
  private https: Server<BridgeData> | null = null;
  private http: Server<BridgeData> | null = null;
  private router = new Router([]);
  private challenges: Record<string, string> = {};
  private certificateKey = "";
  generation = -1;
  rebinds = 0;
  httpsPort = 0;
  httpPort = 0;

  constructor(private readonly config: ListenerConfig) {}

  /** start binds both ports with the first snapshot; a taken port throws EADDRINUSE. */
  start(snapshot: ProxySnapshot): void {
    this.apply(snapshot);
    this.httpsPort = this.https?.port ?? this.config.httpsPort;
    this.http = this.bind("http", this.config.httpPort, snapshot);
    this.httpPort = this.http.port ?? this.config.httpPort;
  }

  /**
   * apply takes a newer snapshot. Routes and challenges change in place; a new set of
   * certificates needs a new HTTPS server, because Bun cannot add or replace certificates on
   * a running one: the new server binds the same port first, then the old one stops
   * gracefully (requests and streams in flight finish; idle keep-alive connections close, as
   * on an nginx reload, and clients reconnect to the new one).
   */
  apply(snapshot: ProxySnapshot): void {
    if (snapshot.generation <= this.generation) return;
    this.generation = snapshot.generation;
    this.router = new Router(snapshot.routes);
    this.challenges = snapshot.challenges;
    const key = snapshot.certificates.map((c) => `${c.serverName}\n${c.cert}`).join("\n");
    if (key === this.certificateKey && this.https) return;
    this.certificateKey = key;
    const previous = this.https;
    this.https = this.bind("https", previous?.port ?? this.config.httpsPort, snapshot);
    if (previous) {
      this.rebinds += 1;
      void previous.stop(false);
    }
  }

  /** stop closes both listeners; graceful lets requests in flight finish. */
  async stop(graceful: boolean): Promise<void> {
    const servers = [this.https, this.http].filter((server): server is Server<BridgeData> => server !== null);
    this.https = null;
    this.http = null;
    await Promise.all(servers.map((server) => server.stop(!graceful)));
  }

  private bind(scheme: "http" | "https", port: number, snapshot: ProxySnapshot): Server<BridgeData> {
    return Bun.serve<BridgeData>({
      hostname: this.config.host,
      port,
      reusePort: true,
      maxRequestBodySize: this.config.maxBodyBytes,
      idleTimeout: 120,
      ...(scheme === "https" && snapshot.certificates.length > 0
        ? { tls: snapshot.certificates.map((c) => ({ serverName: c.serverName, cert: c.cert, key: c.key })) }
        : {}),
      fetch: (request, server) => this.handle(request, server, scheme),
      error: (error) => new Response(`proxy error: ${error.message}\n`, { status: 500 }),
      websocket: {
        idleTimeout: 960,
        open: (ws) => this.bridgeOpen(ws),
        message: (ws, message) => ws.data.upstream.send(message),
        close: (ws) => ws.data.upstream.close(),
      },
    });
  }

  private handle(request: Request, server: Server<BridgeData>, scheme: "http" | "https"): Response | Promise<Response | undefined> {
    const url = request.url;
    const pathStart = url.indexOf("/", url.indexOf("//") + 2);
    const path = pathStart === -1 ? "/" : url.slice(pathStart);
    const host = hostOf(request.headers.get("host"));
    if (scheme === "http") {
      if (path.startsWith(CHALLENGE_PREFIX)) {
        const answer = this.challenges[path.slice(CHALLENGE_PREFIX.length)];
        return answer === undefined
          ? new Response("no such ACME challenge\n", { status: 404 })
          : new Response(answer, { headers: { "content-type": "application/octet-stream" } });
      }
      // `.localhost` is loopback by definition (and a secure context to browsers): it is served
      // on both ports. Every other name is moved to HTTPS.
      if (!(host === "localhost" || host.endsWith(".localhost"))) {
        const port = this.httpsPort === 443 ? "" : `:${this.httpsPort}`;
        return new Response(null, { status: 308, headers: { location: `https://${host || "localhost"}${port}${path}` } });
      }
    }
    const route = this.router.match(host, path);
    if (!route) {
      return errorPage(
        request,
        404,
        "No service here",
        `No service is routed at ${host || "this address"}. Check the name, or add it as a domain of a service.`,
      );
    }
    if (route.state === "starting") {
      return errorPage(request, 503, "Service starting", `${route.service} is ${route.status}; try again in a few seconds.`, {
        "retry-after": String(route.retryAfterS),
      });
    }
    if (route.state === "down") {
      return errorPage(
        request,
        502,
        "Service down",
        `${route.service} is ${route.status}. Start it, or see \`engine diagnose ${route.service}\`.`,
      );
    }
    if (request.headers.get("upgrade")?.toLowerCase() === "websocket") return this.upgrade(request, server, route, scheme, path);
    return this.forward(request, server, route, scheme, host, path);
  }

  private forwardedHeaders(request: Request, server: Server<BridgeData>, scheme: string, host: string): Headers {
    const headers = new Headers(request.headers);
    for (const name of HOP_BY_HOP) headers.delete(name);
    const connection = request.headers.get("connection");
    if (connection) for (const name of connection.split(",")) headers.delete(name.trim());
    const client = server.requestIP(request)?.address ?? "";
    const prior = request.headers.get("x-forwarded-for");
    headers.set("x-forwarded-for", prior ? `${prior}, ${client}` : client);
    headers.set("x-forwarded-proto", scheme);
    headers.set("x-forwarded-host", request.headers.get("host") ?? host);
    headers.set("x-real-ip", client);
    return headers;
  }

  private async forward(
    request: Request,
    server: Server<BridgeData>,
    route: RouteEntry,
    scheme: string,
    host: string,
    path: string,
  ): Promise<Response> {
    const headers = this.forwardedHeaders(request, server, scheme, host);
    const hasBody = request.method !== "GET" && request.method !== "HEAD";
    try {
      const response = await fetch(route.upstream + path, {
        method: request.method,
        headers,
        body: hasBody ? request.body : undefined,
        redirect: "manual",
        decompress: false,
        // Streams (SSE, long polls, model token streams) may stay quiet for minutes.
        timeout: false,
      } as RequestInit);
      if ((response.headers.get("content-type") ?? "").startsWith("text/event-stream")) server.timeout(request, 0);
      return response;
    } catch (error) {
      return errorPage(
        request,
        502,
        "Service unreachable",
        `${route.service} did not answer on ${route.upstream.replace("http://", "")} (${(error as { code?: string }).code ?? (error as Error).message}).`,
      );
    }
  }

  /**
   * upgrade opens the upstream websocket first, so a refusal becomes a 502 instead of an
   * accepted handshake that closes at once, then accepts the client's with the subprotocol
   * the upstream chose.
   */
  private async upgrade(
    request: Request,
    server: Server<BridgeData>,
    route: RouteEntry,
    scheme: string,
    path: string,
  ): Promise<Response | undefined> {
    const headers: Record<string, string> = {};
    for (const name of WS_FORWARDED) {
      const value = request.headers.get(name);
      if (value) headers[name] = value;
    }
    const client = server.requestIP(request)?.address ?? "";
    headers["x-forwarded-for"] = client;
    headers["x-forwarded-proto"] = scheme === "https" ? "wss" : "ws";
    headers["x-forwarded-host"] = request.headers.get("host") ?? "";
    const protocols = (request.headers.get("sec-websocket-protocol") ?? "")
      .split(",")
      .map((p) => p.trim())
      .filter(Boolean);
    const upstream = new WebSocket(route.upstream.replace(/^http/, "ws") + path, { headers, protocols } as never);
    upstream.binaryType = "arraybuffer";
    const opened = await new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(false), 10_000);
      upstream.onopen = () => {
        clearTimeout(timer);
        resolve(true);
      };
      upstream.onerror = () => {
        clearTimeout(timer);
        resolve(false);
      };
    });
    if (!opened) {
      upstream.close();
      return errorPage(request, 502, "Service unreachable", `${route.service} refused the websocket at ${path}.`);
    }
    const accepted = server.upgrade(request, {
      data: { upstream },
      headers: upstream.protocol ? { "sec-websocket-protocol": upstream.protocol } : undefined,
    });
    if (accepted) return undefined;
    upstream.close();
    return errorPage(request, 400, "Bad websocket handshake", "The websocket handshake could not be accepted.");
  }

  private bridgeOpen(ws: ServerWebSocket<BridgeData>): void {
    const upstream = ws.data.upstream;
    upstream.onmessage = (event) => {
      ws.send(event.data as string | ArrayBuffer);
    };
    upstream.onclose = (event) => ws.close(closeCode(event.code), event.reason);
    upstream.onerror = () => ws.close(1011, "upstream error");
  }
}
