import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createHash } from "node:crypto";
import { join } from "node:path";
import type { TCPSocketListener } from "bun";
import { ProxyListener } from "../../../src/engine/proxy/listener";
import type { RouteEntry } from "../../../src/engine/proxy/snapshot";
import { eventually, freePort, REPO_ROOT, tempDir } from "../../helpers";
import { removeAfterRun } from "../../run-dirs";

// The forwarder through a real proxy listener on loopback, in front of a Bun.serve upstream
// (the ordinary case) and a raw-socket upstream that misbehaves on purpose. Clients are raw
// sockets where the exact bytes matter (pipelining, framing, refusals) and fetch elsewhere.

const MAX_BODY = 4 * 1024 * 1024;
const sha256 = (data: Uint8Array | string) => createHash("sha256").update(data).digest("hex");

let proxy: ProxyListener;
let port = 0;
let upstream: ReturnType<typeof Bun.serve>;
let raw: TCPSocketListener<{ id: number; served: number; buffer: string }>;
let rawConnections = 0;
/** rawCloses counts requests the raw upstream met with a close instead of an answer. */
let rawCloses = 0;
/** firstMiB resolves when the upstream has received the first MiB of a /gate body. */
let firstMiB: Promise<void>;
let reachedFirstMiB = () => {};

function route(host: string, upstreamPort: number, extra: Partial<RouteEntry> = {}): RouteEntry {
  return {
    host,
    pathPrefix: "/",
    service: host.split(".")[0] ?? host,
    upstream: `http://127.0.0.1:${upstreamPort}`,
    state: "up",
    status: "running",
    retryAfterS: 5,
    ...extra,
  };
}

/**
 * rawRequest writes `payload` on a new connection (in pieces, `gapMs` apart, when it is an
 * array) and collects what comes back until `done` says so or the proxy closes the connection.
 */
async function rawRequest(
  payload: string | Uint8Array | (string | Uint8Array)[],
  done: (text: string) => boolean = () => false,
  { gapMs = 20, timeoutMs = 5000, to = port } = {},
): Promise<{ text: string; closed: boolean }> {
  let text = "";
  let closed = false;
  let finish = () => {};
  const finished = new Promise<void>((resolve) => {
    finish = resolve;
  });
  const socket = await Bun.connect({
    hostname: "127.0.0.1",
    port: to,
    socket: {
      data(_socket, data) {
        text += data.toString("latin1");
        if (done(text)) finish();
      },
      close() {
        closed = true;
        finish();
      },
    },
  });
  const pieces = Array.isArray(payload) ? payload : [payload];
  for (const [index, piece] of pieces.entries()) {
    if (index > 0) await Bun.sleep(gapMs);
    socket.write(piece);
  }
  const timer = setTimeout(finish, timeoutMs);
  await finished;
  clearTimeout(timer);
  socket.end();
  return { text, closed };
}

/** responses splits what a connection received into its responses (heads and Content-Length bodies). */
function responses(text: string): { status: number; head: string; body: string }[] {
  const out: { status: number; head: string; body: string }[] = [];
  let rest = text;
  while (rest.startsWith("HTTP/1.1 ")) {
    const end = rest.indexOf("\r\n\r\n");
    if (end < 0) break;
    const head = rest.slice(0, end);
    const length = Number(/\r\ncontent-length: (\d+)/i.exec(head)?.[1] ?? 0);
    const status = Number(head.slice(9, 12));
    // The /text route marks its answers to HEAD, which have a length but no body.
    const bodyLength = status < 200 || status === 204 || status === 304 || /\r\nx-was-head: true/i.test(head) ? 0 : length;
    out.push({ status, head, body: rest.slice(end + 4, end + 4 + bodyLength) });
    rest = rest.slice(end + 4 + bodyLength);
  }
  return out;
}

const countResponses = (n: number) => (text: string) => responses(text).filter((r) => r.status >= 200).length >= n;

