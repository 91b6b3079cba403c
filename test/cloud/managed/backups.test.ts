import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { eventually } from "../../helpers";
import { describeEachDialect } from "../helpers";
import { type ManagedCloud, startManagedCloud } from "./helpers";

const HOUR = 3_600_000;
const DAY = 24 * HOUR;

describeEachDialect("hosted machines: backups, tombstones and restore", (dialect) => {
  let cloud: ManagedCloud;
  let token: string;
  let accountId: string;
  let boxId: string;
  const backups = () => cloud.api("GET", "/api/managed/allocation/backups", { token });
  const throughProxy = (id: string, method: string, path: string, body?: unknown) =>
    fetch(`${cloud.url}/boxes/${id}/${path}`, {
      method,
      headers: { authorization: `Bearer ${token}`, ...(body ? { "content-type": "application/json" } : {}) },
      body: body ? JSON.stringify(body) : undefined,
    });
  /** doneBackups waits until the box has `count` backups in a settled state and answers the view. */
  const settled = async (count: number) =>
    eventually(
      async () => {
        const view = (await backups()).body;
        return view.backups.length >= count && view.backups.every((b: { state: string }) => b.state !== "running") ? view : null;
      },
      { timeoutMs: 30_000 },
    );

  beforeAll(async () => {
    cloud = await startManagedCloud(dialect, { places: { launch: 1 }, input: { boxSleepAfterMin: "0" } });
    ({ token, accountId } = await cloud.signIn("keeper@example.com", { paid: true }));
  });
  afterAll(async () => {
    await cloud?.close();
  });

  test("404 before any box; a new box has no backup yet and counts as healthy", async () => {
    const none = await backups();
    expect(none.status).toBe(404);
    expect(none.body.error.code).toBe("allocation_not_found");
    boxId = (await cloud.api("POST", "/api/managed/allocation", { token })).body.id;
    await cloud.waitFor(token, (v) => v.status === "ready");
    const view = await backups();
    expect(view.status).toBe(200);
    expect(view.body).toEqual({
      allocation_id: boxId,
      allocation_status: "ready",
      healthy: true,
      last_backup_at: null,
      retention_days: 7,
      backups: [],
    });
  });

  test("a day later the box is backed up (its engine's state and its data dir), kept for the retention", async () => {
    const deployed = await throughProxy(boxId, "POST", "api/services", { name: "web", kind: "service", command: ["sleep", "600"] });
    expect(deployed.status).toBe(201);
    cloud.clock.advance(DAY + HOUR);
    const view = await settled(1);
    const [backup] = view.backups;
    expect(backup).toMatchObject({ kind: "nightly", state: "done", tombstone: false, error: null });
    expect(backup.size_bytes).toBeGreaterThan(0);
    expect(Date.parse(backup.expires_at) - Date.parse(backup.taken_at)).toBe(7 * DAY);
    expect(view).toMatchObject({ healthy: true, last_backup_at: backup.taken_at });
    const files = join(cloud.dataDir, "backups", boxId, backup.id);
    expect(existsSync(join(files, "engine.db"))).toBe(true);
    expect(existsSync(join(files, "data", "data", "web"))).toBe(true);
    expect(await cloud.auditCount("managed.backed_up", boxId)).toBe(1);
  });

  test("a failed backup makes the box unhealthy and is retried an hour later", async () => {
    cloud.provider.inject("backup", { kind: "fail", times: 1 });
    cloud.clock.advance(DAY + HOUR);
    const failed = await settled(2);
    expect(failed.backups[0]).toMatchObject({ state: "failed", error: expect.stringContaining("provider_failed") });
    expect(failed.healthy).toBe(false);
    expect(await cloud.auditCount("managed.backup_failed", boxId)).toBe(1);
    cloud.clock.advance(HOUR + 1000);
    const retried = await settled(3);
    expect(retried.backups[0].state).toBe("done");
    expect(retried.healthy).toBe(true);
  });

  test("a deleted box's backups stay as tombstones, with a final backup; a backup restores into a new box with the same services", async () => {
    await expect(cloud.managed.restoreBackup((await backups()).body.backups[0].id)).rejects.toMatchObject({ code: "conflict" });
    expect((await cloud.api("DELETE", "/api/managed/allocation", { token })).status).toBe(202);
    await cloud.waitFor(token, (v) => v.status === "deleted");
    const view = (await backups()).body;
    expect(view.allocation_status).toBe("deleted");
    const final = view.backups[0];
    expect(final).toMatchObject({ kind: "final", state: "done", tombstone: true });
    expect(view.backups.filter((b: { state: string }) => b.state === "done").every((b: { tombstone: boolean }) => b.tombstone)).toBe(true);
    expect(view.healthy).toBe(true);

    const restored = await cloud.managed.restoreBackup(final.id);
    expect(restored.restoreFrom).toBe(final.id);
    const ready = await cloud.waitFor(token, (v) => v.status === "ready" && v.id === restored.id);
    expect(ready.kind).toBe("paid");
    const services = (await (await throughProxy(restored.id, "GET", "api/services")).json()) as { name: string }[];
    expect(services.map((service) => service.name)).toEqual(["web"]);
    expect(await cloud.auditCount("managed.allocated", restored.id)).toBe(1);
    // The newest box's backups are what the route shows now.
    expect((await backups()).body).toMatchObject({ allocation_id: restored.id, backups: [] });
  });

  test("past the retention the tombstones are removed, files and all", async () => {
    const kept = (await cloud.deps.db.sql`SELECT id FROM managed_backups WHERE allocation_id = ${boxId} AND state = 'done'`).map(
      (row: { id: string }) => row.id,
    );
    expect(kept.length).toBeGreaterThanOrEqual(2);
    cloud.clock.advance(8 * DAY);
    await eventually(
      async () => {
        const rows = await cloud.deps.db
          .sql`SELECT COUNT(*) AS n FROM managed_backups WHERE allocation_id = ${boxId} AND forgotten_at IS NULL`;
        return Number(rows[0].n) === 0;
      },
      { timeoutMs: 30_000 },
    );
    for (const id of kept) expect(existsSync(join(cloud.dataDir, "backups", boxId, id))).toBe(false);
    expect(accountId).toBeTruthy();
  });
});
