import { afterAll, describe, expect, spyOn, test } from "bun:test";
import { X509Certificate } from "node:crypto";
import { mkdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { Command } from "commander";
import { registerTls } from "../../cli/commands/tls";
import type { TrustOptions } from "../../src/engine/tls";
import { tempDir } from "../helpers";

const dirs: string[] = [];
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

// cli runs the tls commands in-process on a program with the same global options as cli/engine.ts.
async function cli(args: string[], trust?: TrustOptions): Promise<string> {
  const program = new Command("engine").option("--json").option("--data-dir <dir>").exitOverride();
  registerTls(program, () => ({ json: program.opts<{ json?: boolean }>().json === true }), { trust });
  const chunks: string[] = [];
  const write = spyOn(process.stdout, "write").mockImplementation((chunk: string | Uint8Array) => {
    chunks.push(typeof chunk === "string" ? chunk : new TextDecoder().decode(chunk));
    return true;
  });
  try {
    await program.parseAsync(["bun", "engine", ...args]);
  } finally {
    write.mockRestore();
  }
  return chunks.join("");
}

describe("engine ca / engine trust", () => {
  test("ca creates the CA in the data dir and prints the root PEM; --json adds fingerprint, expiry and path", async () => {
    const dataDir = join(tempDir(), "data");
    dirs.push(join(dataDir, ".."));
    const pem = await cli(["--data-dir", dataDir, "ca"]);
    const rootPath = join(dataDir, "pki", "root.crt");
    expect(pem).toBe(readFileSync(rootPath, "utf8"));
    expect(new X509Certificate(pem).ca).toBe(true);
    expect(statSync(join(dataDir, "pki", "root.key")).mode & 0o777).toBe(0o600);

    const json = JSON.parse(await cli(["--json", "--data-dir", dataDir, "ca"])) as Record<string, string>;
    expect(json).toEqual({
      pem,
      fingerprint_sha256: new X509Certificate(pem).fingerprint256,
      not_after: new X509Certificate(pem).validToDate.toISOString(),
      path: rootPath,
    });
  });

  test("trust installs, reports and uninstalls the root in the configured store", async () => {
    const dir = tempDir();
    dirs.push(dir);
    const systemDir = join(dir, "anchors");
    mkdirSync(systemDir);
    const bundlePath = join(dir, "bundle.crt");
    const trust: TrustOptions = {
      systemDir,
      bundlePath,
      updateCommand: ["sh", "-c", 'cat "$0"/*.crt > "$1" 2>/dev/null || : > "$1"', systemDir, bundlePath],
      certutil: join(dir, "no-certutil"),
    };
    const dataDir = join(dir, "data");

    const installed = await cli(["--data-dir", dataDir, "trust"], trust);
    expect(installed).toMatch(/^root {4}.*root\.crt \(SHA-256 ([0-9A-F]{2}:){31}[0-9A-F]{2}\)$/m);
    expect(installed).toMatch(
      new RegExp(`^system  added ${systemDir}/engine-local-root-[0-9a-f]{16}\\.crt; ${bundlePath} now trusts it$`, "m"),
    );
    expect(installed).toMatch(/^nss {5}skipped: certutil is not installed/m);

    const status = JSON.parse(await cli(["--json", "--data-dir", dataDir, "trust", "--status"], trust)) as Record<string, unknown>;
    expect(status).toMatchObject({ system: true, nss: null });

    const removed = JSON.parse(await cli(["--json", "--data-dir", dataDir, "trust", "--uninstall"], trust)) as Record<string, unknown>;
    expect(removed).toMatchObject({ system: "removed", nss: "unavailable", bundle_path: bundlePath });
    expect(readFileSync(bundlePath, "utf8")).toBe("");
  });

  test("trust without an update command fails with not_supported", async () => {
    const dir = tempDir();
    dirs.push(dir);
    const trust: TrustOptions = { systemDir: dir, bundlePath: join(dir, "bundle"), updateCommand: ["/nonexistent/update"] };
    await expect(cli(["--data-dir", join(dir, "data"), "trust"], trust)).rejects.toMatchObject({ code: "not_supported" });
  });
});