beforeAll(async () => {
  firstMiB = new Promise((resolve) => {
    reachedFirstMiB = resolve;
  });
  upstream = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    websocket: {
      message(ws, message) {
        ws.send(typeof message === "string" ? `echo:${message}` : message);
      },
    },
    async fetch(request, server) {
      const url = new URL(request.url);
      if (url.pathname === "/ws")
        return server.upgrade(request, { data: undefined }) ? undefined : new Response("not a websocket", { status: 400 });
      if (url.pathname === "/status") {
        const code = Number(url.searchParams.get("code"));
        return new Response(null, { status: code, headers: code === 304 ? { etag: '"v1"' } : {} });
      }
      if (url.pathname === "/text") return new Response("x".repeat(1000), { headers: { "x-was-head": String(request.method === "HEAD") } });
      if (url.pathname === "/big") {
        const size = Number(url.searchParams.get("mib")) * 1024 * 1024;
        const block = new Uint8Array(64 * 1024).map((_, i) => i % 251);
        let sent = 0;
        return new Response(
          new ReadableStream({
            pull(controller) {
              if (sent >= size) return controller.close();
              controller.enqueue(block);
              sent += block.length;
            },
          }),
        );
      }
      if (url.pathname === "/gate") {
        // Counts the body as it streams in and says when the first MiB is here.
        const hash = createHash("sha256");
        let received = 0;
        const reader = (request.body as ReadableStream<Uint8Array>).getReader();
        for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) {
          received += chunk.value.length;
          hash.update(chunk.value);
          if (received >= 1024 * 1024) reachedFirstMiB();
        }
        return Response.json({ received, sha256: hash.digest("hex") });
      }
      const body = new Uint8Array(await request.arrayBuffer());
      const headers: Record<string, string> = {};
      request.headers.forEach((value, key) => {
        headers[key] = value;
      });
      return Response.json({
        method: request.method,
        path: url.pathname + url.search,
        headers,
        length: body.length,
        body: body.length <= 1024 ? new TextDecoder().decode(body) : "",
        sha256: sha256(body),
      });
    },
  });

  // The raw upstream answers a connection's first request only; a second request on the same
  // connection is met by a close, as when an upstream closes an idle keep-alive connection
  // just as the proxy reuses it. /close answers without a length and closes; /silent never answers.
  raw = Bun.listen<{ id: number; served: number; buffer: string }>({
    hostname: "127.0.0.1",
    port: 0,
    socket: {
      open(socket) {
        rawConnections += 1;
        socket.data = { id: rawConnections, served: 0, buffer: "" };
      },
      data(socket, data) {
        socket.data.buffer += data.toString("latin1");
        const end = socket.data.buffer.indexOf("\r\n\r\n");
        if (end < 0) return;
        const head = socket.data.buffer.slice(0, end);
        socket.data.buffer = "";
        if (head.includes(" /silent ")) return;
        if (socket.data.served > 0) {
          rawCloses += 1;
          socket.end();
          return;
        }
        socket.data.served += 1;
        if (head.includes(" /close ")) {
          socket.end("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end");
          return;
        }
        if (head.includes(" /early ")) {
          socket.write("HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
          return;
        }
        const body = `connection ${socket.data.id}`;
        socket.write(`HTTP/1.1 200 OK\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
      },
    },
  });

  const refused = await freePort();
  proxy = new ProxyListener(
    { host: "127.0.0.1", httpsPort: 0, httpPort: 0, maxBodyBytes: MAX_BODY, stateDir: removeAfterRun(tempDir("engine-forwarder-")) },
    { headerTimeoutMs: 1000 },
  );
  proxy.start({
    generation: 1,
    routes: [route("app.localhost", upstream.port ?? 0), route("raw.localhost", raw.port), route("refused.localhost", refused)],
    certificates: [],
    challenges: {},
  });
  port = proxy.httpPort;
});

afterAll(async () => {
  await proxy?.stop(false);
  upstream?.stop(true);
  raw?.stop(true);
});

describe("request bodies", () => {
  test("a chunked body, sent in pieces with extensions and trailers, reaches the upstream whole", async () => {
    const { text } = await rawRequest(
      [
        "POST /echo HTTP/1.1\r\nHost: app.localhost\r\nTransfer-Encoding: chunked\r\n\r\n",
        "5\r\nhel",
        "lo\r\n6;ext=1\r\n world\r\n",
        "0\r\nX-Trailer: 1\r\n\r\n",
      ],
      countResponses(1),
    );
    const [answer] = responses(text);
    expect(answer?.status).toBe(200);
    const echoed = JSON.parse(answer?.body ?? "{}") as { body: string; headers: Record<string, string> };
    expect(echoed.body).toBe("hello world");
    expect(echoed.headers["transfer-encoding"]).toBe("chunked");
  });

  test("a large body streams through: the upstream has its first MiB before the client sends the rest", async () => {
    const rest = new Uint8Array(31 * 1024 * 1024).map((_, i) => i % 253);
    const first = new Uint8Array(1024 * 1024).fill(7);
    const hash = createHash("sha256").update(first).update(rest);
    const listener = new ProxyListener(
      {
        host: "127.0.0.1",
        httpsPort: 0,
        httpPort: 0,
        maxBodyBytes: 64 * 1024 * 1024,
        stateDir: removeAfterRun(tempDir("engine-forwarder-")),
      },
      {},
    );
    listener.start({ generation: 1, routes: [route("app.localhost", upstream.port ?? 0)], certificates: [], challenges: {} });
    try {
      const body = new ReadableStream<Uint8Array>({
        async start(controller) {
          controller.enqueue(first);
          // A proxy that buffered whole bodies would wait here forever.
          await firstMiB;
          for (let at = 0; at < rest.length; at += 256 * 1024) controller.enqueue(rest.subarray(at, at + 256 * 1024));
          controller.close();
        },
      });
      const response = await fetch(`http://127.0.0.1:${listener.httpPort}/gate`, {
        method: "POST",
        headers: { host: "app.localhost" },
        body,
      });
      expect(response.status).toBe(200);
      expect(await response.json()).toEqual({ received: 32 * 1024 * 1024, sha256: hash.digest("hex") });
    } finally {
      await listener.stop(false);
    }
  });

  test("a Content-Length body of several MiB arrives intact", async () => {
    const body = new Uint8Array(3 * 1024 * 1024 + 17).map((_, i) => (i * 7) % 256);
    const response = await fetch(`http://127.0.0.1:${port}/echo`, { method: "PUT", headers: { host: "app.localhost" }, body });
    const echoed = (await response.json()) as { length: number; sha256: string; headers: Record<string, string> };
    expect(echoed.length).toBe(body.length);
    expect(echoed.sha256).toBe(sha256(body));
  });

  test("a large response streams to a client that reads it", async () => {
    const response = await fetch(`http://127.0.0.1:${port}/big?mib=48`, { headers: { host: "app.localhost" } });
    expect(response.status).toBe(200);
    let length = 0;
    const reader = (response.body as ReadableStream<Uint8Array>).getReader();
    for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) length += chunk.value.length;
    expect(length).toBe(48 * 1024 * 1024);
  });

  test("a Content-Length over the limit is a 413, and the connection closes", async () => {
    const { text, closed } = await rawRequest(`POST /echo HTTP/1.1\r\nHost: app.localhost\r\nContent-Length: ${MAX_BODY + 1}\r\n\r\n`);
    expect(text).toStartWith("HTTP/1.1 413 ");
    expect(text).toContain("ENGINE_PROXY_MAX_BODY_MB");
    expect(closed).toBe(true);
  });

  test("a chunked body that grows past the limit is a 413", async () => {
    const chunk = 512 * 1024;
    const pieces: string[] = ["POST /echo HTTP/1.1\r\nHost: app.localhost\r\nTransfer-Encoding: chunked\r\n\r\n"];
    for (let sent = 0; sent <= MAX_BODY; sent += chunk) pieces.push(`${chunk.toString(16)}\r\n${"y".repeat(chunk)}\r\n`);
    const { text, closed } = await rawRequest(pieces, () => false, { gapMs: 5 });
    expect(text).toStartWith("HTTP/1.1 413 ");
    expect(closed).toBe(true);
  });

  test("Expect: 100-continue gets a 100 from the proxy before the body is sent", async () => {
    let text = "";
    const socket = await Bun.connect({
      hostname: "127.0.0.1",
      port,
      socket: {
        data(_socket, data) {
          text += data.toString("latin1");
        },
      },
    });
    socket.write("POST /echo HTTP/1.1\r\nHost: app.localhost\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
    await eventually(() => text.startsWith("HTTP/1.1 100 Continue\r\n\r\n"));
    socket.write("hello");
    await eventually(() => countResponses(1)(text.slice("HTTP/1.1 100 Continue\r\n\r\n".length)));
    socket.end();
    const [answer] = responses(text.slice("HTTP/1.1 100 Continue\r\n\r\n".length));
    const echoed = JSON.parse(answer?.body ?? "{}") as { body: string; headers: Record<string, string> };
    expect(echoed.body).toBe("hello");
    expect(echoed.headers.expect).toBeUndefined();
  });

  test("Expect: 100-continue with a body over the limit is refused without a 100", async () => {
    const { text } = await rawRequest(
      `POST /echo HTTP/1.1\r\nHost: app.localhost\r\nExpect: 100-continue\r\nContent-Length: ${MAX_BODY * 2}\r\n\r\n`,
    );
    expect(text).toStartWith("HTTP/1.1 413 ");
  });
});

