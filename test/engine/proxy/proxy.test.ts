import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { X509Certificate } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import {
  curlVerified,
  eventually,
  freePort,
  REPO_ROOT,
  startTestEngine,
  type TestEngine,
  waitProxied,
  workloadBun,
  workloadPath,
} from "../../helpers";

const UPSTREAM = join(REPO_ROOT, "test", "fixtures", "proxy", "upstream.ts");

let engine: TestEngine;
let httpsPort = 0;
let httpPort = 0;
let rootPem = "";
let rootFile = "";

async function deployUpstream(name: string, extra: Record<string, unknown> = {}): Promise<number> {
  const port = await freePort();
  const { status } = await engine.json("POST", "/api/services", {
    body: { name, port, command: [workloadBun(), workloadPath(UPSTREAM)], env: { SERVICE_NAME: name }, ...extra },
  });
  expect(status).toBe(201);
  return port;
}

async function waitRouted(host: string, state = "up"): Promise<void> {
  await eventually(async () => {
    const status = (await engine.json<{ routes: { items: { host: string; state: string }[] } }>("GET", "/api/proxy/status")).body;
    return status.routes.items.some((route) => route.host === host && route.state === state);
  });
}

/** curl fetches `https://host:<proxy port>/path`, trusting only the engine's root (SNI = host). */
function curl(host: string, path = "/", extra: string[] = []) {
  return curlVerified(host, httpsPort, rootFile, path, extra);
}

/** servedCertificate reads the certificate the proxy presents for `serverName`. */
async function servedCertificate(serverName: string): Promise<X509Certificate> {
  const proc = Bun.spawn(["openssl", "s_client", "-connect", `127.0.0.1:${httpsPort}`, "-servername", serverName], {
    stdin: "ignore",
    stdout: "pipe",
    stderr: "ignore",
  });
  const text = await new Response(proc.stdout).text();
  const pem = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/.exec(text)?.[0];
  if (!pem) throw new Error(`no certificate for ${serverName}`);
  return new X509Certificate(pem);
}

beforeAll(async () => {
  engine = await startTestEngine({ proxy: true, httpsPort: 0, httpPort: 0, proxyProcesses: 2, mdns: "off", hostname: "box" });
  const status = (await engine.json<{ https_port: number; tls: { http_port: number } }>("GET", "/api/proxy/status")).body;
  httpsPort = status.https_port;
  httpPort = status.tls.http_port;
  rootFile = join(engine.dataDir, "pki", "root.crt");
  rootPem = readFileSync(rootFile, "utf8");
  await deployUpstream("web");
  await deployUpstream("api");
  await waitRouted("web.localhost");
  await waitRouted("api-box.local");
  await waitProxied(httpPort, "web.localhost", "web");
  await waitProxied(httpPort, "api.localhost", "api");
});
afterAll(() => engine.close());

