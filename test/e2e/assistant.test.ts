import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Client, type StoredOAuthTokens, StreamableHTTPClientTransport, UnauthorizedError } from "@modelcontextprotocol/client";
import type { Browser, Page } from "playwright-core";
import type { Diagnosis, ServiceRecord } from "../../src/contract/engine";
import { structured, toolError } from "../engine/mcp/harness";
import { startTestIdp, type TestIdp, testCertificates } from "../fixtures/cloud/idp";
import { MemoryOAuthProvider } from "../fixtures/cloud/oauth-client";
import { eventually, reapWorkloads, runCli, type SpawnedEngine, spawnEngine, tempDir } from "../helpers";
import { type Binaries, buildBinaries } from "./binaries";
import { Children, cloudListening, launchChromium, mintSession, type Running } from "./processes";

/**
 * THE assistant end to end (issue 14), with the compiled binaries: a `dist/engine` linked to a
 * `dist/engine-cloud`, its tunnel up, and the MCP SDK v2 client with its own OAuth provider as
 * an assistant. Each assistant finds the console's authorization server from the console's
 * /mcp (RFC 9728, then RFC 8414), identifies itself by a client ID metadata document served
 * over HTTPS from loopback or by dynamic registration, and is authorized with PKCE while a
 * person signs in and decides at the consent page in headless Chromium. Then it calls
 * `diagnose` on a crashed service of the engine, through the console's /mcp and the tunnel.
 * A read-only grant cannot stop a service, an operate grant can, a grant revoked on
 * /assistants stops working at the next call, an engine that stops is shown offline and the
 * next call says so; the assistant's tokens are nowhere in the engine's log or data.
 */

const SCREENSHOTS = join(import.meta.dir, "screenshots");
const STEP_MS = 15_000;
const EMAIL = "ada@example.com";

const children = new Children();
let binaries: Binaries;
let workDir: string;
let idp: TestIdp;
let cloudDir: string;
let cloud: Running;
let cloudUrl: string;
let mcpUrl: URL;
/** consoleSession is the person's console session, minted by the operator's CLI, for the console's API. */
let consoleSession = "";
let engineDir: string;
let engine: SpawnedEngine | undefined;
/** engineOutput is everything the engine printed; it outlives the process. */
let engineOutput = () => "";
let adminToken: string;
let nodeSlug: string;
let browser: Browser | undefined;
let page: Page;

/** documents is the HTTPS fixture that serves the first assistant's client ID metadata document. */
let documents: ReturnType<typeof Bun.serve>;
let documentFetches = 0;
/** callbacks is the assistants' redirect URI listener (plain http on loopback, as a desktop app's). */
let callbacks: ReturnType<typeof Bun.serve>;
const received: URL[] = [];

const shot = (name: string) => page.screenshot({ path: join(SCREENSHOTS, `assistant-${name}.png`), fullPage: true });

/**
 * Assistant is an OAuthClientProvider as an MCP host implements one: it keeps what the SDK
 * asks it to keep, and records each authorization URL it is asked to open and every token
 * it is given (to look for them in the engine's files afterwards).
 */
class Assistant extends MemoryOAuthProvider {
  /** secrets are every access and refresh token the assistant was given. */
  readonly secrets: string[] = [];
  /** requests are the assistant's HTTP requests (method, URL), in order. */
  readonly requests: string[] = [];
  #state = "";

  constructor(
    name: string,
    redirectUrl: string,
    readonly clientMetadataUrl?: string,
  ) {
    super(name, redirectUrl);
  }

  state() {
    this.#state = crypto.randomUUID();
    return this.#state;
  }
  get lastState() {
    return this.#state;
  }
  override saveTokens(tokens: StoredOAuthTokens) {
    super.saveTokens(tokens);
    this.secrets.push(tokens.access_token, ...(tokens.refresh_token ? [tokens.refresh_token] : []));
  }
  invalidateCredentials(scope: "all" | "client" | "tokens" | "verifier" | "discovery") {
    if (scope === "all" || scope === "tokens") this.saved = undefined;
    if (scope === "all" || scope === "client") this.information = undefined;
  }
  /** fetch is the transport's fetch: the network's own, recorded. */
  readonly fetch = (input: string | URL | Request, init?: RequestInit) => {
    const url = input instanceof Request ? input.url : String(input);
    this.requests.push(`${init?.method ?? (input instanceof Request ? input.method : "GET")} ${url}`);
    return fetch(input, init);
  };
}

