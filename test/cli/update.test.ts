import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { flagFor, patchBody } from "../../cli/commands/services";
import type { ProxyStatus, ServiceRecord } from "../../src/contract/engine";
import { RedisEngine } from "../../src/engine/databases";
import { createToken, eventually, runCli, startTestEngine, type TestEngine } from "../helpers";

let engine: TestEngine;
beforeAll(async () => {
  // The proxy is on (on ports of its own), so `services show` has HTTPS names to list.
  engine = await startTestEngine({ proxy: true, httpsPort: 0, httpPort: 0, proxyProcesses: 1, mdns: "off", hostname: "mybox" });
});
afterAll(async () => {
  await engine.call("POST", "/api/services/cache/stop");
  await engine.close();
});

const cli = (...args: string[]) => runCli(["--data-dir", engine.dataDir, ...args]);
const record = async (name: string) => (await engine.json<ServiceRecord>("GET", `/api/services/${name}`)).body;
const running = (name: string) => eventually(async () => (await record(name)).status === "running", { timeoutMs: 20_000 });

describe("engine services update", () => {
  test("changes only what it is given, says the new version, and keeps the rest", async () => {
    const deployed = await cli(
      "services",
      "deploy",
      "tuned",
      "--memory-mb",
      "64",
      "--env",
      "KEEP=1",
      "--env",
      "DROP=1",
      "--",
      "sleep",
      "300",
    );
    expect(deployed.code).toBe(0);
    await running("tuned");
    const first = await record("tuned");

    const updated = await cli("services", "update", "tuned", "--memory-mb", "400", "--env", "ADDED=2", "--unset-env", "DROP");
    expect(updated).toMatchObject({ code: 0, stderr: "" });
    expect(updated.stdout).toMatch(/^updated tuned to version 2 \(svc_\S+\): \w+/);
    const second = await record("tuned");
    expect(second).toMatchObject({ version: 2, memory_mb: 400, env: { KEEP: "1", ADDED: "2" }, command: first.command });
    await eventually(async () => {
      const now = await record("tuned");
      return now.status === "running" && now.pid !== first.pid;
    });

    const unchanged = await cli("services", "update", "tuned", "--memory-mb", "400");
    expect(unchanged).toMatchObject({ code: 0, stdout: "tuned unchanged: version 2 already has these settings\n" });

    const cleared = await cli("--json", "services", "update", "tuned", "--clear", "memory-mb");
    expect(cleared.code).toBe(0);
    expect(JSON.parse(cleared.stdout)).toMatchObject({ name: "tuned", version: 3, memory_mb: null });
    expect((await cli("services", "show", "tuned")).stdout).toMatch(/^memory\s+no limit$/m);
  }, 30_000);

  test("--health-start-period alone changes only the current probe's start period", async () => {
    expect((await cli("services", "deploy", "probed", "--port", "18978", "--health", "tcp", "--", "sleep", "300")).code).toBe(0);
    const updated = await cli("services", "update", "probed", "--health-start-period", "60");
    expect(updated.code).toBe(0);
    expect((await record("probed")).health).toMatchObject({ type: "tcp", start_period_s: 60, interval_s: 10 });
    await cli("services", "rm", "probed");
  });

  test("a deploy that leaves out the command of a service that exists points to update", async () => {
    const result = await cli("services", "deploy", "tuned", "--memory-mb", "400");
    expect(result.code).toBe(1);
    expect(result.stderr).toContain("engine: command: give a command");
    expect(result.stderr).toContain("tuned exists: to change only some of its settings, use engine services update tuned");
  });

  test("update takes deploy's flags for settings, not for what the service is", async () => {
    const result = await cli("services", "update", "tuned", "--kind", "batch");
    expect(result.code).toBe(1);
    expect(result.stderr).toContain("unknown option '--kind'");
  });

  test.each([
    [["services", "update", "tuned", "--memory-mb", "1"], "engine: --memory-mb: Input should be greater than or equal to 4 [validation]\n"],
    [
      ["services", "update", "tuned", "--health", "tcp"],
      "engine: --port: a tcp health check needs a port to probe: give the service its port (or the check one of its own) [validation]\n",
    ],
    [
      ["services", "update", "tuned", "--health", "tcp:70000"],
      "engine: --health: Input should be less than or equal to 65535 [validation]\n",
    ],
    [
      ["services", "update", "tuned", "--env", "EXTRA=1", "--", "/no/such/program"],
      "engine: command: the command /no/such/program does not exist (looked for /no/such/program) [validation]\n",
    ],
    [["services", "update", "tuned"], "engine: give at least one setting to change (see engine services update --help)\n"],
    [["services", "update", "tuned", "--memory-mb", "8", "--clear", "memory-mb"], "engine: --memory-mb is both set and cleared\n"],
    [["services", "update", "tuned", "--env", "A=1", "--unset-env", "A"], "engine: --env and --unset-env both name A\n"],
    [["services", "update", "nope", "--memory-mb", "8"], 'engine: no service named or with id "nope" [service_not_found]\n'],
  ])("user error %p is one line in the flags' words, exit 1, and changes nothing", async (args, message) => {
    const before = await record("tuned");
    expect(await cli(...args)).toMatchObject({ code: 1, stderr: message });
    expect((await record("tuned")).version).toBe(before.version);
  });

  test("--clear names the settings it resets when given another", async () => {
    const result = await cli("services", "update", "tuned", "--clear", "kind");
    expect(result.code).toBe(1);
    expect(result.stderr).toMatch(/^engine: --clear takes gpus, gpu-memory-mb, memory-mb, port, .* \(got "kind"\)\n$/);
  });
});

