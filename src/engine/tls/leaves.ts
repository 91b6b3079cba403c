import { existsSync, mkdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { Clock } from "../../lib/clock";
import { AppError } from "../../lib/errors";
import { writePrivateFile } from "../../lib/files";
import { DEFAULT_LEAF_LIFETIME_MS, type IssuedLeaf, type LocalCa, renewalTime, writePublicFile } from "./ca";
import { isIpLiteral, keyMatches, loadPrivateKey, parseCertificate } from "./x509";

/** LeafCertificatesOptions configures a LeafCertificates. */
export interface LeafCertificatesOptions {
  ca: LocalCa;
  /** dir holds one `<name>.crt` (leaf and intermediate) and `<name>.key` (mode 0600) per name, normally `<data-dir>/pki/leaves`. */
  dir: string;
  /** clock should be the CA's own, so that issuance and renewal agree on the time. */
  clock: Clock;
  lifetimeMs?: number;
}

/** leavesDirectory is where leaf certificates are kept inside a data dir. */
export function leavesDirectory(dataDir: string): string {
  return join(dataDir, "pki", "leaves");
}

const DNS_LABEL = "[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?";
const SINGLE_DNS_NAME = new RegExp(`^${DNS_LABEL}(?:\\.${DNS_LABEL})*$`);

/**
 * validateLeafName returns `name` when it is one lower-case DNS name (RFC 1123 labels, at most
 * 253 characters, no wildcard, no trailing dot, not an IP address) and throws `invalid_domain`
 * otherwise. Because of these rules a name is also a safe file name.
 */
export function validateLeafName(name: string): string {
  if (typeof name !== "string" || name.length === 0 || name.length > 253 || isIpLiteral(name) || !SINGLE_DNS_NAME.test(name)) {
    throw new AppError("invalid_domain", `${JSON.stringify(name)} is not a lower-case DNS name (no wildcards, no IP addresses)`, {
      name,
    });
  }
  return name;
}

/**
 * LeafCertificates hands out one leaf certificate per DNS name, as Caddy's certificate cache
 * does for `tls internal`: from memory, else from its directory, else freshly issued by the CA
 * and saved. A leaf is renewed once RENEWAL_FRACTION (2/3) of its lifetime has passed; a leaf
 * on disk that the current intermediate did not sign, or whose key does not match, is replaced.
 */
export class LeafCertificates {
  readonly dir: string;
  readonly #ca: LocalCa;
  readonly #clock: Clock;
  readonly #lifetimeMs: number;
  readonly #leaves = new Map<string, IssuedLeaf>();

  constructor(options: LeafCertificatesOptions) {
    this.#ca = options.ca;
    this.dir = options.dir;
    this.#clock = options.clock;
    this.#lifetimeMs = options.lifetimeMs ?? DEFAULT_LEAF_LIFETIME_MS;
  }

  /** get returns a leaf for `name` that is not yet due for renewal. It throws `invalid_domain` for a name validateLeafName refuses. */
  get(name: string): IssuedLeaf {
    validateLeafName(name);
    const now = this.#clock.now();
    const cached = this.#leaves.get(name);
    if (cached && !this.renewalDue(cached, now)) return cached;
    const stored = cached ? undefined : this.#load(name);
    if (stored && !this.renewalDue(stored, now)) {
      this.#leaves.set(name, stored);
      return stored;
    }
    return this.#issue(name);
  }

  /** renewalDue tells whether `leaf` has passed 2/3 of its lifetime at `now`. */
  renewalDue(leaf: IssuedLeaf, now: Date): boolean {
    return now.getTime() >= renewalTime(leaf.notBefore, leaf.notAfter).getTime();
  }

  /**
   * renewDue issues a new leaf for every name this manager holds in memory whose leaf is due at
   * `now`, and returns those names. Leaves only on disk are renewed when get() next asks for them.
   */
  renewDue(now: Date = this.#clock.now()): string[] {
    const renewed: string[] = [];
    for (const [name, leaf] of this.#leaves) {
      if (!this.renewalDue(leaf, now)) continue;
      this.#issue(name);
      renewed.push(name);
    }
    return renewed;
  }

  /** remove forgets the leaf for `name` and deletes its files. */
  remove(name: string): void {
    validateLeafName(name);
    this.#leaves.delete(name);
    rmSync(this.#path(name, "key"), { force: true });
    rmSync(this.#path(name, "crt"), { force: true });
  }

  /** names lists the names whose leaves are held in memory. */
  names(): string[] {
    return [...this.#leaves.keys()];
  }

  #issue(name: string): IssuedLeaf {
    const leaf = this.#ca.issueLeaf([name], this.#lifetimeMs);
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    // The key goes first: a certificate on disk without its key would be replaced on load anyway.
    writePrivateFile(this.#path(name, "key"), leaf.keyPem);
    writePublicFile(this.#path(name, "crt"), leaf.certPem);
    this.#leaves.set(name, leaf);
    return leaf;
  }

  #load(name: string): IssuedLeaf | undefined {
    const certPath = this.#path(name, "crt");
    const keyPath = this.#path(name, "key");
    if (!existsSync(certPath) || !existsSync(keyPath)) return undefined;
    const certPem = readFileSync(certPath, "utf8");
    const keyPem = readFileSync(keyPath, "utf8");
    const certificate = parseCertificate(certPem);
    const key = loadPrivateKey(keyPem);
    if (!certificate || !key || !keyMatches(certificate, key)) return undefined;
    if (!certificate.checkHost(name) || !this.#ca.verifiesLeaf(certificate)) return undefined;
    const issuer = /^CN=(.*)$/m.exec(certificate.issuer)?.[1] ?? "";
    return { certPem, keyPem, notBefore: certificate.validFromDate, notAfter: certificate.validToDate, issuer, names: [name] };
  }

  #path(name: string, extension: "crt" | "key"): string {
    return join(this.dir, `${name}.${extension}`);
  }
}
