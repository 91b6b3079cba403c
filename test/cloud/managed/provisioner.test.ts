import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { AccountStore } from "../../../src/cloud/accounts";
import { AuditLog } from "../../../src/cloud/audit";
import { Database } from "../../../src/cloud/db";
import { ManagedService, Provisioner } from "../../../src/cloud/managed";
import { NodeStore } from "../../../src/cloud/nodes";
import { eventually } from "../../helpers";
import { describeEachDialect, postgresAvailable } from "../helpers";
import { alive, boxPids, type ManagedCloud, startManagedCloud } from "./helpers";

describeEachDialect("the provisioner: hung operations, lost and crashed boxes", (dialect) => {
  let cloud: ManagedCloud;
  let token: string;
  let accountId: string;
  const row = () => cloud.row(accountId);

  beforeAll(async () => {
    cloud = await startManagedCloud(dialect, { places: { launch: 1 }, provisioner: { operationTimeoutMs: 4000, maxAttempts: 4 } });
    ({ token, accountId } = await cloud.signIn("watched@example.com", { paid: true }));
  });
  afterAll(async () => {
    await cloud?.close();
  });

  test("a hung operation is detected past its deadline, recorded, and retried: the box is made once", async () => {
    cloud.provider.inject("create", { kind: "hang", times: 1 });
    const id = (await cloud.api("POST", "/api/managed/allocation", { token })).body.id;
    await eventually(async () => String((await row()).error ?? "").includes("operation_hung"), { timeoutMs: 20_000 });
    expect((await row()).status).toBe("provisioning");
    await cloud.waitFor(token, (v) => v.status === "ready");
    expect((await row()).error).toBeNull();
    expect(cloud.provider.calls.filter((call) => call.id === id && call.operation === "create").length).toBeGreaterThanOrEqual(2);
    expect(boxPids(cloud.dataDir)).toHaveLength(1);
  });

  test("a box that crashed is started again", async () => {
    const { id } = (await cloud.api("GET", "/api/managed/allocation", { token })).body;
    const [pid] = (await cloud.local.status(id)).pids as [number];
    process.kill(pid, "SIGKILL");
    const again = await eventually(
      async () => {
        const status = await cloud.local.status(id);
        return status.state === "running" && status.pids[0] !== pid ? status.pids[0] : null;
      },
      { timeoutMs: 30_000 },
    );
    expect(alive(again as number)).toBe(true);
    expect(boxPids(cloud.dataDir)).toEqual([again as number]);
    expect((await row()).power).toBe("running");
  });

  test("a box lost at the provider fails its allocation without a sandbox and unlinks its node; the next POST makes a new one", async () => {
    const { id } = (await cloud.api("GET", "/api/managed/allocation", { token })).body;
    cloud.provider.inject("status", { kind: "lose", times: 1 });
    const lost = await cloud.waitFor(token, (v) => v.status === "failed");
    expect(lost).toMatchObject({ id, sandbox_id: null, node_id: expect.any(String), error: "the box is gone at the provider" });
    expect((await cloud.api("GET", "/api/nodes", { token })).body.nodes).toEqual([]);
    expect(await cloud.auditCount("managed.lost", id)).toBe(1);
    expect(boxPids(cloud.dataDir)).toEqual([]);
    const replaced = await cloud.api("POST", "/api/managed/allocation", { token });
    expect(replaced.status).toBe(201);
    expect(replaced.body.id).not.toBe(id);
    await cloud.waitFor(token, (v) => v.status === "ready");
    expect(boxPids(cloud.dataDir)).toHaveLength(1);
  });
});

const runOnPostgres = (await postgresAvailable()) ? describe : describe.skip;

runOnPostgres("two provisioners on PostgreSQL", () => {
  let cloud: ManagedCloud;
  let second: Database;
  let first: Provisioner;
  let other: Provisioner;

  beforeAll(async () => {
    // The console serves the API only: the two provisioners below are the only ones.
    cloud = await startManagedCloud("postgres", { role: "api", places: { launch: 10 } });
    second = await Database.open(cloud.databaseUrl);
    // Its pool connected before the race: a first connection made mid-test would let the other
    // provisioner claim every allocation before this one asked, and prove nothing.
    await second.sql`SELECT 1`;
    const again = new ManagedService({
      ...cloud.managed.ctx,
      db: second,
      accounts: new AccountStore(second),
      nodes: new NodeStore(second),
      audit: new AuditLog(second),
    });
    const options = { concurrency: 2, leaseMs: 15_000, operationTimeoutMs: 30_000, recheckMs: 100 };
    first = new Provisioner(cloud.managed, { ...options, owner: "first" });
    other = new Provisioner(again, { ...options, owner: "other" });
  });
  afterAll(async () => {
    await second?.close();
    await cloud?.close();
  });

  test("never act on the same allocation at once, and each box is made once", async () => {
    // Slow steps widen the window in which a second provisioner could step in.
    cloud.provider.inject("create", { kind: "slow", ms: 300 });
    cloud.provider.inject("destroy", { kind: "slow", ms: 300 });
    const tokens: string[] = [];
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) {
      const { token } = await cloud.signIn(`pair-${i}@example.com`, { paid: true });
      tokens.push(token);
      ids.push((await cloud.api("POST", "/api/managed/allocation", { token })).body.id);
    }
    const settle = async (done: (status: string) => boolean) => {
      await eventually(
        async () => {
          // One tick each per round: each claims at most `concurrency` (2) of the 4 due
          // allocations, so both get work whichever's query reaches PostgreSQL first (two ticks
          // each let one provisioner's pair claim all four before the other asked).
          await Promise.all([other.tick(), first.tick()]);
          const rows = await cloud.deps.db.sql`SELECT status FROM managed_allocations WHERE id IN ${cloud.deps.db.sql(ids)}`;
          return rows.every((r: { status: string }) => done(r.status));
        },
        { timeoutMs: 60_000 },
      );
    };
    await settle((status) => status === "ready");
    expect(cloud.provider.maxOverlap()).toBe(0);
    expect(first.worked).toBeGreaterThan(0);
    expect(other.worked).toBeGreaterThan(0);
    for (const id of ids) expect(cloud.provider.calls.filter((c) => c.id === id && c.operation === "create")).toHaveLength(1);
    expect(boxPids(cloud.dataDir)).toHaveLength(4);

    for (const token of tokens) expect((await cloud.api("DELETE", "/api/managed/allocation", { token })).status).toBe(202);
    await settle((status) => status === "deleted");
    expect(cloud.provider.maxOverlap()).toBe(0);
    expect(boxPids(cloud.dataDir)).toEqual([]);
  }, 120_000);
});
