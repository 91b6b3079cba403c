import { lookup } from "node:dns/promises";
import { isIP } from "node:net";
import { canonicalAddress, ProxyList } from "../../lib/forwarded";
import { readBoundedStream } from "../../lib/http";
import { cleanText } from "../nodes";
import { CLIENT_NAME_MAX, type Client, ClientRefused } from "./clients";
import { isLoopbackHostname, redirectUriProblem } from "./redirects";

/**
 * Client ID Metadata Documents (draft-ietf-oauth-client-id-metadata-document, the MCP
 * authorization spec's first way for a client to identify itself): the client id is an https
 * URL, and the document at that URL names the client and its redirect URIs. The console
 * fetches it when an authorization starts, with these guards against being turned into a
 * request forger (SSRF):
 *
 * 1. The URL must be `https`, with a path, no fragment, no user name or password, and in its
 *    normal form (no dot segments: the URL parser's form must be the client id itself).
 * 2. Every address the host name resolves to must be public: loopback, private (RFC 1918,
 *    unique-local), link-local, CGNAT, documentation, multicast and unspecified ranges are
 *    refused before a connection is made. `ENGINE_CLOUD_CIMD_ALLOW_LOOPBACK=1` (tests and
 *    development only) admits loopback addresses, and plain http to them, so a test can serve
 *    a document from 127.0.0.1; private ranges stay refused.
 * 3. No redirect is followed, the answer must be a 200 within FETCH_TIMEOUT_MS, and the body
 *    is read only up to MAX_DOCUMENT_BYTES.
 *
 * The host name is resolved and checked before the fetch, which resolves it again: a name
 * whose DNS answer changes between the two (rebinding) could still reach a private address.
 * The window is the resolver's, the request is a GET with no credentials, and the answer is
 * only parsed as a metadata document, never shown.
 *
 * A document is cached as its answer's Cache-Control says (`max-age`, at most a day;
 * `no-store` or `no-cache` not at all), five minutes when it says nothing.
 */

/** FETCH_TIMEOUT_MS bounds one fetch of a metadata document, connection to last byte. */
export const FETCH_TIMEOUT_MS = 5000;
/** MAX_DOCUMENT_BYTES bounds a metadata document (the draft suggests servers cap it; real ones are under 1 KiB). */
export const MAX_DOCUMENT_BYTES = 16 * 1024;
/** DEFAULT_CACHE_S is how long a document without caching headers is kept. */
export const DEFAULT_CACHE_S = 300;
/** MAX_CACHE_S caps what a document's max-age may ask for. */
export const MAX_CACHE_S = 86_400;
/** MAX_CACHED bounds the cache; the oldest entry is dropped first. */
const MAX_CACHED = 1000;

/** NON_PUBLIC are the address ranges a metadata document may never be fetched from. */
const NON_PUBLIC = ProxyList.parse([
  "0.0.0.0/8",
  "10.0.0.0/8",
  "100.64.0.0/10",
  "127.0.0.0/8",
  "169.254.0.0/16",
  "172.16.0.0/12",
  "192.0.0.0/24",
  "192.0.2.0/24",
  "192.168.0.0/16",
  "198.18.0.0/15",
  "198.51.100.0/24",
  "203.0.113.0/24",
  "224.0.0.0/4",
  "240.0.0.0/4",
  "::/128",
  "::1/128",
  "64:ff9b::/96",
  "100::/64",
  "2001:db8::/32",
  "fc00::/7",
  "fe80::/10",
  "ff00::/8",
]);
const LOOPBACK = ProxyList.parse(["127.0.0.0/8", "::1/128"]);

/** MetadataDocumentOptions configure the fetcher; tests replace the resolver and the clock. */
export interface MetadataDocumentOptions {
  /** allowLoopback admits loopback addresses and plain http to them (ENGINE_CLOUD_CIMD_ALLOW_LOOPBACK; tests only). */
  allowLoopback: boolean;
  clock?: () => number;
  /** resolve answers a host name's addresses (default: the system resolver, every address). */
  resolve?: (hostname: string) => Promise<string[]>;
}

/** isMetadataDocumentId says whether a client id names a metadata document (an https URL; http only when loopback is allowed). */
export function isMetadataDocumentId(clientId: string, allowLoopback: boolean): boolean {
  return clientId.startsWith("https://") || (allowLoopback && clientId.startsWith("http://"));
}

/** cacheSeconds reads how long an answer may be kept from its Cache-Control header. */
export function cacheSeconds(cacheControl: string | null): number {
  if (!cacheControl) return DEFAULT_CACHE_S;
  const directives = cacheControl
    .toLowerCase()
    .split(",")
    .map((part) => part.trim());
  if (directives.some((d) => d === "no-store" || d === "no-cache" || d === "private")) return 0;
  const maxAge = directives.map((d) => /^max-age=(\d{1,10})$/.exec(d)).find(Boolean);
  return maxAge ? Math.min(Number(maxAge[1]), MAX_CACHE_S) : DEFAULT_CACHE_S;
}

