import { afterAll, beforeAll, expect, test } from "bun:test";
import { DeviceLinks, userCodeDigester } from "../../../src/cloud/link";
import { MemoryBuckets, RateLimiter } from "../../../src/cloud/ratelimit";
import { digestSecret } from "../../../src/lib/crypto";
import { isAppError } from "../../../src/lib/errors";
import { describeEachDialect } from "../helpers";
import { type LinkTestCloud, startLinkCloud } from "./helpers";

const USER_CODE = /^[BCDFGHJKLMNPQRSTVWXZ]{4}-[BCDFGHJKLMNPQRSTVWXZ]{4}$/;

/** withoutRequestId is an error body with its request id removed, to compare two answers. */
// biome-ignore lint/suspicious/noExplicitAny: error bodies are read loosely.
const withoutRequestId = (body: any) => ({ ...body, error: { ...body.error, request_id: undefined } });

describeEachDialect("device link", (dialect) => {
  let link: LinkTestCloud;
  beforeAll(async () => {
    link = await startLinkCloud(dialect);
  });
  afterAll(async () => {
    await link?.cloud.close();
  });

  const approve = async (userCode: string, email = "approver@example.com") => {
    const { token } = await link.cloud.signIn(email);
    return link.cloud.api("POST", "/api/nodes/device-approvals/approve", { token, body: { user_code: userCode } });
  };
  const rowOf = async (deviceCode: string) => {
    const [row] = await link.cloud.deps.db.sql`SELECT * FROM device_requests WHERE id = ${deviceCode.split(".")[0]}`;
    return row;
  };

  test("a device request answers 201 with both codes once, the verification URIs, the lifetime and the interval", async () => {
    const address = link.source();
    const answer = await link.cloud.api("POST", "/api/link/device", {
      body: { hostname: "gpu-box", os: "linux", version: "0.6.0" },
      headers: link.from(address),
    });
    expect(answer.status).toBe(201);
    const { publicUrl } = link.cloud.deps.site;
    expect(answer.body).toEqual({
      device_code: expect.stringMatching(/^dev_[a-z0-9]{16}\.[A-Za-z0-9_-]{43}$/),
      user_code: expect.stringMatching(USER_CODE),
      verification_uri: `${publicUrl}/link`,
      verification_uri_complete: `${publicUrl}/link?user_code=${answer.body.user_code}`,
      expires_in: 900,
      interval: 5,
    });
    const row = await rowOf(answer.body.device_code);
    expect(row).toMatchObject({ state: "pending", hostname: "gpu-box", os: "linux", version: "0.6.0", source: address });
    expect(Number(row.attempts_left)).toBe(5);
    expect(Number(row.interval_s)).toBe(5);
    expect(row.account_id).toBeNull();
    expect(row.node_id).toBeNull();
    expect(Number(row.expires_at) - Number(row.created_at)).toBe(900_000);
    // Digests only: the device code's SHA-256, and the user code keyed (a plain SHA-256 of 34 bits is brute-forceable).
    const normalized = answer.body.user_code.replace("-", "");
    expect(row.device_code_digest).toBe(digestSecret(answer.body.device_code));
    expect(row.user_code_digest).toBe(userCodeDigester(link.cloud.deps).digest(normalized));
    expect(row.user_code_digest).not.toBe(digestSecret(normalized));
    const stored = JSON.stringify(row);
    expect(stored).not.toContain(answer.body.device_code.split(".")[1]);
    expect(stored).not.toContain(normalized);
  });

  test("the audit row names the request, the source and the hostname, never a code", async () => {
    const address = link.source();
    const answer = await link.cloud.api("POST", "/api/link/device", {
      body: { hostname: "audited-box", os: "linux", version: "1" },
      headers: link.from(address),
    });
    const id = answer.body.device_code.split(".")[0];
    const [row] = await link.cloud.deps.db.sql`SELECT * FROM audit WHERE subject = ${id}`;
    expect(row).toMatchObject({ action: "device_link.requested", account_id: null, source: address });
    expect(JSON.parse(row.details)).toEqual({ hostname: "audited-box" });
    const all = JSON.stringify(await link.cloud.deps.audit.list(null, 1000));
    expect(all).not.toContain(answer.body.device_code.split(".")[1]);
    expect(all).not.toContain(answer.body.user_code);
    expect(all).not.toContain(answer.body.user_code.replace("-", ""));
  });

  test.each([
    ["control characters", { hostname: "gpu\u0007box\n" }, { hostname: "gpubox" }],
    ["a right-to-left override", { hostname: "evil\u202Eexe.box" }, { hostname: "evilexe.box" }],
    ["bidi isolates and marks", { hostname: "\u2066isolate\u2069\u200e" }, { hostname: "isolate" }],
    ["a hostname over 253", { hostname: "a".repeat(300) }, { hostname: "a".repeat(253) }],
    ["NUL and C1 in the os", { os: "Linux\u0000 6.1\u009b" }, { os: "Linux 6.1" }],
    ["a version over 64", { version: `v${"9".repeat(200)}` }, { version: `v${"9".repeat(63)}` }],
  ])("reported strings are stored cleaned: %s", async (_label, reported, expected) => {
    const answer = await link.requestDevice(reported);
    expect(await rowOf(answer.device_code)).toMatchObject(expected);
  });

  test("a hostname that is empty once cleaned is a 400; a missing or oversized one a 422", async () => {
    const send = (body: unknown) => link.cloud.api("POST", "/api/link/device", { body, headers: link.from(link.source()) });
    const empty = await send({ hostname: "\u202e\u0000 ", os: "", version: "" });
    expect(empty.status).toBe(400);
    expect(empty.body.error.code).toBe("invalid_request");
    expect((await send({ os: "linux", version: "1" })).status).toBe(422);
    expect((await send({ hostname: "h".repeat(1025), os: "", version: "" })).status).toBe(422);
  });

  test("device requests are limited per address (10), charged first", async () => {
    const address = link.source();
    const statuses = [];
    for (let i = 0; i < 11; i++) {
      const body = i === 10 ? { hostname: "\u0000", os: "", version: "" } : { hostname: `bulk-${i}`, os: "", version: "" };
      statuses.push((await link.cloud.api("POST", "/api/link/device", { body, headers: link.from(address) })).status);
    }
    // The eleventh would be a 400, but the empty bucket answers first.
    expect(statuses).toEqual([...Array(10).fill(201), 429]);
  });

  test("bulk creation only ever makes expiring rows", async () => {
    await Promise.all(Array.from({ length: 20 }, (_, i) => link.requestDevice({ hostname: `burst-${i}` })));
    const rows = await link.cloud.deps.db.sql`SELECT created_at, expires_at FROM device_requests`;
    expect(rows.length).toBeGreaterThanOrEqual(20);
    for (const row of rows) expect(Number(row.expires_at) - Number(row.created_at)).toBe(900_000);
  });

  test("a pending request polls 202 authorization_pending with the interval and the time left", async () => {
    const { device_code } = await link.requestDevice();
    link.clock.advance(1000);
    const answer = await link.poll(device_code);
    expect(answer.status).toBe(202);
    expect(answer.body).toEqual({ status: "authorization_pending", interval: 5, expires_in: 899 });
  });

  test("slow_down answers a too-fast poll with no database statement, identically for a real and an invented code", async () => {
    const real = (await link.requestDevice()).device_code as string;
    const invented = `dev_${"a".repeat(16)}.${"B".repeat(43)}`;
    expect((await link.poll(real)).status).toBe(202);
    const unknown = await link.poll(invented);
    expect(unknown.status).toBe(404);
    expect(unknown.body.error.code).toBe("device_request_not_found");
    const stats = link.cloud.deps.db.stats;
    const before = stats.statements;
    const slowReal = await link.poll(real);
    const slowInvented = await link.poll(invented);
    expect(stats.statements).toBe(before);
    for (const answer of [slowReal, slowInvented]) {
      expect(answer.status).toBe(429);
      expect(answer.body.error.code).toBe("slow_down");
      expect(answer.body.error.interval).toBe(10); // RFC 8628 §3.5: +5 s
      expect(answer.headers.get("retry-after")).toBe("10");
    }
    expect(withoutRequestId(slowReal.body)).toEqual(withoutRequestId(slowInvented.body));
    expect(slowReal.body.error.request_id).not.toBe(slowInvented.body.error.request_id);
  });

  test("polls up to 1 s early are tolerated; earlier ones get slow_down, and the longer interval is kept", async () => {
    const { device_code } = await link.requestDevice();
    expect((await link.poll(device_code)).status).toBe(202);
    link.clock.advance(4000);
    expect((await link.poll(device_code)).status).toBe(202);
    link.clock.advance(3900);
    const early = await link.poll(device_code);
    expect(early.status).toBe(429);
    expect(early.body.error.interval).toBe(10);
    // The next poll must now wait 10 s (less the tolerance) after the early one.
    link.clock.advance(8900);
    expect((await link.poll(device_code)).body.error.interval).toBe(15);
    link.clock.advance(14_000);
    const pending = await link.poll(device_code);
    expect(pending.status).toBe(202);
    expect(pending.body.interval).toBe(15);
  });

  test.each([
    ["not a device code at all", 400, "invalid_request"],
    ["dev_aaaaaaaaaaaaaaaa", 400, "invalid_request"],
    [`dev_${"z".repeat(16)}.${"A".repeat(43)}`, 404, "device_request_not_found"],
  ])("polling %p answers %p %p", async (code, status, errorCode) => {
    const answer = await link.poll(code);
    expect(answer.status).toBe(status);
    expect(answer.body.error.code).toBe(errorCode);
  });

  test("a wrong secret for a real id is 403 invalid_device_credential, and reveals no state", async () => {
    const { device_code } = await link.requestDevice();
    const [id] = device_code.split(".");
    const answer = await link.poll(`${id}.${"A".repeat(43)}`);
    expect(answer.status).toBe(403);
    expect(answer.body.error.code).toBe("invalid_device_credential");
    expect(JSON.stringify(answer.body)).not.toContain("pending");
  });

  test("the order: a rate-limited poll with a wrong credential says 429, not 403; a fast repeat says slow_down, not 403", async () => {
    const { device_code } = await link.requestDevice();
    const wrong = `${device_code.split(".")[0]}.${"C".repeat(43)}`;
    const address = link.source();
    // Empty this address's bucket (60) with invented codes, each polled once.
    for (let i = 0; i < 60; i++) await link.poll(`dev_${String(i).padStart(16, "q")}.${"D".repeat(43)}`, address);
    const limited = await link.poll(wrong, address);
    expect(limited.status).toBe(429);
    expect(limited.body.error.code).toBe("rate_limited");
    // From elsewhere the same string passes the limits and the cadence, and only then is found wrong.
    expect((await link.poll(wrong)).status).toBe(403);
    const fast = await link.poll(wrong);
    expect(fast.status).toBe(429);
    expect(fast.body.error.code).toBe("slow_down");
    // Per presented string: 20 at once, whatever the address.
    const repeated = [];
    for (let i = 0; i < 19; i++) repeated.push((await link.poll(wrong)).body.error.code);
    expect(repeated.slice(0, 18)).toEqual(Array(18).fill("slow_down"));
    expect(repeated[18]).toBe("rate_limited");
  });

  test("approved: the poll answers 200 LinkClaimResponse once, with a credential minted then; the next poll is 409", async () => {
    const { device_code, user_code } = await link.requestDevice({ hostname: "approved-box.lan" });
    expect((await link.poll(device_code)).status).toBe(202);
    const grant = await approve(user_code);
    expect(grant.status).toBe(200);
    link.clock.advance(5000);
    const collected = await link.poll(device_code);
    expect(collected.status).toBe(200);
    expect(collected.body).toEqual({
      node_id: grant.body.node_id,
      slug: "approved-box",
      account_id: expect.stringMatching(/^acct_/),
      node_credential: expect.stringMatching(/^enc_[A-Za-z0-9_-]{43}$/),
      cloud_url: link.cloud.deps.site.publicUrl,
      hosted_base_domain: "hosted.localhost",
    });
    // The same shape, key for key, as a claim answer.
    expect(Object.keys(collected.body).sort()).toEqual(
      ["account_id", "cloud_url", "hosted_base_domain", "node_credential", "node_id", "slug"].sort(),
    );
    const node = await link.cloud.deps.nodes.authenticate(collected.body.node_credential);
    expect(node.id).toBe(grant.body.node_id);
    expect(node.enrolledVia).toBe("device");
    const row = await rowOf(device_code);
    expect(row.state).toBe("consumed");
    expect(JSON.stringify(row)).not.toContain(collected.body.node_credential);
    link.clock.advance(5000);
    const again = await link.poll(device_code);
    expect(again.status).toBe(409);
    expect(again.body.error.code).toBe("already_consumed");
  });

  test("concurrent polls of an approved request through ten replicas (each its own cadence map): one 200", async () => {
    const { device_code, user_code } = await link.requestDevice({ hostname: "race-poll-box" });
    expect((await approve(user_code)).status).toBe(200);
    const { deps } = link.cloud;
    const replicas = Array.from(
      { length: 10 },
      () =>
        new DeviceLinks({
          ...deps,
          userCodes: userCodeDigester(deps),
          pollLimiter: new RateLimiter(new MemoryBuckets()),
          clock: link.clock.read,
        }),
    );
    const outcomes = await Promise.all(
      replicas.map((replica) =>
        replica
          .poll(device_code, "10.9.9.9")
          .then((answer) => answer)
          .catch((error) => (isAppError(error) ? error.code : String(error))),
      ),
    );
    const won = outcomes.filter((o) => typeof o === "object" && o.status === 200);
    expect(won.length).toBe(1);
    expect(outcomes.filter((o) => o === "already_consumed").length).toBe(9);
    // The winner's credential is the node's.
    const answer = won[0] as { body: { node_credential: string; node_id: string } };
    expect((await deps.nodes.authenticate(answer.body.node_credential)).id).toBe(answer.body.node_id);
  });

  test("denied: the poll answers 403 access_denied", async () => {
    const { device_code, user_code } = await link.requestDevice();
    const { token } = await link.cloud.signIn("approver@example.com");
    expect((await link.cloud.api("POST", "/api/nodes/device-approvals/deny", { token, body: { user_code } })).status).toBe(200);
    const answer = await link.poll(device_code);
    expect(answer.status).toBe(403);
    expect(answer.body.error.code).toBe("access_denied");
  });

  test("expired: the poll answers 410 expired_token, pending or approved-but-uncollected", async () => {
    const pending = await link.requestDevice();
    const approved = await link.requestDevice({ hostname: "late-box" });
    expect((await approve(approved.user_code)).status).toBe(200);
    link.clock.advance(900_000);
    for (const { device_code } of [pending, approved]) {
      const answer = await link.poll(device_code);
      expect(answer.status).toBe(410);
      expect(answer.body.error.code).toBe("expired_token");
    }
  });

  test("a shorter lifetime can be configured (15 minutes by default)", async () => {
    const short = await startLinkCloud(dialect, { deviceLifetimeMs: 2000 });
    try {
      const { device_code, expires_in } = await short.requestDevice();
      expect(expires_in).toBe(2);
      short.clock.advance(2000);
      expect((await short.poll(device_code)).body.error.code).toBe("expired_token");
    } finally {
      await short.cloud.close();
    }
  });
});
