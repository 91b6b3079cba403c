import { expect, test } from "bun:test";
import { proxyEnvironment } from "../../../src/engine/proxy/processes";

test.each([
  ["the daemon's environment says nothing", { PATH: "/usr/bin" }, "-1"],
  ["the operator chose a purge delay", { PATH: "/usr/bin", MIMALLOC_PURGE_DELAY: "10" }, "10"],
])("a proxy process's allocator keeps freed pages when %s", (_case, env, expected) => {
  const child = proxyEnvironment(env);
  expect(child.MIMALLOC_PURGE_DELAY).toBe(expected);
  expect(child.PATH).toBe("/usr/bin");
});