/**
 * clientIdUrlProblem says why a client id cannot name a metadata document, or null (the
 * draft's §3: https, a path, no fragment, no credentials, no dot segments).
 */
export function clientIdUrlProblem(clientId: string, allowLoopback: boolean): string | null {
  if (clientId.length > 2048) return "the client id URL is longer than 2048 characters";
  let url: URL;
  try {
    url = new URL(clientId);
  } catch {
    return "the client id is not a URL";
  }
  const loopbackHttp = allowLoopback && url.protocol === "http:" && isLoopbackHostname(url.hostname);
  if (url.protocol !== "https:" && !loopbackHttp) return "a client id URL must be https";
  if (url.username || url.password) return "a client id URL may not carry a user name or password";
  if (clientId.includes("#")) return "a client id URL may not have a fragment";
  if (url.pathname === "/" || url.pathname === "") return "a client id URL must have a path";
  if (url.href !== clientId) return "a client id URL must be in normal form (no dot segments, lower-case host, no default port)";
  return null;
}

async function systemResolve(hostname: string): Promise<string[]> {
  const answers = await lookup(hostname, { all: true, verbatim: true });
  return answers.map((answer) => answer.address);
}

/** MetadataDocuments fetches, checks and caches client metadata documents. */
export class MetadataDocuments {
  readonly #cache = new Map<string, { client: Client; expiresAt: number }>();
  readonly #clock: () => number;
  readonly #resolve: (hostname: string) => Promise<string[]>;

  constructor(private readonly options: MetadataDocumentOptions) {
    this.#clock = options.clock ?? Date.now;
    this.#resolve = options.resolve ?? systemResolve;
  }

  /**
   * resolve returns the client a metadata document URL describes, from the cache or fetched
   * now; a URL, an address, an answer or a document the console will not use is
   * `ClientRefused` with a reason the error page shows.
   */
  async resolve(clientId: string): Promise<Client> {
    const cached = this.#cache.get(clientId);
    if (cached && cached.expiresAt > this.#clock()) return cached.client;
    if (cached) this.#cache.delete(clientId);
    const problem = clientIdUrlProblem(clientId, this.options.allowLoopback);
    if (problem) throw new ClientRefused(problem);
    const url = new URL(clientId);
    await this.#assertPublic(url.hostname);
    const { document, keepS } = await this.#fetch(url);
    const client = clientFromDocument(clientId, document);
    if (keepS > 0) {
      if (this.#cache.size >= MAX_CACHED) {
        const oldest = this.#cache.keys().next().value;
        if (oldest !== undefined) this.#cache.delete(oldest);
      }
      this.#cache.set(clientId, { client, expiresAt: this.#clock() + keepS * 1000 });
    }
    return client;
  }

  async #assertPublic(hostname: string): Promise<void> {
    const bare = hostname.startsWith("[") ? hostname.slice(1, -1) : hostname;
    let addresses: string[];
    if (isIP(bare)) addresses = [bare];
    else {
      try {
        addresses = await this.#resolve(bare);
      } catch {
        throw new ClientRefused(`the client id's host ${hostname} does not resolve`);
      }
    }
    if (addresses.length === 0) throw new ClientRefused(`the client id's host ${hostname} does not resolve`);
    for (const raw of addresses) {
      const address = canonicalAddress(raw);
      if (!address) throw new ClientRefused(`the client id's host ${hostname} resolves to an unusable address`);
      if (this.options.allowLoopback && LOOPBACK.has(address)) continue;
      if (NON_PUBLIC.has(address)) {
        throw new ClientRefused(`the client id's host ${hostname} resolves to a non-public address; the console fetches only public ones`);
      }
    }
  }

  async #fetch(url: URL): Promise<{ document: unknown; keepS: number }> {
    let response: Response;
    try {
      response = await fetch(url.href, {
        redirect: "manual",
        headers: { accept: "application/json" },
        signal: AbortSignal.timeout(FETCH_TIMEOUT_MS),
      });
    } catch (error) {
      const timedOut = (error as Error)?.name === "TimeoutError";
      throw new ClientRefused(
        timedOut
          ? "the client metadata document did not arrive in time"
          : `the client metadata document cannot be fetched: ${fetchFailure(error)}`,
      );
    }
    if (response.status !== 200) {
      await response.body?.cancel().catch(() => {});
      throw new ClientRefused(`the client metadata document's URL answered HTTP ${response.status} (redirects are not followed)`);
    }
    const text = await readCapped(response, MAX_DOCUMENT_BYTES);
    if (text === null) throw new ClientRefused(`the client metadata document is larger than ${MAX_DOCUMENT_BYTES} bytes`);
    let document: unknown;
    try {
      document = JSON.parse(text);
    } catch {
      throw new ClientRefused("the client metadata document is not JSON");
    }
    return { document, keepS: cacheSeconds(response.headers.get("cache-control")) };
  }
}

