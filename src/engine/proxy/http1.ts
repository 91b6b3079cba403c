/**
 * http1 is the proxy's HTTP/1.1 framing (RFC 9110, RFC 9112): a strict parser for request and
 * response heads, an incremental chunked-body decoder, and the serializers that write the heads
 * the proxy sends on. It is pure (bytes in, values out) so that every rule is tested with tables
 * in test/engine/proxy/http1.test.ts; the connection state machines live in forwarder.ts.
 *
 * Strict means: anything two HTTP implementations could read differently (request smuggling,
 * RFC 9112 §11.2) is refused instead of guessed at — both Content-Length and Transfer-Encoding,
 * Content-Length values that disagree, obs-fold, bare CR or LF, a Transfer-Encoding whose last
 * coding is not chunked, bytes outside the grammar in names and values.
 *
 * A head is checked whole by one regular expression (its grammar), and then only the fields
 * the proxy reads or rewrites are picked out of it; every other line is passed on as received:
 * a request head goes upstream as its own bytes, copied range by range into one reused buffer
 * around the lines the proxy drops and after the fields it adds, never turned back from text.
 * The proxy's CPU per request is mostly the kernel's; of the rest, what this module allocated
 * and wrote per head was the largest part, so the hot path allocates little: no line arrays,
 * no match arrays, no field objects for a response, one small object per request field it reads.
 */

/** MAX_HEAD_BYTES bounds a request's or response's head (request line and fields); a larger request head answers 431. */
export const MAX_HEAD_BYTES = 64 * 1024;

/** MAX_TRAILER_BYTES bounds the trailer section of a chunked body. */
const MAX_TRAILER_BYTES = 16 * 1024;

/** MAX_CHUNK_EXTENSION_BYTES bounds a chunk-size line's extensions, which the proxy passes on but never reads. */
const MAX_CHUNK_EXTENSION_BYTES = 4096;

const CRLF_CRLF = Buffer.from("\r\n\r\n", "latin1");

/** TCHAR is a character of a token (RFC 9110 §5.6.2): methods and field names. */
const TCHAR = "[!#$%&'*+\\-.^_`|~0-9A-Za-z]";
/** VALUE_CHAR is a character of a field value or reason phrase: visible ASCII, space, tab, obs-text. */
const VALUE_CHAR = "[\\t \\x21-\\x7e\\x80-\\xff]";
/** FIELD_LINES is any number of field lines, each after its CRLF: a token, a colon right after it, a value. */
const FIELD_LINES = `(?:\\r\\n${TCHAR}+:${VALUE_CHAR}*)*`;

/**
 * REQUEST_HEAD is a whole request head (RFC 9112 §3, §5): method SP request-target SP
 * HTTP-version, then field lines. A head that does not match is refused; nothing in it can be a
 * bare CR or LF, obs-fold (a line starting with whitespace), or a space before a colon.
 */
const REQUEST_HEAD = new RegExp(`^${TCHAR}+ [\\x21-\\x7e]+ HTTP\\/\\d\\.\\d${FIELD_LINES}$`);

/** RESPONSE_HEAD is a whole response head; a missing space before an empty reason is tolerated, as browsers do. */
const RESPONSE_HEAD = new RegExp(`^HTTP\\/1\\.\\d [1-9]\\d\\d(?: ${VALUE_CHAR}*)?${FIELD_LINES}$`);

/** byLength groups field names by their length, so a line's name is compared only with names as long as it. */
function byLength(names: string[]): (string[] | undefined)[] {
  const table: (string[] | undefined)[] = [];
  for (const name of names) {
    const list = table[name.length] ?? [];
    list.push(name);
    table[name.length] = list;
  }
  return table;
}

/**
 * REQUEST_FIELDS are the request fields the proxy reads; every other line goes on unread. All
 * but Host are fields it drops and writes itself: hop-by-hop ones, the forwarding fields,
 * Content-Length (written once, as the single value it read) and Expect.
 */
const REQUEST_FIELDS = byLength([
  "host",
  "content-length",
  "transfer-encoding",
  "connection",
  "upgrade",
  "expect",
  "keep-alive",
  "proxy-connection",
  "te",
  "trailer",
  "x-forwarded-for",
  "x-forwarded-proto",
  "x-forwarded-host",
  "x-real-ip",
]);

/** RESPONSE_FIELDS are the response fields that frame the body or describe the connection. */
const RESPONSE_FIELDS = byLength([
  "content-length",
  "transfer-encoding",
  "connection",
  "keep-alive",
  "proxy-connection",
  "te",
  "trailer",
  "upgrade",
]);

/** HOST_VALUE is a uri-host with an optional port: reg-name, IPv4 or a bracketed IP literal. */
const HOST_VALUE = /^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~!$&'()*+,;=%]*)(?::\d*)?$/;

/** DIGITS is a Content-Length value. 15 digits keeps it an exact integer. */
const DIGITS = /^\d{1,15}$/;

/** HeadError is why a head was refused, with the status to answer (400, 431, 505) or to report (502 for a response). */
export interface HeadError {
  ok: false;
  status: number;
  reason: string;
}

/** BodyFraming is how a message's body ends (RFC 9112 §6.3). */
export type BodyFraming =
  | { kind: "none" }
  | { kind: "length"; length: number }
  | { kind: "chunked" }
  /** close: the body runs until the sender closes the connection (responses only). */
  | { kind: "close" };

