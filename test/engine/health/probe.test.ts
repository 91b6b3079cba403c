import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { type HealthSpec, parseHealthShorthand, runProbe, SHORTHAND_DEFAULTS } from "../../../src/engine/health";
import { AppError } from "../../../src/lib/errors";
import { collectOutput, eventually, stopGently, tempDir } from "../../helpers";
import { isAlive, readPids } from "./processes";

const base = { interval_s: 1, timeout_s: 2, failure_threshold: 3 };
const ISO = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/;

let status = 200;
let hang: () => void = () => {};
const hanging = new Promise<void>((resolve) => {
  hang = resolve;
});
let server: ReturnType<typeof Bun.serve>;
let closedPort: number;
let scratch: string;

beforeAll(() => {
  server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(request) {
      const path = new URL(request.url).pathname;
      if (path === "/redirect") return new Response(null, { status: 302, headers: { location: "/missing" } });
      if (path === "/missing") return new Response("gone", { status: 404 });
      if (path === "/slow") await hanging;
      if (path === "/slow-body") {
        // The status and a first chunk come at once; the rest never does.
        const body = new ReadableStream({
          async start(controller) {
            controller.enqueue(new TextEncoder().encode("partial"));
            await hanging;
            controller.close();
          },
        });
        return new Response(body, { status: 200 });
      }
      return new Response(`status ${status}`, { status });
    },
  });
  // A port that was just bound and released has no listener.
  const released = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response() });
  closedPort = released.port!;
  released.stop(true);
  scratch = tempDir("health-probe-");
});

afterAll(() => {
  hang();
  server.stop(true);
  rmSync(scratch, { recursive: true, force: true });
});

afterEach(() => {
  status = 200;
});

const target = () => ({ host: "127.0.0.1", port: server.port! });

describe("http probe", () => {
  test("passes on 200 and reports the status", async () => {
    const result = await runProbe({ ...base, type: "http", path: "/health" }, target());
    expect(result).toMatchObject({ ok: true, detail: "HTTP 200" });
    expect(result.at).toMatch(ISO);
    expect(result.duration_ms).toBeGreaterThanOrEqual(0);
  });

  test("fails on 503", async () => {
    status = 503;
    expect(await runProbe({ ...base, type: "http", path: "/health" }, target())).toMatchObject({ ok: false, detail: "HTTP 503" });
  });

  test("passes on a redirect without following it", async () => {
    expect(await runProbe({ ...base, type: "http", path: "/redirect" }, target())).toMatchObject({ ok: true, detail: "HTTP 302" });
  });

  test("the spec's port overrides the target's", async () => {
    const result = await runProbe({ ...base, type: "http", path: "/", port: server.port! }, { host: "127.0.0.1", port: closedPort });
    expect(result).toMatchObject({ ok: true, detail: "HTTP 200" });
  });

  test("fails with the connect error on a closed port", async () => {
    const result = await runProbe({ ...base, type: "http", path: "/" }, { host: "127.0.0.1", port: closedPort });
    expect(result).toMatchObject({ ok: false, detail: `connect ECONNREFUSED 127.0.0.1:${closedPort}` });
  });

  test("fails after timeout_s when the answer does not come", async () => {
    const result = await runProbe({ ...base, type: "http", path: "/slow", timeout_s: 0.2 }, target());
    expect(result).toMatchObject({ ok: false, detail: "timed out after 200 ms" });
  });

  test("fails after timeout_s when the body does not end", async () => {
    const result = await runProbe({ ...base, type: "http", path: "/slow-body", timeout_s: 0.2 }, target());
    expect(result).toMatchObject({ ok: false, detail: "timed out after 200 ms" });
  });

  test("fails without a port to probe", async () => {
    expect(await runProbe({ ...base, type: "http" }, { host: "127.0.0.1", port: null })).toMatchObject({
      ok: false,
      detail: "no port to probe",
    });
  });

  test("a caller's abort cancels the request", async () => {
    const controller = new AbortController();
    const probing = runProbe({ ...base, type: "http", path: "/slow", timeout_s: 10 }, target(), { signal: controller.signal });
    controller.abort();
    expect(await probing).toMatchObject({ ok: false, detail: "aborted" });
  });
});

