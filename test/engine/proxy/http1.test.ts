import { describe, expect, test } from "bun:test";
import {
  ChunkedDecoder,
  fieldValue,
  MAX_HEAD_BYTES,
  parseRequestHead,
  parseResponseHead,
  type RequestHead,
  type ResponseHead,
  responseFramingKind,
  serializeRequestHead,
  serializeResponseHead,
} from "../../../src/engine/proxy/http1";

const bytes = (text: string) => Buffer.from(text, "latin1");

/** request parses a complete request head and fails the test when it is not accepted. */
function request(text: string): RequestHead {
  const result = parseRequestHead(bytes(text));
  if (result === null || !result.ok) throw new Error(`not accepted: ${JSON.stringify(result)}`);
  return result;
}

function response(text: string): ResponseHead {
  const result = parseResponseHead(bytes(text));
  if (result === null || !result.ok) throw new Error(`not accepted: ${JSON.stringify(result)}`);
  return result;
}

describe("request heads that are refused", () => {
  test.each([
    [
      "Content-Length and Transfer-Encoding together",
      "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
      400,
    ],
    [
      "Transfer-Encoding before Content-Length",
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
      400,
    ],
    ["two differing Content-Length fields", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", 400],
    ["a Content-Length list that disagrees", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 4\r\n\r\n", 400],
    ["a negative Content-Length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400],
    ["a Content-Length with a sign", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\n", 400],
    ["a hexadecimal Content-Length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x10\r\n\r\n", 400],
    ["an empty Content-Length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n", 400],
    ["a Content-Length too large to be exact", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9999999999999999\r\n\r\n", 400],
    ["obs-fold with a space", "GET / HTTP/1.1\r\nHost: a\r\nX-A: one\r\n two\r\n\r\n", 400],
    ["obs-fold with a tab", "GET / HTTP/1.1\r\nHost: a\r\nX-A: one\r\n\ttwo\r\n\r\n", 400],
    ["a first field line that starts with a space", "GET / HTTP/1.1\r\n Host: a\r\n\r\n", 400],
    ["a bare LF ending a field line", "GET / HTTP/1.1\r\nHost: a\nX-A: b\r\n\r\n", 400],
    ["a bare LF ending the request line", "GET / HTTP/1.1\nHost: a\r\n\r\n", 400],
    ["a head of bare LFs only", "GET / HTTP/1.1\nHost: a\n\n", 400],
    ["a bare CR inside a value", "GET / HTTP/1.1\r\nHost: a\r\nX-A: b\rc\r\n\r\n", 400],
    ["a NUL inside a value", "GET / HTTP/1.1\r\nHost: a\r\nX-A: b\x00c\r\n\r\n", 400],
    ["a control character inside a value", "GET / HTTP/1.1\r\nHost: a\r\nX-A: b\x01c\r\n\r\n", 400],
    ["DEL inside a value", "GET / HTTP/1.1\r\nHost: a\r\nX-A: b\x7fc\r\n\r\n", 400],
    ["a space before the colon", "GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400],
    ["a space inside a field name", "GET / HTTP/1.1\r\nHost: a\r\nX A: b\r\n\r\n", 400],
    ["a separator inside a field name", "GET / HTTP/1.1\r\nHost: a\r\nX(A): b\r\n\r\n", 400],
    ["a non-ASCII field name", "GET / HTTP/1.1\r\nHost: a\r\nX-\xe9: b\r\n\r\n", 400],
    ["an empty field name", "GET / HTTP/1.1\r\nHost: a\r\n: b\r\n\r\n", 400],
    ["a field line without a colon", "GET / HTTP/1.1\r\nHost: a\r\nX-A b\r\n\r\n", 400],
    ["a Transfer-Encoding that is not chunked", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 400],
    ["chunked followed by another coding", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 400],
    ["chunked twice", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", 400],
    [
      "chunked twice over two fields",
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
      400,
    ],
    [
      "an unknown coding after chunked in a second field",
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n\r\n",
      400,
    ],
    ["a misspelt chunked", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunkedx\r\n\r\n", 400],
    ["Transfer-Encoding in HTTP/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400],
    ["an HTTP/1.1 request without Host", "GET / HTTP/1.1\r\nX-A: b\r\n\r\n", 400],
    ["two Host fields", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400],
    ["a Host with a space", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400],
    ["a Host with a slash", "GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400],
    ["a request line without a version", "GET /\r\nHost: a\r\n\r\n", 400],
    ["a request line with two spaces", "GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 400],
    ["a lower-case version", "GET / http/1.1\r\nHost: a\r\n\r\n", 400],
    ["a method with a separator", "G(T / HTTP/1.1\r\nHost: a\r\n\r\n", 400],
    ["a target with a control character", "GET /\x01 HTTP/1.1\r\nHost: a\r\n\r\n", 400],
    ["a target with obs-text", "GET /\xe9 HTTP/1.1\r\nHost: a\r\n\r\n", 400],
    ["a relative target", "GET a/b HTTP/1.1\r\nHost: a\r\n\r\n", 400],
    ["an asterisk target for GET", "GET * HTTP/1.1\r\nHost: a\r\n\r\n", 400],
    ["CONNECT", "CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n", 400],
    ["HTTP/0.9 style version", "GET / HTTP/0.9\r\nHost: a\r\n\r\n", 400],
    ["HTTP/2.0 over HTTP/1 framing", "GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505],
    ["a head over 64 KiB", `GET / HTTP/1.1\r\nHost: a\r\nX-A: ${"a".repeat(MAX_HEAD_BYTES)}\r\n\r\n`, 431],
    ["64 KiB without the end of the head", `GET / HTTP/1.1\r\nHost: a\r\nX-A: ${"a".repeat(MAX_HEAD_BYTES)}`, 431],
  ])("%s → %i", (_what, text, status) => {
    const result = parseRequestHead(bytes(text));
    expect(result).not.toBeNull();
    expect(result?.ok).toBe(false);
    expect(result && !result.ok ? result.status : 0).toBe(status);
  });
});

describe("request heads that are accepted", () => {
  test("a GET with its fields in order, names as received", () => {
    const head = request("GET /a?b=1 HTTP/1.1\r\nHost: App.localhost:8080\r\nX-Custom:  v a l  \r\nAccept: */*\r\n\r\n");
    expect(head.method).toBe("GET");
    expect(head.target).toBe("/a?b=1");
    expect(head.minor).toBe(1);
    expect(head.host).toBe("App.localhost:8080");
    // Only Host is read of these fields, and its line goes on as received: nothing is dropped.
    expect(head.hostLine).toBe(true);
    expect(head.dropped).toBeNull();
    expect(fieldValue(head.text, "x-custom")).toBe("v a l");
    expect(fieldValue(head.text, "accept")).toBe("*/*");
    expect(fieldValue(head.text, "cookie")).toBeNull();
    // Fields the proxy does not read go on as received: names in their case, values untouched.
    expect(serializeRequestHead(head, { clientAddress: "::1", scheme: "http" })).toContain(
      "\r\nHost: App.localhost:8080\r\nX-Custom:  v a l  \r\nAccept: */*\r\n",
    );
    expect(head.framing).toEqual({ kind: "none" });
    expect(head.keepAlive).toBe(true);
  });

  test.each([
    ["Content-Length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n\r\n", { kind: "length", length: 12 }],
    [
      "identical Content-Length fields",
      "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
      { kind: "length", length: 5 },
    ],
    ["an identical Content-Length list", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n", { kind: "length", length: 5 }],
    ["Content-Length: 0", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", { kind: "none" }],
    ["chunked", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", { kind: "chunked" }],
    ["chunked in capitals", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: CHUNKED\r\n\r\n", { kind: "chunked" }],
    ["gzip then chunked", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", { kind: "chunked" }],
    ["no body fields", "DELETE / HTTP/1.1\r\nHost: a\r\n\r\n", { kind: "none" }],
  ])("%s frames the body", (_what, text, framing) => {
    expect(request(text).framing).toEqual(framing as never);
  });

  test.each([
    ["HTTP/1.1", "GET / HTTP/1.1\r\nHost: a\r\n\r\n", true],
    ["HTTP/1.1 with Connection: close", "GET / HTTP/1.1\r\nHost: a\r\nConnection: Close\r\n\r\n", false],
    ["HTTP/1.1 with close among other tokens", "GET / HTTP/1.1\r\nHost: a\r\nConnection: x-a, close\r\nX-A: 1\r\n\r\n", false],
    ["HTTP/1.0 (always closed by the proxy)", "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", false],
  ])("%s keeps the connection: %p", (_what, text, keepAlive) => {
    expect(request(text).keepAlive).toBe(keepAlive);
  });

  test("an HTTP/1.0 request may come without Host", () => {
    expect(request("GET / HTTP/1.0\r\n\r\n").host).toBe("");
  });

  test("a higher HTTP/1 minor version is read as 1.1", () => {
    expect(request("GET / HTTP/1.7\r\nHost: a\r\n\r\n").minor).toBe(1);
  });

  test("an absolute-form target routes by its authority and is sent on in origin form", () => {
    const head = request("GET http://app.localhost:81/x?y HTTP/1.1\r\nHost: other\r\n\r\n");
    expect(head.host).toBe("app.localhost:81");
    expect(head.target).toBe("/x?y");
    const sent = serializeRequestHead(head, { clientAddress: "10.0.0.1", scheme: "http" });
    expect(sent).toStartWith("GET /x?y HTTP/1.1\r\n");
    expect(sent).toContain("Host: app.localhost:81\r\n");
    expect(sent).not.toContain("Host: other");
  });

  test("a connection's kept forwarding fields follow each request's host and a client's own X-Forwarded-For", () => {
    // One Forwarding per client connection, as the forwarder keeps it: the fields are written
    // once per host, and a request that brings its own X-Forwarded-For gets its own line.
    const forwarding = { clientAddress: "10.0.0.9", scheme: "https" as const, fields: { host: null, bytes: Buffer.alloc(0) } };
    const sent = (text: string) => serializeRequestHead(request(text), forwarding);
    const first = sent("GET / HTTP/1.1\r\nHost: a.localhost\r\n\r\n");
    expect(first).toContain("X-Forwarded-For: 10.0.0.9\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: a.localhost\r\n");
    expect(sent("GET /2 HTTP/1.1\r\nHost: a.localhost\r\n\r\n")).toBe(first.replace("GET / ", "GET /2 "));
    const other = sent("GET / HTTP/1.1\r\nHost: b.localhost\r\n\r\n");
    expect(other).toContain("X-Forwarded-Host: b.localhost\r\n");
    expect(other).not.toContain("a.localhost");
    const chained = sent("GET / HTTP/1.1\r\nHost: b.localhost\r\nX-Forwarded-For: 192.0.2.1\r\n\r\n");
    expect(chained).toContain("X-Forwarded-For: 192.0.2.1, 10.0.0.9\r\n");
    expect(sent("GET / HTTP/1.1\r\nHost: b.localhost\r\n\r\n")).toBe(other);
  });

  test("empty lines before the request line are skipped (RFC 9112 §2.2) and counted in its length", () => {
    const result = parseRequestHead(bytes("\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n"));
    expect(result?.ok && result.length).toBe(4 + 27);
  });

  test("a pipelined second request is not part of the first head", () => {
    const first = "GET /1 HTTP/1.1\r\nHost: a\r\n\r\n";
    const result = parseRequestHead(bytes(`${first}GET /2 HTTP/1.1\r\nHost: a\r\n\r\n`));
    expect(result?.ok && result.length).toBe(first.length);
  });

  test("an incomplete head waits for more bytes", () => {
    expect(parseRequestHead(bytes("GET / HTTP/1.1\r\nHost: a\r\n"))).toBeNull();
    expect(parseRequestHead(bytes("GET / HTT"))).toBeNull();
  });

  test("obs-text in a value is kept byte for byte", () => {
    const head = request("GET / HTTP/1.1\r\nHost: a\r\nX-Name: caf\xe9\r\n\r\n");
    const sent = Buffer.from(serializeRequestHead(head, { clientAddress: "1.2.3.4", scheme: "https" }), "latin1");
    expect(sent.includes(Buffer.from([0x63, 0x61, 0x66, 0xe9]))).toBe(true);
  });

  test("websocket handshakes need both Connection: upgrade and Upgrade: websocket", () => {
    expect(request("GET /ws HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Upgrade\r\nUpgrade: WebSocket\r\n\r\n").upgrade).toBe(
      "websocket",
    );
    expect(request("GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n").upgrade).toBeNull();
    expect(request("GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n").upgrade).toBeNull();
  });

  test("Expect: 100-continue is recognised in any case", () => {
    expect(request("POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n").expectContinue).toBe(true);
  });
});

describe("the request head sent upstream", () => {
  const head = request(
    "POST /p HTTP/1.1\r\nHost: web.localhost:8080\r\nConnection: keep-alive, X-Secret\r\nKeep-Alive: timeout=5\r\nX-Secret: 1\r\n" +
      "TE: trailers\r\nTrailer: X-T\r\nUpgrade: h2c\r\nProxy-Connection: keep-alive\r\nExpect: 100-continue\r\n" +
      "X-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: gopher\r\nX-Forwarded-Host: evil\r\nX-Real-IP: 6.6.6.6\r\n" +
      "Content-Length: 4, 4\r\ncookie: a=b\r\n\r\n",
  );
  const sent = serializeRequestHead(head, { clientAddress: "127.0.0.1", scheme: "https" });

  test("drops hop-by-hop fields, those named by Connection, and Expect", () => {
    for (const name of ["Connection", "Keep-Alive", "X-Secret", "TE", "Trailer", "Upgrade", "Proxy-Connection", "Expect"]) {
      expect(sent).not.toContain(`\r\n${name}:`);
    }
  });

  test("keeps Host and the other fields as received, names in their case", () => {
    expect(sent).toStartWith("POST /p HTTP/1.1\r\n");
    expect(sent).toContain("\r\nHost: web.localhost:8080\r\n");
    expect(sent).toContain("\r\ncookie: a=b\r\n");
  });

  test("appends the client to X-Forwarded-For and sets -Proto, -Host and X-Real-IP itself", () => {
    expect(sent).toContain("\r\nX-Forwarded-For: 203.0.113.9, 127.0.0.1\r\n");
    expect(sent).toContain("\r\nX-Forwarded-Proto: https\r\n");
    expect(sent).toContain("\r\nX-Forwarded-Host: web.localhost:8080\r\n");
    expect(sent).toContain("\r\nX-Real-IP: 127.0.0.1\r\n");
    expect(sent.match(/X-Forwarded-Proto/g)?.length).toBe(1);
  });

  test("Host stays even when Connection names it", () => {
    const named = serializeRequestHead(request("GET / HTTP/1.1\r\nHost: a\r\nConnection: host, x-b\r\nX-B: 1\r\nX-C: 2\r\n\r\n"), {
      clientAddress: "::1",
      scheme: "http",
    });
    expect(named).toContain("\r\nHost: a\r\n");
    expect(named).not.toContain("X-B:");
    expect(named).toContain("\r\nX-C: 2\r\n");
  });

  test("writes one Content-Length, the value it read", () => {
    expect(sent).toContain("\r\nContent-Length: 4\r\n");
    expect(sent.match(/Content-Length/gi)?.length).toBe(1);
    expect(sent).toEndWith("\r\n\r\n");
  });

  test("a chunked body keeps its coding; a websocket handshake keeps its upgrade", () => {
    const chunked = serializeRequestHead(request("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"), {
      clientAddress: "::1",
      scheme: "http",
    });
    expect(chunked).toContain("\r\nTransfer-Encoding: gzip, chunked\r\n");
    const ws = serializeRequestHead(
      request("GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\n\r\n"),
      { clientAddress: "::1", scheme: "http" },
    );
    expect(ws).toContain("\r\nConnection: upgrade\r\nUpgrade: websocket\r\n");
    expect(ws).toContain("\r\nSec-WebSocket-Key: k\r\n");
  });
});

describe("response heads", () => {
  test.each([
    ["Content-Length and Transfer-Encoding", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"],
    ["differing Content-Length", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n"],
    ["obs-fold", "HTTP/1.1 200 OK\r\nX-A: 1\r\n 2\r\n\r\n"],
    ["a malformed status line", "HTTP/1.1 OK\r\n\r\n"],
    ["a status below 100", "HTTP/1.1 099 Low\r\n\r\n"],
    ["HTTP/2 status line", "HTTP/2 200\r\n\r\n"],
    ["a bare LF", "HTTP/1.1 200 OK\nContent-Length: 0\n\n"],
  ])("refuses %s (the proxy answers 502)", (_what, text) => {
    const result = parseResponseHead(bytes(text));
    expect(result?.ok).toBe(false);
    expect(result && !result.ok ? result.status : 0).toBe(502);
  });

  test.each([
    ["HEAD", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", "none"],
    ["204", "GET", "HTTP/1.1 204 No Content\r\n\r\n", "none"],
    ["304 with a length", "GET", "HTTP/1.1 304 Not Modified\r\nContent-Length: 50\r\n\r\n", "none"],
    ["103", "GET", "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n", "none"],
    ["Content-Length", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", "length"],
    ["Content-Length: 0", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "none"],
    ["chunked", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "chunked"],
    ["a coding without chunked", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "close"],
    ["neither", "GET", "HTTP/1.0 200 OK\r\n\r\n", "close"],
    ["an empty reason", "GET", "HTTP/1.1 200 \r\nContent-Length: 1\r\n\r\n", "length"],
    ["no reason at all", "GET", "HTTP/1.1 200\r\nContent-Length: 1\r\n\r\n", "length"],
  ])("%s: the body is framed by %s", (_what, method, text, kind) => {
    expect(responseFramingKind(method, response(text))).toBe(kind as never);
  });

  test.each([
    ["HTTP/1.1", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n", true],
    ["HTTP/1.1 with close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n", false],
    ["HTTP/1.0", "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n", false],
    ["HTTP/1.0 with keep-alive and a length", "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n", true],
  ])("%s: the upstream connection may be reused: %p", (_what, text, keepAlive) => {
    expect(response(text).keepAlive).toBe(keepAlive);
  });

  test.each([
    ["an ordinary head", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\n", true],
    ["a chunked head", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", true],
    ["a head with Connection", "HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: 5\r\n\r\n", false],
    ["a head with Keep-Alive", "HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nContent-Length: 5\r\n\r\n", false],
    ["a Content-Length list", "HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n", false],
    ["two Content-Length lines", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", false],
    ["a coding without chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", false],
    ["an HTTP/1.0 status line", "HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\n", false],
  ])("%s may go to the client byte for byte: %p", (_what, text, plain) => {
    expect(response(text).plain).toBe(plain);
  });

  test("the head sent to the client drops hop-by-hop fields and says how it frames and closes", () => {
    const head = response(
      "HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Hop\r\nKeep-Alive: timeout=5\r\nX-Hop: 1\r\nTransfer-Encoding: chunked\r\nX-App: yes\r\n\r\n",
    );
    const text = serializeResponseHead(head, { chunked: true, close: true, upgrade: null });
    expect(text).toBe("HTTP/1.1 200 OK\r\nX-App: yes\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
  });
});

describe("chunked bodies", () => {
  /** decode feeds `text` to a decoder in pieces of `step` bytes and returns what it saw. */
  function decode(text: string, step: number) {
    const data: string[] = [];
    const decoder = new ChunkedDecoder((piece) => data.push(Buffer.from(piece).toString("latin1")));
    const input = bytes(text);
    let used = 0;
    for (let at = 0; at < input.length && !decoder.done; at += step) {
      const piece = input.subarray(at, Math.min(input.length, at + step));
      const n = decoder.feed(piece);
      if (n < 0) return { error: decoder.error, used, data: data.join(""), done: false };
      used += n;
    }
    return { error: null, used, data: data.join(""), done: decoder.done, dataBytes: decoder.dataBytes };
  }

  const valid: [string, string, string][] = [
    ["one chunk", "5\r\nhello\r\n0\r\n\r\n", "hello"],
    ["two chunks in hex, mixed case", "a\r\n0123456789\r\nB\r\nabcdefghijk\r\n0\r\n\r\n", "0123456789abcdefghijk"],
    ["an extension", "5;name=value\r\nhello\r\n0;last\r\n\r\n", "hello"],
    ["whitespace before an extension", "5 ;x\r\nhello\r\n0\r\n\r\n", "hello"],
    ["trailers", "5\r\nhello\r\n0\r\nX-Sum: 1\r\nX-Other: 2\r\n\r\n", "hello"],
    ["leading zeros", "005\r\nhello\r\n0000\r\n\r\n", "hello"],
    ["an empty body", "0\r\n\r\n", ""],
  ];
  test.each(valid)("reads %s, in any split", (_what, text, data) => {
    for (const step of [1, 2, 3, 7, 1000]) {
      const result = decode(text, step);
      expect(result.error).toBeNull();
      expect(result.done).toBe(true);
      expect(result.used).toBe(text.length);
      expect(result.data).toBe(data);
    }
  });

  test("stops at the end of the body: what follows is the next message", () => {
    const decoder = new ChunkedDecoder();
    const body = "3\r\nabc\r\n0\r\n\r\n";
    expect(decoder.feed(bytes(`${body}GET / HTTP/1.1\r\n`))).toBe(body.length);
    expect(decoder.done).toBe(true);
    expect(decoder.dataBytes).toBe(3);
  });

  test.each([
    ["a size that is not hex", "g\r\nhello\r\n0\r\n\r\n"],
    ["a missing size", "\r\nhello\r\n0\r\n\r\n"],
    ["a size with a sign", "+5\r\nhello\r\n0\r\n\r\n"],
    ["a bare LF after the size", "5\nhello\r\n0\r\n\r\n"],
    ["a bare CR after the size", "5\rhello\r\n0\r\n\r\n"],
    ["data longer than its size", "3\r\nhello\r\n0\r\n\r\n"],
    ["a bare LF after data", "5\r\nhello\n0\r\n\r\n"],
    ["whitespace after the size, with no extension", "5 \r\nhello\r\n0\r\n\r\n"],
    ["a control character in an extension", "5;a\x01\r\nhello\r\n0\r\n\r\n"],
    ["a size too large", "fffffffffffffffff\r\n"],
    ["obs-fold in a trailer", "0\r\nX-A: 1\r\n 2\r\n\r\n"],
    ["a bare LF ending the body", "0\r\n\n"],
  ])("refuses %s", (_what, text) => {
    for (const step of [1, 1000]) expect(decode(text, step).error).not.toBeNull();
  });
});
