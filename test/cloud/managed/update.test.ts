import { afterAll, beforeAll, expect, test } from "bun:test";
import { num } from "../../../src/cloud/db";
import { VERSION } from "../../../src/lib/version";
import { eventually } from "../../helpers";
import { describeEachDialect } from "../helpers";
import { alive, type ManagedCloud, NEXT_VERSION, startManagedCloud } from "./helpers";

const MINUTE = 60_000;
/** LATER_VERSION is a third release: offered after NEXT_VERSION. */
const LATER_VERSION = NEXT_VERSION.replace(/\.(\d+)$/, (_, patch: string) => `.${Number(patch) + 1}`);

describeEachDialect("hosted machines: update", (dialect) => {
  let cloud: ManagedCloud;
  let token: string;
  let accountId: string;
  let boxId: string;
  const update = (body: unknown = { version: NEXT_VERSION }) => cloud.api("POST", "/api/managed/allocation/update", { token, body });
  const state = () => cloud.api("GET", "/api/managed/allocation/update", { token });
  const row = () => cloud.row(accountId);

  beforeAll(async () => {
    cloud = await startManagedCloud(dialect, {
      places: { launch: 1 },
      releases: [VERSION, NEXT_VERSION, LATER_VERSION],
      provisioner: { maxAttempts: 2, operationTimeoutMs: 10_000 },
    });
    ({ token, accountId } = await cloud.signIn("updater@example.com", { paid: true }));
    cloud.provider.offer([VERSION]);
  });
  afterAll(async () => {
    await cloud?.close();
  });

  test("404 without a box; the view shows the box's version and the one offered", async () => {
    const none = await state();
    expect(none.status).toBe(404);
    expect(none.body.error.code).toBe("allocation_not_found");
    expect((await update()).status).toBe(404);
    boxId = (await cloud.api("POST", "/api/managed/allocation", { token })).body.id;
    await cloud.waitFor(token, (v) => v.status === "ready");
    const current = await state();
    expect(current.status).toBe(200);
    expect(current.body).toEqual({
      allocation_id: boxId,
      current_version: VERSION,
      offered_version: VERSION,
      state: "idle",
      target_version: null,
      requested_at: null,
      next_allowed_at: null,
      error: null,
    });
    cloud.provider.offer([VERSION, NEXT_VERSION]);
    expect((await state()).body.offered_version).toBe(NEXT_VERSION);
  });

  test.each([
    ["a downgrade", "0.0.1", "downgrade_refused"],
    ["the version it runs", VERSION, "up_to_date"],
    ["a version not offered", "99.0.0", "version_not_offered"],
  ])("%s is 409 and writes nothing", async (_, version, code) => {
    const before = await row();
    const answer = await update({ version });
    expect(answer.status).toBe(409);
    expect(answer.body.error.code).toBe(code);
    expect((await row()).update_state).toBe(before.update_state);
    expect(await cloud.auditCount("managed.update_requested", boxId)).toBe(0);
  });

  test.each([
    ["no body", undefined],
    ["an empty body", {}],
    ["a version that is not one", { version: "1.0 beta" }],
    ["a version too long", { version: `1.${"0".repeat(70)}` }],
  ])("%s is 422", async (_, body) => {
    const answer = await cloud.api("POST", "/api/managed/allocation/update", { token, body });
    expect(answer.status).toBe(422);
    expect(answer.body.detail).toBeArray();
  });

  test.each(["suspended", "closed"] as const)("a %s account may not update (403)", async (standing) => {
    await cloud.deps.accounts.set(accountId, { standing });
    const answer = await update();
    expect(answer.status).toBe(403);
    expect(answer.body.error.code).toBe("account_suspended");
    await cloud.deps.accounts.set(accountId, { standing: "active" });
  });

  test("an accepted update answers 202; a repeat while it runs answers 202 and writes nothing; the provisioner runs stop → update → start", async () => {
    const pid = (await cloud.local.status(boxId)).pids[0] as number;
    const mark = cloud.provider.calls.length;
    cloud.provider.inject("stop", { kind: "slow", ms: 1000, times: 1 });
    const accepted = await update();
    expect(accepted.status).toBe(202);
    expect(accepted.body).toMatchObject({ allocation_id: boxId, current_version: VERSION, target_version: NEXT_VERSION });
    expect(["pending", "running"]).toContain(accepted.body.state);
    const written = num((await row()).updated_at);
    const repeat = await update();
    expect(repeat.status).toBe(202);
    expect(repeat.body.target_version).toBe(NEXT_VERSION);
    expect(await cloud.auditCount("managed.update_requested", boxId)).toBe(1);
    // Another version while one runs is busy.
    cloud.provider.offer([VERSION, NEXT_VERSION, LATER_VERSION]);
    const other = await update({ version: LATER_VERSION });
    expect(other.status).toBe(409);
    expect(other.body.error.code).toBe("box_busy");
    cloud.provider.offer([VERSION, NEXT_VERSION]);
    expect(num((await row()).updated_at)).toBeGreaterThanOrEqual(written);
    const done = await eventually(async () => ((await state()).body.state === "done" ? (await state()).body : null), { timeoutMs: 30_000 });
    expect(done).toMatchObject({ current_version: NEXT_VERSION, target_version: NEXT_VERSION, error: null });
    const steps = cloud.provider.calls
      .slice(mark)
      .filter((call) => call.id === boxId && ["stop", "update", "start"].includes(call.operation))
      .map((call) => call.operation);
    expect(steps).toEqual(["stop", "update", "start"]);
    expect(alive(pid)).toBe(false);
    const status = await cloud.local.status(boxId);
    expect(status).toMatchObject({ state: "running", version: NEXT_VERSION });
    expect((await cloud.api("GET", "/api/managed/allocation", { token })).body).toMatchObject({
      box_version: NEXT_VERSION,
      power: "running",
    });
    expect(await cloud.auditCount("managed.updated", boxId)).toBe(1);
    // A version it ran before is now a downgrade.
    expect((await update({ version: VERSION })).body.error.code).toBe("downgrade_refused");
  });

  test("within 3 minutes of the previous accepted update, another is 429 update_too_soon with Retry-After", async () => {
    cloud.provider.offer([VERSION, NEXT_VERSION, LATER_VERSION]);
    const early = await update({ version: LATER_VERSION });
    expect(early.status).toBe(429);
    expect(early.body.error.code).toBe("update_too_soon");
    expect(Number(early.headers.get("retry-after"))).toBeGreaterThan(0);
    expect(Number(early.headers.get("retry-after"))).toBeLessThanOrEqual(180);
    const view = (await state()).body;
    expect(Date.parse(view.next_allowed_at) - Date.parse(view.requested_at)).toBe(3 * MINUTE);
    cloud.clock.advance(3 * MINUTE);
  });

  test("a box being backed up is 409 backup_running", async () => {
    await cloud.deps.db.sql`UPDATE managed_allocations SET sleep_after_ms = 0 WHERE id = ${boxId}`;
    cloud.provider.inject("backup", { kind: "slow", ms: 3000, times: 1 });
    cloud.clock.advance(25 * 60 * MINUTE);
    await eventually(async () => (await row()).backing_up_since !== null, { timeoutMs: 20_000 });
    const answer = await update({ version: LATER_VERSION });
    expect(answer.status).toBe(409);
    expect(answer.body.error.code).toBe("backup_running");
    await eventually(async () => (await row()).backing_up_since === null, { timeoutMs: 20_000 });
  });

  test("a sleeping box is 409 box_offline; a starting one 409 box_busy", async () => {
    await cloud.deps.db.sql`UPDATE managed_allocations SET sleep_after_ms = ${30 * MINUTE} WHERE id = ${boxId}`;
    cloud.clock.advance(31 * MINUTE);
    await eventually(async () => (await row()).power === "asleep", { timeoutMs: 20_000 });
    const offline = await update({ version: LATER_VERSION });
    expect(offline.status).toBe(409);
    expect(offline.body.error.code).toBe("box_offline");
    cloud.provider.inject("start", { kind: "slow", ms: 2000, times: 1 });
    expect((await cloud.api("POST", "/api/managed/allocation/wake", { token })).status).toBe(202);
    const busy = await update({ version: LATER_VERSION });
    expect(busy.status).toBe(409);
    expect(busy.body.error.code).toBe("box_busy");
    await eventually(async () => (await row()).power === "running", { timeoutMs: 20_000 });
  });

  test("an update the provider fails is `failed` with its reason, the box is never moved back, and a retry waits its 3 minutes", async () => {
    cloud.provider.inject("update", { kind: "fail", times: 2 });
    expect((await update({ version: LATER_VERSION })).status).toBe(202);
    const failed = await eventually(async () => ((await state()).body.state === "failed" ? (await state()).body : null), {
      timeoutMs: 30_000,
    });
    expect(failed.error).toContain("provider_failed");
    expect(failed.current_version).toBe(NEXT_VERSION);
    expect(await cloud.auditCount("managed.update_failed", boxId)).toBe(1);
    const updates = cloud.provider.calls.filter((call) => call.id === boxId && call.operation === "update");
    expect(updates.every((call) => call.at > 0)).toBe(true);
    expect((await cloud.local.status(boxId)).version).toBe(NEXT_VERSION);
    const soon = await update({ version: LATER_VERSION });
    expect(soon.status).toBe(429);
    cloud.clock.advance(3 * MINUTE);
    // The failed update left the box stopped: it is woken first, then updated.
    if ((await row()).power === "asleep") {
      expect((await cloud.api("POST", "/api/managed/allocation/wake", { token })).status).toBe(202);
      await eventually(async () => (await row()).power === "running", { timeoutMs: 20_000 });
    }
    expect((await update({ version: LATER_VERSION })).status).toBe(202);
    await eventually(async () => (await state()).body.state === "done", { timeoutMs: 30_000 });
    expect((await state()).body.current_version).toBe(LATER_VERSION);
  });
});
