import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, lstatSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { installTrust, LocalCa, rootFileStem, type TrustOptions, trustStatus, uninstallTrust } from "../../../src/engine/tls";
import { tempDir } from "../../helpers";
import { curlThrough, describeWhen, run, serveTls } from "./tls-helpers";

const dirs: string[] = [];
function newDir(): string {
  const dir = tempDir("engine-trust-");
  dirs.push(dir);
  return dir;
}
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

// fakeStore is a trust store in a temp dir whose update command concatenates its roots into the bundle.
function fakeStore(extra: Partial<TrustOptions> = {}): TrustOptions & { systemDir: string; bundlePath: string; log: string } {
  const dir = newDir();
  const systemDir = join(dir, "ca-certificates");
  mkdirSync(systemDir);
  const bundlePath = join(dir, "bundle.crt");
  const log = join(dir, "update.log");
  const script = 'echo run >> "$2"; cat "$0"/*.crt > "$1" 2>/dev/null || : > "$1"';
  return {
    systemDir,
    bundlePath,
    log,
    updateCommand: ["sh", "-c", script, systemDir, bundlePath, log],
    certutil: join(dir, "no-certutil"),
    nssDb: join(dir, "nssdb"),
    ...extra,
  };
}

function newRoot(): { ca: LocalCa; rootPem: string } {
  const ca = new LocalCa({ dir: join(newDir(), "pki") });
  return { ca, rootPem: ca.rootPem() };
}

const updateRuns = (log: string) => (existsSync(log) ? readFileSync(log, "utf8").split("\n").filter(Boolean).length : 0);

