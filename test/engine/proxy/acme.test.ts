import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import {
  curlVerified,
  eventually,
  freePort,
  REPO_ROOT,
  startTestEngine,
  type TestEngine,
  tempDir,
  workloadBun,
  workloadPath,
} from "../../helpers";
import { removeAfterRun } from "../../run-dirs";
import { pebbleAvailable, type RunningPebble, startPebble } from "../tls/pebble";

const UPSTREAM = join(REPO_ROOT, "test", "fixtures", "proxy", "upstream.ts");
const available = pebbleAvailable();

/** startWithPebble starts a Pebble that validates http-01 on `challengePort`, and an engine whose HTTP port is `httpPort`. */
async function startWithPebble(httpPort: number, challengePort: number): Promise<{ engine: TestEngine; pebble: RunningPebble }> {
  const pebble = await startPebble({ httpPort: challengePort });
  const caFile = join(removeAfterRun(tempDir("engine-acme-ca-")), "directory-ca.pem");
  writeFileSync(caFile, pebble.directoryCa);
  const engine = await startTestEngine({
    proxy: true,
    httpsPort: 0,
    httpPort,
    proxyProcesses: 2,
    mdns: "off",
    hostname: "box",
    acmeDirectory: pebble.directoryUrl,
    acmeEmail: "ops@example.com",
    acmeCaFile: caFile,
  });
  const upstreamPort = await freePort();
  const deployed = await engine.json("POST", "/api/services", {
    body: { name: "shop", port: upstreamPort, command: [workloadBun(), workloadPath(UPSTREAM)], env: { SERVICE_NAME: "shop" } },
  });
  expect(deployed.status).toBe(201);
  return { engine, pebble };
}

describe.skipIf(!available)("ACME through the engine, against a real Pebble", () => {
  let engine: TestEngine;
  let pebble: RunningPebble;
  beforeAll(async () => {
    const httpPort = await freePort();
    ({ engine, pebble } = await startWithPebble(httpPort, httpPort));
  });
  afterAll(async () => {
    await engine?.close();
    await pebble?.stop();
  });

  test("a public domain gets a certificate through a real http-01 challenge served by the engine's HTTP port", async () => {
    const added = await engine.json<{ kind: string; certificate: { issuer: string } }>("POST", "/api/services/shop/domains", {
      body: { domain: "shop.example.com" },
    });
    expect(added.status).toBe(201);
    expect(added.body.kind).toBe("public");
    expect(added.body.certificate.issuer).toContain("Pebble");

    const status = (
      await engine.json<{
        https_port: number;
        acme: { enabled: boolean; account: string; orders: { domain: string; state: string }[] };
        domains: { domain: string; certificate: { source: string } }[];
      }>("GET", "/api/proxy/status")
    ).body;
    expect(status.acme.enabled).toBe(true);
    expect(status.acme.account).toBe("registered");
    expect(status.domains).toContainEqual(
      expect.objectContaining({ domain: "shop.example.com", certificate: expect.objectContaining({ source: "acme" }) }),
    );
    expect(JSON.stringify(status.acme)).not.toContain("PRIVATE KEY");

    // A client that trusts only Pebble's root reaches the service under its public name.
    const rootFile = join(engine.dataDir, "pebble-root.pem");
    writeFileSync(rootFile, `${await pebble.rootPem()}\n${await pebble.intermediatePem()}`);
    const out = await eventually(
      async () => {
        const result = await curlVerified("shop.example.com", status.https_port, rootFile, "/x");
        return result.code === 0 && result.out.startsWith("{") ? result.out : null;
      },
      { timeoutMs: 10000 },
    );
    expect((JSON.parse(out) as { service: string }).service).toBe("shop");
  });
});

describe.skipIf(!available)("ACME refusal", () => {
  let engine: TestEngine;
  let pebble: RunningPebble;
  beforeAll(async () => {
    // Pebble validates on a port where nothing listens: every challenge fails.
    ({ engine, pebble } = await startWithPebble(await freePort(), await freePort()));
  });
  afterAll(async () => {
    await engine?.close();
    await pebble?.stop();
  });

  test("a certificate the CA will not issue is a 422 acme_failed with the CA's reason, and nothing is stored", async () => {
    const response = await engine.json<{ detail: { msg: string; ctx: { code: string } }[] }>("POST", "/api/services/shop/domains", {
      body: { domain: "refused.example.com" },
    });
    // Every 422 has the contract's detail shape; the error's code travels in ctx.code (decision 148).
    expect(response.status).toBe(422);
    expect(response.body.detail[0]?.ctx.code).toBe("acme_failed");
    expect(response.body.detail[0]?.msg).toContain("refused.example.com");
    const status = (await engine.json<{ domains: { domain: string }[]; routes: { items: { host: string }[] } }>("GET", "/api/proxy/status"))
      .body;
    expect(status.domains.map((d) => d.domain)).not.toContain("refused.example.com");
    expect(status.routes.items.map((r) => r.host)).not.toContain("refused.example.com");
  });
});
