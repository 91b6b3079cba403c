import { afterAll, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { PRESTART_HOOKS, type PrestartHook, runPrestart } from "../../../../src/engine/scheduler/hooks";
import { tempDir } from "../../../helpers";
import { hostOf, launchOf } from "./launch";

const root = tempDir();
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** gate is a promise the test settles by hand: a hook's wait on the disk, held open. */
function gate(): { wait: Promise<void>; open(): void; fail(error: Error): void } {
  const { promise, resolve, reject } = Promise.withResolvers<void>();
  return { wait: promise, open: () => resolve(), fail: reject };
}

/** hook is a prestart hook that says when it began and ended into `events`, waiting on `until` in between. */
function hook(name: string, events: string[], until: Promise<void> = Promise.resolve()): PrestartHook {
  return {
    name,
    async run() {
      events.push(`${name} began`);
      await until;
      events.push(`${name} ended`);
    },
  };
}

test("the data dir and the user are one stage, before the workdir, the database and the command", () => {
  expect(PRESTART_HOOKS.map((stage) => stage.map((one) => one.name))).toEqual([
    ["directories", "user"],
    ["workdir"],
    ["database"],
    ["command"],
  ]);
});

test("a stage's hooks run together, and the next stage begins once all of them have ended", async () => {
  const events: string[] = [];
  const slow = gate();
  const run = runPrestart(launchOf(root), hostOf(root), [[hook("a", events, slow.wait), hook("b", events)], [hook("c", events)]]);
  await Bun.sleep(0);
  // b began while a waited, and ended before it; c waits for a.
  expect(events).toEqual(["a began", "b began", "b ended"]);
  slow.open();
  await run;
  expect(events).toEqual(["a began", "b began", "b ended", "a ended", "c began", "c ended"]);
});

test("a stage that fails is thrown once all its hooks have ended, the first in the stage's order, and no later stage runs", async () => {
  const events: string[] = [];
  const first = gate();
  const second = gate();
  const run = runPrestart(launchOf(root), hostOf(root), [
    [hook("a", events, first.wait), hook("b", events, second.wait)],
    [hook("c", events)],
  ]);
  let settled = false;
  void run.catch(() => undefined).finally(() => (settled = true));
  second.fail(new Error("b failed"));
  await Bun.sleep(0);
  // b has failed, a still works: the launch is not over yet.
  expect(settled).toBe(false);
  first.fail(new Error("a failed"));
  await expect(run).rejects.toThrow("a failed");
  expect(events).toEqual(["a began", "b began"]);
});
