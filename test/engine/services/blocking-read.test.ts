import { describe, expect, test } from "bun:test";
import type { ServiceRecord } from "../../../src/contract/engine";
import { testEngineWithClient } from "./harness";

const fixture = testEngineWithClient();

/** read GETs a service with the given query, answering the status, the record and its index. */
async function read(name: string, query = "") {
  const started = performance.now();
  const response = await fetch(`${fixture.engine().url}/api/services/${name}${query}`, {
    headers: { authorization: `Bearer ${fixture.engine().adminToken}` },
  });
  const body = (await response.json()) as ServiceRecord & { error?: { code: string } };
  return {
    status: response.status,
    body,
    index: response.headers.get("x-engine-index"),
    etag: response.headers.get("etag"),
    ms: performance.now() - started,
  };
}

/** pending says whether a promise is still unsettled after `ms`. */
async function pending(promise: Promise<unknown>, ms: number): Promise<boolean> {
  return Promise.race([promise.then(() => false), Bun.sleep(ms).then(() => true)]);
}

describe("a read of a service as a blocking query", () => {
  test("each answer names its state; the same state reads the same index, a change a new one", async () => {
    await fixture.api().deployed({ name: "indexed", command: "exec sleep 300" });
    const running = await fixture.api().waitFor("indexed", "running", (record) => record.pid !== null);
    const first = await read("indexed");
    const again = await read("indexed");
    expect(first.status).toBe(200);
    expect(first.index).toMatch(/^[0-9a-z]{1,32}$/);
    expect(first.etag).toBe(`"${first.index}"`);
    expect(again.index).toBe(first.index);
    expect(first.body.pid).toBe(running.pid);
    await fixture.api().control("indexed", "stop");
    const stopped = await read("indexed");
    expect(stopped.body.status).toBe("stopped");
    expect(stopped.index).not.toBe(first.index);
  });

  test("with the current index it waits for the change and answers the changed record", async () => {
    await fixture.api().deployed({ name: "watched", command: "exec sleep 300" });
    const before = await fixture.api().waitFor("watched", "running", (record) => record.pid !== null);
    const current = await read("watched");
    const waiting = read("watched", `?index=${current.index}&wait=30`);
    // Nothing changes: the read is still held.
    expect(await pending(waiting, 400)).toBe(true);
    // A kill -9 of the workload: the restart policy starts it again, and the held read answers.
    process.kill(before.pid as number, "SIGKILL");
    const changed = await waiting;
    expect(changed.status).toBe(200);
    expect(changed.index).not.toBe(current.index);
    expect(changed.body.pid).not.toBe(before.pid);
    // It answered well before its wait ran out.
    expect(changed.ms).toBeLessThan(20_000);
  });

  test("an index that is not the current one answers at once", async () => {
    await fixture.api().deployed({ name: "stale", command: "exec sleep 300" });
    await fixture.api().waitFor("stale", "running");
    const answer = await read("stale", "?index=0&wait=30");
    expect(answer.status).toBe(200);
    expect(answer.ms).toBeLessThan(5_000);
    expect(answer.index).not.toBe("0");
  });

  test("a wait that runs out answers the record as it is, with the same index", async () => {
    await fixture.api().deployed({ name: "quiet", command: "exec sleep 300" });
    await fixture.api().waitFor("quiet", "running", (record) => record.pid !== null);
    const current = await read("quiet");
    const answer = await read("quiet", `?index=${current.index}&wait=1`);
    expect(answer.status).toBe(200);
    expect(answer.index).toBe(current.index);
    expect(answer.body).toEqual(current.body);
    expect(answer.ms).toBeGreaterThanOrEqual(900);
  });

  test("a delete answers a held read with its first change; a read of the deleted service is 404", async () => {
    await fixture.api().deployed({ name: "doomed", command: "exec sleep 300" });
    await fixture.api().waitFor("doomed", "running");
    const current = await read("doomed");
    const waiting = read("doomed", `?index=${current.index}&wait=30`);
    expect(await pending(waiting, 200)).toBe(true);
    expect((await fixture.engine().call("DELETE", "/api/services/doomed")).status).toBe(200);
    const answer = await waiting;
    // The delete stops the service first: that change, or the deletion itself, ends the wait.
    if (answer.status === 200) expect(answer.body.desired_state).toBe("stopped");
    else expect(answer.status).toBe(404);
    const after = await read("doomed", `?index=${answer.index ?? current.index}&wait=30`);
    expect(after.status).toBe(404);
    expect(after.body.error?.code).toBe("service_not_found");
    expect(after.ms).toBeLessThan(5_000);
  });

  test.each([
    ["a wait of 0", "?index=abc&wait=0", "wait"],
    ["a wait past 300 s", "?index=abc&wait=301", "wait"],
    ["a wait that is not a number", "?index=abc&wait=soon", "wait"],
    ["an index that no answer could have", "?index=ABC-1&wait=5", "index"],
  ])("%s is refused with 422 naming the parameter", async (_what, query, field) => {
    await fixture.api().deployed({ name: "checked", command: "exec sleep 300" });
    const answer = await read("checked", query);
    expect(answer.status).toBe(422);
    const { detail } = answer.body as unknown as { detail: { loc: string[] }[] };
    expect(detail[0]?.loc).toEqual(["query", field]);
  });
});
