import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import type { Server } from "bun";
import { approvalRoutes } from "../../../src/cloud/approvals";
import { linkRoutes } from "../../../src/cloud/link";
import {
  abortableSleep,
  CloudLinkClient,
  type DeviceLinkResponse,
  LinkError,
  normalizeCloudUrl,
  type PollEvent,
  type ReportedMachine,
  reportedMachine,
} from "../../../src/engine/link";
import { VERSION } from "../../../src/lib/version";
import { startTestCloud, type TestCloud } from "../../cloud/helpers";
import { freePort } from "../../helpers";

const machine: ReportedMachine = { hostname: "gpu-box", os: "linux 6.1.0 x64", version: VERSION };
const CLAIM = {
  node_id: "node_1",
  slug: "gpu-box",
  account_id: "acct_1",
  node_credential: "nc_secret",
  cloud_url: "https://cloud.example",
  hosted_base_domain: "hosted.example",
};

/** scripted starts a server that answers each request with the next scripted answer (the last one repeats). */
function scripted(answers: (() => Response | Promise<Response>)[]): { server: Server<undefined>; url: string; requests: string[] } {
  const requests: string[] = [];
  const server = Bun.serve({
    port: 0,
    async fetch(request) {
      requests.push(`${request.method} ${new URL(request.url).pathname} ${await request.text()}`);
      const next = answers.length > 1 ? answers.shift() : answers[0];
      return (next as () => Response | Promise<Response>)();
    },
  });
  return { server, url: `http://127.0.0.1:${server.port}`, requests };
}

const json =
  (status: number, body: unknown, headers: Record<string, string> = {}) =>
  () =>
    Response.json(body, { status, headers });
const envelope = (status: number, code: string, extra: Record<string, unknown> = {}, headers: Record<string, string> = {}) =>
  json(status, { error: { code, message: `cloud says ${code}`, request_id: "req_1", ...extra } }, headers);
const pending = (interval: number) => json(202, { status: "authorization_pending", interval, expires_in: 100 });

/** fakeTime is a clock and a sleep that only record: a poll loop runs in no real time. */
function fakeTime() {
  let now = 1_000_000;
  const waits: number[] = [];
  return {
    waits,
    now: () => now,
    sleep: async (ms: number, signal?: AbortSignal) => {
      if (signal?.aborted) throw new LinkError("cancelled", "cancelled");
      waits.push(ms);
      now += ms;
    },
  };
}

const device = (overrides: Partial<DeviceLinkResponse> = {}): DeviceLinkResponse => ({
  device_code: "dc_1",
  user_code: "BCDF-GHJK",
  verification_uri: "https://cloud.example/link",
  verification_uri_complete: "https://cloud.example/link?user_code=BCDF-GHJK",
  expires_in: 60,
  interval: 1,
  ...overrides,
});

const servers: Server<undefined>[] = [];
afterEach(() => {
  for (const server of servers.splice(0)) server.stop(true);
});
function serve(answers: (() => Response | Promise<Response>)[]) {
  const made = scripted(answers);
  servers.push(made.server);
  return made;
}

