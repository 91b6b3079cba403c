import { describe, expect, test } from "bun:test";
import { INHERITED_ENV, inheritedEnv, NETWORK_ENV } from "../../src/engine/config";

describe("inheritedEnv", () => {
  // What a run inherits, then what only a build adds, then what nothing inherits.
  const run = { PATH: "/usr/bin", HOME: "/root", LANG: "C.UTF-8", CUDA_HOME: "/usr/local/cuda" };
  const network = { SSH_AUTH_SOCK: "/run/agent", HTTPS_PROXY: "http://proxy:3128" };
  const daemon = { ...run, ...network, ENGINE_ADMIN_TOKEN: "secret-secret-secret", TERM: "xterm", UNSET: undefined };
  test.each([
    ["a run or an exec probe", [], run],
    ["a build, which also fetches", NETWORK_ENV, { ...run, ...network }],
  ] as const)("%s inherits only the listed variables that are set", (_what, extra, expected) => {
    expect(inheritedEnv(daemon, extra)).toEqual(expected);
  });

  test("the daemon's own settings are never in the lists", () => {
    for (const name of [...INHERITED_ENV, ...NETWORK_ENV]) expect(name.startsWith("ENGINE_")).toBe(false);
  });
});
