/** Cases for the sign-in's return_to guard, shared by the unit test and the route test. */

/**
 * OPEN_REDIRECT_PAYLOADS are the usual open-redirect tricks (OWASP ASVS 5.0 3.7.2, the OWASP
 * unvalidated-redirects cheat sheet, PayloadsAllTheThings' open-redirect list): each must be
 * refused as a `return_to`. The route test sends every one through HTTP too.
 */
export const OPEN_REDIRECT_PAYLOADS: [string, string][] = [
  ["network-path reference", "//evil.example"],
  ["three slashes", "///evil.example"],
  ["slash backslash", "/\\evil.example"],
  ["two backslashes", "\\\\evil.example"],
  ["backslash slash", "\\/evil.example"],
  ["absolute https URL", "https://evil.example/"],
  ["scheme without slashes", "http:evil.example"],
  ["https with slash backslash", "https:/\\evil.example"],
  ["javascript scheme", "javascript:alert(1)"],
  ["mixed-case javascript scheme", "JaVaScRiPt:alert(document.domain)"],
  ["data URL", "data:text/html,<script>alert(1)</script>"],
  ["bare host name", "evil.example"],
  ["userinfo-looking host", "@evil.example"],
  ["leading space", " //evil.example"],
  ["encoded double slash", "/%2F%2Fevil.example"],
  ["encoded double slash, lower case", "/%2f%2fevil.example"],
  ["encoded backslash", "/%5Cevil.example"],
  ["encoded backslash at the start", "%5C%5Cevil.example"],
  ["encoded slashes without a leading slash", "%2F%2Fevil.example"],
  ["double-encoded slashes", "/%252F%252Fevil.example"],
  ["tab between slashes", "/\t/evil.example"],
  ["newline between slashes", "/\n/evil.example"],
  ["carriage return", "/\r/evil.example"],
  ["NUL", "/\u0000/evil.example"],
  ["encoded tab", "/%09/evil.example"],
  ["encoded CR LF (header splitting)", "/%0D%0ALocation:%20https://evil.example"],
  ["dot segment to a network path", "/..//evil.example"],
  ["two dot segments to a network path", "/../..//evil.example"],
  ["single dot to a network path", "/.//evil.example"],
  ["encoded dot segment to a network path", "/%2e%2e//evil.example"],
  ["network path with trailing dots", "//evil.example/%2F.."],
  ["broken percent-encoding", "/%E0%A4%A"],
  ["lone percent", "/%"],
];

/** GOOD_RETURN_TOS are same-site paths and what they normalise to. */
export const GOOD_RETURN_TOS: [string, string][] = [
  ["/", "/"],
  ["/nodes", "/nodes"],
  ["/nodes?tab=keys", "/nodes?tab=keys"],
  ["/nodes/abc#settings", "/nodes/abc#settings"],
  ["/oauth/authorize?rid=r_123&x=1", "/oauth/authorize?rid=r_123&x=1"],
  ["/a/./b/../c", "/a/c"],
  ["/search?q=a%20b", "/search?q=a%20b"],
  ["/search?next=https://example.com/x", "/search?next=https://example.com/x"],
  ["/café", "/caf%C3%A9"],
  ["/a b", "/a%20b"],
];