describe("one connection, several requests", () => {
  test("pipelined requests are answered in order, a body between them included", async () => {
    const payload =
      "GET /echo?n=1 HTTP/1.1\r\nHost: app.localhost\r\n\r\n" +
      "POST /echo?n=2 HTTP/1.1\r\nHost: app.localhost\r\nContent-Length: 5\r\n\r\nhello" +
      "GET /echo?n=3 HTTP/1.1\r\nHost: app.localhost\r\n\r\n";
    const { text } = await rawRequest(payload, countResponses(3));
    const answers = responses(text);
    expect(answers.map((a) => a.status)).toEqual([200, 200, 200]);
    expect(answers.map((a) => (JSON.parse(a.body) as { path: string }).path)).toEqual(["/echo?n=1", "/echo?n=2", "/echo?n=3"]);
    expect((JSON.parse(answers[1]?.body ?? "{}") as { body: string }).body).toBe("hello");
  });

  test("HEAD gets the upstream's Content-Length and no body; the next response follows at once", async () => {
    const { text } = await rawRequest(
      "HEAD /text HTTP/1.1\r\nHost: app.localhost\r\n\r\nGET /echo?after=head HTTP/1.1\r\nHost: app.localhost\r\n\r\n",
      countResponses(2),
    );
    const answers = responses(text);
    expect(answers[0]?.head).toMatch(/\r\ncontent-length: 1000/i);
    expect(answers[0]?.body).toBe("");
    expect((JSON.parse(answers[1]?.body ?? "{}") as { path: string }).path).toBe("/echo?after=head");
  });

  test("204 and 304 have no body; the connection goes on", async () => {
    const { text } = await rawRequest(
      "GET /status?code=204 HTTP/1.1\r\nHost: app.localhost\r\n\r\n" +
        "GET /status?code=304 HTTP/1.1\r\nHost: app.localhost\r\n\r\n" +
        "GET /echo?after=304 HTTP/1.1\r\nHost: app.localhost\r\n\r\n",
      countResponses(3),
    );
    const answers = responses(text);
    expect(answers.map((a) => a.status)).toEqual([204, 304, 200]);
    expect(answers[1]?.head).toMatch(/\r\netag: "v1"/i);
    expect((JSON.parse(answers[2]?.body ?? "{}") as { path: string }).path).toBe("/echo?after=304");
  });

  test("Connection: close is honoured after the response", async () => {
    const { text, closed } = await rawRequest("GET /echo HTTP/1.1\r\nHost: app.localhost\r\nConnection: close\r\n\r\n");
    expect(text).toStartWith("HTTP/1.1 200 ");
    expect(text).toContain("\r\nConnection: close\r\n");
    expect(closed).toBe(true);
  });

  test("HTTP/1.0 gets its answer and a close", async () => {
    const { text, closed } = await rawRequest("GET /echo HTTP/1.0\r\nHost: app.localhost\r\n\r\n");
    expect(text).toStartWith("HTTP/1.1 200 ");
    expect(closed).toBe(true);
  });

  test("HTTP/1.0 receives a streamed (chunked) response without chunked coding", async () => {
    const { text, closed } = await rawRequest("GET /big?mib=1 HTTP/1.0\r\nHost: app.localhost\r\n\r\n", () => false, { timeoutMs: 5000 });
    expect(closed).toBe(true);
    const end = text.indexOf("\r\n\r\n");
    expect(text.slice(0, end).toLowerCase()).not.toContain("transfer-encoding");
    expect(text.length - end - 4).toBe(1024 * 1024);
  });
});