describe("trust store (temporary store, fake update command)", () => {
  test("install adds the root file and the bundle entry, once; uninstall undoes it", async () => {
    const store = fakeStore();
    const { rootPem } = newRoot();
    const stem = rootFileStem(rootPem);
    expect(stem).toMatch(/^engine-local-root-[0-9a-f]{16}$/);
    const systemPath = join(store.systemDir, `${stem}.crt`);

    expect(await trustStatus(rootPem, store)).toEqual({ system: false, nss: null, system_path: systemPath });

    const installed = await installTrust(rootPem, store);
    expect(installed).toMatchObject({ system: "added", nss: "unavailable", system_path: systemPath, bundle_path: store.bundlePath });
    expect(installed.commands).toHaveLength(1);
    expect(readFileSync(systemPath, "utf8")).toBe(rootPem);
    expect(statSync(systemPath).mode & 0o777).toBe(0o644);
    expect(readFileSync(store.bundlePath, "utf8")).toContain(rootPem.trim());
    expect(await trustStatus(rootPem, store)).toEqual({ system: true, nss: null, system_path: systemPath });

    const again = await installTrust(rootPem, store);
    expect(again).toMatchObject({ system: "unchanged", commands: [] });
    expect(updateRuns(store.log)).toBe(1);

    const removed = await uninstallTrust(rootPem, store);
    expect(removed).toMatchObject({ system: "removed", nss: "unavailable" });
    expect(existsSync(systemPath)).toBe(false);
    expect(readFileSync(store.bundlePath, "utf8")).not.toContain(rootPem.trim());
    expect(await trustStatus(rootPem, store)).toMatchObject({ system: false });

    expect(await uninstallTrust(rootPem, store)).toMatchObject({ system: "unchanged", commands: [] });
    expect(updateRuns(store.log)).toBe(2);
  });

  test("a root file whose bundle was never rebuilt is not reported as trusted, and install rebuilds it", async () => {
    const store = fakeStore();
    const { rootPem } = newRoot();
    writeFileSync(join(store.systemDir, `${rootFileStem(rootPem)}.crt`), rootPem);
    expect((await trustStatus(rootPem, store)).system).toBe(false);
    expect((await installTrust(rootPem, store)).system).toBe("added");
    expect((await trustStatus(rootPem, store)).system).toBe(true);
  });

  test("two engines' roots live side by side", async () => {
    const store = fakeStore();
    const first = newRoot();
    const second = newRoot();
    await installTrust(first.rootPem, store);
    await installTrust(second.rootPem, store);
    await uninstallTrust(first.rootPem, store);
    expect((await trustStatus(first.rootPem, store)).system).toBe(false);
    expect((await trustStatus(second.rootPem, store)).system).toBe(true);
  });

  test("a missing update command is not_supported and changes nothing", async () => {
    const store = fakeStore({ updateCommand: ["/nonexistent/update-ca-certificates"] });
    const { rootPem } = newRoot();
    await expect(installTrust(rootPem, store)).rejects.toMatchObject({
      code: "not_supported",
      message: expect.stringContaining("was not found"),
    });
    expect(existsSync(join(store.systemDir, `${rootFileStem(rootPem)}.crt`))).toBe(false);
  });

  test("a missing trust store folder is not_supported", async () => {
    const store = fakeStore();
    const { rootPem } = newRoot();
    await expect(installTrust(rootPem, { ...store, systemDir: join(store.systemDir, "absent") })).rejects.toMatchObject({
      code: "not_supported",
    });
  });

  test("a failing update command is reported with its output", async () => {
    const store = fakeStore({ updateCommand: ["sh", "-c", "echo broken bundle >&2; exit 3"] });
    const { rootPem } = newRoot();
    await expect(installTrust(rootPem, store)).rejects.toMatchObject({
      code: "trust_failed",
      message: expect.stringContaining("exit code 3: broken bundle"),
    });
  });

  test("a trust store the user may not write is forbidden", async () => {
    // Root writes anywhere, so this runs the check as an unprivileged user where one exists.
    const store = fakeStore();
    const { rootPem } = newRoot();
    if (process.getuid?.() !== 0) {
      await expect(installTrust(rootPem, { ...store, systemDir: "/usr/local/share/ca-certificates" })).rejects.toMatchObject({
        code: "forbidden",
      });
      return;
    }
    if ((await run(["id", "-u", "nobody"])).code !== 0 || !Bun.which("setpriv")) {
      console.warn("skipped: a trust store the user may not write: needs the user nobody and setpriv (apt-get install util-linux)");
      return;
    }
    const probe = join(newDir(), "probe.ts");
    writeFileSync(
      probe,
      `import { installTrust } from ${JSON.stringify(join(import.meta.dir, "../../../src/engine/tls"))};
       await installTrust(process.env.ROOT_PEM ?? "", { systemDir: "/usr/local/share/ca-certificates", updateCommand: ["true"], certutil: "/nonexistent" })
         .then(() => console.log("installed"), (error) => console.log(error.code));`,
    );
    await run(["chmod", "-R", "a+rX", join(probe, "..")]);
    // A checkout inside a private directory (mktemp -d is 0700) cannot be read by nobody: the
    // probe would fail for that reason, not the one under test.
    const reachable = await run([
      "setpriv",
      "--reuid=nobody",
      "--regid=nogroup",
      "--clear-groups",
      "sh",
      "-c",
      `test -x ${JSON.stringify(process.execPath)} && test -r ${JSON.stringify(join(import.meta.dir, "../../../src/engine/tls/index.ts"))}`,
    ]);
    if (reachable.code !== 0) {
      console.warn("skipped: a trust store the user may not write: the checkout is not readable by the user nobody");
      return;
    }
    const result = await run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", process.execPath, probe], {
      ...process.env,
      ROOT_PEM: rootPem,
      HOME: "/tmp",
    });
    expect(result.stdout.trim()).toBe("forbidden");
  });
});