describe("http probe of Python's http.server", () => {
  let python: Bun.Subprocess<"ignore", "pipe", "pipe">;
  let output: () => string;
  let port: number;
  let www: string;

  beforeAll(async () => {
    www = join(scratch, "www");
    mkdirSync(www);
    writeFileSync(join(www, "index.html"), "<p>ok</p>");
    // 300 KB is more than one socket buffer: a client that drops the answer unread meets Python mid-write.
    writeFileSync(join(www, "page.bin"), Buffer.alloc(300_000, "a"));
    writeFileSync(join(www, "huge.bin"), Buffer.alloc(2 * 1024 * 1024 + 1, "b"));
    python = Bun.spawn(["python3", "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory", www], {
      stdin: "ignore",
      stdout: "pipe",
      stderr: "pipe",
    });
    output = collectOutput(python);
    const match = await eventually(() => /Serving HTTP on \S+ port (\d+)/.exec(output()), { timeoutMs: 10_000 });
    port = Number(match[1]);
  });

  afterAll(async () => {
    if (python) await stopGently(python);
  });

  /** requestLines counts the requests Python logged for a path. */
  const requestLines = (path: string) =>
    output()
      .split("\n")
      .filter((line) => line.includes(`"GET ${path} HTTP/1.1"`)).length;

  test("20 probes leave no reset or broken pipe in the server's log", async () => {
    const before = requestLines("/page.bin");
    for (let i = 0; i < 20; i++) {
      const path = i % 2 === 0 ? "/page.bin" : "/";
      const result = await runProbe({ ...base, type: "http", path }, { host: "127.0.0.1", port });
      expect(result).toMatchObject({ ok: true, detail: "HTTP 200" });
    }
    await eventually(() => requestLines("/page.bin") === before + 10 && requestLines("/") >= 10);
    // A last request read in full, after every probe: Python has handled the probes by the time it logs it.
    await (await fetch(`http://127.0.0.1:${port}/index.html?last`)).text();
    await eventually(() => requestLines("/index.html?last") === 1);
    expect(output().match(/ConnectionResetError|BrokenPipeError|Connection reset|Traceback|Exception occurred.*/g) ?? []).toEqual([]);
  });

  test("a body past the limit is not read to the end, and the status still decides", async () => {
    const result = await runProbe({ ...base, type: "http", path: "/huge.bin" }, { host: "127.0.0.1", port });
    expect(result).toMatchObject({ ok: true, detail: "HTTP 200 (body over 1048576 bytes: the rest was not read)" });
  });
});

describe("tcp probe", () => {
  test("passes when a listener accepts, and closes the connection", async () => {
    let opened = 0;
    let closed = 0;
    const listener = Bun.listen({
      hostname: "127.0.0.1",
      port: 0,
      socket: {
        open() {
          opened++;
        },
        close() {
          closed++;
        },
        data() {},
      },
    });
    try {
      const result = await runProbe({ ...base, type: "tcp" }, { host: "127.0.0.1", port: listener.port });
      expect(result).toMatchObject({ ok: true, detail: `connected to 127.0.0.1:${listener.port}` });
      await eventually(() => opened === 1 && closed === 1);
    } finally {
      listener.stop(true);
    }
  });

  test("fails on a closed port", async () => {
    const result = await runProbe({ ...base, type: "tcp" }, { host: "127.0.0.1", port: closedPort });
    expect(result).toMatchObject({ ok: false, detail: `connect ECONNREFUSED 127.0.0.1:${closedPort}` });
  });
});

