import type { KeyObject, X509Certificate } from "node:crypto";
import { chmodSync, closeSync, existsSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, statSync, writeSync } from "node:fs";
import { hostname as osHostname } from "node:os";
import { join } from "node:path";
import { type Clock, systemClock } from "../../lib/clock";
import { AppError } from "../../lib/errors";
import { writePrivateFile } from "../../lib/files";
import {
  commonNameOf,
  generateKeyPair,
  isIpLiteral,
  keyMatches,
  loadPrivateKey,
  parseCertificate,
  privateKeyPem,
  randomSerial,
  signCertificate,
  wholeSeconds,
} from "./x509";

const DAY_MS = 24 * 60 * 60 * 1000;

/** ROOT_LIFETIME_MS is how long a new root is valid: ten years, as Caddy's and mkcert's roots are. */
export const ROOT_LIFETIME_MS = 3652 * DAY_MS;
/** INTERMEDIATE_LIFETIME_MS is how long a new intermediate is valid; it is renewed at 2/3 of that. */
export const INTERMEDIATE_LIFETIME_MS = 365 * DAY_MS;
/** DEFAULT_LEAF_LIFETIME_MS is the lifetime of a leaf certificate unless the caller asks for another. */
export const DEFAULT_LEAF_LIFETIME_MS = 7 * DAY_MS;
/** CLOCK_SKEW_MS is how far back a new certificate's notBefore is set, so clients whose clock is behind accept it. */
export const CLOCK_SKEW_MS = 5 * 60 * 1000;
/** RENEWAL_FRACTION is the part of a certificate's lifetime after which it is renewed. */
export const RENEWAL_FRACTION = 2 / 3;

const ORGANIZATION = "engine Local CA";
const LOCK_STALE_MS = 30_000;
const LOCK_WAIT_MS = 10_000;

/** pkiDirectory is where the CA keeps its files inside a data dir. */
export function pkiDirectory(dataDir: string): string {
  return join(dataDir, "pki");
}

/** LocalCaOptions configures a LocalCa. */
export interface LocalCaOptions {
  /** dir holds the CA's files, normally `<data-dir>/pki`; it is created with mode 0700. */
  dir: string;
  clock?: Clock;
  /** hostname ends the CA's names ("engine Local Root CA - <hostname>"); default: this machine's. */
  hostname?: string;
  rootLifetimeMs?: number;
  intermediateLifetimeMs?: number;
}

/** IssuedLeaf is a leaf certificate with its chain and its private key. */
export interface IssuedLeaf {
  /** certPem is the leaf followed by the intermediate that signed it, as a TLS server sends them. */
  certPem: string;
  /** keyPem is the leaf's private key (PKCS#8). It is a secret: never log it. */
  keyPem: string;
  notBefore: Date;
  notAfter: Date;
  /** issuer is the common name of the intermediate that signed the leaf. */
  issuer: string;
  names: string[];
}

interface Authority {
  root: X509Certificate;
  rootPem: string;
  intermediate: X509Certificate;
  intermediatePem: string;
  intermediateKey: KeyObject;
}

/**
 * LocalCa is the engine's own certificate authority, like Caddy's `tls internal`: a root that
 * users trust once (`engine trust`) and an intermediate that signs short-lived leaf
 * certificates. It creates both on first use in its directory and loads them on later starts.
 * The root key is read only when an intermediate must be signed and is not kept in memory.
 * Creation and renewal hold a lock file, so a CLI command and the daemon never make two roots.
 */
export class LocalCa {
  readonly dir: string;
  readonly #clock: Clock;
  readonly #hostname: string;
  readonly #rootLifetimeMs: number;
  readonly #intermediateLifetimeMs: number;
  #authority: Authority | undefined;

  constructor(options: LocalCaOptions) {
    this.dir = options.dir;
    this.#clock = options.clock ?? systemClock;
    this.#hostname = options.hostname ?? osHostname();
    this.#rootLifetimeMs = options.rootLifetimeMs ?? ROOT_LIFETIME_MS;
    this.#intermediateLifetimeMs = options.intermediateLifetimeMs ?? INTERMEDIATE_LIFETIME_MS;
  }

  /** rootPath is the root certificate's file, the one to hand to clients that should trust the CA. */
  get rootPath(): string {
    return join(this.dir, "root.crt");
  }

  /** intermediatePath is the intermediate certificate's file. */
  get intermediatePath(): string {
    return join(this.dir, "intermediate.crt");
  }

  /** rootPem returns the root certificate as PEM, creating the CA first if it does not exist. */
  rootPem(): string {
    return this.#provision().rootPem;
  }

  /** intermediatePem returns the current intermediate certificate as PEM. */
  intermediatePem(): string {
    return this.#provision().intermediatePem;
  }

