import { afterAll, beforeAll, expect, test } from "bun:test";
import { readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { type Baseline, CONFORMANCE_ALPHA_CLI, judgeRun, readResults, runSuite, suiteName } from "../../conformance";
import { freePort, tempDir } from "../../helpers";
import { describeEachDialect, startTestCloud, type TestCloud } from "../helpers";
import { type AssistantDriver, assistantDriver, type DocumentServer, ridOf, startDocumentServer } from "./helpers";

/**
 * The MCP conformance suite's authorization-server scenarios against the console's
 * authorization server. The pinned release (0.1.x) has none: its `auth/*` scenarios are client
 * scenarios, which start the suite's own authorization and MCP servers and judge the OAuth
 * client it runs. The 0.2.0 alpha (pinned beside it under the alias `mcp-conformance-alpha`) adds
 * the `authorization` command: `authorization-server-metadata-endpoint` reads the RFC 8414
 * document at the issuer, `authorization-code-grant` runs a PKCE authorization with the
 * `resource` parameter, prints the URL a person would open, waits for the redirect on its own
 * loopback callback, and exchanges the code. Here the test is the person: it opens the URL as a
 * browser would (the console redirects to its consent page), approves through the decision
 * route the consent page posts to, and follows the redirect to the suite's callback. It runs for
 * a dynamically registered client and for a client metadata document (served on loopback,
 * admitted by ENGINE_CLOUD_CIMD_ALLOW_LOOPBACK's setting). Each check is compared with
 * conformance-baseline.json beside this file. Decision 283.
 */

const BASELINE_FILE = join(import.meta.dir, "conformance-baseline.json");

describeEachDialect("the MCP conformance suite's authorization scenarios", (dialect) => {
  let cloud: TestCloud;
  let driver: AssistantDriver;
  let session: string;
  let documents: DocumentServer;
  const outputDirs: string[] = [];

  beforeAll(async () => {
    cloud = await startTestCloud(dialect, { cimdAllowLoopback: true });
    driver = assistantDriver(cloud);
    session = (await cloud.signIn("conformance@example.com", { remoteLink: true })).token;
    documents = startDocumentServer();
  });

  afterAll(async () => {
    documents?.close();
    await cloud?.close();
    for (const dir of outputDirs) rmSync(dir, { recursive: true, force: true });
  });

  /**
   * consentTo plays the person at the URL the suite printed: the authorization request answers
   * a redirect to the consent page, the decision approves it, and its redirect is followed to
   * the suite's callback.
   */
  async function consentTo(authorizationUrl: string): Promise<void> {
    const response = await fetch(authorizationUrl, { redirect: "manual" });
    const text = await response.text();
    const rid = ridOf({ status: response.status, location: response.headers.get("location"), text, headers: response.headers, json: null });
    const decided = await cloud.api("POST", "/api/oauth/authorize/decision", { token: session, body: { rid, approve: true } });
    expect(decided.status).toBe(200);
    const callback = await fetch(decided.body.redirect_to as string);
    expect(callback.status).toBe(200);
    await callback.body?.cancel();
  }

  test.each([
    ["a dynamically registered client", "dcr"],
    ["a client metadata document", "cimd"],
  ] as const)(
    "every scenario answers what the baseline records, for %s",
    async (_name, kind) => {
      const baseline = JSON.parse(readFileSync(BASELINE_FILE, "utf8")) as Baseline;
      expect(baseline.suite).toBe(suiteName(CONFORMANCE_ALPHA_CLI));
      const port = await freePort();
      const redirectUri = `http://127.0.0.1:${port}/callback`;
      let clientId: string;
      if (kind === "dcr") {
        const registered = await driver.registerClient({
          client_name: "MCP conformance suite",
          redirect_uris: [redirectUri],
          token_endpoint_auth_method: "none",
        });
        expect(registered.status).toBe(201);
        clientId = registered.json.client_id as string;
      } else {
        clientId = documents.url(`/conformance/${port}/client.json`);
        documents.serve(`/conformance/${port}/client.json`, {
          client_id: clientId,
          client_name: "MCP conformance suite",
          redirect_uris: [redirectUri],
          grant_types: ["authorization_code", "refresh_token"],
          response_types: ["code"],
          token_endpoint_auth_method: "none",
        });
      }

      const outputDir = tempDir("cloud-oauth-conformance-");
      outputDirs.push(outputDir);
      const issuer = cloud.deps.site.publicUrl;
      let consented: Promise<void> | undefined;
      let consentFailed: unknown;
      const run = runSuite(
        CONFORMANCE_ALPHA_CLI,
        [
          "authorization",
          "--url",
          issuer,
          "--client-id",
          clientId,
          "--resource",
          driver.mcpUrl,
          "--port",
          String(port),
          "--output-dir",
          outputDir,
        ],
        outputDir,
        (line) => {
          if (!line.startsWith(`${issuer}/oauth/authorize?`)) return;
          consented ??= consentTo(line).catch((error) => {
            consentFailed = error;
          });
        },
      );
      // A consent that failed leaves the suite waiting for its callback: say why, not that it timed out.
      await run.catch((error) => {
        throw consentFailed ?? error;
      });
      await consented;
      if (consentFailed) throw consentFailed;
      expect(consented).toBeDefined();
      // The console read the client's metadata document to know it (a registered client has none).
      if (kind === "cimd") expect(documents.hits(`/conformance/${port}/client.json`)).toBeGreaterThan(0);
      expect(judgeRun(baseline, "test/cloud/oauth/conformance-baseline.json", readResults(outputDir, "authorization-server"))).toEqual([]);
    },
    150_000,
  );
});
