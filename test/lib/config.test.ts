import { describe, expect, test } from "bun:test";
import { homedir } from "node:os";
import { join } from "node:path";
import { resolveCloudConfig } from "../../src/cloud/config";
import { chooseDataDir, defaultDataDir, resolveConfig } from "../../src/engine/config";
import { userDataDir } from "../../src/lib/config";

describe("config", () => {
  test("defaults: port 9321, loopback, XDG data dir", () => {
    const config = resolveConfig({}, {});
    expect(config.port).toBe(9321);
    expect(config.host).toBe("127.0.0.1");
    expect(config.dataDir).toBe(defaultDataDir());
    expect(config.socketPath).toBe(join(config.dataDir, "engine.sock"));
  });

  test("XDG_DATA_HOME moves the default data dir of an unprivileged engine", () => {
    expect(defaultDataDir({ XDG_DATA_HOME: "/srv/data" }, 1000)).toBe("/srv/data/engine");
    expect(defaultDataDir({}, 1000)).toBe(join(homedir(), ".local", "share", "engine"));
  });

  const legacy = join(homedir(), ".local", "share", "engine");
  const cases: [string, Record<string, number>, string, boolean, Record<string, string>][] = [
    ["a fresh machine", {}, "/var/lib/engine", false, {}],
    ["a sudo -E that kept a user's XDG_DATA_HOME", {}, "/var/lib/engine", false, { XDG_DATA_HOME: "/home/alice/.local/share" }],
    [
      "a sudo -E onto a user's existing data dir (never taken over)",
      { "/home/alice/.local/share/engine": 1000 },
      "/var/lib/engine",
      false,
      { XDG_DATA_HOME: "/home/alice/.local/share" },
    ],
    ["an install that already uses /var/lib/engine", { "/var/lib/engine": 0 }, "/var/lib/engine", false, {}],
    ["both dirs (the system one wins)", { "/var/lib/engine": 0, [legacy]: 0 }, "/var/lib/engine", false, {}],
    ["an older root install in root's XDG dir", { [legacy]: 0 }, legacy, true, {}],
  ];
  test.each(cases)("as root, %s: the data dir is the expected one", (_case, owners, expected, warned, env) => {
    const choice = chooseDataDir(env, 0, (path) => owners[path] ?? null);
    expect(choice.path).toBe(expected);
    if (warned) {
      expect(choice.warning).toContain(`mv ${legacy} /var/lib/engine`);
      expect(choice.warning).toContain(`ENGINE_DATA_DIR=${legacy}`);
    } else {
      expect(choice.warning).toBeUndefined();
    }
  });

  test("an explicit data dir is used as given, with no warning", () => {
    const config = resolveConfig({ dataDir: "/tmp/given" }, {});
    expect(config).toMatchObject({ dataDir: "/tmp/given", dataDirWarning: undefined });
  });

  test("the console keeps its XDG data dir, as root too", () => {
    expect(resolveCloudConfig({}, {}).dataDir).toBe(userDataDir(process.env, "engine-cloud"));
  });

  test("flags override the environment", () => {
    const config = resolveConfig({ port: "8080", dataDir: "/tmp/a" }, { port: "9000", dataDir: "/tmp/b", logLevel: "debug" });
    expect(config).toMatchObject({ port: 8080, dataDir: "/tmp/a", logLevel: "debug" });
  });

  test.each([
    [{ port: "-1" }, "config: port"],
    [{ port: "1e3" }, "config: port"],
    [{ host: "bad host" }, "config: host"],
    [{ logLevel: "verbose" }, "config: log_level"],
    [{ dataDir: `/tmp/${"d".repeat(120)}` }, "config: data_dir"],
    [{ mcpAllowedHosts: "https://gpu.example.com" }, "config: mcp_allowed_hosts"],
    [{ mcpAllowedHosts: "gpu.example.com:9321" }, "config: mcp_allowed_hosts"],
  ])("%p is refused naming the field", (input, message) => {
    expect(() => resolveConfig(input, {})).toThrow(message);
  });

  test("ENGINE_MCP_ALLOWED_HOSTS names hosts /mcp answers to, lower-cased", () => {
    expect(resolveConfig({}, {}).mcpAllowedHosts).toEqual([]);
    expect(resolveConfig({}, { mcpAllowedHosts: "GPU.example.com, box ,[fd00::1]" }).mcpAllowedHosts).toEqual([
      "gpu.example.com",
      "box",
      "[fd00::1]",
    ]);
  });

  test("ENGINE_PROXY_CPU_AFFINITY pins the proxy's processes unless it says off; anything else is refused by name", () => {
    expect(resolveConfig({}, {}).proxy.cpuAffinity).toBe("auto");
    expect(resolveConfig({}, { proxyCpuAffinity: "off" }).proxy.cpuAffinity).toBe("off");
    expect(() => resolveConfig({}, { proxyCpuAffinity: "0-3" })).toThrow("proxy_cpu_affinity: must be auto or off");
  });

  test("a bad ENGINE_ADMIN_TOKEN is refused without echoing it", () => {
    try {
      resolveConfig({}, { adminToken: "tiny secret" });
      throw new Error("accepted");
    } catch (error) {
      expect((error as Error).message).toContain("admin_token");
      expect((error as Error).message).not.toContain("tiny secret");
    }
  });
});