describe("the upstream connection", () => {
  test("one the upstream closes as it is reused is retried once for a GET, on a new connection", async () => {
    const first = await fetch(`http://127.0.0.1:${port}/a`, { headers: { host: "raw.localhost" } });
    const firstBody = await first.text();
    expect(firstBody).toMatch(/^connection \d+$/);
    const closesBefore = rawCloses;
    const second = await fetch(`http://127.0.0.1:${port}/b`, { headers: { host: "raw.localhost" } });
    expect(second.status).toBe(200);
    expect(await second.text()).not.toBe(firstBody);
    // The pooled connection was reused, closed by the upstream, and the request sent again.
    expect(rawCloses).toBe(closesBefore + 1);
  });

  test("a POST on such a connection is not retried: 502", async () => {
    await fetch(`http://127.0.0.1:${port}/warm`, { headers: { host: "raw.localhost" } });
    const response = await fetch(`http://127.0.0.1:${port}/post`, { method: "POST", headers: { host: "raw.localhost" }, body: "x" });
    expect(response.status).toBe(502);
    expect(await response.text()).toContain("closed the connection");
  });

  test("a response delimited by the upstream's close reaches the client, which is then closed", async () => {
    const { text, closed } = await rawRequest("GET /close HTTP/1.1\r\nHost: raw.localhost\r\n\r\n");
    expect(text).toStartWith("HTTP/1.1 200 OK\r\n");
    expect(text).toContain("\r\nConnection: close\r\n");
    expect(text).toEndWith("\r\n\r\nuntil the end");
    expect(closed).toBe(true);
  });

  test("an informational 103 goes on to the client before the final response", async () => {
    const { text } = await rawRequest("GET /early HTTP/1.1\r\nHost: raw.localhost\r\n\r\n", countResponses(1));
    expect(text).toStartWith("HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\n");
    expect(text).toEndWith("\r\n\r\nok");
  });

  test("a websocket is a byte tunnel after the 101: text and a 4 MiB binary message echo back", async () => {
    const ws = new WebSocket(`ws://127.0.0.1:${port}/ws`, { headers: { host: "app.localhost" } } as never);
    ws.binaryType = "arraybuffer";
    const received: (string | ArrayBuffer)[] = [];
    ws.onmessage = (event) => received.push(event.data as string | ArrayBuffer);
    await eventually(() => ws.readyState === WebSocket.OPEN);
    const big = new Uint8Array(4 * 1024 * 1024).map((_, i) => i % 241);
    ws.send("hello");
    ws.send(big);
    await eventually(() => received.length === 2, { timeoutMs: 10_000 });
    expect(received[0]).toBe("echo:hello");
    expect(sha256(new Uint8Array(received[1] as ArrayBuffer))).toBe(sha256(big));
    ws.close();
  });

  test("a refused connection is the 502 page", async () => {
    const response = await fetch(`http://127.0.0.1:${port}/`, { headers: { host: "refused.localhost", accept: "text/html" } });
    expect(response.status).toBe(502);
    expect(response.headers.get("content-type")).toStartWith("text/html");
    expect(await response.text()).toContain("ECONNREFUSED");
  });

  test("an upstream that sends no response head in time is a 504", async () => {
    const response = await fetch(`http://127.0.0.1:${port}/silent`, { headers: { host: "raw.localhost" } });
    expect(response.status).toBe(504);
    expect(await response.text()).toContain("did not answer within 1 s");
  });

  test("the forwarded request carries the forwarding fields and not the hop-by-hop ones", async () => {
    const response = await fetch(`http://127.0.0.1:${port}/echo`, {
      headers: { host: "app.localhost:8080", connection: "keep-alive, x-drop", "x-drop": "1", "x-forwarded-for": "203.0.113.1" },
    });
    const { headers } = (await response.json()) as { headers: Record<string, string> };
    expect(headers.host).toBe("app.localhost:8080");
    expect(headers["x-forwarded-for"]).toBe("203.0.113.1, 127.0.0.1");
    expect(headers["x-forwarded-proto"]).toBe("http");
    expect(headers["x-forwarded-host"]).toBe("app.localhost:8080");
    expect(headers["x-real-ip"]).toBe("127.0.0.1");
    expect(headers["x-drop"]).toBeUndefined();
  });
});

