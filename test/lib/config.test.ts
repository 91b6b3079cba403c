import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import { defaultDataDir, resolveConfig } from "../../src/lib/config";

describe("config", () => {
  test("defaults: port 9321, loopback, XDG data dir", () => {
    const config = resolveConfig({}, {});
    expect(config.port).toBe(9321);
    expect(config.host).toBe("127.0.0.1");
    expect(config.dataDir).toBe(defaultDataDir());
    expect(config.socketPath).toBe(join(config.dataDir, "engine.sock"));
  });

  test("XDG_DATA_HOME moves the default data dir", () => {
    expect(defaultDataDir({ XDG_DATA_HOME: "/srv/data" })).toBe("/srv/data/engine");
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
  ])("%p is refused naming the field", (input, message) => {
    expect(() => resolveConfig(input, {})).toThrow(message);
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