describe("routing over HTTPS with the local CA", () => {
  test("two names, each with its own certificate by SNI, verified against the engine's root", async () => {
    const web = await eventually(async () => {
      const result = await curl("web-box.local", "/hello?x=1");
      return result.code === 0 ? result : null;
    });
    const echoed = JSON.parse(web.out) as { service: string; path: string; headers: Record<string, string> };
    expect(echoed.service).toBe("web");
    expect(echoed.path).toBe("/hello?x=1");
    expect(echoed.headers["x-forwarded-proto"]).toBe("https");
    expect(echoed.headers["x-forwarded-host"]).toBe(`web-box.local:${httpsPort}`);
    expect(echoed.headers["x-forwarded-for"]).toContain("127.0.0.1");
    const api = await curl("api.localhost", "/");
    expect(api.code).toBe(0);
    expect((JSON.parse(api.out) as { service: string }).service).toBe("api");
    const webCert = await servedCertificate("web-box.local");
    const apiCert = await servedCertificate("api.localhost");
    expect(webCert.subjectAltName).toBe("DNS:web-box.local");
    expect(apiCert.subjectAltName).toBe("DNS:api.localhost");
    expect(webCert.issuer).toContain("engine Local Intermediate CA");
  });

  test("a client that trusts another root is refused", async () => {
    const result = await curlVerified("web.localhost", httpsPort, "/etc/ssl/certs/ca-certificates.crt");
    expect(result.code).toBe(60);
  });

  test("plain HTTP redirects to HTTPS with a 308, but .localhost names are served on both", async () => {
    const redirect = await fetch(`http://127.0.0.1:${httpPort}/a/b?c=1`, { headers: { host: "web-box.local" }, redirect: "manual" });
    expect(redirect.status).toBe(308);
    expect(redirect.headers.get("location")).toBe(`https://web-box.local:${httpsPort}/a/b?c=1`);
    const local = await fetch(`http://127.0.0.1:${httpPort}/x`, { headers: { host: "web.localhost" } });
    expect(local.status).toBe(200);
    expect(((await local.json()) as { headers: Record<string, string> }).headers["x-forwarded-proto"]).toBe("http");
  });

  test("an unknown name is a 404 page from the proxy", async () => {
    const response = await fetch(`http://127.0.0.1:${httpPort}/`, { headers: { host: "nobody.localhost", accept: "text/html" } });
    expect(response.status).toBe(404);
    expect(await response.text()).toContain("No service");
  });

  test("a websocket echoes through the proxy, over TLS", async () => {
    const ws = new WebSocket(`wss://127.0.0.1:${httpsPort}/ws`, {
      headers: { host: "web.localhost" },
      tls: { rejectUnauthorized: false },
    } as never);
    const received: string[] = [];
    ws.onmessage = (event) => received.push(String(event.data));
    await eventually(() => ws.readyState === WebSocket.OPEN);
    ws.send("hello");
    ws.send("again");
    await eventually(() => received.length === 2);
    expect(received).toEqual(["echo:hello", "echo:again"]);
    ws.close();
  });

  test("server-sent events arrive one by one, not buffered until the end", async () => {
    const started = Date.now();
    const response = await fetch(`http://127.0.0.1:${httpPort}/sse?count=4&gap_ms=300`, { headers: { host: "web.localhost" } });
    expect(response.headers.get("content-type")).toStartWith("text/event-stream");
    const reader = (response.body as ReadableStream<Uint8Array>).getReader();
    const arrivals: number[] = [];
    let text = "";
    for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) {
      const piece = new TextDecoder().decode(chunk.value);
      text += piece;
      for (let i = 0; i < (piece.match(/data:/g) ?? []).length; i++) arrivals.push(Date.now() - started);
    }
    expect(arrivals.length).toBe(4);
    // The first event arrives long before the stream ends (3 gaps of 300 ms).
    expect((arrivals[3] ?? 0) - (arrivals[0] ?? 0)).toBeGreaterThan(600);
    expect(text).toContain("data: 3");
  });

  test("request bodies pass through", async () => {
    const response = await fetch(`http://127.0.0.1:${httpPort}/post`, {
      method: "POST",
      headers: { host: "web.localhost", "content-type": "text/plain" },
      body: "x".repeat(1000),
    });
    expect(response.status).toBe(200);
    expect(((await response.json()) as { method: string }).method).toBe("POST");
  });
});

describe("routes follow the service's state", () => {
  test("503 with Retry-After while a service waits to start, 502 once it is stopped", async () => {
    await deployUpstream("waiting", { bindings: ["not-deployed-yet"] });
    await waitRouted("waiting.localhost", "starting");
    const starting = await fetch(`http://127.0.0.1:${httpPort}/`, { headers: { host: "waiting.localhost" } });
    expect(starting.status).toBe(503);
    expect(Number(starting.headers.get("retry-after"))).toBeGreaterThan(0);
    expect(await starting.text()).toContain("waiting");
    expect((await engine.json("POST", "/api/services/waiting/stop")).status).toBe(200);
    await waitRouted("waiting.localhost", "down");
    const down = await fetch(`http://127.0.0.1:${httpPort}/`, { headers: { host: "waiting.localhost" } });
    expect(down.status).toBe(502);
    expect((await engine.json("DELETE", "/api/services/waiting")).status).toBe(200);
    await eventually(async () => {
      const response = await fetch(`http://127.0.0.1:${httpPort}/`, { headers: { host: "waiting.localhost" } });
      return response.status === 404;
    });
  });
});

