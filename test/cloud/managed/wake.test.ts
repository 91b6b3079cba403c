import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { num } from "../../../src/cloud/db";
import { eventually } from "../../helpers";
import { describeEachDialect } from "../helpers";
import { alive, boxPids, type ManagedCloud, startManagedCloud } from "./helpers";

const MINUTE = 60_000;

describeEachDialect("hosted machines: idle sleep and wake", (dialect) => {
  let cloud: ManagedCloud;
  let token: string;
  let accountId: string;
  let boxId: string;
  const wake = () => cloud.api("POST", "/api/managed/allocation/wake", { token });
  /** afterAPass waits until the provisioner has looked at the box since now (a pass sets its next time past now). */
  const afterAPass = async () => {
    const since = cloud.clock.now().getTime();
    await eventually(
      async () => {
        const row = await cloud.row(accountId);
        return row.lease_owner === null && num(row.next_check_at) > since;
      },
      { timeoutMs: 20_000 },
    );
  };
  const power = async () => (await cloud.row(accountId)).power as string;
  const throughProxy = async (path = "api/health") =>
    fetch(`${cloud.url}/boxes/${boxId}/${path}`, { headers: { authorization: `Bearer ${token}` } });

  beforeAll(async () => {
    cloud = await startManagedCloud(dialect, { places: { launch: 1, trial: 0 }, provisioner: { operationTimeoutMs: 5000 } });
    ({ token, accountId } = await cloud.signIn("sleeper@example.com", { paid: true }));
  });
  afterAll(async () => {
    await cloud?.close();
  });

  test("no ready box is 404 no_ready_box, while none exists and while it is being made", async () => {
    const none = await wake();
    expect(none.status).toBe(404);
    expect(none.body.error.code).toBe("no_ready_box");
    cloud.provider.inject("start", { kind: "slow", ms: 1000, times: 1 });
    boxId = (await cloud.api("POST", "/api/managed/allocation", { token })).body.id;
    const making = await wake();
    expect(making.status).toBe(404);
    expect(making.body.error.code).toBe("no_ready_box");
    await cloud.waitFor(token, (v) => v.status === "ready");
  });

  test("a box that is not asleep answers 200, unchanged, with nothing written", async () => {
    const answer = await wake();
    expect(answer.status).toBe(200);
    expect(answer.body).toEqual({ allocation_id: boxId, power: "running", start_started_at: null, url: `${cloud.url}/boxes/${boxId}/` });
    expect(await cloud.auditCount("managed.wake_requested", boxId)).toBe(0);
  });

  test("requests through the box's URL keep it awake; idle past its sleep setting, it sleeps and its engine ends", async () => {
    const pid = (await cloud.local.status(boxId)).pids[0] as number;
    cloud.clock.advance(20 * MINUTE);
    expect((await throughProxy()).status).toBe(200);
    await eventually(async () => num((await cloud.row(accountId)).last_activity_at) >= cloud.clock.now().getTime() - 1000);
    cloud.clock.advance(20 * MINUTE);
    await afterAPass();
    expect(await power()).toBe("running");
    // Console polling is not activity: reading the allocation leaves the box to its idle time.
    expect((await cloud.api("GET", "/api/managed/allocation", { token })).status).toBe(200);
    cloud.clock.advance(11 * MINUTE);
    await eventually(async () => (await power()) === "asleep", { timeoutMs: 20_000 });
    expect(alive(pid)).toBe(false);
    expect(boxPids(cloud.dataDir)).toEqual([]);
    expect(existsSync(cloud.local.dataDir(boxId))).toBe(true);
    expect(await cloud.auditCount("managed.slept", boxId)).toBe(1);
    const view = (await cloud.api("GET", "/api/managed/allocation", { token })).body;
    expect(view).toMatchObject({ status: "ready", power: "asleep", billing_active: false });
  });

  test("a request to a sleeping box never wakes it (409 box_not_running)", async () => {
    const answer = await throughProxy();
    expect(answer.status).toBe(409);
    expect(((await answer.json()) as { error: { code: string } }).error.code).toBe("box_not_running");
    await afterAPass();
    expect(await power()).toBe("asleep");
  });

  test("wake answers 202 starting (whatever the sleep setting), a repeat the same with nothing written, and the box answers again", async () => {
    await cloud.deps.db.sql`UPDATE managed_allocations SET sleep_after_ms = 0 WHERE id = ${boxId}`;
    cloud.provider.inject("start", { kind: "slow", ms: 1500, times: 1 });
    const first = await wake();
    expect(first.status).toBe(202);
    expect(first.body).toMatchObject({ allocation_id: boxId, power: "starting", start_started_at: expect.any(String) });
    const repeat = await wake();
    expect(repeat.status).toBe(202);
    expect(repeat.body).toEqual(first.body);
    expect(await cloud.auditCount("managed.wake_requested", boxId)).toBe(1);
    await eventually(async () => (await power()) === "running", { timeoutMs: 20_000 });
    expect((await throughProxy()).status).toBe(200);
    expect(boxPids(cloud.dataDir)).toHaveLength(1);
    expect(await cloud.auditCount("managed.woke", boxId)).toBe(1);
    await cloud.deps.db.sql`UPDATE managed_allocations SET sleep_after_ms = ${30 * MINUTE} WHERE id = ${boxId}`;
  });

  test.each(["suspended", "closed"] as const)("a %s account may not wake (403)", async (standing) => {
    await cloud.deps.accounts.set(accountId, { standing });
    const answer = await wake();
    expect(answer.status).toBe(403);
    expect(answer.body.error.code).toBe("account_suspended");
    await cloud.deps.accounts.set(accountId, { standing: "active" });
  });

  test("a spent start budget is 429 start_budget_spent with Retry-After; a new window takes starts again", async () => {
    cloud.clock.advance(31 * MINUTE);
    await eventually(async () => (await power()) === "asleep", { timeoutMs: 20_000 });
    const now = cloud.clock.now().getTime();
    await cloud.deps.db
      .sql`UPDATE managed_allocations SET starts_in_window = 6, start_window_at = ${now - 10 * MINUTE} WHERE id = ${boxId}`;
    const refused = await wake();
    expect(refused.status).toBe(429);
    expect(refused.body.error.code).toBe("start_budget_spent");
    expect(Number(refused.headers.get("retry-after"))).toBe(50 * 60);
    expect(await power()).toBe("asleep");
    cloud.clock.advance(51 * MINUTE);
    // A start that hangs: the wake is accepted, and stays `starting`.
    cloud.provider.inject("start", { kind: "hang", times: 1 });
    expect((await wake()).status).toBe(202);
  });

  test("while a start has run over two minutes, wake is 429 start_stuck; the hung start is retried and the box comes up", async () => {
    expect((await wake()).status).toBe(202);
    cloud.clock.advance(2 * MINUTE + 1000);
    const stuck = await wake();
    expect(stuck.status).toBe(429);
    expect(stuck.body.error.code).toBe("start_stuck");
    expect(stuck.headers.get("retry-after")).toBe("60");
    await eventually(async () => (await power()) === "running", { timeoutMs: 30_000 });
    expect((await cloud.row(accountId)).error).toBeNull();
    expect(boxPids(cloud.dataDir)).toHaveLength(1);
  });
});