/** Session is an assistant's SDK client connected (or trying to connect) to the console's /mcp. */
interface Session {
  client: Client;
  transport: StreamableHTTPClientTransport;
}

function session(assistant: Assistant, pinModern: boolean): Session {
  const client = new Client(
    { name: assistant.name, version: "1.0.0" },
    pinModern ? { versionNegotiation: { mode: { pin: "2026-07-28" } } } : {},
  );
  const transport = new StreamableHTTPClientTransport(mcpUrl, { authProvider: assistant, fetch: assistant.fetch });
  return { client, transport };
}

/** connected connects a fresh SDK client with the assistant's saved tokens. */
async function connected(assistant: Assistant, pinModern: boolean): Promise<Client> {
  const { client, transport } = session(assistant, pinModern);
  await client.connect(transport);
  return client;
}

/** Consent is what the person sees and does at the consent page: who asks, the access chosen, the screenshot's name. */
interface Consent {
  /** signIn: whether the browser has no session yet, so the console asks the person to sign in first. */
  signIn: boolean;
  client: string;
  access: "Read only" | "Operate";
  screenshot: string;
}

/**
 * decideInBrowser opens an authorization URL in Chromium, signs in when the console asks,
 * checks who the consent page names, picks the access, approves, and returns the callback
 * URL the browser was sent to.
 */
async function decideInBrowser(url: URL, expect_: Consent & { declaredName: string }): Promise<URL> {
  const before = received.length;
  await page.goto(url.href);
  // The authorization endpoint sends the browser to the consent page, which sends a signed-out person to sign in first.
  const signIn = page.getByRole("heading", { name: "Sign in to engine cloud" });
  await page
    .getByTestId("consent")
    .or(signIn)
    .waitFor()
    .catch(async (error: Error) => {
      // An error page of the authorization endpoint (an unknown client, an unreachable document) says why.
      throw new Error(`${error.message}\nat ${page.url()}: ${((await page.locator("body").textContent()) ?? "").slice(0, 500)}`);
    });
  expect(await signIn.isVisible()).toBe(expect_.signIn);
  if (expect_.signIn) {
    expect(page.url()).toStartWith(`${cloudUrl}/signin?return_to=%2Foauth%2Fauthorize%3Frid%3D`);
    await page.getByRole("button", { name: "Sign in", exact: true }).click();
    await page.waitForURL((at) => at.href.startsWith(`${idp.issuer}/interaction/`));
    await page.getByLabel("Email").fill(EMAIL);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.waitForURL(/\/oauth\/authorize\?rid=/);
  }
  const consent = page.getByTestId("consent");
  await consent.waitFor();
  expect(await page.getByTestId("consent-client").textContent()).toBe(expect_.client);
  expect(await page.getByTestId("consent-redirect").textContent()).toBe(new URL(url.searchParams.get("redirect_uri") ?? "").host);
  const text = (await consent.textContent()) ?? "";
  // The name it gives itself is shown only as unverified; a loopback callback is a local app, and the person is told so.
  expect(text).toContain(`It calls itself “${expect_.declaredName}”`);
  expect(await page.getByTestId("consent-local").isVisible()).toBe(true);
  expect(text).toContain(nodeSlug);
  await page.getByLabel(expect_.access).check();
  await shot(expect_.screenshot);
  await page.getByRole("button", { name: "Approve" }).click();
  await eventually(() => received.length > before, { timeoutMs: STEP_MS });
  // The listener answers before the browser has committed the navigation: let it finish, or the next goto is interrupted.
  const redirectUri = url.searchParams.get("redirect_uri") ?? "";
  await page.waitForURL((at) => at.href.startsWith(redirectUri));
  return received[before] as URL;
}