describe("exec probe", () => {
  test.each<[string, HealthSpec["command"], boolean, string]>([
    ["true passes", "true", true, "exit 0"],
    ["false fails", "false", false, "exit 1"],
    ["the first line of output is kept", "echo '  not ready'; echo more; exit 3", false, "exit 3: not ready"],
    ["stderr counts when stdout is empty", "echo broken >&2; exit 2", false, "exit 2: broken"],
    ["an argv runs without a shell", ["/bin/sh", "-c", "exit 4"], false, "exit 4"],
    ["an empty command fails", "  ", false, "no command to run"],
  ])("%s", async (_name, command, ok, detail) => {
    expect(await runProbe({ ...base, type: "exec", command }, { host: "127.0.0.1", port: null })).toMatchObject({ ok, detail });
  });

  test("runs in the target's cwd with its env on top of the daemon's PATH, and nothing else of the daemon's", async () => {
    process.env.ENGINE_PROBE_TEST_SECRET = "daemon-only";
    const result = await runProbe(
      {
        ...base,
        type: "exec",
        command: 'test "$PWD" = "$EXPECTED" && test -n "$PATH" && test -z "$ENGINE_PROBE_TEST_SECRET" && echo "$GREETING"',
      },
      { host: "127.0.0.1", port: null, cwd: scratch, env: { EXPECTED: scratch, GREETING: "hello" } },
    );
    delete process.env.ENGINE_PROBE_TEST_SECRET;
    expect(result).toMatchObject({ ok: true, detail: "exit 0: hello" });
  });

  test("a plain command string runs without the shell, with PWD its cwd as the shell would set it", async () => {
    const result = await runProbe(
      { ...base, type: "exec", command: "printenv PWD GREETING" },
      { host: "127.0.0.1", port: null, cwd: scratch, env: { GREETING: "hello" } },
    );
    expect(result).toMatchObject({ ok: true, detail: `exit 0: ${scratch}` });
    // Run directly, a program that is not there cannot start (through sh it would exit 127).
    const missing = await runProbe({ ...base, type: "exec", command: "no-such-program-here --check" }, { host: "127.0.0.1", port: null });
    expect(missing.ok).toBe(false);
    expect(missing.detail).toStartWith("spawn failed:");
  });

  test("a command that cannot start fails with the reason", async () => {
    const result = await runProbe({ ...base, type: "exec", command: [join(scratch, "no-such-binary")] }, { host: "127.0.0.1", port: null });
    expect(result.ok).toBe(false);
    expect(result.detail).toStartWith("spawn failed:");
  });

  test("sleep 5 with timeout 0.2 times out and leaves no process behind", async () => {
    const pidFile = join(scratch, "timeout.pids");
    // The shell, a background sleep and a foreground sleep: the whole tree must go.
    const command = `echo $$ >> ${pidFile}; sleep 5 & echo $! >> ${pidFile}; sleep 5`;
    const result = await runProbe({ ...base, type: "exec", command, timeout_s: 0.2 }, { host: "127.0.0.1", port: null });
    expect(result).toMatchObject({ ok: false, detail: "timed out after 200 ms" });
    expect(result.duration_ms).toBeLessThan(2000);
    const pids = readPids(pidFile);
    expect(pids).toHaveLength(2);
    await eventually(() => pids.every((pid) => !isAlive(pid)));
  });

  test("a background child left by a passing command is removed too", async () => {
    const pidFile = join(scratch, "background.pids");
    const result = await runProbe(
      { ...base, type: "exec", command: `sleep 5 & echo $! >> ${pidFile}; exit 0` },
      { host: "127.0.0.1", port: null },
    );
    expect(result).toMatchObject({ ok: true, detail: "exit 0" });
    const pids = readPids(pidFile);
    expect(pids).toHaveLength(1);
    await eventually(() => !isAlive(pids[0]!));
  });
});

describe("parseHealthShorthand", () => {
  test.each<[string, number | null, HealthSpec | null]>([
    ["/health", 8000, { type: "http", path: "/health", port: 8000, ...SHORTHAND_DEFAULTS }],
    ["/system_stats", null, { type: "http", path: "/system_stats", ...SHORTHAND_DEFAULTS }],
    ["tcp", 5432, { type: "tcp", port: 5432, ...SHORTHAND_DEFAULTS }],
    [" tcp ", null, { type: "tcp", ...SHORTHAND_DEFAULTS }],
    ["", 8000, null],
  ])("%j on port %p", (text, port, expected) => {
    expect(parseHealthShorthand(text, port)).toEqual(expected);
  });

  test("the defaults are 10 s, 5 s and 3 failures", () => {
    expect(SHORTHAND_DEFAULTS).toEqual({ interval_s: 10, timeout_s: 5, failure_threshold: 3 });
  });

  test("anything else is a template defect", () => {
    expect(() => parseHealthShorthand("udp", 53)).toThrow(AppError);
    expect(() => parseHealthShorthand("health", 53)).toThrow(/neither "", "tcp" nor a path/);
  });
});