describe("refused requests", () => {
  test.each([
    [
      "Content-Length with Transfer-Encoding",
      "POST / HTTP/1.1\r\nHost: app.localhost\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
      400,
    ],
    ["obs-fold", "GET / HTTP/1.1\r\nHost: app.localhost\r\nX-A: 1\r\n 2\r\n\r\n", 400],
    ["bare LF line ends", "GET / HTTP/1.1\nHost: app.localhost\n\n", 400],
    ["a head over 64 KiB", `GET / HTTP/1.1\r\nHost: app.localhost\r\nX-A: ${"a".repeat(70_000)}\r\n\r\n`, 431],
    ["a malformed chunk", "POST /echo HTTP/1.1\r\nHost: app.localhost\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400],
  ])("%s: %i, then the connection closes", async (_what, payload, status) => {
    const { text, closed } = await rawRequest(payload);
    expect(text).toStartWith(`HTTP/1.1 ${status} `);
    expect(closed).toBe(true);
  });

  test("a request smuggled behind a refused one is never forwarded", async () => {
    const { text } = await rawRequest(
      "POST /echo HTTP/1.1\r\nHost: app.localhost\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /echo?smuggled HTTP/1.1\r\nHost: app.localhost\r\n\r\n",
    );
    expect(text).toStartWith("HTTP/1.1 400 ");
    expect(text).not.toContain("smuggled");
  });
});

describe("sharing the port", () => {
  test("a second process binds the same port (SO_REUSEPORT) and both accept connections", async () => {
    const child = Bun.spawn([process.execPath, join(REPO_ROOT, "test", "fixtures", "proxy", "second-listener.ts")], {
      env: { ...process.env, HTTP_PORT: String(port), ROUTE_HOST: "app.localhost" },
      stdin: "pipe",
      stdout: "pipe",
      stderr: "inherit",
    });
    try {
      const reader = (child.stdout as ReadableStream<Uint8Array>).getReader();
      const line = new TextDecoder().decode((await reader.read()).value);
      expect(line).toStartWith(`ready ${port}`);
      // The kernel spreads new connections over both listeners; ours answers 200, the other 503.
      const statuses = new Set<number>();
      for (let i = 0; i < 64 && statuses.size < 2; i++) {
        const { text } = await rawRequest("GET /echo HTTP/1.1\r\nHost: app.localhost\r\nConnection: close\r\n\r\n");
        statuses.add(Number(text.slice(9, 12)));
      }
      expect([...statuses].sort()).toEqual([200, 503]);
    } finally {
      child.stdin.end();
      await Promise.race([child.exited, Bun.sleep(3000).then(() => child.kill("SIGKILL"))]);
    }
  });
});
