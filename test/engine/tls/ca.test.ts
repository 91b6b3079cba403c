import { afterAll, describe, expect, test } from "bun:test";
import { X509Certificate } from "node:crypto";
import { readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { DEFAULT_LEAF_LIFETIME_MS, INTERMEDIATE_LIFETIME_MS, LocalCa, ROOT_LIFETIME_MS } from "../../../src/engine/tls";
import { MutableClock, REPO_ROOT, tempDir } from "../../helpers";
import { curlThrough, opensslVerify, run, serveTls } from "./tls-helpers";

const DAY_MS = 86_400_000;
const dirs: string[] = [];
function newDir(): string {
  const dir = tempDir("engine-tls-");
  dirs.push(dir);
  return dir;
}
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

function mode(path: string): number {
  return statSync(path).mode & 0o777;
}

function certificates(pem: string): X509Certificate[] {
  return (pem.match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g) ?? []).map((block) => new X509Certificate(block));
}

describe("LocalCa", () => {
  test("creates a root and an intermediate on first use with private keys and a private directory", async () => {
    const dataDir = newDir();
    const dir = join(dataDir, "pki");
    const ca = new LocalCa({ dir, hostname: "box" });
    const rootPem = ca.rootPem();

    expect(mode(dir)).toBe(0o700);
    expect(mode(join(dir, "root.key"))).toBe(0o600);
    expect(mode(join(dir, "intermediate.key"))).toBe(0o600);
    expect(mode(join(dir, "root.crt"))).toBe(0o644);
    expect(mode(join(dir, "intermediate.crt"))).toBe(0o644);
    expect(readFileSync(ca.rootPath, "utf8")).toBe(rootPem);

    const root = new X509Certificate(rootPem);
    const intermediate = new X509Certificate(ca.intermediatePem());
    expect(root.subject).toContain("CN=engine Local Root CA - box");
    expect(root.ca).toBe(true);
    expect(root.verify(root.publicKey)).toBe(true);
    expect(intermediate.subject).toContain("CN=engine Local Intermediate CA - box");
    expect(intermediate.ca).toBe(true);
    expect(intermediate.checkIssued(root)).toBe(true);
    expect(intermediate.verify(root.publicKey)).toBe(true);

    const now = Date.now();
    expect(root.validToDate.getTime() - now).toBeGreaterThan(ROOT_LIFETIME_MS - 60_000);
    expect(root.validToDate.getTime() - now).toBeLessThanOrEqual(ROOT_LIFETIME_MS);
    expect(ca.rootNotAfter()).toEqual(root.validToDate);
    expect(intermediate.validToDate.getTime() - now).toBeGreaterThan(INTERMEDIATE_LIFETIME_MS - 60_000);

    // The intermediate may sign leaves only: path length 0 below it.
    const text = await run(["openssl", "x509", "-noout", "-text", "-in", ca.intermediatePath]);
    expect(text.stdout).toMatch(/CA:TRUE, pathlen:0/);
    expect(text.stdout).toMatch(/Certificate Sign, CRL Sign/);
  });

  test("the fingerprint is written as openssl writes it", async () => {
    const ca = new LocalCa({ dir: join(newDir(), "pki") });
    ca.rootPem();
    const openssl = await run(["openssl", "x509", "-noout", "-fingerprint", "-sha256", "-in", ca.rootPath]);
    expect(openssl.code).toBe(0);
    expect(openssl.stdout.trim()).toBe(`sha256 Fingerprint=${ca.rootFingerprintSha256()}`);
    expect(ca.rootFingerprintSha256()).toMatch(/^([0-9A-F]{2}:){31}[0-9A-F]{2}$/);
  });

  test("a second instance on the same directory loads the same root and intermediate", () => {
    const dir = join(newDir(), "pki");
    const first = new LocalCa({ dir });
    const rootPem = first.rootPem();
    const intermediatePem = first.intermediatePem();
    const rootKey = readFileSync(join(dir, "root.key"), "utf8");

    const second = new LocalCa({ dir });
    expect(second.rootPem()).toBe(rootPem);
    expect(second.intermediatePem()).toBe(intermediatePem);
    expect(second.rootFingerprintSha256()).toBe(first.rootFingerprintSha256());
    expect(readFileSync(join(dir, "root.key"), "utf8")).toBe(rootKey);
  });

  test("processes that start at the same moment end up with one root", async () => {
    const dir = join(newDir(), "pki");
    const script = `import { LocalCa } from ${JSON.stringify(join(REPO_ROOT, "src/engine/tls"))};
      const ca = new LocalCa({ dir: process.argv[2] });
      process.stdout.write(ca.rootFingerprintSha256() + " " + ca.intermediatePem().length);`;
    const scriptPath = join(dir, "..", "make-ca.ts");
    writeFileSync(scriptPath, script);
    const results = await Promise.all(Array.from({ length: 6 }, () => run([process.execPath, scriptPath, dir])));
    for (const result of results) expect(result.code).toBe(0);
    const fingerprints = new Set(results.map((result) => result.stdout.split(" ")[0]));
    expect(fingerprints.size).toBe(1);
    expect(new LocalCa({ dir }).rootFingerprintSha256()).toBe([...fingerprints][0] ?? "");
  });

  test("issues a leaf that openssl verifies for TLS servers through the intermediate", async () => {
    const dir = newDir();
    const ca = new LocalCa({ dir: join(dir, "pki") });
    const before = Date.now();
    const leaf = ca.issueLeaf(["App.Test", "www.app.test", "127.0.0.1", "::1"]);

    expect(leaf.names).toEqual(["app.test", "www.app.test", "127.0.0.1", "::1"]);
    expect(leaf.issuer).toBe(`engine Local Intermediate CA - ${(await import("node:os")).hostname()}`);
    const [certificate, chained, ...rest] = certificates(leaf.certPem);
    expect(rest).toHaveLength(0);
    expect(chained?.fingerprint256).toBe(new X509Certificate(ca.intermediatePem()).fingerprint256);
    expect(certificate?.subjectAltName).toBe("DNS:app.test, DNS:www.app.test, IP Address:127.0.0.1, IP Address:0:0:0:0:0:0:0:1");
    expect(certificate?.ca).toBe(false);
    expect(certificate?.checkHost("app.test")).toBe("app.test");
    expect(certificate?.checkIP("127.0.0.1")).toBe("127.0.0.1");

    // notBefore is backdated for clock skew; the default lifetime is seven days.
    expect(leaf.notBefore.getTime()).toBeLessThanOrEqual(before - 60_000);
    expect(leaf.notBefore.getTime()).toBeGreaterThan(before - 10 * 60_000);
    expect(leaf.notAfter.getTime() - before).toBeGreaterThan(DEFAULT_LEAF_LIFETIME_MS - 60_000);
    expect(leaf.notAfter.getTime() - before).toBeLessThanOrEqual(DEFAULT_LEAF_LIFETIME_MS);
    expect(certificate?.validToDate).toEqual(leaf.notAfter);

    const verified = await opensslVerify(dir, { rootPath: ca.rootPath, intermediatePem: ca.intermediatePem(), leafPem: leaf.certPem });
    expect(verified.stderr).toBe("");
    expect(verified.stdout).toContain(": OK");

    const leafPath = join(dir, "leaf.pem");
    writeFileSync(leafPath, leaf.certPem);
    const text = await run(["openssl", "x509", "-noout", "-text", "-in", leafPath]);
    expect(text.stdout).toMatch(/X509v3 Extended Key Usage: *\n *TLS Web Server Authentication\n/);
    expect(text.stdout).toMatch(/X509v3 Key Usage: critical\n *Digital Signature\n/);
    expect(text.stdout).toMatch(/Serial Number:\s*\n?\s*([0-9a-f]{2}:){15}[0-9a-f]{2}/);
  });

  test("every leaf has its own key and serial", () => {
    const ca = new LocalCa({ dir: join(newDir(), "pki") });
    const first = ca.issueLeaf(["a.test"]);
    const second = ca.issueLeaf(["a.test"]);
    expect(first.keyPem).not.toBe(second.keyPem);
    expect(first.keyPem).toStartWith("-----BEGIN PRIVATE KEY-----");
    const [one] = certificates(first.certPem);
    const [two] = certificates(second.certPem);
    expect(one?.serialNumber).not.toBe(two?.serialNumber);
  });

  test("a leaf serves a real TLS handshake that curl trusts with the root", async () => {
    const dir = newDir();
    const ca = new LocalCa({ dir: join(dir, "pki") });
    const leaf = ca.issueLeaf(["web.engine.test"]);
    const server = serveTls("web.engine.test", leaf.certPem, leaf.keyPem);
    try {
      const trusted = await curlThrough("web.engine.test", server.port ?? 0, ca.rootPath);
      expect(trusted).toMatchObject({ code: 0, stdout: "hello web.engine.test" });

      // A different CA's root does not vouch for it.
      const other = new LocalCa({ dir: join(dir, "other") });
      other.rootPem();
      const untrusted = await curlThrough("web.engine.test", server.port ?? 0, other.rootPath);
      expect(untrusted.code).toBe(60);
    } finally {
      server.stop(true);
    }
  });

  test("renews the intermediate past two thirds of its life and keeps the root", async () => {
    const dir = newDir();
    const clock = new MutableClock();
    const ca = new LocalCa({ dir: join(dir, "pki"), clock, intermediateLifetimeMs: 30 * DAY_MS });
    const rootPem = ca.rootPem();
    const intermediatePem = ca.intermediatePem();

    clock.advance(19 * DAY_MS);
    expect(ca.intermediatePem()).toBe(intermediatePem);
    clock.advance(2 * DAY_MS);
    const renewed = ca.intermediatePem();
    expect(renewed).not.toBe(intermediatePem);
    expect(ca.rootPem()).toBe(rootPem);
    expect(new X509Certificate(renewed).verify(new X509Certificate(rootPem).publicKey)).toBe(true);
    expect(readFileSync(ca.intermediatePath, "utf8")).toBe(renewed);

    // Another process that opens the directory later sees the renewed one.
    expect(new LocalCa({ dir: join(dir, "pki"), clock }).intermediatePem()).toBe(renewed);
  });

  test("a leaf never outlives its intermediate", () => {
    const clock = new MutableClock();
    const ca = new LocalCa({ dir: join(newDir(), "pki"), clock, intermediateLifetimeMs: 9 * DAY_MS });
    clock.advance(5 * DAY_MS);
    const leaf = ca.issueLeaf(["a.test"], 30 * DAY_MS);
    expect(leaf.notAfter).toEqual(ca.intermediateNotAfter());
  });

  test("a damaged intermediate key is replaced; the root stays", () => {
    const dir = join(newDir(), "pki");
    const first = new LocalCa({ dir });
    const rootPem = first.rootPem();
    const intermediatePem = first.intermediatePem();
    writeFileSync(join(dir, "intermediate.key"), "not a key");
    const second = new LocalCa({ dir });
    expect(second.rootPem()).toBe(rootPem);
    expect(second.intermediatePem()).not.toBe(intermediatePem);
    expect(mode(join(dir, "intermediate.key"))).toBe(0o600);
  });

  test.each([
    [[]],
    [[""]],
    [["a..test"]],
    [["-a.test"]],
    [["a.test."]],
    [["a_b.test"]],
    [["a/b"]],
    [["*.*.test"]],
    [["a.*.test"]],
    [["ünï.test"]],
    [[`${"a".repeat(64)}.test`]],
    [[`${"a.".repeat(127)}test`]],
  ])("issueLeaf rejects %j with invalid_domain", (names) => {
    const ca = new LocalCa({ dir: join(newDir(), "pki") });
    expect(() => ca.issueLeaf(names)).toThrow(expect.objectContaining({ code: "invalid_domain" }));
  });

  test("issueLeaf accepts a leading wildcard", () => {
    const ca = new LocalCa({ dir: join(newDir(), "pki") });
    const [certificate] = certificates(ca.issueLeaf(["*.apps.test"]).certPem);
    expect(certificate?.subjectAltName).toBe("DNS:*.apps.test");
  });
});
