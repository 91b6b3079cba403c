import { afterAll, beforeAll, expect, test } from "bun:test";
import { cleanReported, slugOf } from "../../../src/cloud/nodes";
import { isAppError } from "../../../src/lib/errors";
import { describeEachDialect, startTestCloud, type TestCloud } from "../helpers";

test.each([
  ["gpu-box", "gpu-box"],
  ["GPU-Box.lan", "gpu-box"],
  ["my_workstation.example.com", "my-workstation"],
  ["  --odd--name--  ", "odd-name"],
  ["Ünïcödé", "unicode"],
  ["søren", "s-ren"],
  ["日本", "machine"],
  ["", "machine"],
  ["a".repeat(80), "a".repeat(40)],
])("slugOf(%p) is %p", (hostname, slug) => {
  expect(slugOf(hostname)).toBe(slug);
});

test("reported strings lose control characters and bidi overrides, and are bounded", () => {
  const cleaned = cleanReported({ hostname: "evil\u202Eexe.box\u0007\n", os: "Linux\u0000 6.1\u009b", version: "v".repeat(500) });
  expect(cleaned).toEqual({ hostname: "evilexe.box", os: "Linux 6.1", version: "v".repeat(64) });
});

describeEachDialect("node enrollment", (dialect) => {
  let cloud: TestCloud;
  beforeAll(async () => {
    cloud = await startTestCloud(dialect);
  });
  afterAll(async () => {
    await cloud?.close();
  });

  test("a new hostname creates a node, the same slug adopts it with a new credential, and the limit counts only new nodes", async () => {
    const { accountId } = await cloud.signIn("limits@example.com", { nodeLimit: 2 });
    const { nodes, db } = cloud.deps;
    const first = await db.transaction((tx) => nodes.enroll(tx, accountId, { hostname: "box-a", os: "linux", version: "1" }, "link_code"));
    expect(first.adopted).toBe(false);
    const again = await db.transaction((tx) => nodes.enroll(tx, accountId, { hostname: "BOX-A.lan", os: "linux", version: "2" }, "device"));
    expect(again.adopted).toBe(true);
    expect(again.node.id).toBe(first.node.id);
    expect(again.credential).not.toBe(first.credential);
    // The old credential no longer authenticates; the new one does.
    await expect(nodes.authenticate(first.credential)).rejects.toThrow();
    expect((await nodes.authenticate(again.credential)).id).toBe(first.node.id);
    await db.transaction((tx) => nodes.enroll(tx, accountId, { hostname: "box-b", os: "", version: "" }, "device"));
    const refused = await db
      .transaction((tx) => nodes.enroll(tx, accountId, { hostname: "box-c", os: "", version: "" }, "device"))
      .catch((error) => error);
    expect(isAppError(refused) && refused.code).toBe("node_limit_reached");
    expect((await nodes.list(accountId)).map((n) => n.slug)).toEqual(["box-a", "box-b"]);
  });

  test("concurrent enrollments of one account never pass its node limit", async () => {
    const { accountId } = await cloud.signIn("race@example.com", { nodeLimit: 3 });
    const { nodes, db } = cloud.deps;
    const outcomes = await Promise.all(
      Array.from({ length: 12 }, (_, i) =>
        db
          .transaction((tx) => nodes.enroll(tx, accountId, { hostname: `racer-${i}`, os: "", version: "" }, "device"))
          .then(() => "ok")
          .catch((error) => (isAppError(error) ? error.code : String(error))),
      ),
    );
    expect(outcomes.filter((o) => o === "ok").length).toBe(3);
    expect(outcomes.filter((o) => o === "node_limit_reached").length).toBe(9);
    expect((await nodes.list(accountId)).length).toBe(3);
  });

  test("what an engine reports over its tunnel is stored cleaned: version, GPUs, tools; last seen only moves forward", async () => {
    const { accountId } = await cloud.signIn("reports@example.com");
    const other = await cloud.signIn("other-reports@example.com");
    const { nodes, db } = cloud.deps;
    const enrolled = await db.transaction((tx) =>
      nodes.enroll(tx, accountId, { hostname: "rig", os: "linux", version: "0.1.0" }, "device"),
    );
    const older = await db.transaction((tx) =>
      nodes.enroll(tx, accountId, { hostname: "old-rig", os: "linux", version: "0.1.0" }, "device"),
    );
    const id = enrolled.node.id;
    expect(await nodes.toolsOf(accountId, [id, older.node.id])).toBeNull();
    const tools = [{ name: "list_services", inputSchema: { type: "object" } }];
    await nodes.recordHello(older.node.id, { version: "0.6.0", gpus: [], tools: [{ name: "old", inputSchema: {} }] }, 1_000);
    await nodes.recordHello(
      id,
      { version: "0.7.0\u0007", gpus: [{ index: 0, name: "H100\u202e", memory_total_mb: 81_920, mig_profile: null }], tools },
      2_000,
    );
    expect(await nodes.get(accountId, id)).toMatchObject({
      version: "0.7.0",
      lastSeenAt: 2_000,
      gpus: [{ index: 0, name: "H100", memory_total_mb: 81_920, mig_profile: null }],
    });
    // The most recently seen node's tools are the ones listed; another account's rows are not read.
    expect(await nodes.toolsOf(accountId, [id, older.node.id])).toEqual(tools);
    expect(await nodes.toolsOf(accountId, [older.node.id])).toEqual([{ name: "old", inputSchema: {} }]);
    expect(await nodes.toolsOf(other.accountId, [id])).toBeNull();
    expect(await nodes.get(other.accountId, id)).toBeUndefined();
    await nodes.touch(id, 1_500);
    expect((await nodes.get(accountId, id))?.lastSeenAt).toBe(2_000);
    await nodes.touch(id, 3_000);
    await nodes.recordGpus(id, [], 3_500);
    expect(await nodes.get(accountId, id)).toMatchObject({ lastSeenAt: 3_500, gpus: [] });
  });
});
