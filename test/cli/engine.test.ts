import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { STORE_MIGRATIONS } from "../../src/engine/store";
import { VERSION } from "../../src/lib/version";
import { eventually, REPO_ROOT, reapWorkloads, runCli, type SpawnedEngine, spawnEngine, tempDir } from "../helpers";

let engine: SpawnedEngine;
let dataDir: string;
beforeAll(async () => {
  dataDir = tempDir();
  engine = await spawnEngine(dataDir);
});
afterAll(async () => {
  await engine.stop();
  reapWorkloads(dataDir); // and the users a root engine made for the services deployed here
  rmSync(dataDir, { recursive: true, force: true });
});

const cli = (...args: string[]) => runCli(["--data-dir", dataDir, ...args]);

describe("engine CLI", () => {
  test("tokens create / list / revoke over the unix socket, human and --json", async () => {
    const created = await cli(
      "--json",
      "tokens",
      "create",
      "ci",
      "--role",
      "submitter",
      "--max-gpus",
      "2",
      "--scope",
      "web,db",
      "--expires-in",
      "30d",
    );
    expect(created.code).toBe(0);
    const record = JSON.parse(created.stdout) as {
      id: string;
      token: string;
      scope_services: string[];
      max_gpus: number;
      expires_at: string;
    };
    expect(record.token).toStartWith("eng_");
    expect(record).toMatchObject({ scope_services: ["web", "db"], max_gpus: 2 });
    expect(Date.parse(record.expires_at) - Date.now()).toBeGreaterThan(29 * 86400_000);

    const table = await cli("tokens", "list");
    expect(table.code).toBe(0);
    expect(table.stdout.split("\n")[0]).toMatch(/^ID\s+NAME\s+ROLE\s+STATE/);
    expect(table.stdout).toContain("ci");
    expect(table.stdout).not.toContain(record.token);

    const revoked = await cli("tokens", "revoke", "ci");
    expect(revoked).toMatchObject({ code: 0, stdout: `revoked ci (${record.id})\n` });
    const json = JSON.parse((await cli("--json", "tokens", "list")).stdout) as { id: string; revoked: boolean }[];
    expect(json.find((t) => t.id === record.id)?.revoked).toBe(true);
  });

  test("templates list / show", async () => {
    const list = await cli("templates", "list");
    expect(list.code).toBe(0);
    expect(list.stdout).toContain("vllm");
    const show = await cli("templates", "show", "vllm");
    expect(show.code).toBe(0);
    expect(show.stdout).toMatch(/^id\s+vllm$/m);
    expect(show.stdout).toContain("https://github.com/vllm-project/vllm");
    const json = JSON.parse((await cli("--json", "templates", "show", "redis")).stdout) as { id: string };
    expect(json.id).toBe("redis");
  });

  test("HTTP with a token instead of the socket: --url and --token", async () => {
    const token = (await Bun.file(join(dataDir, "admin.token")).text()).trim();
    const ok = await runCli(["--url", engine.url, "--token", token, "--json", "tokens", "list"]);
    expect(ok.code).toBe(0);
    const bad = await runCli(["--url", engine.url, "--token", "eng_wrong", "tokens", "list"]);
    expect(bad).toMatchObject({ code: 1, stderr: "engine: the bearer token is not valid [invalid_token]\n" });
  });

  test("version reports the CLI, its store schema and the daemon", async () => {
    const version = await cli("--json", "version");
    expect(JSON.parse(version.stdout)).toEqual({
      cli: VERSION,
      daemon: VERSION,
      store_schema: STORE_MIGRATIONS.at(-1),
      store_migrations: [...STORE_MIGRATIONS],
    });
    // --no-daemon asks nothing of a daemon: what `engine upgrade` runs on a new binary.
    const local = await runCli(["--url", "http://127.0.0.1:9", "--json", "version", "--no-daemon"]);
    expect(local.code).toBe(0);
    expect(JSON.parse(local.stdout)).toEqual({
      cli: VERSION,
      store_schema: STORE_MIGRATIONS.at(-1),
      store_migrations: [...STORE_MIGRATIONS],
    });
    const human = await runCli(["--url", "http://127.0.0.1:9", "version", "--no-daemon"]);
    expect(human.stdout).toBe(`engine ${VERSION}, store schema ${STORE_MIGRATIONS.at(-1)}\n`);
  });

  test.each([
    [["templates", "show", "nope"], 'engine: no app template with id "nope" [template_not_found]\n'],
    [["tokens", "create", "x", "--role", "root"], "engine: role: Input should be 'admin', 'submitter' or 'readonly' [validation]\n"],
    [["tokens", "create", "x", "--max-gpus", "two"], 'engine: --max-gpus takes a whole number (got "two")\n'],
    [["tokens", "revoke", "ghost"], 'engine: no active token named "ghost" [token_not_found]\n'],
  ])("user error %p is one line and exit 1", async (args, message) => {
    const result = await cli(...args);
    expect(result).toMatchObject({ code: 1, stderr: message });
  });

  test("a daemon that is not running is a clear error", async () => {
    const empty = tempDir();
    const result = await runCli(["--data-dir", empty, "--url", "http://127.0.0.1:1", "tokens", "list"]);
    expect(result.code).toBe(1);
    expect(result.stderr).toStartWith("engine: cannot reach the engine at http://127.0.0.1:1: is `engine serve` running?");
    rmSync(empty, { recursive: true, force: true });
  });

  test.each([
    [["servics"], "error: unknown command 'servics'\n(Did you mean services?)\n(run 'engine --help' for usage)\n"],
    [["services", "lst"], "error: unknown command 'lst'\n(Did you mean list?)\n(run 'engine services --help' for usage)\n"],
    [["tokens", "create"], "error: missing required argument 'name'\n(run 'engine tokens create --help' for usage)\n"],
  ])("a usage error (%p) ends with its hint and where the help is, not the whole help", async (args, stderr) => {
    const result = await cli(...args);
    expect(result.code).toBe(1);
    expect(result.stderr).toBe(stderr);
    expect(result.stdout).toBe("");
  });

  test("`npx engine` runs the CLI from the clone, as the README says", async () => {
    const npx = Bun.spawn(["npx", "--no-install", "engine", "--help"], {
      cwd: REPO_ROOT,
      env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: process.env.HOME ?? "/tmp" },
      stdout: "pipe",
      stderr: "pipe",
    });
    const [stdout, code] = await Promise.all([new Response(npx.stdout).text(), npx.exited]);
    expect(code).toBe(0);
    expect(stdout).toContain("Usage: engine");
  });
});