  /** rootFingerprintSha256 returns the root's SHA-256 fingerprint as `openssl x509 -fingerprint -sha256` writes it: upper-case hex pairs joined by colons. */
  rootFingerprintSha256(): string {
    return this.#provision().root.fingerprint256;
  }

  /** rootNotAfter returns the time the root certificate expires. */
  rootNotAfter(): Date {
    return this.#provision().root.validToDate;
  }

  /** intermediateNotAfter returns the time the current intermediate expires. */
  intermediateNotAfter(): Date {
    return this.#provision().intermediate.validToDate;
  }

  /**
   * issueLeaf signs a new server certificate for `names` with a fresh key. Names are DNS names
   * (a leading `*.` wildcard is allowed) or IP literals; DNS names are lower-cased. The leaf's
   * notBefore is set CLOCK_SKEW_MS in the past, and its notAfter never passes the intermediate's.
   * It throws `invalid_domain` for a name that is neither.
   */
  issueLeaf(names: string[], lifetimeMs: number = DEFAULT_LEAF_LIFETIME_MS): IssuedLeaf {
    const normalized = normalizeLeafNames(names);
    if (!Number.isFinite(lifetimeMs) || lifetimeMs <= 0) throw new RangeError(`issueLeaf: lifetimeMs must be positive (got ${lifetimeMs})`);
    const authority = this.#provision();
    const now = this.#clock.now();
    const notBefore = wholeSeconds(new Date(now.getTime() - CLOCK_SKEW_MS));
    const notAfter = wholeSeconds(new Date(Math.min(now.getTime() + lifetimeMs, authority.intermediate.validToDate.getTime())));
    const dnsNames = normalized.filter((name) => !isIpLiteral(name));
    const ipAddresses = normalized.filter(isIpLiteral);
    const first = normalized[0] ?? "";
    const key = generateKeyPair();
    const issuer = commonNameOf(authority.intermediate);
    const leaf = signCertificate({
      // RFC 5280 caps a common name at 64 characters; the names that matter are in the subjectAltName.
      subject: { commonName: first.length <= 64 ? first : undefined },
      serialHex: randomSerial(),
      notBefore,
      notAfter,
      publicKey: key.publicKey,
      dnsNames,
      ipAddresses,
      signer: { privateKey: authority.intermediateKey, certificate: authority.intermediate },
    });
    return {
      certPem: leaf.pem + authority.intermediatePem,
      keyPem: privateKeyPem(key.privateKey),
      notBefore,
      notAfter,
      issuer,
      names: normalized,
    };
  }

  /**
   * verifiesLeaf tells whether a leaf certificate was signed by the current intermediate.
   * A leaf from an earlier intermediate (or an earlier CA) answers false.
   */
  verifiesLeaf(leaf: X509Certificate): boolean {
    const authority = this.#provision();
    return leaf.checkIssued(authority.intermediate) && leaf.verify(authority.intermediate.publicKey);
  }

  // provision returns the loaded authority, loading or creating it on first use and renewing
  // the intermediate once it is past RENEWAL_FRACTION of its life.
  #provision(): Authority {
    const now = this.#clock.now();
    if (this.#authority && !renewalDue(this.#authority.intermediate, now)) return this.#authority;
    this.#authority = withLock(this.dir, () => this.#loadOrCreate(now));
    return this.#authority;
  }

  #loadOrCreate(now: Date): Authority {
    const rootCertPath = this.rootPath;
    const rootKeyPath = join(this.dir, "root.key");
    const intermediateCertPath = this.intermediatePath;
    const intermediateKeyPath = join(this.dir, "intermediate.key");

    let rootPem = readText(rootCertPath);
    let root = rootPem ? parseCertificate(rootPem) : undefined;
    if (!root?.ca || root.validToDate <= now) root = undefined;

    let intermediatePem = readText(intermediateCertPath);
    let intermediate = intermediatePem ? parseCertificate(intermediatePem) : undefined;
    let intermediateKey = loadPrivateKey(readText(intermediateKeyPath) ?? "");
    const intermediateUsable =
      root &&
      intermediate &&
      intermediateKey &&
      intermediate.ca &&
      intermediate.checkIssued(root) &&
      intermediate.verify(root.publicKey) &&
      keyMatches(intermediate, intermediateKey) &&
      !renewalDue(intermediate, now);
    if (intermediateUsable && root && rootPem && intermediate && intermediatePem && intermediateKey) {
      return { root, rootPem, intermediate, intermediatePem, intermediateKey };
    }

