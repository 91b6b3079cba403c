import { AppError } from "../../lib/errors";

/** RETURN_TO_BASE is a stand-in origin for resolving a path; nothing is ever sent there. */
const RETURN_TO_BASE = "https://return-to.invalid";

/** Controls a browser strips or acts on inside a URL (tab, CR, LF, NUL, ...), and DEL. */
const CONTROL = /[\x00-\x1f\x7f]/;

function refuse(raw: string, why: string): never {
  throw new AppError("invalid_return_to", `return_to must be a path on this site (${why})`, { return_to: raw.slice(0, 200) });
}

/**
 * refuseUnsafeShape rejects what a browser could read as another origin: anything that does
 * not start with one `/` (schemes such as `javascript:` or `https:`, bare host names), a
 * network-path reference (`//host`), any backslash (browsers treat `\` as `/`, so `/\host`
 * is `//host`), and control characters (browsers drop tab and newline inside URLs, so
 * `/\t/host` becomes `//host`; CR LF would split a header).
 */
function refuseUnsafeShape(raw: string, value: string, stage: string): void {
  if (!value.startsWith("/")) refuse(raw, `${stage} does not start with /`);
  if (value.startsWith("//")) refuse(raw, `${stage} starts with //`);
  if (value.includes("\\")) refuse(raw, `${stage} holds a backslash`);
  if (CONTROL.test(value)) refuse(raw, `${stage} holds a control character`);
}

/**
 * normalizeReturnTo accepts only a same-site relative path and returns it normalised to
 * path + query + fragment, or throws `invalid_return_to` (400). It is the open-redirect
 * guard of OWASP ASVS 5.0 3.7.2 for the sign-in's `return_to`:
 *
 * 1. the value as given must be a path (see refuseUnsafeShape);
 * 2. decoded once, it must still be one, so `/%2F%2Fhost`, `/%5Chost` and `/%09/host` fail,
 *    and a still-encoded slash or backslash after that one decoding (`%252F`) is refused as
 *    a double-encoding trick;
 * 3. resolved against a stand-in origin, it must keep that origin, and its normalised form
 *    (dot segments removed, `%2e%2e` included) must pass step 1 again, so `/..//host`, which
 *    resolves to the path `//host`, fails.
 */
export function normalizeReturnTo(raw: string): string {
  refuseUnsafeShape(raw, raw, "the value");
  let decoded: string;
  try {
    decoded = decodeURIComponent(raw);
  } catch {
    refuse(raw, "it is not valid percent-encoding");
  }
  refuseUnsafeShape(raw, decoded, "the decoded value");
  if (/%(2f|5c)/i.test(decoded)) refuse(raw, "it encodes a slash or backslash twice");
  let url: URL;
  try {
    url = new URL(raw, RETURN_TO_BASE);
  } catch {
    refuse(raw, "it is not a URL path");
  }
  if (url.origin !== RETURN_TO_BASE) refuse(raw, "it names another origin");
  const normalized = `${url.pathname}${url.search}${url.hash}`;
  refuseUnsafeShape(raw, normalized, "the normalised path");
  return normalized;
}