describe("CloudLinkClient against a scripted server", () => {
  test("reports this machine as hostname, `<platform> <release> <arch>` and the engine version", () => {
    const reported = reportedMachine();
    expect(reported.hostname.length).toBeGreaterThan(0);
    expect(reported.os).toMatch(/^\w+ \S+ \w+$/);
    expect(reported.version).toBe(VERSION);
  });

  test.each([
    ["https://cloud.example/", "https://cloud.example"],
    ["http://127.0.0.1:8787", "http://127.0.0.1:8787"],
    ["https://example.com/console//", "https://example.com/console"],
  ])("normalizes the cloud URL %s", (raw, normalized) => {
    expect(normalizeCloudUrl(raw)).toBe(normalized);
  });

  test.each(["cloud.example", "ftp://cloud.example", "https://cloud.example/?x=1", "https://user:pw@cloud.example"])(
    "refuses the cloud URL %s",
    (raw) => {
      expect(() => normalizeCloudUrl(raw)).toThrow(LinkError);
    },
  );

  test("polls at the cloud's interval and returns the identity once approved", async () => {
    const { url, requests } = serve([pending(2), pending(3), json(200, CLAIM)]);
    const time = fakeTime();
    const events: PollEvent[] = [];
    const client = new CloudLinkClient({ cloudUrl: url, ...time });
    const claim = await client.pollDevice(device({ interval: 1 }), { onEvent: (event) => events.push(event) });
    expect(claim).toEqual(CLAIM);
    // RFC 8628 §3.4: wait the interval before the first poll, then the latest interval the cloud gave.
    expect(time.waits).toEqual([1000, 2000, 3000]);
    expect(events).toEqual([
      { event: "pending", interval: 2, expires_in: 100 },
      { event: "pending", interval: 3, expires_in: 100 },
    ]);
    expect(requests).toEqual(Array(3).fill(`POST /api/link/device/poll ${JSON.stringify({ device_code: "dc_1" })}`));
  });

  test.each([
    ["without an interval, +5 s (RFC 8628 §3.5)", {}, 6000, 6],
    ["with the cloud's interval, that interval", { interval: 12 }, 12_000, 12],
  ])("slow_down %s", async (_name, extra, wait, interval) => {
    const { url } = serve([envelope(429, "slow_down", extra), json(200, CLAIM)]);
    const time = fakeTime();
    const events: PollEvent[] = [];
    const client = new CloudLinkClient({ cloudUrl: url, ...time });
    expect(await client.pollDevice(device({ interval: 1 }), { onEvent: (event) => events.push(event) })).toEqual(CLAIM);
    expect(time.waits).toEqual([1000, wait]);
    expect(events).toEqual([{ event: "slow_down", interval }]);
  });

  test("rate_limited waits out Retry-After (seconds or an HTTP date), never less than the interval", async () => {
    const { url } = serve([
      envelope(429, "rate_limited", {}, { "retry-after": "7" }),
      // The fake clock stands at 1_009_000 ms by then: this date is 9 s later.
      envelope(429, "rate_limited", {}, { "retry-after": new Date(1_018_000).toUTCString() }),
      envelope(429, "rate_limited", {}, { "retry-after": "0" }),
      json(200, CLAIM),
    ]);
    const time = fakeTime();
    const events: PollEvent[] = [];
    const client = new CloudLinkClient({ cloudUrl: url, ...time });
    await client.pollDevice(device({ interval: 2 }), { onEvent: (event) => events.push(event) });
    expect(time.waits).toEqual([2000, 7000, 9000, 2000]);
    expect(events).toEqual([
      { event: "rate_limited", retry_after: 7 },
      { event: "rate_limited", retry_after: 9 },
      { event: "rate_limited", retry_after: 0 },
    ]);
  });

  test("a 5xx is retried with backoff and the loop goes on", async () => {
    const { url } = serve([
      envelope(503, "database_unavailable"),
      envelope(502, "bad_gateway"),
      envelope(500, "internal"),
      json(200, CLAIM),
    ]);
    const time = fakeTime();
    const events: PollEvent[] = [];
    const client = new CloudLinkClient({ cloudUrl: url, ...time });
    expect(await client.pollDevice(device({ interval: 1 }), { onEvent: (event) => events.push(event) })).toEqual(CLAIM);
    expect(time.waits).toEqual([1000, 1000, 2000, 4000]);
    expect(events.map((event) => event.event)).toEqual(["retrying", "retrying", "retrying"]);
  });

  test("an unreachable cloud is retried with backoff until the request expires, then reported", async () => {
    const port = await freePort();
    const time = fakeTime();
    const client = new CloudLinkClient({ cloudUrl: `http://127.0.0.1:${port}`, ...time });
    const failure = await client.pollDevice(device({ interval: 1, expires_in: 20 })).catch((error) => error);
    expect(failure).toBeInstanceOf(LinkError);
    expect(failure.code).toBe("cloud_unreachable");
    expect(failure.message).toContain("expired while retrying");
    // 1 s, then doubling, capped by what is left of the 20 s lifetime; one last try at the deadline.
    expect(time.waits).toEqual([1000, 1000, 2000, 4000, 8000, 4000]);
  });

  test.each([
    [403, "access_denied", /denied in the console/],
    [410, "expired_token", /expired before it was approved/],
    [409, "already_consumed", /already used/],
    [404, "device_request_not_found", /cloud says device_request_not_found/],
    [400, "invalid_request", /cloud says invalid_request/],
  ])("a %i %s ends the loop with that code", async (status, code, message) => {
    const { url } = serve([pending(1), envelope(status, code)]);
    const client = new CloudLinkClient({ cloudUrl: url, ...fakeTime() });
    const failure = await client.pollDevice(device()).catch((error) => error);
    expect(failure).toBeInstanceOf(LinkError);
    expect({ code: failure.code, status: failure.status }).toEqual({ code, status });
    expect(failure.message).toMatch(message);
  });

  test("the request's lifetime ends the loop as expired_token after one last poll", async () => {
    const { url, requests } = serve([pending(10)]);
    const time = fakeTime();
    const client = new CloudLinkClient({ cloudUrl: url, ...time });
    const failure = await client.pollDevice(device({ interval: 10, expires_in: 25 })).catch((error) => error);
    expect(failure.code).toBe("expired_token");
    expect(time.waits).toEqual([10_000, 10_000, 5000, 0]);
    expect(requests.length).toBe(3);
  });

  test("an AbortSignal (Ctrl-C) stops a waiting loop at once as cancelled", async () => {
    const { url, requests } = serve([pending(3600)]);
    const abort = new AbortController();
    const client = new CloudLinkClient({ cloudUrl: url });
    const outcome = client.pollDevice(device({ interval: 0 }), {
      signal: abort.signal,
      onEvent: () => abort.abort(),
    });
    const failure = await outcome.catch((error) => error);
    expect(failure).toBeInstanceOf(LinkError);
    expect(failure.code).toBe("cancelled");
    expect(requests.length).toBe(1);
    await expect(abortableSleep(10, AbortSignal.abort())).rejects.toThrow("cancelled");
  });

  test("a request that gets no answer times out as cloud_unreachable", async () => {
    const { url } = serve([() => new Promise<Response>(() => {})]);
    const client = new CloudLinkClient({ cloudUrl: url, timeoutMs: 200 });
    const failure = await client.startDevice(machine).catch((error) => error);
    expect(failure.code).toBe("cloud_unreachable");
    expect(failure.message).toContain("no answer within");
  });

  test("an answer outside the contract is invalid_answer, never half-read", async () => {
    const { url } = serve([json(200, { node_id: "n" }), json(201, { user_code: "X" }), json(500, "oops")]);
    const client = new CloudLinkClient({ cloudUrl: url });
    expect((await client.claimCode("NL-X", machine).catch((error) => error)).code).toBe("invalid_answer");
    expect((await client.startDevice(machine).catch((error) => error)).code).toBe("invalid_answer");
    expect((await client.enrollWithKey("k", machine).catch((error) => error)).code).toBe("invalid_answer");
  });

  test("metadata: 404 from an older cloud is `supported: false`; 200 is the domain; other failures throw", async () => {
    const { url } = serve([
      envelope(404, "not_found"),
      () => new Response("Not Found", { status: 404 }),
      json(200, { hosted_base_domain: "hosted.example" }),
      envelope(500, "internal"),
    ]);
    const client = new CloudLinkClient({ cloudUrl: url });
    expect(await client.fetchMetadata()).toEqual({ supported: false });
    expect(await client.fetchMetadata()).toEqual({ supported: false });
    expect(await client.fetchMetadata()).toEqual({ supported: true, hosted_base_domain: "hosted.example" });
    await expect(client.fetchMetadata()).rejects.toThrow(LinkError);
  });
});

