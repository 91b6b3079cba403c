/**
 * Redirect URIs: which a client may register, and whether the one an authorization request
 * names is one it registered. Pure functions, tested with tables.
 */

/** MAX_REDIRECT_URI_LENGTH bounds one redirect URI (characters). */
export const MAX_REDIRECT_URI_LENGTH = 2048;

/**
 * REFUSED_SCHEMES can never receive a code: they run script, read local files, or are not a
 * place a browser navigates to on the user's behalf.
 */
const REFUSED_SCHEMES = new Set(["javascript:", "data:", "file:", "vbscript:", "about:", "blob:", "filesystem:", "ws:", "wss:", "ftp:"]);

/** isLoopbackHostname says whether a URL's hostname is this machine: `localhost`, 127.0.0.0/8 or `[::1]`. */
export function isLoopbackHostname(hostname: string): boolean {
  return hostname === "localhost" || hostname === "[::1]" || /^127(\.\d{1,3}){3}$/.test(hostname);
}

function parsed(uri: string): URL | null {
  try {
    return new URL(uri);
  } catch {
    return null;
  }
}

/**
 * redirectUriProblem says why a client may not register `uri` as a redirect URI, or null
 * when it may (RFC 9700 §2.1, RFC 8252 §7): an absolute URI without a fragment; `https` on any
 * host; `http` only on a loopback host (a native app's local listener); a private-use scheme
 * (`cursor://…`), which a native app claims on the user's machine; never a scheme that runs
 * script or reads files.
 */
export function redirectUriProblem(uri: unknown): string | null {
  if (typeof uri !== "string" || uri.length === 0) return "a redirect URI must be a non-empty string";
  if (uri.length > MAX_REDIRECT_URI_LENGTH) return `a redirect URI is at most ${MAX_REDIRECT_URI_LENGTH} characters`;
  if (/[\u0000-\u0020\u007f]/.test(uri)) return "a redirect URI may not hold spaces or control characters";
  const url = parsed(uri);
  if (!url) return `${JSON.stringify(uri.slice(0, 100))} is not an absolute URI`;
  if (uri.includes("#")) return "a redirect URI may not have a fragment";
  if (url.username || url.password) return "a redirect URI may not carry a user name or password";
  if (url.protocol === "https:") return url.hostname ? null : "an https redirect URI needs a host";
  if (url.protocol === "http:") {
    return isLoopbackHostname(url.hostname) ? null : "plain http is allowed only to a loopback host (localhost, 127.0.0.1, [::1])";
  }
  if (REFUSED_SCHEMES.has(url.protocol)) return `the ${url.protocol} scheme may not receive an authorization code`;
  return /^[a-z][a-z0-9+.-]*:$/.test(url.protocol) ? null : `the scheme ${url.protocol} is not a valid URI scheme`;
}

/**
 * redirectMatches says whether `presented` is the registered redirect `registered`: the same
 * string (RFC 9700 §4.1.3: exact matching), except that a loopback `http` redirect matches on
 * any port, since a native app's local listener takes whichever port is free (RFC 8252 §7.3).
 */
export function redirectMatches(registered: string, presented: string): boolean {
  if (registered === presented) return true;
  const want = parsed(registered);
  const got = parsed(presented);
  if (!want || !got || want.protocol !== "http:" || got.protocol !== "http:") return false;
  if (!isLoopbackHostname(want.hostname) || presented.includes("#")) return false;
  return (
    want.hostname === got.hostname &&
    want.pathname === got.pathname &&
    want.search === got.search &&
    !got.username &&
    !got.password &&
    presented.startsWith(`http://${got.host}`)
  );
}

/** RedirectTarget is where an answer goes and how the consent page describes it. */
export interface RedirectTarget {
  /** host is what the consent page names: the host, or `scheme:` for a private-use scheme. */
  host: string;
  /** localOnly is true when the answer stays on the user's machine (a loopback host or an app's own scheme). */
  localOnly: boolean;
}

/** redirectTarget describes a (valid) redirect URI for the consent page. */
export function redirectTarget(uri: string): RedirectTarget {
  const url = parsed(uri);
  if (!url) return { host: uri.slice(0, 100), localOnly: false };
  if (url.protocol === "https:" || url.protocol === "http:") {
    return { host: url.host, localOnly: isLoopbackHostname(url.hostname) };
  }
  return { host: `${url.protocol}//${url.host}`, localOnly: true };
}

/**
 * withParameters appends answer parameters to a redirect URI's query, keeping the query it
 * already has (RFC 6749 §4.1.2: "MUST retain the query component"). A private-use scheme URI
 * that URL cannot rewrite keeps its text and gains a query.
 */
export function withParameters(uri: string, parameters: Record<string, string | null | undefined>): string {
  const entries = Object.entries(parameters).filter((entry): entry is [string, string] => typeof entry[1] === "string");
  const url = parsed(uri);
  if (url) {
    for (const [name, value] of entries) url.searchParams.append(name, value);
    return url.href;
  }
  const query = new URLSearchParams(entries).toString();
  return `${uri}${uri.includes("?") ? "&" : "?"}${query}`;
}
