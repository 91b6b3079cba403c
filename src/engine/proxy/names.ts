import { AppError } from "../../lib/errors";

/** LOCAL_SUFFIXES are the names no public CA will certify: they get local-CA certificates. */
const LOCAL_SUFFIXES = [".local", ".localhost", ".internal", ".lan", ".home.arpa", ".test", ".example", ".invalid"];

/** DomainKind tells where a name's certificate comes from and whether mDNS publishes it. */
export type DomainKind = "mdns" | "localhost" | "private" | "public";

/** domainKind classifies a valid, lower-cased domain name. */
export function domainKind(domain: string): DomainKind {
  if (domain.endsWith(".local")) return "mdns";
  if (domain === "localhost" || domain.endsWith(".localhost")) return "localhost";
  if (LOCAL_SUFFIXES.some((suffix) => domain.endsWith(suffix))) return "private";
  return "public";
}

const LABEL = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;

/**
 * validateDomain lower-cases a domain and checks it: DNS labels only, no wildcards (browsers
 * reject `*.local` certificates, mkcert#237), no IP literals, and `.local` names of exactly
 * one label before `.local`, because `a.b.local` does not resolve with Linux's default
 * nss-mdns nor on Windows. It throws `invalid_domain` with the reason.
 */
export function validateDomain(raw: string): string {
  const domain = raw.trim().toLowerCase().replace(/\.$/, "");
  const fail = (why: string) => new AppError("invalid_domain", `invalid domain ${JSON.stringify(raw)}: ${why}`);
  if (domain.length === 0 || domain.length > 253) throw fail("a domain has 1 to 253 characters");
  if (domain.includes("*")) throw fail("wildcards are not supported: add each name (one certificate per name)");
  if (/^[0-9.]+$/.test(domain) || domain.includes(":")) throw fail("an IP address is not a domain");
  const labels = domain.split(".");
  if (labels.length < 2 && domain !== "localhost") throw fail("a domain needs at least two labels (e.g. app.example.com or app.local)");
  for (const label of labels) {
    if (!LABEL.test(label)) throw fail(`label ${JSON.stringify(label)} must be 1-63 letters, digits or inner hyphens`);
  }
  if (domain.endsWith(".local") && labels.length !== 2) {
    throw fail("a .local name must have one label before .local (a.b.local does not resolve with nss-mdns or on Windows)");
  }
  if (/^[0-9]+$/.test(labels.at(-1) ?? "")) throw fail("the top-level label cannot be numeric");
  return domain;
}

/**
 * defaultNames are the names every service with a port gets: `<service>-<hostname>.local`
 * (one label, published over mDNS, so the LAN reaches it) and `<service>.localhost` (which
 * resolves to loopback everywhere without DNS).
 */
export function defaultNames(service: string, hostname: string): string[] {
  const local = `${service}-${hostname}`;
  return [...(local.length <= 63 ? [`${local}.local`] : []), `${service}.localhost`];
}

/** apexName is the machine's own name, `<hostname>.local`, which routes to the engine's API and UI. */
export function apexName(hostname: string): string {
  return `${hostname}.local`;
}

/** hostOf strips the port (and IPv6 brackets) from a Host header and lower-cases it. */
export function hostOf(header: string | null): string {
  if (!header) return "";
  let host = header.toLowerCase();
  if (host.startsWith("[")) return host.slice(1, host.indexOf("]"));
  const colon = host.lastIndexOf(":");
  if (colon > 0) host = host.slice(0, colon);
  return host.endsWith(".") ? host.slice(0, -1) : host;
}
