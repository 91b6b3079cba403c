import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createPrivateKey, X509Certificate } from "node:crypto";
import { readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { type AcmeCertificate, AcmeIssuer, type AcmeIssuerOptions } from "../../../src/engine/tls/acme";
import { AppError } from "../../../src/lib/errors";
import { eventually, MutableClock, tempDir } from "../../helpers";
import { freePort, pebbleMissing, type RunningPebble, startPebble } from "./pebble";
import { describeWhen } from "./tls-helpers";

// Everything here runs against a real Pebble (Debian package `pebble`); without it the suite is skipped.
const EAB_KID = "kid-1";
const EAB_HMAC = "zWNDZM6eQGHWpSRTPal5eIUYFTu7EajVIoguysqZ9wG44nMEtx3MUAsUDkMTQ12W";

interface LogLine {
  level: string;
  obj: Record<string, unknown>;
  msg: string;
}

function captureLog() {
  const lines: LogLine[] = [];
  const write = (level: string) => (obj: Record<string, unknown>, msg: string) => lines.push({ level, obj, msg });
  return { lines, log: { info: write("info"), warn: write("warn"), error: write("error") } };
}

function splitPem(chain: string): string[] {
  return chain.match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g) ?? [];
}

async function rejection(promise: Promise<unknown>): Promise<AppError> {
  try {
    await promise;
  } catch (error) {
    expect(error).toBeInstanceOf(AppError);
    return error as AppError;
  }
  throw new Error("expected a rejection");
}

