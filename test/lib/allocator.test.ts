import { expect, test } from "bun:test";
import { allocatorSettled, keepFreedPages } from "../../src/lib/allocator";

test.each([
  ["the daemon's environment says nothing", { PATH: "/usr/bin" }, "-1"],
  ["the operator chose a purge delay", { PATH: "/usr/bin", MIMALLOC_PURGE_DELAY: "10" }, "10"],
])("a process started by the engine keeps its allocator's freed pages when %s", (_case, env, expected) => {
  const child = keepFreedPages(env);
  expect(child.MIMALLOC_PURGE_DELAY).toBe(expected);
  expect(child.PATH).toBe("/usr/bin");
  expect(allocatorSettled(child)).toBe(true);
});

test("a process started with no purge delay has not settled its allocator", () => {
  expect(allocatorSettled({ PATH: "/usr/bin" })).toBe(false);
});