/** RequestHead is a parsed, validated request head. */
export interface RequestHead {
  /** ok and length: a parsed head is its own result (HeadResult), with the bytes it took, empty lines before it included. */
  ok: true;
  length: number;
  /** text is the head as received (latin1, one character per byte), without the empty line that ends it. */
  text: string;
  /**
   * source holds the head's bytes, `text` being those from `start` on: the head the proxy sends
   * upstream copies its unchanged lines from there rather than writing them again.
   */
  source: Buffer;
  start: number;
  method: string;
  /** target is the request-target in origin form ("/path?query"), or "*" for OPTIONS. */
  target: string;
  /** minor is the HTTP/1 minor version: 0 or 1 (a higher 1.x is read as 1.1, RFC 9110 §2.5). */
  minor: number;
  /**
   * dropped are where the field lines start that the proxy does not send on (hop-by-hop ones,
   * Content-Length, Expect, the forwarding fields it sets, a Host an absolute-form target
   * replaces), in order, or null for none; every other line is passed on unread.
   */
  dropped: readonly number[] | null;
  /** priorFor is the client's own X-Forwarded-For (its values joined), or "". */
  priorFor: string;
  /** hostLine is true when a Host line goes on as received (else the proxy writes `host` itself). */
  hostLine: boolean;
  /** host is the Host field, or the authority of an absolute-form target, which takes precedence (RFC 9112 §3.2.2). */
  host: string;
  framing: BodyFraming;
  /** contentLength is the Content-Length value (one value, even when received as a list), or -1. */
  contentLength: number;
  /** transferCodings is the Transfer-Encoding value as received, when the body is chunked. */
  transferCodings: string;
  /** keepAlive is false when the client asked to close, or speaks HTTP/1.0 (which the proxy always closes). */
  keepAlive: boolean;
  /** upgrade is "websocket" for a websocket handshake (Connection: upgrade and Upgrade: websocket), else null. */
  upgrade: string | null;
  /** expectContinue is true for `Expect: 100-continue`. */
  expectContinue: boolean;
  /** connectionTokens are the lower-cased Connection tokens: fields they name are hop-by-hop too. */
  connectionTokens: readonly string[];
}

/** ResponseHead is a parsed, validated response head from an upstream. */
export interface ResponseHead {
  /** ok and length: a parsed head is its own result (HeadResult), with the bytes it took. */
  ok: true;
  length: number;
  /** text is the head as received (latin1), without the empty line that ends it. */
  text: string;
  /**
   * plain is true when the head may go to the client byte for byte: HTTP/1.1, no field that is
   * hop-by-hop except one Transfer-Encoding line ending in chunked, and at most one
   * Content-Length line with a single value.
   */
  plain: boolean;
  status: number;
  minor: number;
  /** contentLength is the Content-Length value, or -1. */
  contentLength: number;
  /** transferCodings is the Transfer-Encoding value as received, or "". */
  transferCodings: string;
  /** chunked is true when the last transfer coding is chunked. */
  chunked: boolean;
  /** keepAlive is false when the upstream will close the connection after this response. */
  keepAlive: boolean;
  connectionTokens: readonly string[];
}

/** HeadResult is a parsed head (which says `ok`, and its length) or why it was refused; one object either way. */
export type HeadResult<T> = T | HeadError;

function fail(status: number, reason: string): HeadError {
  return { ok: false, status, reason };
}

/**
 * findHeadEnd returns the offset just past the CRLF CRLF that ends a head starting at 0, or -1
 * while the head is incomplete. A head longer than MAX_HEAD_BYTES, or one that already shows a
 * bare LF (so no CRLF CRLF may ever come), is an error at once rather than a wait for more.
 */
function findHeadEnd(buffer: Buffer, tooLarge: number, malformed: number): number | HeadError {
  const end = buffer.indexOf(CRLF_CRLF);
  if (end >= 0) {
    if (end + 4 > MAX_HEAD_BYTES) return fail(tooLarge, "the head is larger than 64 KiB");
    return end + 4;
  }
  if (buffer.length >= MAX_HEAD_BYTES) return fail(tooLarge, "the head is larger than 64 KiB");
  // A bare LF can only be refused once seen; without this a client that ends lines with LF alone
  // would wait for the idle timeout instead of getting its 400.
  for (let at = buffer.indexOf(10); at >= 0; at = buffer.indexOf(10, at + 1)) {
    if (at === 0 || buffer[at - 1] !== 13) return fail(malformed, "a line ends with a bare LF");
  }
  return -1;
}

/**
 * whatIsWrong says why a head failed REQUEST_HEAD or RESPONSE_HEAD, line by line, for the
 * answer's text; it runs only for heads that are refused.
 */
function whatIsWrong(text: string, startLine: RegExp): string {
  const lines = text.split("\r\n");
  if (!startLine.test(lines[0] as string)) return "a malformed start line";
  for (const line of lines.slice(1)) {
    if (line.startsWith(" ") || line.startsWith("\t")) return "obs-fold (a field line starting with whitespace) is not accepted";
    if (line.includes("\r") || line.includes("\n")) return "a bare CR or LF in a field line";
    if (!new RegExp(`^${TCHAR}+:${VALUE_CHAR}*$`).test(line)) return "a malformed field line";
  }
  return "a malformed head";
}

/**
 * nextField finds the next field line of a validated head, from the line break at `from` on,
 * whose name is in `names` (grouped by length), and returns where its line starts, or -1. It
 * allocates nothing: the name found (lower-case, from `names`), where its value starts and ends
 * without the whitespace around it, and the line break after it (where to go on from) are left
 * in `found`. Names are compared letter by letter without case: in a validated token `c | 0x20`
 * equals a lower-case letter or `-` only for that letter in either case, or for `-` itself.
 */