describeWhen(pebbleMissing(), "AcmeIssuer against Pebble")("AcmeIssuer against Pebble", () => {
  let pebble: RunningPebble;
  let challengeServer: ReturnType<typeof Bun.serve>;
  const dirs: string[] = [];
  const issuers = new Set<AcmeIssuer>();
  /** validations records every request Pebble's validation authority made: host and path. */
  const validations: { host: string; path: string }[] = [];
  /** refusing holds the domains whose challenges the server answers 404, as a broken proxy would. */
  const refusing = new Set<string>();

  beforeAll(async () => {
    const httpPort = await freePort();
    // The same contract as the engine's HTTP port: GET /.well-known/acme-challenge/<token>
    // answers issuer.challengeResponse(token) as text/plain.
    challengeServer = Bun.serve({
      port: httpPort,
      hostname: "127.0.0.1",
      fetch(request) {
        const url = new URL(request.url);
        const host = (request.headers.get("host") ?? "").split(":")[0] ?? "";
        validations.push({ host, path: url.pathname });
        const match = /^\/\.well-known\/acme-challenge\/([A-Za-z0-9_-]+)$/.exec(url.pathname);
        if (!match?.[1] || refusing.has(host)) return new Response("not found", { status: 404 });
        for (const issuer of issuers) {
          const answer = issuer.challengeResponse(match[1]);
          if (answer !== undefined) return new Response(answer, { headers: { "content-type": "text/plain" } });
        }
        return new Response("not found", { status: 404 });
      },
    });
    pebble = await startPebble({ httpPort });
  });

  afterAll(async () => {
    for (const issuer of issuers) issuer.stop();
    challengeServer?.stop(true);
    await pebble?.stop();
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  });

  function makeIssuer(overrides: Partial<AcmeIssuerOptions> = {}, target: RunningPebble = pebble) {
    const { lines, log } = captureLog();
    const dir = overrides.dir ?? tempDir("engine-acme-");
    if (!overrides.dir) dirs.push(dir);
    const certificates: { domain: string; certificate: AcmeCertificate }[] = [];
    const issuer = new AcmeIssuer({
      directoryUrl: target.directoryUrl,
      directoryCa: target.directoryCa,
      email: "ops@example.test",
      dir,
      log,
      clock: new MutableClock(),
      onCertificate: (domain, certificate) => {
        certificates.push({ domain, certificate });
      },
      ...overrides,
    });
    issuers.add(issuer);
    return { issuer, dir, lines, certificates };
  }

  let first: { issuer: AcmeIssuer; dir: string; lines: LogLine[]; certificate: AcmeCertificate; ms: number } | undefined;
  async function firstIssuance() {
    if (!first) {
      const made = makeIssuer();
      const started = performance.now();
      const certificate = await made.issuer.issue("app.example.test");
      first = { ...made, certificate, ms: performance.now() - started };
    }
    return first;
  }

  test("issues a certificate for app.example.test through a real http-01 challenge", async () => {
    const { issuer, dir, certificate, ms } = await firstIssuance();
    console.info(`acme: first issuance (account, order, challenge, finalize) took ${ms.toFixed(0)} ms`);

    const challenges = validations.filter((v) => v.host === "app.example.test" && v.path.startsWith("/.well-known/acme-challenge/"));
    expect(challenges.length).toBeGreaterThan(0);
    // The order is over, so its challenges are gone.
    for (const { path } of challenges) expect(issuer.challengeResponse(path.split("/").pop() ?? "")).toBeUndefined();

    const leaf = new X509Certificate(certificate.certPem);
    expect(leaf.subjectAltName).toBe("DNS:app.example.test");
    expect(leaf.checkPrivateKey(createPrivateKey(certificate.keyPem))).toBe(true);
    expect(certificate.issuer).toStartWith("Pebble Intermediate CA");
    expect(certificate.notAfter.getTime()).toBeGreaterThan(certificate.notBefore.getTime());
    expect(certificate.notAfter.getTime()).toBe(new Date(leaf.validTo).getTime());

    expect(statSync(join(dir, "account.key")).mode & 0o777).toBe(0o600);
    expect(issuer.status()).toMatchObject({ account: "registered", email: "ops@example.test", eab: false });
  });

  test("the chain verifies against Pebble's root with openssl verify", async () => {
    const { certificate } = await firstIssuance();
    const dir = tempDir("engine-acme-verify-");
    dirs.push(dir);
    const [leaf, ...chain] = splitPem(certificate.certPem);
    expect(chain.length).toBeGreaterThan(0);
    writeFileSync(join(dir, "leaf.pem"), `${leaf}\n`);
    writeFileSync(join(dir, "root.pem"), await pebble.rootPem());
    writeFileSync(join(dir, "intermediate.pem"), await pebble.intermediatePem());
    const verify = Bun.spawnSync(
      ["openssl", "verify", "-CAfile", "root.pem", "-untrusted", "intermediate.pem", "-purpose", "sslserver", "leaf.pem"],
      { cwd: dir, stdout: "pipe", stderr: "pipe" },
    );
    expect(`${verify.stdout}${verify.stderr}`.trim()).toBe("leaf.pem: OK");
    expect(verify.exitCode).toBe(0);
    // The intermediate the CA sent with the leaf is the one the management API names.
    expect(new X509Certificate(chain[0] ?? "").fingerprint256).toBe(new X509Certificate(await pebble.intermediatePem()).fingerprint256);
  });

  test("a second issuer on the same dir reuses the account from disk", async () => {
    const { dir } = await firstIssuance();
    const key = readFileSync(join(dir, "account.key"), "utf8");
    const account = readFileSync(join(dir, "account.json"), "utf8");
    const second = makeIssuer({ dir });
    expect(second.issuer.status().account).toBe("registered");

    const certificate = await second.issuer.issue("second.example.test");
    expect(new X509Certificate(certificate.certPem).subjectAltName).toBe("DNS:second.example.test");
    expect(readFileSync(join(dir, "account.key"), "utf8")).toBe(key);
    expect(readFileSync(join(dir, "account.json"), "utf8")).toBe(account);
    expect(second.lines.map((line) => line.msg)).not.toContain("acme: account registered");
  });

  test("an account the CA no longer knows is registered again with the same key", async () => {
    const made = makeIssuer();
    await made.issuer.issue("forgotten.example.test");
    const accountPath = join(made.dir, "account.json");
    const stored = JSON.parse(readFileSync(accountPath, "utf8")) as { directory_url: string; url: string };
    writeFileSync(accountPath, JSON.stringify({ ...stored, url: stored.url.replace(/[^/]+$/, "0000000000000000") }));

    const again = makeIssuer({ dir: made.dir });
    const certificate = await again.issuer.issue("forgotten.example.test");
    expect(new X509Certificate(certificate.certPem).subjectAltName).toBe("DNS:forgotten.example.test");
    expect(again.lines.map((line) => line.msg)).toContain("acme: account registered");
  });

  test("concurrent issue calls for one domain share one order", async () => {
    const { issuer } = makeIssuer();
    const [a, b] = await Promise.all([issuer.issue("shared.example.test"), issuer.issue("Shared.Example.Test")]);
    expect(a).toBe(b);
  });

  test.each([
    ["an IP address", "127.0.0.1", "malformed", "IP address"],
    ["an underscore", "bad_name.example.test", "malformed", "illegal character"],
  ])("a domain with %s is refused by the CA with acme_failed", async (_, domain, type, detail) => {
    const { issuer } = makeIssuer();
    const error = await rejection(issuer.issue(domain));
    expect(error.code).toBe("acme_failed");
    expect(error.message).toContain(`the certificate order for ${domain} failed: ${type}: `);
    expect(error.message).toContain(detail);
    expect(error.details).toMatchObject({ domain, stage: "order", problem_type: `urn:ietf:params:acme:error:${type}` });

    // Retrying cannot fix what the CA refused: ensure() marks it failed without a retry.
    issuer.ensure(domain);
    const state = await eventually(() => (issuer.state(domain)?.state === "failed" ? issuer.state(domain) : undefined), {
      timeoutMs: 15_000,
    });
    expect(state).toMatchObject({ domain, state: "failed", attempts: 1, next_retry_at: null, not_after: null });
    expect(state.last_error).toContain(detail);
  });

  test("a challenge the HTTP port answers with 404 fails with what the CA saw", async () => {
    refusing.add("broken.example.test");
    const { issuer } = makeIssuer();
    const error = await rejection(issuer.issue("broken.example.test"));
    expect(error.code).toBe("acme_failed");
    expect(error.message).toStartWith("the http-01 challenge for broken.example.test failed: unauthorized: ");
    expect(error.message).toContain("404");
    expect(error.details).toMatchObject({ stage: "challenge", problem_type: "urn:ietf:params:acme:error:unauthorized" });
    expect(validations.some((v) => v.host === "broken.example.test")).toBe(true);
  });

  test("ensure() schedules a retry with backoff after a failed challenge, and cancel() stops it", async () => {
    refusing.add("retry.example.test");
    const { issuer } = makeIssuer({ retry: { baseMs: 60_000, maxMs: 3_600_000 } });
    const before = Date.now();
    issuer.ensure("retry.example.test");
    expect(issuer.state("retry.example.test")).toMatchObject({ state: "pending", attempts: 1 });
    const state = await eventually(
      () => (issuer.state("retry.example.test")?.state === "retrying" ? issuer.state("retry.example.test") : undefined),
      {
        timeoutMs: 15_000,
      },
    );
    expect(state).toMatchObject({ domain: "retry.example.test", state: "retrying", attempts: 1, not_after: null });
    expect(state.last_error).toContain("unauthorized");
    const delay = new Date(state.next_retry_at ?? 0).getTime() - before;
    expect(delay).toBeGreaterThanOrEqual(54_000 - 1);
    expect(delay).toBeLessThanOrEqual(66_000 + (Date.now() - before));

    expect(issuer.cancel("retry.example.test")).toBe(true);
    expect(issuer.state("retry.example.test")).toBeUndefined();
    expect(issuer.status().orders).toEqual([]);
  });

  test("ensure() retries until the challenge succeeds, then hands over the certificate", async () => {
    refusing.add("flaky.example.test");
    const { issuer, certificates } = makeIssuer({ retry: { baseMs: 200, maxMs: 1000 } });
    issuer.ensure("flaky.example.test");
    await eventually(() => issuer.state("flaky.example.test")?.state === "retrying", { timeoutMs: 15_000 });
    refusing.delete("flaky.example.test");

    await eventually(() => issuer.state("flaky.example.test")?.state === "valid", { timeoutMs: 30_000 });
    const state = issuer.state("flaky.example.test");
    expect(state?.attempts).toBeGreaterThanOrEqual(2);
    expect(state?.last_error).toBeNull();
    expect(state?.next_retry_at).toBeNull();
    expect(certificates.map((c) => c.domain)).toEqual(["flaky.example.test"]);
    expect(state?.not_after).toBe(certificates[0]?.certificate.notAfter.toISOString() ?? "");
  });

  test("renewDue() renews a certificate past 2/3 of its lifetime, not before", async () => {
    const { issuer, certificates } = makeIssuer();
    issuer.ensure("renew.example.test");
    await eventually(() => certificates.length === 1, { timeoutMs: 30_000 });
    const { notBefore, notAfter } = certificates[0]!.certificate;
    const lifetime = notAfter.getTime() - notBefore.getTime();

    expect(issuer.renewDue(new Date(notBefore.getTime() + lifetime * 0.6))).toEqual([]);
    expect(issuer.renewDue(new Date(notBefore.getTime() + lifetime * 0.7))).toEqual(["renew.example.test"]);
    await eventually(() => certificates.length === 2, { timeoutMs: 30_000 });
    const [old, renewed] = certificates.map((c) => new X509Certificate(c.certificate.certPem));
    expect(renewed?.serialNumber).not.toBe(old?.serialNumber);
    expect(issuer.state("renew.example.test")).toMatchObject({ state: "valid", attempts: 1 });
  });

  test("ensure() with a certificate that is not yet due makes no order", async () => {
    const { issuer, certificates } = makeIssuer();
    const now = Date.now();
    const notAfter = new Date(now + 90 * 86_400_000);
    issuer.ensure("held.example.test", { notBefore: new Date(now - 86_400_000), notAfter });
    expect(issuer.state("held.example.test")).toMatchObject({ state: "valid", attempts: 0, not_after: notAfter.toISOString() });
    expect(issuer.status().account).toBe("none");
    expect(certificates).toEqual([]);
  });

  test("a directory whose TLS certificate is not trusted fails at once with the TLS reason", async () => {
    const { issuer } = makeIssuer({ directoryCa: undefined });
    const error = await rejection(issuer.issue("untrusted.example.test"));
    expect(error.code).toBe("acme_failed");
    expect(error.message).toStartWith(`cannot reach the ACME directory ${pebble.directoryUrl}: `);
    expect(error.message).toContain("certificate");
    expect(issuer.status().account).toBe("none");
  });

  test("an unreachable directory fails at once, and ensure() retries it later", async () => {
    const directoryUrl = `https://127.0.0.1:${await freePort()}/dir`;
    const { issuer } = makeIssuer({ directoryUrl, retry: { baseMs: 60_000, maxMs: 3_600_000 } });
    const error = await rejection(issuer.issue("down.example.test"));
    expect(error.message).toStartWith(`cannot reach the ACME directory ${directoryUrl}: `);
    expect(error.details).toEqual({ stage: "directory" });

    issuer.ensure("down.example.test");
    const state = await eventually(() =>
      issuer.state("down.example.test")?.state === "retrying" ? issuer.state("down.example.test") : undefined,
    );
    expect(state.last_error).toBe(error.message);
    expect(state.next_retry_at).not.toBeNull();
    issuer.cancel("down.example.test");
  });

  test("status() and the logs never contain a key or the EAB secret", async () => {
    const { issuer, lines, dir, certificate } = await firstIssuance();
    const status = issuer.status();
    expect(Object.keys(status).sort()).toEqual(["account", "directory_url", "eab", "email", "enabled", "orders"]);
    const accountKey = readFileSync(join(dir, "account.key"), "utf8");
    const everything = JSON.stringify(status) + JSON.stringify(lines);
    expect(everything).not.toContain("PRIVATE KEY");
    expect(everything).not.toContain(accountKey.split("\n")[1] ?? "");
    expect(everything).not.toContain(certificate.keyPem.split("\n")[1] ?? "");
  });

  describe("with external account binding required", () => {
    let eabPebble: RunningPebble;
    beforeAll(async () => {
      const port = Number(new URL(challengeServer.url).port);
      eabPebble = await startPebble({ httpPort: port, eabRequired: true, eabKeys: { [EAB_KID]: EAB_HMAC } });
    });
    afterAll(() => eabPebble?.stop());

    test("an account without EAB is refused with externalAccountRequired", async () => {
      const { issuer } = makeIssuer({}, eabPebble);
      const error = await rejection(issuer.issue("eab.example.test"));
      expect(error.code).toBe("acme_failed");
      expect(error.message).toStartWith("the CA refused the account: externalAccountRequired: ");
      expect(issuer.status()).toMatchObject({ account: "none", eab: false });
    });

    test("an account with EAB registers and issues; the HMAC key never shows", async () => {
      const { issuer, lines } = makeIssuer({ eab: { kid: EAB_KID, hmacKey: EAB_HMAC } }, eabPebble);
      const certificate = await issuer.issue("eab.example.test");
      expect(new X509Certificate(certificate.certPem).subjectAltName).toBe("DNS:eab.example.test");
      expect(issuer.status()).toMatchObject({ account: "registered", eab: true });
      expect(JSON.stringify(issuer.status()) + JSON.stringify(lines)).not.toContain(EAB_HMAC);
    });
  });
});
