import { connect } from "node:net";

/** RawRequest is one HTTP/1.1 request written byte for byte: no client normalizes its path or headers. */
export interface RawRequest {
  method: string;
  /** target is the request-target exactly as sent (dot segments, %00 and all). */
  target: string;
  headers: [string, string][];
  body?: Uint8Array | string;
}

/** RawAnswer is what came back: the status, lower-cased headers and the body as text. */
export interface RawAnswer {
  status: number;
  headers: Record<string, string>;
  body: string;
  ms: number;
}

const CRLF = "\r\n";

/** dechunk decodes a chunked transfer-coded body (RFC 9112 §7.1). */
function dechunk(data: Buffer): Buffer | null {
  const parts: Buffer[] = [];
  let offset = 0;
  for (;;) {
    const end = data.indexOf(CRLF, offset);
    if (end === -1) return null;
    const size = Number.parseInt(data.subarray(offset, end).toString("latin1").split(";")[0] ?? "", 16);
    if (Number.isNaN(size)) return null;
    if (size === 0) return Buffer.concat(parts);
    if (data.length < end + 2 + size + 2) return null;
    parts.push(data.subarray(end + 2, end + 2 + size));
    offset = end + 2 + size + 2;
  }
}

/** parse returns the answer once `data` holds a whole response, else null. */
function parse(data: Buffer, method: string, ended: boolean): Omit<RawAnswer, "ms"> | null {
  const headEnd = data.indexOf(`${CRLF}${CRLF}`);
  if (headEnd === -1) return null;
  const [statusLine = "", ...lines] = data.subarray(0, headEnd).toString("latin1").split(CRLF);
  const status = Number(statusLine.split(" ")[1]);
  const headers: Record<string, string> = {};
  for (const line of lines) {
    const colon = line.indexOf(":");
    if (colon > 0) headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
  }
  const rest = data.subarray(headEnd + 4);
  const done = (body: Buffer) => ({ status, headers, body: body.toString("utf8") });
  if (method === "HEAD" || status === 204 || status === 304) return done(Buffer.alloc(0));
  if (headers["transfer-encoding"]?.toLowerCase().includes("chunked")) {
    const body = dechunk(rest);
    return body ? done(body) : ended ? done(rest) : null;
  }
  if (headers["content-length"] !== undefined) {
    const length = Number(headers["content-length"]);
    return rest.length >= length ? done(rest.subarray(0, length)) : ended ? done(rest) : null;
  }
  return ended ? done(rest) : null;
}

/**
 * send writes one request on a fresh connection to 127.0.0.1:port and reads one answer. A
 * server that does not answer within timeoutMs gives status 0 (the suite counts it a failure).
 */
export function send(port: number, request: RawRequest, timeoutMs = 5_000): Promise<RawAnswer> {
  const started = performance.now();
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let settled = false;
    const socket = connect({ host: "127.0.0.1", port });
    const finish = (answer: Omit<RawAnswer, "ms">) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.destroy();
      resolve({ ...answer, ms: performance.now() - started });
    };
    const timer = setTimeout(() => finish({ status: 0, headers: {}, body: "no answer in time" }), timeoutMs);
    socket.on("connect", () => {
      const body =
        request.body === undefined ? undefined : typeof request.body === "string" ? Buffer.from(request.body) : Buffer.from(request.body);
      const headers = [...request.headers, ["Host", `127.0.0.1:${port}`], ["Connection", "close"]];
      if (body !== undefined && !request.headers.some(([name]) => name.toLowerCase() === "content-length")) {
        headers.push(["Content-Length", String(body.length)]);
      }
      const head = `${request.method} ${request.target} HTTP/1.1${CRLF}${headers.map(([n, v]) => `${n}: ${v}`).join(CRLF)}${CRLF}${CRLF}`;
      // One write: a body that reaches the server after its answer finds the socket closed
      // (Connection: close), and the kernel's reset takes the answer with it (decision 509).
      socket.write(body === undefined ? Buffer.from(head, "latin1") : Buffer.concat([Buffer.from(head, "latin1"), body]));
    });
    socket.on("data", (chunk: Buffer) => {
      chunks.push(chunk);
      const answer = parse(Buffer.concat(chunks), request.method, false);
      if (answer) finish(answer);
    });
    socket.on("end", () =>
      finish(parse(Buffer.concat(chunks), request.method, true) ?? { status: 0, headers: {}, body: "connection closed without an answer" }),
    );
    socket.on("error", (error) =>
      finish(parse(Buffer.concat(chunks), request.method, true) ?? { status: 0, headers: {}, body: `socket error: ${error.message}` }),
    );
  });
}