function nextField(text: string, from: number, names: (string[] | undefined)[]): number {
  let lineBreak = from;
  while (lineBreak >= 0) {
    const start = lineBreak + 2;
    lineBreak = text.indexOf("\r\n", start);
    const colon = text.indexOf(":", start);
    const candidates = names[colon - start];
    if (candidates === undefined) continue;
    for (const name of candidates) {
      let i = 0;
      while (i < name.length && (text.charCodeAt(start + i) | 0x20) === name.charCodeAt(i)) i += 1;
      if (i < name.length) continue;
      const valueStart = valueFrom(text, colon + 1, lineBreak < 0 ? text.length : lineBreak);
      found.name = name;
      found.valueStart = valueStart;
      found.valueEnd = valueTo(text, valueStart, lineBreak < 0 ? text.length : lineBreak);
      found.next = lineBreak;
      return start;
    }
  }
  return -1;
}

/** firstField is nextField from a head's first field line on. */
function firstField(text: string, names: (string[] | undefined)[]): number {
  return nextField(text, text.indexOf("\r\n"), names);
}

/** found is nextField's last find; parsing is synchronous, so one record serves every head. */
const found = { name: "", valueStart: 0, valueEnd: 0, next: -1 };

/**
 * foundContentLength folds the Content-Length value nextField found last into the one seen so
 * far (readContentLength), reading a plain run of digits where it lies.
 */
function foundContentLength(text: string, previous: number): number | string {
  const digits = digitsValue(text, found.valueStart, found.valueEnd);
  if (digits >= 0 && (previous < 0 || digits === previous)) return digits;
  return readContentLength(text.slice(found.valueStart, found.valueEnd), previous);
}

/** digitsValue is the number a run of 1 to 15 ASCII digits spells, or -1 for anything else (a list, a sign, a space). */
function digitsValue(text: string, from: number, to: number): number {
  if (to <= from || to - from > 15) return -1;
  let n = 0;
  for (let i = from; i < to; i++) {
    const c = text.charCodeAt(i) - 48;
    if (c < 0 || c > 9) return -1;
    n = n * 10 + c;
  }
  return n;
}

/** valueFrom is where a field value between `from` and `to` starts, after its optional whitespace (spaces and tabs only, RFC 9110 §5.6.3). */
function valueFrom(text: string, from: number, to: number): number {
  let start = from;
  while (start < to && (text.charCodeAt(start) === 32 || text.charCodeAt(start) === 9)) start += 1;
  return start;
}

/** valueTo is where a field value that starts at `start` ends, before the optional whitespace that comes before `to`. */
function valueTo(text: string, start: number, to: number): number {
  let end = to;
  while (end > start && (text.charCodeAt(end - 1) === 32 || text.charCodeAt(end - 1) === 9)) end -= 1;
  return end;
}

/** trimValue is the field value between `from` and `to` without the optional whitespace around it. */
function trimValue(text: string, from: number, to: number): string {
  const start = valueFrom(text, from, to);
  return text.slice(start, valueTo(text, start, to));
}

/**
 * fieldValue is the value of the first field named `lowerName` in a head's text, or null. It
 * is for the fields the proxy rarely reads (Accept, for an error page) and scans the text.
 */
export function fieldValue(text: string, lowerName: string): string | null {
  let at = 0;
  for (;;) {
    at = text.indexOf("\r\n", at);
    if (at < 0) return null;
    at += 2;
    const colon = text.indexOf(":", at);
    if (colon - at === lowerName.length && text.slice(at, colon).toLowerCase() === lowerName) {
      const end = text.indexOf("\r\n", colon);
      return trimValue(text, colon + 1, end < 0 ? text.length : end);
    }
  }
}

/** NONE is the empty token list most heads have, shared rather than allocated per head; it is never added to. */
const NONE: readonly string[] = Object.freeze([]);

/** listTokens appends the members of a comma-separated field value, lower-cased and trimmed, to `list` (a new array when `list` is NONE). */
function listTokens(value: string, list: readonly string[]): string[] {
  const into = list === NONE ? [] : (list as string[]);
  for (const part of value.split(",")) {
    const token = part.trim().toLowerCase();
    if (token) into.push(token);
  }
  return into;
}

/** NO_BODY and CHUNKED are the request framings without a length, shared by every head. */
const NO_BODY: BodyFraming = { kind: "none" };
const CHUNKED: BodyFraming = { kind: "chunked" };

/**
 * readContentLength folds a Content-Length value into the one seen so far: RFC 9110 §8.6 lets a
 * recipient accept a list of identical values ("5, 5"), and any disagreement is an error.
 */
function readContentLength(value: string, previous: number): number | string {
  if (DIGITS.test(value)) {
    const n = Number(value);
    return previous >= 0 && n !== previous ? "Content-Length values disagree" : n;
  }
  let length = previous;
  for (const part of value.split(",")) {
    const digits = part.trim();
    if (!DIGITS.test(digits)) return "an invalid Content-Length";
    const n = Number(digits);
    if (length >= 0 && n !== length) return "Content-Length values disagree";
    length = n;
  }
  return length;
}

