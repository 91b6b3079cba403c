import { X509Certificate } from "node:crypto";
import { accessSync, constants, existsSync, readFileSync, rmSync, statSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { AppError } from "../../lib/errors";
import { writePublicFile } from "./ca";
import { splitPemCertificates } from "./x509";

/**
 * SystemTrustStore is where one Linux family keeps the extra roots it trusts and the command
 * that folds them into its bundle. The table follows mkcert's (truststore_linux.go).
 */
export interface SystemTrustStore {
  systemDir: string;
  bundlePath: string;
  updateCommand: string[];
  /** removeCommand rebuilds the bundle after a root was deleted, dropping its links too. */
  removeCommand: string[];
}

/** SYSTEM_TRUST_STORES lists the known layouts, Debian's first; only Debian's is tested here. */
export const SYSTEM_TRUST_STORES: readonly SystemTrustStore[] = [
  {
    systemDir: "/usr/local/share/ca-certificates",
    bundlePath: "/etc/ssl/certs/ca-certificates.crt",
    updateCommand: ["update-ca-certificates"],
    // Without --fresh, update-ca-certificates rebuilds the bundle but leaves the deleted root's
    // links in /etc/ssl/certs dangling; Debian documents --fresh for removing a local root.
    removeCommand: ["update-ca-certificates", "--fresh"],
  },
  {
    systemDir: "/etc/pki/ca-trust/source/anchors",
    bundlePath: "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    updateCommand: ["update-ca-trust", "extract"],
    removeCommand: ["update-ca-trust", "extract"],
  },
  {
    systemDir: "/etc/ca-certificates/trust-source/anchors",
    bundlePath: "/etc/ssl/certs/ca-certificates.crt",
    updateCommand: ["trust", "extract-compat"],
    removeCommand: ["trust", "extract-compat"],
  },
  {
    systemDir: "/usr/share/pki/trust/anchors",
    bundlePath: "/var/lib/ca-certificates/ca-bundle.pem",
    updateCommand: ["update-ca-certificates"],
    removeCommand: ["update-ca-certificates"],
  },
];

/** TrustOptions locates the trust stores; every field has a default, so tests can point them at a temp dir. */
export interface TrustOptions {
  /** systemDir is the folder of local roots; default: the first of SYSTEM_TRUST_STORES that exists. */
  systemDir?: string;
  /** bundlePath is the PEM bundle the update command writes, which OpenSSL, curl and Python read. */
  bundlePath?: string;
  /** updateCommand rebuilds the bundle from systemDir (argv, looked up on PATH). */
  updateCommand?: string[];
  /** removeCommand rebuilds the bundle after uninstalling; default: the store's, or updateCommand when that is given. */
  removeCommand?: string[];
  /** nssDb is the NSS database Chrome and Chromium on Linux use; default `$HOME/.pki/nssdb`. */
  nssDb?: string;
  /** certutil is NSS's tool; default `certutil` on PATH. When it is missing, NSS is left alone. */
  certutil?: string;
}

/** TrustStatus says where the root is trusted. */
export interface TrustStatus {
  /** system is true when the root's file is in systemDir and its certificate is in the bundle. */
  system: boolean;
  /** nss is null when certutil is not installed, else whether the NSS database holds the root. */
  nss: boolean | null;
  system_path: string;
}

/** TrustChange says what installTrust or uninstallTrust did in each store. */
export interface TrustChange {
  system: "added" | "removed" | "unchanged";
  /** nss is "unavailable" without certutil and "no_database" when the NSS database does not exist. */
  nss: "added" | "removed" | "unchanged" | "unavailable" | "no_database";
  system_path: string;
  bundle_path: string;
  nss_db: string;
  /** commands are the commands that were run, for the user to see (never with key material; there is none). */
  commands: string[];
}

interface ResolvedTrust {
  systemDir: string;
  bundlePath: string;
  updateCommand: string[];
  removeCommand: string[];
  nssDb: string;
  certutil: string | null;
}

/** rootFileStem names the root's files and NSS nickname after its fingerprint, so two engines' roots never collide. */
export function rootFileStem(rootPem: string): string {
  const certificate = parseRoot(rootPem);
  return `engine-local-root-${certificate.fingerprint256.replaceAll(":", "").slice(0, 16).toLowerCase()}`;
}

/** trustStatus reports whether `rootPem` is in the system trust store and in the NSS database. */
export async function trustStatus(rootPem: string, options: TrustOptions = {}): Promise<TrustStatus> {
  const resolved = resolveTrust(options);
  const stem = rootFileStem(rootPem);
  const systemPath = join(resolved.systemDir, `${stem}.crt`);
  const system = sameCertificateFile(systemPath, rootPem) && bundleContains(resolved.bundlePath, rootPem);
  const nss = resolved.certutil === null ? null : await nssHas(resolved, stem);
  return { system, nss, system_path: systemPath };
}

/**
 * installTrust adds `rootPem` to the system trust store (a file in systemDir, then the update
 * command) and, when certutil is installed and the NSS database exists, to NSS with trust flags
 * `C,,` (a CA for TLS servers only). It throws `forbidden` when systemDir is not writable (run it
 * as root), `not_supported` when no system trust store or update command is found, and
 * `trust_failed` when a command fails or the bundle does not contain the root afterwards.
 */
export async function installTrust(rootPem: string, options: TrustOptions = {}): Promise<TrustChange> {
  const resolved = resolveTrust(options);
  const stem = rootFileStem(rootPem);
  const systemPath = join(resolved.systemDir, `${stem}.crt`);
  const commands: string[] = [];
  let system: TrustChange["system"] = "unchanged";
  if (!sameCertificateFile(systemPath, rootPem) || !bundleContains(resolved.bundlePath, rootPem)) {
    requireWritable(resolved, resolved.updateCommand[0]);
    writePublicFile(systemPath, normalizePem(rootPem));
    await runChecked(resolved.updateCommand, commands);
    if (!bundleContains(resolved.bundlePath, rootPem)) {
      throw new AppError(
        "trust_failed",
        `${resolved.updateCommand.join(" ")} ran, but ${resolved.bundlePath} does not contain the root from ${systemPath}`,
      );
    }
    system = "added";
  }

  let nss: TrustChange["nss"] = nssAvailability(resolved);
  if (nss === "unchanged" && !(await nssHas(resolved, stem))) {
    await runChecked(
      [resolved.certutil ?? "certutil", "-d", `sql:${resolved.nssDb}`, "-A", "-t", "C,,", "-n", stem, "-i", systemPath],
      commands,
    );
    nss = "added";
  }
  return { system, nss, system_path: systemPath, bundle_path: resolved.bundlePath, nss_db: resolved.nssDb, commands };
}

/**
 * uninstallTrust removes `rootPem` from the system trust store and the NSS database, undoing
 * installTrust. Roots that are not installed are left as they are ("unchanged").
 */
export async function uninstallTrust(rootPem: string, options: TrustOptions = {}): Promise<TrustChange> {
  const resolved = resolveTrust(options);
  const stem = rootFileStem(rootPem);
  const systemPath = join(resolved.systemDir, `${stem}.crt`);
  const commands: string[] = [];
  let system: TrustChange["system"] = "unchanged";
  if (existsSync(systemPath)) {
    requireWritable(resolved, resolved.removeCommand[0]);
    rmSync(systemPath, { force: true });
    await runChecked(resolved.removeCommand, commands);
    if (bundleContains(resolved.bundlePath, rootPem)) {
      throw new AppError(
        "trust_failed",
        `${resolved.removeCommand.join(" ")} ran, but ${resolved.bundlePath} still contains the root: it was added some other way`,
      );
    }
    system = "removed";
  }

  let nss: TrustChange["nss"] = nssAvailability(resolved);
  if (nss === "unchanged" && (await nssHas(resolved, stem))) {
    await runChecked([resolved.certutil ?? "certutil", "-d", `sql:${resolved.nssDb}`, "-D", "-n", stem], commands);
    nss = "removed";
  }
  return { system, nss, system_path: systemPath, bundle_path: resolved.bundlePath, nss_db: resolved.nssDb, commands };
}

function resolveTrust(options: TrustOptions): ResolvedTrust {
  const detected = SYSTEM_TRUST_STORES.find((store) => existsSync(store.systemDir)) ?? SYSTEM_TRUST_STORES[0];
  const certutil = options.certutil ?? "certutil";
  return {
    systemDir: options.systemDir ?? detected?.systemDir ?? "",
    bundlePath: options.bundlePath ?? detected?.bundlePath ?? "",
    updateCommand: options.updateCommand ?? detected?.updateCommand ?? [],
    removeCommand: options.removeCommand ?? options.updateCommand ?? detected?.removeCommand ?? [],
    nssDb: options.nssDb ?? join(homedir(), ".pki", "nssdb"),
    certutil: Bun.which(certutil) ?? (existsSync(certutil) ? certutil : null),
  };
}

function requireWritable(resolved: ResolvedTrust, command: string | undefined): void {
  if (!existsSync(resolved.systemDir) || !statSync(resolved.systemDir).isDirectory()) {
    throw new AppError(
      "not_supported",
      `no system trust store found (looked for ${SYSTEM_TRUST_STORES.map((store) => store.systemDir).join(", ")}); trust the root by hand (see certs/README.md)`,
    );
  }
  if (!command || !(Bun.which(command) ?? (existsSync(command) ? command : null))) {
    throw new AppError(
      "not_supported",
      `${command ?? "the trust store's update command"} was not found; install the ca-certificates package, or trust the root by hand (see certs/README.md)`,
    );
  }
  try {
    accessSync(resolved.systemDir, constants.W_OK);
  } catch {
    throw new AppError("forbidden", `changing the system trust store needs root: ${resolved.systemDir} is not writable (try sudo)`);
  }
}

// runChecked runs a command to its end, recording it, and throws `internal` with its output's tail when it fails.
async function runChecked(argv: string[], commands: string[]): Promise<string> {
  commands.push(argv.join(" "));
  const child = Bun.spawn(argv, { stdin: "ignore", stdout: "pipe", stderr: "pipe" });
  const [stdout, stderr, exitCode] = await Promise.all([
    new Response(child.stdout).text(),
    new Response(child.stderr).text(),
    child.exited,
  ]);
  if (exitCode !== 0) {
    const tail = `${stdout}\n${stderr}`.trim().split("\n").slice(-5).join("\n");
    throw new AppError("trust_failed", `${argv.join(" ")} failed with exit code ${exitCode}: ${tail}`);
  }
  return stdout;
}

function nssAvailability(resolved: ResolvedTrust): TrustChange["nss"] {
  if (resolved.certutil === null) return "unavailable";
  // Like mkcert, never create an NSS database: one exists once Chrome has run.
  if (!existsSync(join(resolved.nssDb, "cert9.db"))) return "no_database";
  return "unchanged";
}

async function nssHas(resolved: ResolvedTrust, nickname: string): Promise<boolean> {
  if (resolved.certutil === null || !existsSync(join(resolved.nssDb, "cert9.db"))) return false;
  const child = Bun.spawn([resolved.certutil, "-d", `sql:${resolved.nssDb}`, "-L", "-n", nickname], {
    stdin: "ignore",
    stdout: "ignore",
    stderr: "ignore",
  });
  return (await child.exited) === 0;
}

function parseRoot(rootPem: string): X509Certificate {
  try {
    return new X509Certificate(rootPem);
  } catch {
    throw new AppError("trust_failed", "the root certificate could not be parsed");
  }
}

// certificateBody returns the base64 of a PEM certificate without whitespace, to compare certificates as bytes.
function certificateBody(pem: string): string {
  return pem
    .replace(/-----(BEGIN|END) CERTIFICATE-----/g, "")
    .replace(/\s+/g, "")
    .trim();
}

function normalizePem(pem: string): string {
  return splitPemCertificates(pem)[0] ?? pem;
}

function sameCertificateFile(path: string, rootPem: string): boolean {
  try {
    return certificateBody(normalizePem(readFileSync(path, "utf8"))) === certificateBody(normalizePem(rootPem));
  } catch {
    return false;
  }
}

function bundleContains(bundlePath: string, rootPem: string): boolean {
  let bundle: string;
  try {
    bundle = readFileSync(bundlePath, "utf8");
  } catch {
    return false;
  }
  const wanted = certificateBody(normalizePem(rootPem));
  return splitPemCertificates(bundle).some((block) => certificateBody(block) === wanted);
}