const certutil = Bun.which("certutil");
const NSS_SUITE = "trust store: NSS database with the real certutil";
describeWhen(certutil ? null : "certutil not found (apt-get install libnss3-tools)", NSS_SUITE)(NSS_SUITE, () => {
  test("install adds the root to an existing NSS database with C,, trust; uninstall removes it", async () => {
    const nssDb = join(newDir(), "nssdb");
    mkdirSync(nssDb);
    expect((await run([certutil ?? "", "-N", "--empty-password", "-d", `sql:${nssDb}`])).code).toBe(0);
    const store = fakeStore({ certutil: certutil ?? "", nssDb });
    const { rootPem } = newRoot();
    const stem = rootFileStem(rootPem);

    expect((await trustStatus(rootPem, store)).nss).toBe(false);
    expect((await installTrust(rootPem, store)).nss).toBe("added");
    expect((await trustStatus(rootPem, store)).nss).toBe(true);
    const listed = await run([certutil ?? "", "-d", `sql:${nssDb}`, "-L"]);
    expect(listed.stdout).toMatch(new RegExp(`${stem}\\s+C,,`));
    expect((await installTrust(rootPem, store)).nss).toBe("unchanged");

    expect((await uninstallTrust(rootPem, store)).nss).toBe("removed");
    expect((await trustStatus(rootPem, store)).nss).toBe(false);
  });

  test("no NSS database means NSS is skipped, never created", async () => {
    const store = fakeStore({ certutil: certutil ?? "" });
    const { rootPem } = newRoot();
    expect((await installTrust(rootPem, store)).nss).toBe("no_database");
    expect(existsSync(store.nssDb ?? "")).toBe(false);
    expect((await trustStatus(rootPem, store)).nss).toBe(false);
  });
});

// This one changes the machine's real trust store (what CI runs as root): it installs a fresh
// root, proves OpenSSL and curl trust a leaf through the system bundle, and removes it again.
const realStoreMissing =
  process.getuid?.() !== 0
    ? "it changes the machine's trust store, so it runs as root only"
    : Bun.which("update-ca-certificates") === null || !existsSync("/usr/local/share/ca-certificates")
      ? "update-ca-certificates or /usr/local/share/ca-certificates not found (apt-get install ca-certificates)"
      : null;
const REAL_STORE_SUITE = "trust store: the real system store";
describeWhen(realStoreMissing, REAL_STORE_SUITE)(REAL_STORE_SUITE, () => {
  const dir = newDir();
  const ca = new LocalCa({ dir: join(dir, "pki") });
  const rootPem = ca.rootPem();
  const options: TrustOptions = { nssDb: join(dir, "no-nssdb") };
  afterAll(async () => {
    await uninstallTrust(rootPem, options);
  });

  test("a leaf is trusted through /etc/ssl/certs after install and not after uninstall", async () => {
    const leaf = ca.issueLeaf(["system-trust.engine.test"]);
    const leafPath = join(dir, "leaf.pem");
    const intermediatePath = join(dir, "intermediate.pem");
    writeFileSync(leafPath, leaf.certPem);
    writeFileSync(intermediatePath, ca.intermediatePem());
    const verify = () =>
      run([
        "openssl",
        "verify",
        "-purpose",
        "sslserver",
        "-CAfile",
        "/etc/ssl/certs/ca-certificates.crt",
        "-untrusted",
        intermediatePath,
        leafPath,
      ]);
    const server = serveTls("system-trust.engine.test", leaf.certPem, leaf.keyPem);
    try {
      expect((await verify()).code).not.toBe(0);
      expect((await curlThrough("system-trust.engine.test", server.port ?? 0)).code).toBe(60);

      const installed = await installTrust(rootPem, options);
      expect(installed).toMatchObject({ system: "added", system_path: `/usr/local/share/ca-certificates/${rootFileStem(rootPem)}.crt` });
      expect(await trustStatus(rootPem, options)).toMatchObject({ system: true });
      expect((await verify()).stdout).toContain(": OK");
      expect(await curlThrough("system-trust.engine.test", server.port ?? 0)).toMatchObject({
        code: 0,
        stdout: "hello system-trust.engine.test",
      });

      const removed = await uninstallTrust(rootPem, options);
      expect(removed).toMatchObject({ system: "removed", commands: ["update-ca-certificates --fresh"] });
      // No link to the deleted file is left behind in /etc/ssl/certs.
      expect(() => lstatSync(`/etc/ssl/certs/${rootFileStem(rootPem)}.pem`)).toThrow();
      expect(await trustStatus(rootPem, options)).toMatchObject({ system: false });
      expect((await verify()).code).not.toBe(0);
      expect((await curlThrough("system-trust.engine.test", server.port ?? 0)).code).toBe(60);
    } finally {
      server.stop(true);
    }
  });
});