/** parseTarget turns an absolute-form target into origin form and its authority; other forms pass through. */
function parseTarget(method: string, target: string): { path: string; authority: string | null } | string {
  if (target.charCodeAt(0) === 47 /* / */) return { path: target, authority: null };
  if (target === "*") return method === "OPTIONS" ? { path: "*", authority: null } : "an asterisk target is only for OPTIONS";
  const absolute = /^https?:\/\/([^/?#]*)([^#]*)$/i.exec(target);
  if (!absolute) return "the request target is not in origin or absolute form";
  const path = absolute[2] ?? "";
  return { authority: absolute[1] ?? "", path: path.startsWith("/") ? path : `/${path}` };
}

/** ORIGIN_FORM stands for a target in origin form, whose path is the target as received. */
const ORIGIN_FORM = { path: "", authority: null } as const;

/** METHODS are the common methods, whose names a head shares rather than cuts from its text. */
const METHODS = byLength(["GET", "PUT", "HEAD", "POST", "PATCH", "DELETE", "OPTIONS"]);

/** methodOf is the method at the start of a head's text, `length` characters long: a shared string for a common one. */
function methodOf(text: string, length: number): string {
  const candidates = METHODS[length];
  if (candidates !== undefined) {
    for (const name of candidates) if (text.startsWith(name)) return name;
  }
  return text.slice(0, length);
}

const REQUEST_LINE = new RegExp(`^${TCHAR}+ [\\x21-\\x7e]+ HTTP\\/\\d\\.\\d$`);

/**
 * parseRequestHead parses the request head at the start of `buffer`. It returns null while the
 * head is incomplete, the head and its length in bytes once complete, or the status to answer:
 * 431 for a head over MAX_HEAD_BYTES, 505 for an HTTP major version other than 1, 400 for every
 * other fault. Empty lines before the request line are skipped (RFC 9112 §2.2).
 */
export function parseRequestHead(input: Buffer): HeadResult<RequestHead> | null {
  let skipped = 0;
  while (input.length >= skipped + 2 && input[skipped] === 13 && input[skipped + 1] === 10) skipped += 2;
  const buffer = skipped > 0 ? input.subarray(skipped) : input;
  const end = findHeadEnd(buffer, 431, 400);
  if (end === -1) return null;
  if (typeof end !== "number") return end;
  const text = buffer.toString("latin1", 0, end - 4);
  if (!REQUEST_HEAD.test(text)) return fail(400, whatIsWrong(text, REQUEST_LINE));
  // REQUEST_HEAD vouches for the shape: "METHOD SP target SP HTTP/d.d".
  const methodEnd = text.indexOf(" ");
  const targetEnd = text.indexOf(" ", methodEnd + 1);
  const method = methodOf(text, methodEnd);
  const major = text.charCodeAt(targetEnd + 6) - 48;
  if (major !== 1) return fail(major === 0 ? 400 : 505, "only HTTP/1.0 and HTTP/1.1 are served");
  const minor = text.charCodeAt(targetEnd + 8) - 48 >= 1 ? 1 : 0;
  if (method === "CONNECT") return fail(400, "CONNECT is not served by a reverse proxy");
  // The origin form ("/path"), which nearly every request has, needs no parsing and no object.
  const targetText = text.slice(methodEnd + 1, targetEnd);
  const target = targetText.charCodeAt(0) === 47 /* / */ ? ORIGIN_FORM : parseTarget(method, targetText);
  if (typeof target === "string") return fail(400, target);
  const path = target === ORIGIN_FORM ? targetText : target.path;
  let host: string | null = null;
  let hostStart = -1;
  let contentLength = -1;
  let transferCodings = "";
  let codings = NONE;
  let connectionTokens = NONE;
  let upgradeValue: string | null = null;
  let expectContinue = false;
  let priorFor = "";
  // dropped are the lines the proxy does not send on: it writes its own framing, connection
  // and forwarding fields. Most heads have none, and then no array is made.
  let dropped: number[] | null = null;
  for (let start = firstField(text, REQUEST_FIELDS); start >= 0; start = nextField(text, found.next, REQUEST_FIELDS)) {
    const name = found.name;
    if (name === "host") {
      if (host !== null) return fail(400, "more than one Host field");
      const value = text.slice(found.valueStart, found.valueEnd);
      if (!HOST_VALUE.test(value)) return fail(400, "an invalid Host");
      host = value;
      hostStart = start;
      continue;
    }
    if (name === "content-length") {
      const length = foundContentLength(text, contentLength);
      if (typeof length === "string") return fail(400, length);
      contentLength = length;
    } else if (name === "transfer-encoding") {
      const value = text.slice(found.valueStart, found.valueEnd);
      transferCodings = transferCodings ? `${transferCodings}, ${value}` : value;
      codings = listTokens(value, codings);
    } else if (name === "connection") connectionTokens = listTokens(text.slice(found.valueStart, found.valueEnd), connectionTokens);
    else if (name === "upgrade") upgradeValue = text.slice(found.valueStart, found.valueEnd);
    else if (name === "expect") {
      if (text.slice(found.valueStart, found.valueEnd).toLowerCase() === "100-continue") expectContinue = true;
    } else if (name === "x-forwarded-for") {
      const value = text.slice(found.valueStart, found.valueEnd);
      priorFor = priorFor ? `${priorFor}, ${value}` : value;
    }
    // Every field the proxy reads but Host is one it sets itself (REQUEST_FIELDS).
    if (dropped === null) dropped = [];
    dropped.push(start);
  }
  if (host === null && minor === 1 && target.authority === null) return fail(400, "an HTTP/1.1 request without Host");
  // An absolute-form target's authority replaces Host (RFC 9112 §3.2.2): a Host line that
  // differs from it is dropped, and the upstream gets the authority as Host.
  let hostLine = host !== null;
  if (target.authority !== null) {
    if (!HOST_VALUE.test(target.authority)) return fail(400, "an invalid authority in the request target");
    if (host !== null && host !== target.authority) {
      hostLine = false;
      if (dropped === null) dropped = [];
      dropped.push(hostStart);
    }
    host = target.authority;
  }
  let framing: BodyFraming;
  if (codings.length > 0) {
    if (contentLength >= 0) return fail(400, "both Content-Length and Transfer-Encoding");
    if (minor === 0) return fail(400, "Transfer-Encoding in an HTTP/1.0 request");
    if (codings[codings.length - 1] !== "chunked" || codings.indexOf("chunked") !== codings.length - 1) {
      return fail(400, "a Transfer-Encoding whose only and last coding is not chunked");
    }
    framing = CHUNKED;
  } else framing = contentLength > 0 ? { kind: "length", length: contentLength } : NO_BODY;
  const upgrade = upgradeValue !== null && connectionTokens.includes("upgrade") && /^websocket$/i.test(upgradeValue) ? "websocket" : null;
  return {
    ok: true,
    length: skipped + end,
    text,
    source: input,
    start: skipped,
    method,
    target: path,
    minor,
    dropped,
    priorFor,
    hostLine,
    host: host ?? "",
    framing,
    contentLength,
    transferCodings,
    keepAlive: minor === 1 && !connectionTokens.includes("close"),
    upgrade,
    expectContinue,
    connectionTokens,
  };
}

const STATUS_LINE = new RegExp(`^HTTP\\/1\\.\\d [1-9]\\d\\d(?: ${VALUE_CHAR}*)?$`);

/**
 * parseResponseHead parses an upstream's response head at the start of `buffer`: null while
 * incomplete, else the head and its length, or an error (the proxy answers 502 for it). An
 * upstream is held to the same framing rules as a client: a response with both Content-Length
 * and Transfer-Encoding, or disagreeing lengths, is refused rather than guessed at.
 */
export function parseResponseHead(buffer: Buffer): HeadResult<ResponseHead> | null {
  const end = findHeadEnd(buffer, 502, 502);
  if (end === -1) return null;
  if (typeof end !== "number") return end;
  const text = buffer.toString("latin1", 0, end - 4);
  if (!RESPONSE_HEAD.test(text)) return fail(502, whatIsWrong(text, STATUS_LINE));
  // RESPONSE_HEAD vouches for the shape: "HTTP/1.d ddd".
  const minor = text.charCodeAt(7) - 48 >= 1 ? 1 : 0;
  const status = (text.charCodeAt(9) - 48) * 100 + (text.charCodeAt(10) - 48) * 10 + (text.charCodeAt(11) - 48);
  let contentLength = -1;
  let transferCodings = "";
  let codings = NONE;
  let connectionTokens = NONE;
  // plain stays true while nothing in the head needs rewriting for the client.
  let plain = minor === 1;
  let lengthLines = 0;
  let codingLines = 0;
  // The fields are read where they lie; a value is cut out of the text only when it is a list.
  for (let start = firstField(text, RESPONSE_FIELDS); start >= 0; start = nextField(text, found.next, RESPONSE_FIELDS)) {
    const name = found.name;
    if (name === "content-length") {
      const length = foundContentLength(text, contentLength);
      if (typeof length === "string") return fail(502, length);
      contentLength = length;
      // A list ("5, 5") is written again as one value.
      const comma = text.indexOf(",", found.valueStart);
      if (++lengthLines > 1 || (comma >= 0 && comma < found.valueEnd)) plain = false;
    } else if (name === "transfer-encoding") {
      const value = text.slice(found.valueStart, found.valueEnd);
      transferCodings = transferCodings ? `${transferCodings}, ${value}` : value;
      codings = listTokens(value, codings);
      codingLines += 1;
    } else {
      plain = false;
      if (name === "connection") connectionTokens = listTokens(text.slice(found.valueStart, found.valueEnd), connectionTokens);
    }
  }
  if (codings.length > 0 && contentLength >= 0) return fail(502, "both Content-Length and Transfer-Encoding");
  const chunked = codings.length > 0 && codings[codings.length - 1] === "chunked";
  if (chunked && codings.indexOf("chunked") !== codings.length - 1) return fail(502, "chunked applied more than once");
  if (codingLines > 1 || (codingLines === 1 && !chunked)) plain = false;
  return {
    ok: true,
    length: end,
    text,
    plain,
    status,
    minor,
    contentLength,
    transferCodings,
    chunked,
    keepAlive:
      minor === 1
        ? !connectionTokens.includes("close")
        : connectionTokens.includes("keep-alive") && !connectionTokens.includes("close") && (contentLength >= 0 || chunked),
    connectionTokens,
  };
}

/**
 * responseFramingKind is how a response's body ends (RFC 9112 §6.3): never a body for HEAD,
 * 1xx, 204 and 304; chunked when the last coding is chunked; else Content-Length (its length
 * is `head.contentLength`); else the connection's close (which also covers a
 * Transfer-Encoding without chunked). A kind rather than a framing, so a response costs no
 * framing object.
 */
export function responseFramingKind(method: string, head: ResponseHead): BodyFraming["kind"] {
  if (method === "HEAD" || head.status < 200 || head.status === 204 || head.status === 304) return "none";
  if (head.chunked) return "chunked";
  if (head.transferCodings) return "close";
  if (head.contentLength >= 0) return head.contentLength === 0 ? "none" : "length";
  return "close";
}

/** IDEMPOTENT are the methods a request may be sent again for (RFC 9110 §9.2.2). */
const IDEMPOTENT = new Set(["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"]);

/** isIdempotent is true for methods that may be retried after a connection failed before any answer. */
export function isIdempotent(method: string): boolean {
  return IDEMPOTENT.has(method);
}

enum ChunkState {
  Size,
  SizeSpace,
  Extension,
  SizeLf,
  Data,
  DataCr,
  DataLf,
  TrailerStart,
  Trailer,
  TrailerLf,
  EndLf,
  Done,
}

/**
 * ChunkedDecoder follows a chunked body (RFC 9112 §7.1) as its bytes arrive, in any split. It
 * finds where the body ends, counts its data bytes (for the body limit), and refuses what is
 * not chunked coding: a size that is not hex, a bare CR or LF, a missing CRLF after data,
 * oversized extensions or trailers. The proxy forwards the received bytes unchanged (the
 * framing it checked is the framing the next hop reads); `onData`, when set, also receives the
 * decoded data, for a client that cannot read chunked coding.
 */
export class ChunkedDecoder {
  private state = ChunkState.Size;
  private remaining = 0;
  private sizeDigits = 0;
  private lineBytes = 0;
  private trailerBytes = 0;
  /** dataBytes is the number of data bytes seen so far. */
  dataBytes = 0;
  /** error is why the body is not valid chunked coding, once it is not. */
  error: string | null = null;

  constructor(private readonly onData?: (data: Uint8Array) => void) {}

  /** done is true once the last chunk and the trailer section have been read. */
  get done(): boolean {
    return this.state === ChunkState.Done;
  }

  /**
   * feed reads `bytes` from `from` and returns how many belong to the body: all of them while
   * it goes on, fewer when it ends inside them (the rest is the next message), and -1 after an
   * error (see `error`).
   */
  feed(bytes: Uint8Array, from = 0): number {
    let i = from;
    const length = bytes.length;
    while (i < length) {
      const state = this.state;
      if (state === ChunkState.Data) {
        const take = Math.min(this.remaining, length - i);
        if (this.onData) this.onData(bytes.subarray(i, i + take));
        this.remaining -= take;
        this.dataBytes += take;
        i += take;
        if (this.remaining === 0) this.state = ChunkState.DataCr;
        continue;
      }
      if (state === ChunkState.Done) break;
      const c = bytes[i] as number;
      i += 1;
      switch (state) {
        case ChunkState.Size: {
          const digit = hexValue(c);
          if (digit >= 0) {
            if (++this.sizeDigits > 12) return this.fail("a chunk size too large");
            this.remaining = this.remaining * 16 + digit;
          } else if (this.sizeDigits === 0) return this.fail("a chunk size that is not hexadecimal");
          else if (c === 13) this.state = ChunkState.SizeLf;
          else if (c === 59 /* ; */) this.enterExtension();
          else if (c === 32 || c === 9) this.state = ChunkState.SizeSpace;
          else return this.fail("a chunk size that is not hexadecimal");
          break;
        }
        case ChunkState.SizeSpace:
          // RFC 9112 §7.1.1 allows whitespace (BWS) only before an extension's semicolon.
          if (c === 59) this.enterExtension();
          else if (c !== 32 && c !== 9) return this.fail("whitespace after a chunk size");
          break;
        case ChunkState.Extension:
          if (c === 13) this.state = ChunkState.SizeLf;
          else if ((c < 32 && c !== 9) || c === 127) return this.fail("a control character in a chunk extension");
          else if (++this.lineBytes > MAX_CHUNK_EXTENSION_BYTES) return this.fail("a chunk extension too long");
          break;
        case ChunkState.SizeLf:
          if (c !== 10) return this.fail("a bare CR after a chunk size");
          if (this.remaining === 0) this.state = ChunkState.TrailerStart;
          else this.state = ChunkState.Data;
          this.sizeDigits = 0;
          break;
        case ChunkState.DataCr:
          if (c !== 13) return this.fail("chunk data longer than its size");
          this.state = ChunkState.DataLf;
          break;
        case ChunkState.DataLf:
          if (c !== 10) return this.fail("a bare CR after chunk data");
          this.state = ChunkState.Size;
          break;
        case ChunkState.TrailerStart:
          if (c === 13) this.state = ChunkState.EndLf;
          else if (c === 10 || c === 32 || c === 9) return this.fail("a malformed trailer field");
          else {
            this.state = ChunkState.Trailer;
            if (++this.trailerBytes > MAX_TRAILER_BYTES) return this.fail("trailers larger than 16 KiB");
          }
          break;
        case ChunkState.Trailer:
          if (c === 13) this.state = ChunkState.TrailerLf;
          else if (c === 10 || (c < 32 && c !== 9) || c === 127) return this.fail("a control character in a trailer field");
          else if (++this.trailerBytes > MAX_TRAILER_BYTES) return this.fail("trailers larger than 16 KiB");
          break;
        case ChunkState.TrailerLf:
          if (c !== 10) return this.fail("a bare CR in a trailer field");
          this.state = ChunkState.TrailerStart;
          break;
        case ChunkState.EndLf:
          if (c !== 10) return this.fail("a bare CR at the end of a chunked body");
          this.state = ChunkState.Done;
          return i - from;
      }
    }
    return i - from;
  }

  private enterExtension(): void {
    this.state = ChunkState.Extension;
    this.lineBytes = 0;
  }

  private fail(reason: string): number {
    this.error = reason;
    return -1;
  }
}

function hexValue(c: number): number {
  if (c >= 48 && c <= 57) return c - 48;
  if (c >= 97 && c <= 102) return c - 87;
  if (c >= 65 && c <= 70) return c - 55;
  return -1;
}

/** REASONS are the reason phrases of the statuses the proxy writes itself. */
const REASONS: Record<number, string> = {
  100: "Continue",
  101: "Switching Protocols",
  200: "OK",
  308: "Permanent Redirect",
  400: "Bad Request",
  404: "Not Found",
  413: "Content Too Large",
  431: "Request Header Fields Too Large",
  500: "Internal Server Error",
  502: "Bad Gateway",
  503: "Service Unavailable",
  504: "Gateway Timeout",
  505: "HTTP Version Not Supported",
};

/** reasonPhrase is the standard phrase for a status the proxy writes itself. */
export function reasonPhrase(status: number): string {
  return REASONS[status] ?? "Unknown";
}

/** Forwarding is what the proxy adds to a request it forwards. */
export interface Forwarding {
  /** clientAddress is the peer's IP address (X-Forwarded-For, X-Real-IP). */
  clientAddress: string;
  /** scheme is the client's scheme (X-Forwarded-Proto). */
  scheme: "http" | "https";
  /**
   * fields, when given, keeps the forwarding fields last written for `host`, as bytes: a
   * connection's requests come from one address, usually for one host, so a kept-alive
   * connection makes them once rather than joining five strings per request.
   */
  fields?: { host: string | null; bytes: Buffer };
}

/** forwardingText is X-Forwarded-For (after `priorFor`, the client's own), -Proto, -Host and X-Real-IP. */
function forwardingText(host: string, priorFor: string, forwarding: Forwarding): string {
  const client = forwarding.clientAddress;
  return (
    `X-Forwarded-For: ${priorFor ? `${priorFor}, ${client}` : client}\r\nX-Forwarded-Proto: ${forwarding.scheme}\r\n` +
    `X-Forwarded-Host: ${host}\r\nX-Real-IP: ${client}\r\n`
  );
}

/** forwardingBytes are the forwarding fields of a request without X-Forwarded-For of its own, kept per connection and host. */
function forwardingBytes(host: string, forwarding: Forwarding): Buffer {
  const kept = forwarding.fields;
  if (kept !== undefined && kept.host === host) return kept.bytes;
  const bytes = Buffer.from(forwardingText(host, "", forwarding), "latin1");
  if (kept !== undefined) {
    kept.host = host;
    kept.bytes = bytes;
  }
  return bytes;
}

/**
 * namedLines finds the lines of the fields a Connection header names (other than the
 * connection options the proxy handles itself): they are hop-by-hop too (RFC 9110 §7.6.1).
 */
function namedLines(text: string, tokens: readonly string[]): number[] {
  const starts: number[] = [];
  for (const token of tokens) {
    // Host is never dropped: the upstream needs it, whatever the client's Connection says.
    if (token === "close" || token === "keep-alive" || token === "upgrade" || token === "host") continue;
    if (!/^[!#$%&'*+\-.^_`|~0-9a-z]+$/.test(token)) continue;
    const pattern = new RegExp(`\r\n${token.replace(/[.*+^$|]/g, "\\$&")}:`, "gi");
    for (let match = pattern.exec(text); match !== null; match = pattern.exec(text)) starts.push(match.index + 2);
  }
  return starts;
}

/** ranges holds keptRanges' answer: pairs of start and end offsets in a head's text. */
let ranges = new Int32Array(64);

/**
 * keptRanges finds the runs of a head's field lines (each after its CRLF) that are kept when the
 * lines starting at `dropped` (in order) are left out, and returns how many it left in `ranges`
 * as [from, to) pairs: a head with nothing to drop is one run, from its first CRLF to its end.
 */
function keptRanges(text: string, dropped: readonly number[] | null): number {
  const firstBreak = text.indexOf("\r\n");
  if (firstBreak < 0) return 0;
  const cuts = dropped === null ? 0 : dropped.length;
  const most = 2 * (cuts + 1);
  if (ranges.length < most) ranges = new Int32Array(most * 2);
  let count = 0;
  // keptFrom is where the next run of kept lines begins: the CRLF before a line.
  let keptFrom = firstBreak;
  for (let d = 0; d < cuts; d++) {
    const start = (dropped as readonly number[])[d] as number;
    if (start - 2 > keptFrom) {
      ranges[count++] = keptFrom;
      ranges[count++] = start - 2;
    }
    const end = text.indexOf("\r\n", start);
    keptFrom = end < 0 ? text.length : end;
  }
  if (keptFrom < text.length) {
    ranges[count++] = keptFrom;
    ranges[count++] = text.length;
  }
  return count / 2;
}

/** HTTP_1_1 ends the request line the proxy sends; CRLF ends lines. */
const HTTP_1_1 = Buffer.from(" HTTP/1.1", "latin1");

/** scratch is where request heads are written; one head at a time, sent (or copied) before the next is written. */
let scratch = Buffer.allocUnsafe(16 * 1024);

/** headBuffer is the buffer that holds the head writeRequestHead wrote last. */
export function headBuffer(): Buffer {
  return scratch;
}

/**
 * writeRequestHead writes the head the proxy sends upstream at the start of `headBuffer()` and
 * returns its length in bytes: the request line in origin form over
 * HTTP/1.1; the client's field lines as received, minus hop-by-hop ones and those its
 * Connection names, minus Expect (the proxy answers 100-continue itself) and the forwarding
 * fields it sets; `Host` as received; X-Forwarded-For (appended to), -Proto, -Host and
 * X-Real-IP; the body's framing (chunked coding passes through unchanged); and the upgrade
 * fields of a websocket handshake. What goes on unchanged is copied from the bytes the head
 * was read from, never turned into a string and back. The buffer is shared by every call: its
 * bytes are to be written (or copied) before the next call. `room` more bytes are left free
 * after the head, for the first bytes of a body to go in the same write.
 */
export function writeRequestHead(head: RequestHead, forwarding: Forwarding, room = 0): number {
  const text = head.text;
  const priorFor = head.priorFor;
  let dropped = head.dropped;
  if (head.connectionTokens.length > 0) {
    // Lines the Connection field names may come anywhere: the runs are cut in order.
    const named = namedLines(text, head.connectionTokens);
    if (named.length > 0) dropped = (dropped === null ? named : [...dropped, ...named]).sort((a, b) => a - b);
  }
  let extra = "";
  // An absolute-form request may come without Host; the upstream still needs one.
  if (!head.hostLine && head.host) extra += `Host: ${head.host}\r\n`;
  const forwardingFields = priorFor === "" ? forwardingBytes(head.host, forwarding) : forwardingText(head.host, priorFor, forwarding);
  if (head.contentLength >= 0) extra += `Content-Length: ${head.contentLength}\r\n`;
  if (head.framing.kind === "chunked") extra += `Transfer-Encoding: ${head.transferCodings}\r\n`;
  if (head.upgrade) extra += `Connection: upgrade\r\nUpgrade: ${head.upgrade}\r\n`;

  // The bound: the request line and fields as received, at most, and what the proxy adds.
  const bound = head.method.length + head.target.length + text.length + forwardingFields.length + extra.length + 16 + room;
  if (scratch.length < bound) scratch = Buffer.allocUnsafe(Math.max(bound, scratch.length * 2));
  const out = scratch;
  const source = head.source;
  const base = head.start;
  // The request line: as received up to the target when the target is, then the version the proxy speaks.
  const targetAt = head.method.length + 1;
  let at: number;
  if (text.startsWith(head.target, targetAt) && text.charCodeAt(targetAt + head.target.length) === 32) {
    at = source.copy(out, 0, base, base + targetAt + head.target.length);
  } else at = out.write(`${head.method} ${head.target}`, 0, "latin1");
  at += HTTP_1_1.copy(out, at);
  // The field lines as received, each after its CRLF, cut where a dropped line starts.
  const runs = keptRanges(text, dropped);
  for (let i = 0; i < 2 * runs; i += 2) at += source.copy(out, at, base + (ranges[i] as number), base + (ranges[i + 1] as number));
  out[at++] = 13;
  out[at++] = 10;
  at += typeof forwardingFields === "string" ? out.write(forwardingFields, at, "latin1") : forwardingFields.copy(out, at);
  if (extra) at += out.write(extra, at, "latin1");
  out[at++] = 13;
  out[at++] = 10;
  return at;
}

/** serializeRequestHead is writeRequestHead's head as latin1 text, one character per byte (for tests and logs). */
export function serializeRequestHead(head: RequestHead, forwarding: Forwarding): string {
  const length = writeRequestHead(head, forwarding);
  return headBuffer().toString("latin1", 0, length);
}

/**
 * serializeResponseHead writes the head the proxy sends to its client: the upstream's status
 * over HTTP/1.1, its field lines minus hop-by-hop ones and those its Connection names, then the
 * framing the proxy keeps (`Transfer-Encoding` when the chunked body passes through unchanged),
 * `Connection: close` when the proxy closes after it, and the upgrade fields of a 101. It
 * returns latin1 text like serializeRequestHead. (A `plain` head the proxy neither closes nor
 * de-chunks is not written again at all: its bytes go on as received.)
 */
export function serializeResponseHead(head: ResponseHead, options: { chunked: boolean; close: boolean; upgrade: string | null }): string {
  const source = head.text;
  const dropped = head.connectionTokens.length > 0 ? namedLines(source, head.connectionTokens) : [];
  for (let start = firstField(source, RESPONSE_FIELDS); start >= 0; start = nextField(source, found.next, RESPONSE_FIELDS)) {
    dropped.push(start);
  }
  dropped.sort((a, b) => a - b);
  // The status and reason go on as received, after the version the proxy speaks.
  const statusLineEnd = source.indexOf("\r\n");
  let text = `HTTP/1.1 ${source.slice(9, statusLineEnd < 0 ? source.length : statusLineEnd)}`;
  const runs = keptRanges(source, dropped);
  for (let i = 0; i < 2 * runs; i += 2) text += source.slice(ranges[i], ranges[i + 1]);
  text += "\r\n";
  if (head.contentLength >= 0) text += `Content-Length: ${head.contentLength}\r\n`;
  if (options.chunked) text += `Transfer-Encoding: ${head.transferCodings}\r\n`;
  if (options.upgrade) text += `Connection: upgrade\r\nUpgrade: ${options.upgrade}\r\n`;
  else if (options.close) text += "Connection: close\r\n";
  return `${text}\r\n`;
}

/** LocalAnswer is a response the proxy makes itself (error pages, redirects, ACME answers). */
export interface LocalAnswer {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/** serializeAnswer writes a whole local answer: head and, unless the request was HEAD, body. */
export function serializeAnswer(answer: LocalAnswer, options: { head: boolean; close: boolean }): Buffer {
  const body = Buffer.from(answer.body, "utf8");
  let text = `HTTP/1.1 ${answer.status} ${reasonPhrase(answer.status)}\r\n`;
  for (const [name, value] of Object.entries(answer.headers)) text += `${name}: ${value}\r\n`;
  text += `content-length: ${body.length}\r\n`;
  if (options.close) text += "connection: close\r\n";
  const head = Buffer.from(`${text}\r\n`, "latin1");
  return options.head || body.length === 0 ? head : Buffer.concat([head, body]);
}