/** approveOver approves a device request as the signed-in user, the way the console's page does. */
async function approveOver(cloud: TestCloud, token: string, userCode: string) {
  return cloud.api("POST", "/api/nodes/device-approvals/approve", { token, body: { user_code: userCode } });
}

/** skipFirstWait lets the first poll go at once (the cloud allows a device code's first poll at any time); later waits are real. */
function skipFirstWait() {
  let first = true;
  return (ms: number, signal?: AbortSignal) => {
    if (first) {
      first = false;
      return Promise.resolve();
    }
    return abortableSleep(ms, signal);
  };
}

describe("CloudLinkClient against engine-cloud", () => {
  let cloud: TestCloud;
  let token: string;
  let accountId: string;
  beforeAll(async () => {
    cloud = await startTestCloud("sqlite");
    ({ token, accountId } = await cloud.signIn("linker@example.com", { nodeLimit: 50 }));
  });
  afterAll(async () => {
    await cloud?.close();
  });

  test("device flow: the machine asks, a signed-in user approves, the poll returns the node identity", async () => {
    const client = new CloudLinkClient({ cloudUrl: cloud.url, sleep: skipFirstWait() });
    const started = await client.startDevice(machine);
    expect(started.interval).toBeGreaterThan(0);
    expect(started.expires_in).toBeGreaterThan(0);
    expect(started.verification_uri_complete).toContain(started.verification_uri);
    const approved = await approveOver(cloud, token, started.user_code);
    expect(approved.status).toBe(200);
    const claim = await client.pollDevice(started);
    expect(claim).toMatchObject({ account_id: accountId, slug: "gpu-box", cloud_url: cloud.url, hosted_base_domain: "hosted.localhost" });
    expect(claim.node_credential.length).toBeGreaterThan(16);
    expect(claim.node_id).toBe(approved.body.node_id);
  });

  test("slow_down: polling too fast raises the interval by 5 s, and the client then waits the new interval", async () => {
    const requested: number[] = [];
    let calls = 0;
    const abort = new AbortController();
    const client = new CloudLinkClient({
      cloudUrl: cloud.url,
      // The first two waits are skipped, so the second poll comes too fast; the third is recorded and the loop stopped.
      sleep: async (ms, signal) => {
        calls += 1;
        if (calls <= 2) return;
        requested.push(ms);
        abort.abort();
        return abortableSleep(ms, signal);
      },
    });
    const started = await client.startDevice(machine);
    const events: PollEvent[] = [];
    const failure = await client.pollDevice(started, { signal: abort.signal, onEvent: (event) => events.push(event) }).catch((e) => e);
    expect(failure.code).toBe("cancelled");
    expect(events).toEqual([
      { event: "pending", interval: started.interval, expires_in: expect.any(Number) },
      { event: "slow_down", interval: started.interval + 5 },
    ]);
    expect(requested).toEqual([(started.interval + 5) * 1000]);
  });

  test("denied: the loop ends with access_denied", async () => {
    const client = new CloudLinkClient({ cloudUrl: cloud.url, sleep: skipFirstWait() });
    const started = await client.startDevice(machine);
    const denied = await cloud.api("POST", "/api/nodes/device-approvals/deny", { token, body: { user_code: started.user_code } });
    expect(denied.status).toBe(200);
    const failure = await client.pollDevice(started).catch((e) => e);
    expect(failure).toBeInstanceOf(LinkError);
    expect({ code: failure.code, status: failure.status }).toEqual({ code: "access_denied", status: 403 });
  });

  test("link code: claimed once for the node identity, refused after", async () => {
    const minted = await cloud.api("POST", "/api/link/codes", { token, body: {} });
    expect(minted.status).toBe(201);
    expect(minted.body.code).toStartWith("NL-");
    const client = new CloudLinkClient({ cloudUrl: cloud.url });
    const claim = await client.claimCode(minted.body.code, { ...machine, hostname: "code-box" });
    expect(claim).toMatchObject({ account_id: accountId, slug: "code-box", cloud_url: cloud.url });
    const again = await client.claimCode(minted.body.code, machine).catch((e) => e);
    expect(again).toBeInstanceOf(LinkError);
    expect([409, 410]).toContain(again.status);
    const unknown = await client.claimCode("NL-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", machine).catch((e) => e);
    expect(unknown.status).toBe(404);
  });

  test("pre-authorized key: enrolls without a browser; a revoked key is refused", async () => {
    const minted = await cloud.api("POST", "/api/preauth-keys", { token, body: { max_uses: 2 } });
    expect(minted.status).toBe(201);
    const client = new CloudLinkClient({ cloudUrl: cloud.url });
    const claim = await client.enrollWithKey(minted.body.key, { ...machine, hostname: "key-box" });
    expect(claim).toMatchObject({ account_id: accountId, slug: "key-box", cloud_url: cloud.url });
    expect((await cloud.api("DELETE", `/api/preauth-keys/${minted.body.id}`, { token })).status).toBe(204);
    const revoked = await client.enrollWithKey(minted.body.key, machine).catch((e) => e);
    expect(revoked).toBeInstanceOf(LinkError);
    expect(revoked.status).toBe(404);
  });

  test("metadata: the cloud publishes its hosted base domain", async () => {
    expect(await new CloudLinkClient({ cloudUrl: cloud.url }).fetchMetadata()).toEqual({
      supported: true,
      hosted_base_domain: "hosted.localhost",
    });
  });
});

describe("CloudLinkClient against engine-cloud with a short device lifetime", () => {
  let cloud: TestCloud;
  beforeAll(async () => {
    // The lifetime is not a setting of the console; its link module takes one for tests.
    cloud = await startTestCloud("sqlite", {}, { modules: [(deps) => linkRoutes(deps, { deviceLifetimeMs: 1500 }), approvalRoutes] });
  });
  afterAll(async () => {
    await cloud?.close();
  });

  test("expired: a request nobody approves ends with expired_token once its lifetime has passed", async () => {
    const client = new CloudLinkClient({ cloudUrl: cloud.url });
    const started = await client.startDevice(machine);
    expect(started.expires_in).toBeLessThanOrEqual(2);
    const failure = await client.pollDevice(started).catch((e) => e);
    expect(failure).toBeInstanceOf(LinkError);
    expect(failure.code).toBe("expired_token");
    expect(failure.message).toContain("expired before it was approved");
  });
});