    // A new intermediate is needed, so the root key is too; without a matching one the root is made again.
    let rootKey = root ? loadPrivateKey(readText(rootKeyPath) ?? "") : undefined;
    if (!root || !rootKey || !keyMatches(root, rootKey)) {
      const key = generateKeyPair();
      const created = signCertificate({
        subject: { organization: ORGANIZATION, commonName: `engine Local Root CA - ${this.#hostname}` },
        serialHex: randomSerial(),
        notBefore: wholeSeconds(new Date(now.getTime() - CLOCK_SKEW_MS)),
        notAfter: wholeSeconds(new Date(now.getTime() + this.#rootLifetimeMs)),
        publicKey: key.publicKey,
        ca: { pathLength: 1 },
        signer: { privateKey: key.privateKey },
      });
      writePrivateFile(rootKeyPath, privateKeyPem(key.privateKey));
      writePublicFile(rootCertPath, created.pem);
      root = created.parsed;
      rootPem = created.pem;
      rootKey = key.privateKey;
    }

    const key = generateKeyPair();
    const created = signCertificate({
      subject: { organization: ORGANIZATION, commonName: `engine Local Intermediate CA - ${this.#hostname}` },
      serialHex: randomSerial(),
      notBefore: wholeSeconds(new Date(now.getTime() - CLOCK_SKEW_MS)),
      notAfter: wholeSeconds(new Date(Math.min(now.getTime() + this.#intermediateLifetimeMs, root.validToDate.getTime()))),
      publicKey: key.publicKey,
      ca: { pathLength: 0 },
      signer: { privateKey: rootKey, certificate: root },
    });
    writePrivateFile(intermediateKeyPath, privateKeyPem(key.privateKey));
    writePublicFile(intermediateCertPath, created.pem);
    intermediate = created.parsed;
    intermediatePem = created.pem;
    intermediateKey = key.privateKey;
    return {
      root,
      rootPem: rootPem ?? "",
      intermediate,
      intermediatePem,
      intermediateKey,
    };
  }
}

/** renewalDue tells whether a certificate is past RENEWAL_FRACTION of its lifetime at `now`. */
export function renewalDue(certificate: { validFromDate: Date; validToDate: Date }, now: Date): boolean {
  return now.getTime() >= renewalTime(certificate.validFromDate, certificate.validToDate).getTime();
}

/** renewalTime is the moment RENEWAL_FRACTION of the span from notBefore to notAfter has passed. */
export function renewalTime(notBefore: Date, notAfter: Date): Date {
  return new Date(notBefore.getTime() + (notAfter.getTime() - notBefore.getTime()) * RENEWAL_FRACTION);
}

const DNS_LABEL = "[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?";
const DNS_NAME = new RegExp(`^(?:\\*\\.)?${DNS_LABEL}(?:\\.${DNS_LABEL})*$`);

// normalizeLeafNames lower-cases DNS names, drops duplicates and rejects what is neither a DNS
// name (RFC 1123 labels, an optional leading wildcard label) nor an IP literal.
function normalizeLeafNames(names: string[]): string[] {
  if (names.length === 0) throw new AppError("invalid_domain", "a leaf certificate needs at least one name");
  const normalized: string[] = [];
  for (const raw of names) {
    const name = isIpLiteral(raw) ? raw : raw.toLowerCase();
    if (!isIpLiteral(name) && (name.length > 253 || !DNS_NAME.test(name))) {
      throw new AppError("invalid_domain", `${JSON.stringify(raw)} is neither a DNS name nor an IP address`, { name: raw });
    }
    if (!normalized.includes(name)) normalized.push(name);
  }
  return normalized;
}

function readText(path: string): string | undefined {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return undefined;
  }
}

/** writePublicFile writes a certificate (mode 0644) atomically: a temporary sibling renamed over the target. */
export function writePublicFile(path: string, contents: string): void {
  const temporary = `${path}.${process.pid}.tmp`;
  const fd = openSync(temporary, "w", 0o644);
  try {
    writeSync(fd, contents);
  } finally {
    closeSync(fd);
  }
  chmodSync(temporary, 0o644);
  renameSync(temporary, path);
}

// withLock runs `action` while holding `<dir>/.lock`, made with O_EXCL. A lock older than
// LOCK_STALE_MS was left by a process that died and is taken over.
function withLock<T>(dir: string, action: () => T): T {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  chmodSync(dir, 0o700);
  const lockPath = join(dir, ".lock");
  const deadline = Date.now() + LOCK_WAIT_MS;
  for (;;) {
    try {
      closeSync(openSync(lockPath, "wx", 0o600));
      break;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
    }
    try {
      if (Date.now() - statSync(lockPath).mtimeMs > LOCK_STALE_MS) rmSync(lockPath, { force: true });
    } catch {
      // released meanwhile
    }
    if (Date.now() > deadline)
      throw new AppError("ca_failed", `the certificate authority in ${dir} is locked by another process (${lockPath})`);
    Bun.sleepSync(20);
  }
  try {
    return action();
  } finally {
    if (existsSync(lockPath)) rmSync(lockPath, { force: true });
  }
}
