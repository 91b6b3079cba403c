import { afterAll, describe, expect, test } from "bun:test";
import { X509Certificate } from "node:crypto";
import { existsSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { LeafCertificates, LocalCa, leavesDirectory, pkiDirectory } from "../../../src/engine/tls";
import { MutableClock, tempDir } from "../../helpers";
import { curlThrough, opensslVerify, serveTls } from "./tls-helpers";

const DAY_MS = 86_400_000;
const dirs: string[] = [];
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

function setup(options: { dataDir?: string; clock?: MutableClock; lifetimeMs?: number } = {}) {
  const dataDir =
    options.dataDir ??
    (() => {
      const dir = tempDir("engine-leaves-");
      dirs.push(dir);
      return dir;
    })();
  const clock = options.clock ?? new MutableClock();
  const ca = new LocalCa({ dir: pkiDirectory(dataDir), clock });
  const leaves = new LeafCertificates({ ca, dir: leavesDirectory(dataDir), clock, lifetimeMs: options.lifetimeMs });
  return { dataDir, clock, ca, leaves };
}

describe("LeafCertificates", () => {
  test("issues a leaf once, keeps it in memory and on disk with a private key", async () => {
    const { dataDir, ca, leaves } = setup();
    const leaf = leaves.get("app.test");
    expect(leaves.get("app.test")).toBe(leaf);
    expect(leaf.names).toEqual(["app.test"]);

    const certPath = join(dataDir, "pki", "leaves", "app.test.crt");
    const keyPath = join(dataDir, "pki", "leaves", "app.test.key");
    expect(readFileSync(certPath, "utf8")).toBe(leaf.certPem);
    expect(readFileSync(keyPath, "utf8")).toBe(leaf.keyPem);
    expect(statSync(keyPath).mode & 0o777).toBe(0o600);
    expect(statSync(certPath).mode & 0o777).toBe(0o644);

    const verified = await opensslVerify(dataDir, { rootPath: ca.rootPath, intermediatePem: ca.intermediatePem(), leafPem: leaf.certPem });
    expect(verified.stdout).toContain(": OK");
  });

  test("a new manager on the same data dir loads the leaf from disk instead of issuing one", () => {
    const first = setup();
    const leaf = first.leaves.get("app.test");
    const second = setup({ dataDir: first.dataDir });
    const loaded = second.leaves.get("app.test");
    expect(loaded.certPem).toBe(leaf.certPem);
    expect(loaded.keyPem).toBe(leaf.keyPem);
    expect(loaded.notAfter).toEqual(leaf.notAfter);
    expect(loaded.issuer).toBe(leaf.issuer);
  });

  test("renewal is due at two thirds of the lifetime", () => {
    const { clock, leaves } = setup({ lifetimeMs: 3 * DAY_MS });
    const leaf = leaves.get("app.test");
    const renewal = leaf.notBefore.getTime() + ((leaf.notAfter.getTime() - leaf.notBefore.getTime()) * 2) / 3;
    expect(leaves.renewalDue(leaf, new Date(renewal - 1000))).toBe(false);
    expect(leaves.renewalDue(leaf, new Date(renewal))).toBe(true);

    clock.advance(renewal - 60_000 - Date.now());
    expect(leaves.renewDue()).toEqual([]);
    expect(leaves.get("app.test")).toBe(leaf);
  });

  test("renewDue re-issues due leaves only and saves them", () => {
    const { dataDir, clock, leaves } = setup();
    const early = leaves.get("early.test");
    clock.advance(3 * DAY_MS);
    const late = leaves.get("late.test");
    clock.advance(2 * DAY_MS); // early is 5 of 7 days old, late 2 of 7
    expect(leaves.renewDue(clock.now())).toEqual(["early.test"]);
    const renewed = leaves.get("early.test");
    expect(renewed.certPem).not.toBe(early.certPem);
    expect(renewed.keyPem).not.toBe(early.keyPem);
    expect(renewed.notAfter.getTime()).toBeGreaterThan(early.notAfter.getTime());
    expect(leaves.get("late.test")).toBe(late);
    expect(readFileSync(join(dataDir, "pki", "leaves", "early.test.crt"), "utf8")).toBe(renewed.certPem);
    expect(leaves.renewDue(clock.now())).toEqual([]);
  });

  test("get replaces a leaf on disk that is due, so a restarted engine never serves a stale one", () => {
    const first = setup();
    const leaf = first.leaves.get("app.test");
    const clock = new MutableClock();
    clock.advance(6 * DAY_MS);
    const second = setup({ dataDir: first.dataDir, clock });
    const loaded = second.leaves.get("app.test");
    expect(loaded.certPem).not.toBe(leaf.certPem);
    expect(second.leaves.renewalDue(loaded, clock.now())).toBe(false);
  });

  test("a leaf on disk from another CA or with a foreign key is replaced", () => {
    const first = setup();
    const leaf = first.leaves.get("app.test");
    const other = setup();
    const foreign = other.leaves.get("app.test");
    const certPath = join(first.dataDir, "pki", "leaves", "app.test.crt");
    const keyPath = join(first.dataDir, "pki", "leaves", "app.test.key");

    writeFileSync(certPath, foreign.certPem);
    writeFileSync(keyPath, foreign.keyPem);
    const fromOtherCa = setup({ dataDir: first.dataDir }).leaves.get("app.test");
    expect(fromOtherCa.certPem).not.toBe(foreign.certPem);
    expect(first.ca.verifiesLeaf(new X509Certificate(fromOtherCa.certPem))).toBe(true);

    writeFileSync(keyPath, leaf.keyPem); // matches no certificate now on disk
    const replaced = setup({ dataDir: first.dataDir }).leaves.get("app.test");
    expect(replaced.keyPem).not.toBe(leaf.keyPem);
    expect(replaced.certPem).not.toBe(fromOtherCa.certPem);
  });

  test("remove forgets the leaf and deletes its files", () => {
    const { dataDir, leaves } = setup();
    const leaf = leaves.get("app.test");
    leaves.remove("app.test");
    expect(existsSync(join(dataDir, "pki", "leaves", "app.test.crt"))).toBe(false);
    expect(existsSync(join(dataDir, "pki", "leaves", "app.test.key"))).toBe(false);
    expect(leaves.names()).toEqual([]);
    expect(leaves.get("app.test").certPem).not.toBe(leaf.certPem);
  });

  test("a leaf from get serves HTTPS that curl trusts with the root", async () => {
    const { ca, leaves } = setup();
    const leaf = leaves.get("notebook.engine.test");
    const server = serveTls("notebook.engine.test", leaf.certPem, leaf.keyPem);
    try {
      const result = await curlThrough("notebook.engine.test", server.port ?? 0, ca.rootPath);
      expect(result).toMatchObject({ code: 0, stdout: "hello notebook.engine.test" });
    } finally {
      server.stop(true);
    }
  });

  test.each([
    "App.test",
    "*.app.test",
    "app.test.",
    ".app.test",
    "a..test",
    "-app.test",
    "app-.test",
    "app_x.test",
    "127.0.0.1",
    "::1",
    "",
    "../escape",
    "a/b.test",
    "app.test a.test",
    `${"a".repeat(64)}.test`,
    `${"a.".repeat(127)}test`,
  ])("rejects %j with invalid_domain", (name) => {
    const { leaves, dataDir } = setup();
    expect(() => leaves.get(name)).toThrow(expect.objectContaining({ code: "invalid_domain" }));
    expect(() => leaves.remove(name)).toThrow(expect.objectContaining({ code: "invalid_domain" }));
    expect(existsSync(join(dataDir, "pki", "leaves"))).toBe(false);
  });

  test.each(["localhost", "app.test", "a-b.c-d.local", "x1.internal", `${"a".repeat(63)}.test`])("accepts %j", (name) => {
    const { leaves } = setup();
    expect(leaves.get(name).names).toEqual([name]);
  });
});