/**
 * authorize runs the SDK's flow for an assistant that has no tokens: the first request is
 * refused (401), the SDK discovers, identifies the client and hands over an authorization
 * URL; the person decides in the browser; `finishAuth` exchanges the code.
 */
async function authorize(assistant: Assistant, pinModern: boolean, consent: Consent): Promise<URL> {
  const { client: sdk, transport } = session(assistant, pinModern);
  await expect(sdk.connect(transport)).rejects.toBeInstanceOf(UnauthorizedError);
  const url = assistant.authorizations.at(-1) as URL;
  expect(`${url.origin}${url.pathname}`).toBe(`${cloudUrl}/oauth/authorize`);
  expect(url.searchParams.get("code_challenge_method")).toBe("S256");
  expect(url.searchParams.get("resource")).toBe(mcpUrl.href);
  expect(url.searchParams.get("scope")).toBe("engine:read engine:operate");
  const back = await decideInBrowser(url, { ...consent, declaredName: assistant.name });
  expect(back.searchParams.get("state")).toBe(assistant.lastState);
  expect(back.searchParams.get("iss")).toBe(cloudUrl);
  await transport.finishAuth(back.searchParams);
  await sdk.close().catch(() => undefined);
  return back;
}

async function api(method: string, path: string, body?: unknown) {
  const response = await fetch(`${cloudUrl}${path}`, {
    method,
    headers: { authorization: `Bearer ${consoleSession}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  // biome-ignore lint/suspicious/noExplicitAny: a test reads whichever fields it asserts on.
  return { status: response.status, body: (await response.json().catch(() => null)) as any };
}

async function engineApi<T>(method: string, path: string, body?: unknown): Promise<{ status: number; body: T }> {
  if (!engine) throw new Error("the engine is not running");
  const response = await fetch(`${engine.url}${path}`, {
    method,
    headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: response.status, body: (await response.json()) as T };
}

const serviceStatus = async (name: string) => (await engineApi<ServiceRecord>("GET", `/api/services/${name}`)).body.status;

/** filesUnder lists the regular files under a directory, recursively. */
function filesUnder(dir: string): string[] {
  const out: string[] = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) out.push(...filesUnder(path));
    else if (entry.isFile()) out.push(path);
  }
  return out;
}

/** cimd identifies itself by its metadata document; dcr registers dynamically. */
let cimd: Assistant;
let dcr: Assistant;

beforeAll(async () => {
  mkdirSync(SCREENSHOTS, { recursive: true });
  workDir = tempDir("engine-e2e-assistant-");
  [binaries, idp] = await Promise.all([buildBinaries(), startTestIdp({ tls: false })]);

  // The first assistant's client ID metadata document, over HTTPS from a private test CA.
  const tls = testCertificates();
  const caFile = join(workDir, "cimd-ca.pem");
  writeFileSync(caFile, tls.caPem);
  documents = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    tls: { cert: tls.certPem, key: tls.keyPem },
    fetch(request) {
      if (new URL(request.url).pathname !== "/assistant/client-metadata.json") return new Response("not found", { status: 404 });
      documentFetches += 1;
      return Response.json(
        {
          client_id: cimdUrl(),
          client_name: "Claude (CIMD)",
          client_uri: `https://127.0.0.1:${documents.port}/`,
          redirect_uris: [`http://127.0.0.1:${callbacks.port}/cimd/callback`],
          grant_types: ["authorization_code", "refresh_token"],
          response_types: ["code"],
          token_endpoint_auth_method: "none",
        },
        { headers: { "cache-control": "max-age=300" } },
      );
    },
  });
  callbacks = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    fetch(request) {
      received.push(new URL(request.url));
      return new Response("You can close this window.");
    },
  });
  cimd = new Assistant("Claude (CIMD)", `http://127.0.0.1:${callbacks.port}/cimd/callback`, cimdUrl());
  dcr = new Assistant("Cursor (DCR)", `http://127.0.0.1:${callbacks.port}/dcr/callback`);

  cloudDir = join(workDir, "cloud");
  // The operator makes the account with the remote-link entitlement; the person's first
  // sign-in (at the first consent) adopts it by its verified email.
  const added = await runCli(["--data-dir", cloudDir, "accounts", "add", EMAIL, "--remote-link", "on"], {}, [binaries.cloud]);
  expect(added.code).toBe(0);
  cloud = children.start([binaries.cloud, "--data-dir", cloudDir, "serve", "--port", "0", "--log-level", "info"], {
    ENGINE_CLOUD_OIDC_ISSUER: idp.issuer,
    ENGINE_CLOUD_OIDC_CLIENT_ID: idp.clientId,
    ENGINE_CLOUD_OIDC_CLIENT_SECRET: idp.clientSecret,
    ENGINE_CLOUD_CIMD_ALLOW_LOOPBACK: "1",
    // The console is a Bun program: Bun trusts the CAs in this file as Node does.
    NODE_EXTRA_CA_CERTS: caFile,
  });
  cloudUrl = await cloudListening(cloud);
  mcpUrl = new URL(`${cloudUrl}/mcp`);
  consoleSession = await mintSession(binaries.cloud, cloudDir, "--email", EMAIL);

  // The machine: linked with a pre-authorized key, then served; its tunnel connects.
  engineDir = join(workDir, "engine");
  const key = await api("POST", "/api/preauth-keys", { max_uses: 1 });
  expect(key.status).toBe(201);
  const linked = await runCli(["--data-dir", engineDir, "link", "--cloud", cloudUrl, "--key", key.body.key], {}, [binaries.engine]);
  expect(linked.code).toBe(0);
  engine = await spawnEngine(engineDir, { command: [binaries.engine], env: { ENGINE_SHIM: "" } });
  engineOutput = engine.output;
  adminToken = readFileSync(join(engineDir, "admin.token"), "utf8").trim();
  const status = await eventually(
    async () => {
      const shown = await runCli(["--data-dir", engineDir, "link", "status", "--json"], {}, [binaries.engine]);
      const value = JSON.parse(shown.stdout) as { slug: string; tunnel: { state: string } };
      return value.tunnel.state === "connected" ? value : null;
    },
    { timeoutMs: 30_000 },
  );
  nodeSlug = status.slug;

  // A service that crashes (so a diagnosis has a cause) and one that runs (to be stopped).
  const crasher = await engineApi("POST", "/api/services", {
    name: "crasher",
    command: "echo about to fail: cannot open model.bin >&2; exit 1",
    kind: "batch",
  });
  expect(crasher.status).toBe(201);
  const sleeper = await engineApi("POST", "/api/services", { name: "sleeper", command: "exec sleep 300" });
  expect(sleeper.status).toBe(201);
  await eventually(async () => (await serviceStatus("crasher")) === "failed" && (await serviceStatus("sleeper")) === "running", {
    timeoutMs: 30_000,
  });

  browser = await launchChromium();
  page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
  page.setDefaultTimeout(STEP_MS);
}, 300_000);

