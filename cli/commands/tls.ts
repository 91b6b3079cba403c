import type { Command } from "commander";
import { resolveConfig } from "../../src/engine/config";
import {
  installTrust,
  LocalCa,
  pkiDirectory,
  type TrustChange,
  type TrustOptions,
  trustStatus,
  uninstallTrust,
} from "../../src/engine/tls";
import { emit, type Output, printPairs } from "../output";

/** TlsCommandOptions lets tests point `engine trust` at a temporary trust store instead of the system's. */
export interface TlsCommandOptions {
  trust?: TrustOptions;
}

/**
 * registerTls adds `engine ca`, which prints the local CA's root certificate (creating the CA
 * when it does not exist yet), and `engine trust`, which installs that root into the system
 * and NSS trust stores, or removes it with --uninstall. Neither needs the daemon.
 */
export function registerTls(program: Command, output: () => Output, options: TlsCommandOptions = {}): void {
  const openCa = () => {
    const dataDir = resolveConfig({ dataDir: program.opts<{ dataDir?: string }>().dataDir }).dataDir;
    return new LocalCa({ dir: pkiDirectory(dataDir) });
  };

  program
    .command("ca")
    .description("print the local CA's root certificate (PEM), creating the CA if it does not exist")
    .action(() => {
      const ca = openCa();
      const pem = ca.rootPem();
      const value = {
        pem,
        fingerprint_sha256: ca.rootFingerprintSha256(),
        not_after: ca.rootNotAfter().toISOString(),
        path: ca.rootPath,
      };
      emit(output(), value, () => process.stdout.write(pem));
    });

  program
    .command("trust")
    .description("trust the local CA's root in the system store (and NSS, for Chrome) so HTTPS to local names works; needs root")
    .option("--uninstall", "remove the root from the trust stores again")
    .option("--status", "only report where the root is trusted")
    .option("--nss-db <dir>", "NSS database to change (default ~/.pki/nssdb; under sudo pass your own)")
    .action(async (flags: { uninstall?: boolean; status?: boolean; nssDb?: string }) => {
      const ca = openCa();
      const rootPem = ca.rootPem();
      const trustOptions: TrustOptions = { ...options.trust, ...(flags.nssDb ? { nssDb: flags.nssDb } : {}) };
      if (flags.status) {
        const status = await trustStatus(rootPem, trustOptions);
        emit(output(), { ...status, fingerprint_sha256: ca.rootFingerprintSha256() }, () =>
          printPairs([
            ["root", `${ca.rootPath} (SHA-256 ${ca.rootFingerprintSha256()})`],
            ["system", `${status.system ? "trusted" : "not trusted"} (${status.system_path})`],
            ["nss", status.nss === null ? "certutil not installed" : status.nss ? "trusted" : "not trusted"],
          ]),
        );
        return;
      }
      const change = flags.uninstall ? await uninstallTrust(rootPem, trustOptions) : await installTrust(rootPem, trustOptions);
      emit(output(), { ...change, fingerprint_sha256: ca.rootFingerprintSha256() }, () => printPairs(describeChange(change, ca)));
    });
}

function describeChange(change: TrustChange, ca: LocalCa): [string, string][] {
  const system = {
    added: `added ${change.system_path}; ${change.bundle_path} now trusts it`,
    removed: `removed ${change.system_path}; ${change.bundle_path} no longer trusts it`,
    unchanged: `unchanged (${change.system_path})`,
  }[change.system];
  const nss = {
    added: `added to ${change.nss_db}`,
    removed: `removed from ${change.nss_db}`,
    unchanged: `unchanged (${change.nss_db})`,
    unavailable: "skipped: certutil is not installed (apt install libnss3-tools)",
    no_database: `skipped: no NSS database at ${change.nss_db}`,
  }[change.nss];
  const rows: [string, string][] = [
    ["root", `${ca.rootPath} (SHA-256 ${ca.rootFingerprintSha256()})`],
    ["system", system],
    ["nss", nss],
  ];
  if (change.commands.length > 0) rows.push(["ran", change.commands.join("\n")]);
  return rows;
}