/**
 * fetchFailure says in a few words why a fetch of a metadata document failed, from the
 * runtime's error code: an untrusted TLS certificate (a private CA the console was not told
 * about, or an egress proxy that intercepts TLS: `NODE_EXTRA_CA_CERTS` adds a CA), a refused
 * or dropped connection, a failed TLS handshake. Only public addresses are fetched (loopback
 * too with ENGINE_CLOUD_CIMD_ALLOW_LOOPBACK), so the reason tells the person nothing about the
 * console's own network that anyone could not learn by connecting themselves.
 */
export function fetchFailure(error: unknown): string {
  const raw = (error as { code?: unknown } | null)?.code;
  const code = typeof raw === "string" && /^[A-Za-z0-9_]{1,64}$/.test(raw) ? raw : "";
  if (/CERT|SIGNATURE|ISSUER|SELF_SIGNED|ALTNAME|HOSTNAME_MISMATCH/.test(code)) {
    return `its server's TLS certificate is not trusted by the console (${code})`;
  }
  if (code === "ECONNREFUSED" || code === "ConnectionRefused") return "its server refused the connection";
  if (code === "EPROTO") return "the TLS handshake with its server failed (does it speak https on that port?)";
  if (code === "ECONNRESET" || code === "ConnectionClosed") return "its server closed the connection";
  return code ? `the connection failed (${code})` : "the connection failed";
}

/** readCapped reads a body as text, or null once it passes `maxBytes` (the rest is not read). */
async function readCapped(response: Response, maxBytes: number): Promise<string | null> {
  if (Number(response.headers.get("content-length") ?? "0") > maxBytes) {
    await response.body?.cancel().catch(() => {});
    return null;
  }
  return readBoundedStream(response.body, maxBytes);
}

/**
 * negotiatedAuthMethod is how a client will authenticate at the token endpoint, or null when
 * the console cannot serve it: the console has public clients only (`none` + PKCE), so a
 * document that names another method is accepted only when it also lists `none` among the
 * methods it supports, as ChatGPT's does (`private_key_jwt`, with `none` in
 * `token_endpoint_auth_methods_supported`).
 */
export function negotiatedAuthMethod(document: Record<string, unknown>): "none" | null {
  const chosen = document.token_endpoint_auth_method;
  if (chosen === undefined || chosen === "none") return "none";
  const supported = document.token_endpoint_auth_methods_supported;
  return Array.isArray(supported) && supported.includes("none") ? "none" : null;
}

/** clientFromDocument checks a fetched document against its URL and returns the client it describes. */
export function clientFromDocument(clientId: string, document: unknown): Client {
  if (document === null || typeof document !== "object" || Array.isArray(document)) {
    throw new ClientRefused("the client metadata document is not a JSON object");
  }
  const doc = document as Record<string, unknown>;
  if (doc.client_id !== clientId) {
    throw new ClientRefused("the client metadata document's client_id is not the URL it was fetched from");
  }
  const redirects = doc.redirect_uris;
  if (!Array.isArray(redirects) || redirects.length === 0 || redirects.length > 20) {
    throw new ClientRefused("the client metadata document must list 1 to 20 redirect_uris");
  }
  for (const uri of redirects) {
    const problem = redirectUriProblem(uri);
    if (problem) throw new ClientRefused(`the client metadata document lists a redirect URI the console will not use: ${problem}`);
  }
  if (negotiatedAuthMethod(doc) === null) {
    throw new ClientRefused(
      `the client authenticates with ${String(doc.token_endpoint_auth_method).slice(0, 40)} at the token endpoint; this console serves public clients only (none, with PKCE)`,
    );
  }
  if (doc.grant_types !== undefined && !(Array.isArray(doc.grant_types) && doc.grant_types.includes("authorization_code"))) {
    throw new ClientRefused("the client metadata document's grant_types do not include authorization_code");
  }
  if (doc.response_types !== undefined && !(Array.isArray(doc.response_types) && doc.response_types.includes("code"))) {
    throw new ClientRefused("the client metadata document's response_types do not include code");
  }
  return {
    id: clientId,
    kind: "metadata_document",
    label: new URL(clientId).host,
    declaredName: typeof doc.client_name === "string" ? cleanText(doc.client_name, CLIENT_NAME_MAX) : "",
    redirectUris: redirects as string[],
    redirectPatterns: [],
  };
}