describe("domains", () => {
  test("add routes a private name with a local-CA certificate; remove takes it away; removing again is removed:false", async () => {
    const added = await engine.json<{ domain: string; kind: string; certificate: { issuer: string } }>(
      "POST",
      "/api/services/web/domains",
      { body: { domain: "Shop.Internal" } },
    );
    expect(added.status).toBe(201);
    expect(added.body.domain).toBe("shop.internal");
    expect(added.body.kind).toBe("private");
    expect(added.body.certificate.issuer).toContain("engine Local Intermediate CA");
    const served = await eventually(async () => {
      const result = await curl("shop.internal", "/d");
      return result.code === 0 ? result : null;
    });
    expect((JSON.parse(served.out) as { service: string }).service).toBe("web");
    const listed = (await engine.json<{ domains: { domain: string; source: string; service: string }[] }>("GET", "/api/proxy/status")).body;
    expect(listed.domains).toContainEqual(expect.objectContaining({ domain: "shop.internal", source: "user", service: "web" }));

    const removed = await engine.json("DELETE", "/api/services/web/domains/shop.internal");
    expect(removed.status).toBe(200);
    expect(removed.body).toEqual({ service_name: "web", domain: "shop.internal", removed: true });
    await eventually(async () => {
      const response = await fetch(`http://127.0.0.1:${httpPort}/`, { headers: { host: "shop.internal" }, redirect: "manual" });
      return response.status === 308;
    });
    // Its certificate went with it: a verifying client cannot even complete the handshake.
    expect((await curl("shop.internal")).code).not.toBe(0);
    const again = await engine.json("DELETE", "/api/services/web/domains/shop.internal");
    expect(again.status).toBe(200);
    expect(again.body).toEqual({ service_name: "web", domain: "shop.internal", removed: false });
  });

  test("a path prefix routes only that part of a name", async () => {
    expect(
      (await engine.json("POST", "/api/services/api/domains", { body: { domain: "site.internal", path_prefix: "/api" } })).status,
    ).toBe(201);
    expect((await engine.json("POST", "/api/services/web/domains", { body: { domain: "site.internal" } })).status).toBe(409);
    const apiPart = await eventually(async () => {
      const result = await curl("site.internal", "/api/v1");
      return result.code === 0 && result.out.startsWith("{") ? result : null;
    });
    expect((JSON.parse(apiPart.out) as { service: string }).service).toBe("api");
    expect((await curl("site.internal", "/apix")).out).toContain("No service");
    expect((await engine.json("DELETE", "/api/services/api/domains/site.internal")).body).toMatchObject({ removed: true });
  });

  test.each([
    ["not a domain", "bad name", 422, "invalid_domain"],
    ["a wildcard", "*.example.com", 422, "invalid_domain"],
    ["a multi-label .local name", "a.b.local", 422, "invalid_domain"],
    ["an IP address", "10.0.0.1", 422, "invalid_domain"],
    ["another service's default name", "api.localhost", 409, "domain_in_use"],
    ["the engine's own name", "box.local", 409, "domain_in_use"],
  ])("refuses %s with %i, and stores nothing", async (_what, domain, status, code) => {
    const before = (await engine.json<{ domains: unknown[] }>("GET", "/api/proxy/status")).body.domains.length;
    const response = await engine.json<{ error?: { code: string }; detail?: unknown }>("POST", "/api/services/web/domains", {
      body: { domain },
    });
    expect(response.status).toBe(status);
    if (response.body.error) expect(response.body.error.code).toBe(code);
    expect((await engine.json<{ domains: unknown[] }>("GET", "/api/proxy/status")).body.domains.length).toBe(before);
  });

  test("a domain for a service without a port is refused with no_port", async () => {
    expect((await engine.json("POST", "/api/services", { body: { name: "portless", command: ["sleep", "300"] } })).status).toBe(201);
    const response = await engine.json<{ error: { code: string } }>("POST", "/api/services/portless/domains", {
      body: { domain: "p.internal" },
    });
    expect(response.status).toBe(409);
    expect(response.body.error.code).toBe("no_port");
    expect((await engine.json("POST", "/api/services/nobody/domains", { body: { domain: "p.internal" } })).status).toBe(404);
  });
});

describe("certificate renewal", () => {
  test("at 2/3 of their life leaves are renewed; a stream on a kept-alive connection goes on, new connections get the new certificate", async () => {
    const before = await servedCertificate("web.localhost");
    // A long stream over HTTPS holds its connection across the renewal.
    const response = await fetch(`https://127.0.0.1:${httpsPort}/sse?count=8&gap_ms=250`, {
      headers: { host: "web.localhost" },
      tls: { ca: rootPem, rejectUnauthorized: false },
    } as RequestInit);
    const reader = (response.body as ReadableStream<Uint8Array>).getReader();
    let events = 0;
    const first = await reader.read();
    events += (new TextDecoder().decode(first.value).match(/data:/g) ?? []).length;

    engine.clock.advance(5 * 24 * 3600_000); // 5 of 7 days: past 2/3
    await engine.daemon.proxy.renewNow();
    const after = await eventually(async () => {
      const current = await servedCertificate("web.localhost");
      return current.serialNumber !== before.serialNumber ? current : null;
    });
    expect(new Date(after.validTo).getTime()).toBeGreaterThan(new Date(before.validTo).getTime());
    const status = (await engine.json<{ tls: { last_renewal: { names: string[] } } }>("GET", "/api/proxy/status")).body;
    expect(status.tls.last_renewal.names).toContain("web.localhost");

    for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) {
      events += (new TextDecoder().decode(chunk.value).match(/data:/g) ?? []).length;
    }
    expect(events).toBe(8);
  });
});