function cimdUrl(): string {
  return `https://127.0.0.1:${documents.port}/assistant/client-metadata.json`;
}

afterAll(async () => {
  await browser?.close();
  await engine?.stop();
  await children.stopAll();
  if (engineDir) reapWorkloads(engineDir);
  documents?.stop(true);
  callbacks?.stop(true);
  await idp?.close();
  if (workDir) rmSync(workDir, { recursive: true, force: true });
});

describe("an assistant (the MCP SDK v2 client and its OAuth provider) reaches a linked engine through the console", () => {
  test("identified by its metadata document: discovery, sign-in and a read-only consent in the browser, then diagnose through the relay", async () => {
    await authorize(cimd, true, { signIn: true, client: `127.0.0.1:${documents.port}`, access: "Read only", screenshot: "consent-cimd" });
    // Discovery as the SDK does it: the resource's metadata (named by the 401's challenge), then the authorization server's.
    const paths = cimd.requests.map((line) => line.replace(cloudUrl, ""));
    const resourceMetadata = paths.indexOf("GET /.well-known/oauth-protected-resource/mcp");
    const serverMetadata = paths.indexOf("GET /.well-known/oauth-authorization-server");
    expect(resourceMetadata).toBeGreaterThanOrEqual(0);
    expect(serverMetadata).toBeGreaterThan(resourceMetadata);
    // The client id is the document's URL: nothing was registered, and the console fetched the document.
    expect(paths).not.toContain("POST /oauth/register");
    expect(cimd.information?.client_id).toBe(cimdUrl());
    expect(documentFetches).toBeGreaterThan(0);
    expect(paths).toContain("POST /oauth/token");
    expect(cimd.saved?.scope).toBe("engine:read");

    const client = await connected(cimd, true);
    try {
      const diagnosed = structured<{ cause: string; service: string; diagnosis: Diagnosis }>(
        await client.callTool({ name: "diagnose", arguments: { service: "crasher", node: nodeSlug } }),
      );
      expect(diagnosed.service).toBe("crasher");
      expect(diagnosed.cause).toStartWith("file_not_found: it could not open a file: model.bin");
      expect(diagnosed.diagnosis.status).toBe("failed");
    } finally {
      await client.close();
    }
  }, 120_000);

  test("a read-only grant cannot stop a service: refused with insufficient_scope, the SDK asks for more, the service runs on", async () => {
    const client = await connected(cimd, true);
    const asked = cimd.authorizations.length;
    try {
      await expect(client.callTool({ name: "stop_service", arguments: { service: "sleeper", node: nodeSlug } })).rejects.toBeInstanceOf(
        UnauthorizedError,
      );
    } finally {
      await client.close().catch(() => undefined);
    }
    // The console answered 403 insufficient_scope: the SDK's step-up asked the person for operate.
    expect(cimd.authorizations.length).toBe(asked + 1);
    expect(cimd.authorizations.at(-1)?.searchParams.get("scope")).toBe("engine:read engine:operate");
    // A raw call with the same token says why.
    const raw = await fetch(mcpUrl, {
      method: "POST",
      headers: {
        authorization: `Bearer ${cimd.saved?.access_token}`,
        "content-type": "application/json",
        accept: "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "stop_service",
      },
      body: JSON.stringify({
        jsonrpc: "2.0",
        id: 1,
        method: "tools/call",
        params: {
          name: "stop_service",
          arguments: { service: "sleeper", node: nodeSlug },
          _meta: {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": { name: "raw", version: "1" },
            "io.modelcontextprotocol/clientCapabilities": {},
          },
        },
      }),
    });
    expect(raw.status).toBe(403);
    expect(raw.headers.get("www-authenticate")).toStartWith('Bearer error="insufficient_scope"');
    expect(await serviceStatus("sleeper")).toBe("running");
    // Still good for reading.
    const again = await connected(cimd, true);
    try {
      structured(await again.callTool({ name: "list_services", arguments: { node: nodeSlug } }));
    } finally {
      await again.close();
    }
  }, 60_000);

  test("registered dynamically, granted operate: it stops the service", async () => {
    await authorize(dcr, false, { signIn: false, client: `127.0.0.1:${callbacks.port}`, access: "Operate", screenshot: "consent-dcr" });
    expect(dcr.requests.some((line) => line === `POST ${cloudUrl}/oauth/register`)).toBe(true);
    expect(dcr.information?.client_id).toMatch(/^dcr_/);
    expect(dcr.saved?.scope).toBe("engine:read engine:operate");
    const client = await connected(dcr, false);
    try {
      const diagnosed = structured<{ cause: string }>(
        await client.callTool({ name: "diagnose", arguments: { service: "crasher", node: nodeSlug } }),
      );
      expect(diagnosed.cause).toStartWith("file_not_found");
      structured(await client.callTool({ name: "stop_service", arguments: { service: "sleeper", node: nodeSlug } }));
    } finally {
      await client.close();
    }
    expect(await serviceStatus("sleeper")).toBe("stopped");
  }, 120_000);

  test("a grant revoked on /assistants stops working at the next call", async () => {
    const client = await connected(dcr, false);
    try {
      structured(await client.callTool({ name: "list_services", arguments: { node: nodeSlug } }));
      await page.goto(`${cloudUrl}/assistants`);
      const rows = page.getByTestId("grants").locator("tbody tr");
      await rows.first().waitFor();
      expect(await rows.count()).toBe(2);
      const row = rows.filter({ hasText: "operate" });
      await shot("assistants");
      const revokedToken = dcr.saved?.access_token as string;
      await row.getByRole("button", { name: "Revoke" }).click();
      await row
        .getByTestId("grant-state")
        .getByText(/revoked/)
        .waitFor();
      // The next call: the token is refused, the refresh token too, and the SDK asks the person again.
      const asked = dcr.authorizations.length;
      await expect(client.callTool({ name: "list_services", arguments: { node: nodeSlug } })).rejects.toThrow();
      expect(dcr.authorizations.length).toBe(asked + 1);
      const raw = await fetch(mcpUrl, {
        method: "POST",
        headers: { authorization: `Bearer ${revokedToken}`, "content-type": "application/json" },
        body: "{}",
      });
      expect(raw.status).toBe(401);
      expect(raw.headers.get("www-authenticate")).toContain('error="invalid_token"');
    } finally {
      await client.close().catch(() => undefined);
    }
    // The other assistant's grant is untouched.
    const other = await connected(cimd, true);
    try {
      structured(await other.callTool({ name: "list_services", arguments: { node: nodeSlug } }));
    } finally {
      await other.close();
    }
  }, 60_000);

  test("an engine that drops its link is shown offline in the node list, and the next call says so", async () => {
    await (engine as SpawnedEngine).stop();
    engine = undefined;
    const row = await eventually(
      async () => {
        const listed = await api("GET", "/api/nodes");
        return (listed.body.nodes as { slug: string; online: boolean; last_seen_at: string | null }[]).find(
          (node) => node.slug === nodeSlug && !node.online,
        );
      },
      { timeoutMs: 30_000 },
    );
    expect(row.last_seen_at).not.toBeNull();
    await page.goto(`${cloudUrl}/nodes`);
    await page
      .getByTestId("node-status")
      .getByText(/^offline since /)
      .waitFor();
    await shot("nodes-offline");

    const client = await connected(cimd, true);
    try {
      const offline = toolError(await client.callTool({ name: "diagnose", arguments: { service: "crasher", node: nodeSlug } }));
      expect(offline.error?.code).toBe("machine_offline");
      expect(offline.error?.message).toBe(`machine ${nodeSlug} is offline since ${row.last_seen_at}`);
    } finally {
      await client.close();
    }
  }, 60_000);

  test("the assistants' tokens never reach the engine: not in its log, its output or its data directory", () => {
    const secrets = [...cimd.secrets, ...dcr.secrets];
    expect(secrets.length).toBeGreaterThanOrEqual(4);
    const files = filesUnder(engineDir);
    expect(files.some((file) => file.endsWith("engine.log"))).toBe(true);
    const leaks: string[] = [];
    for (const file of files) {
      if (statSync(file).size > 64 * 1024 * 1024) continue;
      const content = readFileSync(file);
      for (const secret of secrets) if (content.includes(secret)) leaks.push(`${file} holds ${secret.slice(0, 8)}…`);
    }
    for (const secret of secrets) if (engineOutput().includes(secret)) leaks.push(`the engine's output holds ${secret.slice(0, 8)}…`);
    expect(leaks).toEqual([]);
    // The console keeps only digests: not in its output or its database either.
    for (const file of filesUnder(cloudDir)) {
      const content = readFileSync(file);
      for (const secret of secrets) if (content.includes(secret)) leaks.push(`${file} holds ${secret.slice(0, 8)}…`);
    }
    const output = cloud.stdout() + cloud.stderr();
    for (const secret of secrets) if (output.includes(secret)) leaks.push(`the console's output holds ${secret.slice(0, 8)}…`);
    expect(leaks).toEqual([]);
  });
});
