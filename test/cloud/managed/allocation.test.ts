import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { num } from "../../../src/cloud/db";
import { eventually } from "../../helpers";
import { describeEachDialect } from "../helpers";
import { alive, boxPids, type ManagedCloud, startManagedCloud } from "./helpers";

/** HOUR is a trial box's lifetime (the contract's Limits). */
const HOUR = 3_600_000;

describeEachDialect("hosted machines: allocation and delete", (dialect) => {
  let cloud: ManagedCloud;
  const allocate = (token: string) => cloud.api("POST", "/api/managed/allocation", { token });
  const remove = (token: string) => cloud.api("DELETE", "/api/managed/allocation", { token });
  const view = (token: string) => cloud.api("GET", "/api/managed/allocation", { token });
  const nodes = async (token: string) =>
    (await cloud.api("GET", "/api/nodes", { token })).body.nodes as { id: string; enrolled_via: string }[];
  const allocations = async (accountId: string) => {
    const [row] = await cloud.deps.db.sql`SELECT COUNT(*) AS n FROM managed_allocations WHERE account_id = ${accountId}`;
    return num(row.n);
  };

  beforeAll(async () => {
    cloud = await startManagedCloud(dialect, {
      places: { launch: 5, trial: 2 },
      provisioner: { maxAttempts: 2, operationTimeoutMs: 10_000 },
    });
  });
  afterAll(async () => {
    await cloud?.close();
  });

  test("404 before any; an unpaid account gets a one-hour trial (201) linked as a node, reachable through its URL; a repeat answers 200", async () => {
    const { token, accountId } = await cloud.signIn("trial@example.com");
    const none = await view(token);
    expect(none.status).toBe(404);
    expect(none.body.error.code).toBe("allocation_not_found");
    const created = await allocate(token);
    expect(created.status).toBe(201);
    expect(created.body).toMatchObject({ kind: "trial", status: "provisioning", power: "none", sandbox_id: null, url: null });
    expect(Date.parse(created.body.expires_at) - Date.parse(created.body.created_at)).toBe(HOUR);
    expect((await nodes(token)).map((node) => [node.id, node.enrolled_via])).toEqual([[created.body.node_id, "hosted"]]);
    const account = await cloud.deps.accounts.byId(accountId);
    expect(account?.trialsLeft).toBe(0);
    expect(await cloud.auditCount("managed.allocated", created.body.id)).toBe(1);

    const ready = await cloud.waitFor(token, (v) => v.status === "ready");
    expect(ready).toMatchObject({ id: created.body.id, power: "running", sandbox_id: created.body.id, billing_active: false });
    const health = await fetch(`${ready.url}api/health`, { headers: { authorization: `Bearer ${token}` } });
    expect(health.status).toBe(200);
    expect(((await health.json()) as { status: string }).status).toBe("ok");
    // Nothing a box answers may run as the console's origin.
    expect(health.headers.get("content-security-policy")).toContain("sandbox");
    expect(health.headers.get("x-content-type-options")).toBe("nosniff");
    // A cookie-authenticated change through the box's URL needs the console's CSRF header, like /api.
    const cookie = { cookie: `engine_session=${token}` };
    expect((await fetch(`${ready.url}api/services`, { method: "POST", headers: cookie })).status).toBe(403);
    // The box answers only its owner's session.
    const stranger = await cloud.signIn("stranger@example.com");
    expect((await fetch(`${ready.url}api/health`, { headers: { authorization: `Bearer ${stranger.token}` } })).status).toBe(404);
    expect((await fetch(`${ready.url}api/health`)).status).toBe(401);

    const again = await allocate(token);
    expect(again.status).toBe(200);
    expect(again.body.id).toBe(created.body.id);
    expect(await allocations(accountId)).toBe(1);
    expect(await cloud.auditCount("managed.allocated", created.body.id)).toBe(1);
    expect(await cloud.auditCount("managed.ready", created.body.id)).toBe(1);
  });

  test("no trial left is 403 trial_quota_used; no trial place free is 409 trial_boxes_busy; an inactive account 403", async () => {
    const spent = await cloud.signIn("spent@example.com", { trialsLeft: 0 });
    const quota = await allocate(spent.token);
    expect(quota.status).toBe(403);
    expect(quota.body.error.code).toBe("trial_quota_used");
    await cloud.managed.setPlaces("trial", 1);
    const busy = await cloud.signIn("busy@example.com");
    const refused = await allocate(busy.token);
    expect(refused.status).toBe(409);
    expect(refused.body.error.code).toBe("trial_boxes_busy");
    // The refusal spent nothing: the trial is still there for when a place frees.
    expect((await cloud.deps.accounts.byId(busy.accountId))?.trialsLeft).toBe(1);
    for (const standing of ["suspended", "closed"] as const) {
      const inactive = await cloud.signIn(`${standing}-alloc@example.com`, { standing, paid: true });
      const answer = await allocate(inactive.token);
      expect(answer.status).toBe(403);
      expect(answer.body.error.code).toBe("account_suspended");
      expect(await allocations(inactive.accountId)).toBe(0);
    }
    expect(await allocations(spent.accountId)).toBe(0);
    expect(await allocations(busy.accountId)).toBe(0);
    await cloud.managed.setPlaces("trial", 2);
  });

  test("a paid account (a seat) gets a full box with no expiry, which bills while it runs", async () => {
    const { token } = await cloud.signIn("payer@example.com");
    await cloud.managed.grantSeat("payer@example.com");
    const created = await allocate(token);
    expect(created.status).toBe(201);
    expect(created.body).toMatchObject({ kind: "paid", expires_at: null });
    const ready = await cloud.waitFor(token, (v) => v.status === "ready");
    expect(ready.billing_active).toBe(true);
  });

  test("a failed allocation with no sandbox is replaced by a new allocation (201, new id)", async () => {
    const { token, accountId } = await cloud.signIn("unlucky@example.com", { paid: true });
    cloud.provider.inject("create", { kind: "fail", times: 2 });
    const first = await allocate(token);
    expect(first.status).toBe(201);
    const failed = await cloud.waitFor(token, (v) => v.status === "failed");
    expect(failed).toMatchObject({ id: first.body.id, sandbox_id: null, url: null });
    expect(failed.error).toContain("provider_failed");
    expect(await cloud.auditCount("managed.failed", first.body.id)).toBe(1);
    const replaced = await allocate(token);
    expect(replaced.status).toBe(201);
    expect(replaced.body.id).not.toBe(first.body.id);
    expect(await allocations(accountId)).toBe(2);
    await cloud.waitFor(token, (v) => v.status === "ready" && v.id === replaced.body.id);
    expect((await allocate(token)).status).toBe(200);
  });

  test("delete: 202 deleting while the provider owes it (node unlinked at once), retried until done, audited once; then 200 deleted", async () => {
    const { token } = await cloud.signIn("payer@example.com");
    const box = (await view(token)).body;
    expect(box.status).toBe("ready");
    cloud.provider.inject("destroy", { kind: "fail", times: 3 });
    const deleting = await remove(token);
    expect(deleting.status).toBe(202);
    expect(deleting.body).toMatchObject({ id: box.id, status: "deleting", billing_active: false, url: null });
    expect(await nodes(token)).toEqual([]);
    const repeat = await remove(token);
    expect(repeat.status).toBe(202);
    // A box being deleted is still the current one: allocating answers it.
    expect((await allocate(token)).body).toMatchObject({ id: box.id, status: "deleting" });
    await cloud.waitFor(token, (v) => v.status === "deleted");
    const destroys = cloud.provider.calls.filter((call) => call.operation === "destroy" && call.id === box.id);
    expect(destroys.length).toBeGreaterThanOrEqual(4);
    expect(existsSync(cloud.local.boxDir(box.id))).toBe(false);
    const done = await remove(token);
    expect(done.status).toBe(200);
    expect(done.body).toMatchObject({ status: "deleted", deleted_at: expect.any(String) });
    expect(await cloud.auditCount("managed.deleted", box.id)).toBe(1);
    expect(await cloud.auditCount("managed.destroyed", box.id)).toBe(1);
    // The seat is still held: a new POST makes a new box.
    const next = await allocate(token);
    expect(next.status).toBe(201);
    expect(next.body.id).not.toBe(box.id);
    expect((await remove(token)).status).toBeOneOf([200, 202]);
  });

  test("delete needs no payment or standing: a suspended and a closed owner can stop the cost", async () => {
    const { token, accountId } = await cloud.signIn("unlucky@example.com");
    const box = (await view(token)).body;
    expect(box.status).toBe("ready");
    await cloud.deps.accounts.set(accountId, { standing: "closed", paid: false });
    const answer = await remove(token);
    expect(answer.status).toBeOneOf([200, 202]);
    await eventually(async () => (await cloud.row(accountId)).status === "deleted", { timeoutMs: 30_000 });
    expect(await cloud.auditCount("managed.deleted", box.id)).toBe(1);
    await cloud.deps.accounts.set(accountId, { standing: "suspended" });
    expect((await remove(token)).status).toBe(200);
    expect(await cloud.auditCount("managed.deleted", box.id)).toBe(1);
  });

  test("delete with nothing at the provider (the box was never made) is 200 deleted at once; 404 without any box", async () => {
    const { token } = await cloud.signIn("quick@example.com", { paid: true });
    cloud.provider.inject("create", { kind: "hang", times: 1 });
    const created = await allocate(token);
    expect(created.status).toBe(201);
    const answer = await remove(token);
    expect(answer.status).toBe(200);
    expect(answer.body.status).toBe("deleted");
    expect(await cloud.auditCount("managed.deleted", created.body.id)).toBe(1);
    const none = await cloud.signIn("never@example.com");
    const missing = await remove(none.token);
    expect(missing.status).toBe(404);
    expect(missing.body.error.code).toBe("allocation_not_found");
  });

  test("the trial box is gone an hour later: expired, deleted at the provider, its process ended", async () => {
    const { token, accountId } = await cloud.signIn("trial@example.com");
    const box = (await view(token)).body;
    expect(box.status).toBe("ready");
    const pid = (await cloud.local.status(box.id)).pids[0] as number;
    expect(boxPids(cloud.dataDir)).toContain(pid);
    cloud.clock.advance(HOUR + 1000);
    await cloud.waitFor(token, (v) => v.status === "deleted");
    expect(alive(pid)).toBe(false);
    expect(await cloud.auditCount("managed.expired", box.id)).toBe(1);
    expect(await cloud.auditCount("managed.deleted", box.id)).toBe(0);
    const again = await allocate(token);
    expect(again.status).toBe(403);
    expect(again.body.error.code).toBe("trial_quota_used");
    expect(await allocations(accountId)).toBe(1);
  });
});