describe("the engine binary's entry", () => {
  // `engine __proxy` is a proxy process (the compiled binary's fallback, decision 487), and a
  // bundle evaluates every static import at start: one static import in the entry loads the
  // whole CLI into each such process (a heap three times the size, docs/decisions.md 484).
  test("imports nothing statically, so a proxy process loads only the proxy's modules", async () => {
    const source = await Bun.file(join(REPO_ROOT, "cli", "engine.ts")).text();
    // The shebang line is for the shell; the transpiler reads the module after it.
    const transpiled = new Bun.Transpiler({ loader: "ts" }).scanImports(source.replace(/^#!.*\n/, ""));
    expect(transpiled.filter((entry) => entry.kind === "import-statement")).toEqual([]);
    expect(transpiled.map((entry) => entry.path).sort()).toEqual(["../src/engine/daemon/reexec", "../src/engine/proxy/main", "./program"]);
  });
});

describe("the daemon's allocator (decision 526)", () => {
  const environ = (pid: number) => readFileSync(`/proc/${pid}/environ`, "utf8").split("\0");

  test("a daemon started without the setting runs, as the pid that was started, with its allocator keeping freed pages", () => {
    // spawnEngine starts `engine serve` with PATH and HOME only, as a shell would without the variable.
    expect(environ(engine.proc.pid)).toContain("MIMALLOC_PURGE_DELAY=-1");
  });

  test("the operator's own purge delay is kept", async () => {
    const otherDir = tempDir();
    const other = await spawnEngine(otherDir, { env: { MIMALLOC_PURGE_DELAY: "25" } });
    try {
      expect(environ(other.proc.pid)).toContain("MIMALLOC_PURGE_DELAY=25");
      expect(environ(other.proc.pid)).not.toContain("MIMALLOC_PURGE_DELAY=-1");
    } finally {
      await other.stop();
      rmSync(otherDir, { recursive: true, force: true });
    }
  });

  test("workloads do not inherit the daemon's allocator setting", async () => {
    const name = "allocator-env";
    const script = "echo purge=$" + "{MIMALLOC_PURGE_DELAY:-unset}"; // the shell's expansion, not the test's
    const deployed = await cli("services", "deploy", name, "--kind", "batch", "--wait", "30", "--command", script);
    expect(deployed.code).toBe(0);
    const logs = await eventually(async () => {
      const { stdout } = await cli("logs", "--raw", name);
      return stdout.includes("purge=") ? stdout : null;
    });
    expect(logs).toContain("purge=unset");
  });
});