describe("engine services show", () => {
  test("lists the HTTPS names the proxy serves the service at", async () => {
    expect((await cli("services", "deploy", "web", "--port", "18977", "--", "sleep", "300")).code).toBe(0);
    const proxy = (await engine.json<ProxyStatus>("GET", "/api/proxy/status")).body;
    const port = proxy.https_port === 443 ? "" : `:${proxy.https_port}`;
    const shown = await cli("services", "show", "web");
    expect(shown.code).toBe(0);
    expect(shown.stdout).toMatch(new RegExp(`^https\\s+https://web-mybox\\.local${port}/\\n\\s+https://web\\.localhost${port}/$`, "m"));
    const portless = await cli("services", "show", "tuned");
    expect(portless.stdout).toMatch(/^https\s+- \(no port: the proxy routes services that declare one\)$/m);
    await cli("services", "stop", "web");
  });

  const redis = new RedisEngine().detectTools({ PATH: process.env.PATH ?? "" }).missing.length === 0;
  (redis ? test : test.skip)(
    "a database's connection is shown with its password masked; --reveal shows it to an admin and refuses others plainly",
    async () => {
      const password = "cli-reveal-pw-123";
      expect((await cli("services", "deploy", "cache", "--engine", "redis", "--secret", `REDIS_PASSWORD=${password}`)).code).toBe(0);
      await running("cache");
      const port = (await record("cache")).port;
      const masked = await cli("services", "show", "cache");
      expect(masked.stdout).toMatch(new RegExp(`^connection\\s+redis://:\\*\\*\\*\\*@127\\.0\\.0\\.1:${port}/0$`, "m"));
      expect(masked.stdout).not.toContain(password);
      // A database speaks its own protocol: the proxy gives it no HTTPS name.
      expect(masked.stdout).toMatch(/^https\s+- \(a database: clients connect to its port; see connection\)$/m);

      // A Redis server runs as the service's own user under a root engine, as every other service does.
      expect(masked.stdout).toMatch(process.geteuid?.() === 0 ? /^user\s+eng-cache$/m : /^user\s+the engine's$/m);
      const revealed = await cli("services", "show", "cache", "--reveal");
      expect(revealed.stdout).toMatch(new RegExp(`^connection\\s+redis://:${password}@127\\.0\\.0\\.1:${port}/0$`, "m"));
      const json = JSON.parse((await cli("--json", "services", "show", "cache", "--reveal")).stdout) as ServiceRecord & {
        connection: { url: string; password: string };
      };
      expect(json.connection).toMatchObject({ engine: "redis", password, url: `redis://:${password}@127.0.0.1:${port}/0` });

      for (const role of ["submitter", "readonly"]) {
        const token = (await createToken(engine, { name: `cli-${role}`, role })).secret;
        const asRole = (...args: string[]) => runCli(["--url", engine.url, "--token", token, ...args]);
        const refused = await asRole("services", "show", "cache", "--reveal");
        expect(refused).toMatchObject({ code: 1, stdout: "" });
        expect(refused.stderr).toBe(
          "engine: --reveal needs an admin token: the connection URL holds the database's password, which only an admin may read (without --reveal it is shown masked) [forbidden]\n",
        );
        const shown = await asRole("services", "show", "cache");
        expect(shown.code).toBe(0);
        expect(shown.stdout).toContain("redis://:****@");
      }
    },
    60_000,
  );

  test("--reveal on a service that is not a database says so", async () => {
    const result = await cli("services", "show", "tuned", "--reveal");
    expect(result).toMatchObject({
      code: 1,
      stderr: "engine: tuned is a service, not a database: it has no connection details [not_a_database]\n",
    });
  });
});

describe("the update's request and the flags an error names", () => {
  test.each([
    ["one setting", [], { memoryMb: "400" }, { memory_mb: 400 }],
    ["env set and removed, key by key", [], { env: ["A=1"], unsetEnv: ["B"] }, { env: { A: "1", B: null } }],
    ["a secret removed", [], { unsetSecret: ["TOKEN"] }, { secrets: { TOKEN: null } }],
    ["a setting reset", [], { clear: ["memory-mb", "--port", "repo"] }, { memory_mb: null, port: null, build: null }],
    ["one restart field", [], { maxRestarts: "9" }, { restart: { max_restarts: 9 } }],
    ["a new command after --", ["python3", "app.py"], {}, { command: ["python3", "app.py"] }],
    ["no health check", [], { health: "none" }, { health: null }],
    [
      "a new ref of the current build",
      [],
      { ref: "v2" },
      { build: { repo_url: "https://example.com/app.git", ref: "v2", command: "make" } },
    ],
  ] as const)("%s", (_label, argv, options, expected) => {
    const build = { repo_url: "https://example.com/app.git", ref: "main", command: "make" };
    expect(patchBody([...argv], options as never, build)).toEqual(expected as never);
  });

  test.each([
    [["body", "memory_mb"], {}, "--memory-mb"],
    [["body", "restart", "window_seconds"], {}, "--window-seconds"],
    [["body", "env", "GREETING"], {}, "--env GREETING"],
    [["body", "secrets", "TOKEN"], {}, "--secret TOKEN"],
    [["body", "health", "port"], { health: { type: "tcp" } }, "--port"],
    [["body", "health", "port"], { health: { type: "tcp", port: 70000 } }, "--health"],
    [["body", "health", "command"], { health: { type: "exec" } }, "--health"],
    [["body", "build", "subdir"], {}, "--subdir"],
    [["body", "bindings", 0], {}, "--bind"],
    [["body", "command"], { command: "sh -c x" }, "--command"],
    [["body", "command"], { command: ["x"] }, "command"],
    [["body", "stop_timeout_s"], {}, "stop_timeout_s"],
  ] as const)("%p is named %p", (loc, sent, flag) => {
    expect(flagFor([...loc], sent as Record<string, unknown>)).toBe(flag);
  });
});
