import { afterEach } from "bun:test";
import {
  chmodSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmdirSync,
  rmSync,
  statSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import { readAdminTokenFile } from "../src/engine/auth";
import { type ConfigInput, resolveConfig } from "../src/engine/config";
import { type DaemonOptions, type RunningDaemon, startDaemon } from "../src/engine/daemon";
import { compileShim, detectCgroupDriver, shimSource } from "../src/engine/supervisor";
import { removeServiceUsersOf } from "../src/engine/users";
import type { Clock } from "../src/lib/clock";

let shimPath: string | undefined;
/** testShim compiles the process shim once per test process, so each test engine need not. */
export function testShim(): string {
  if (shimPath && existsSync(shimPath)) return shimPath;
  const source = shimSource() ?? "";
  const hash = new Bun.CryptoHasher("sha256").update(source).digest("hex").slice(0, 12);
  shimPath = join(tmpdir(), `engine-test-shim-${process.getuid?.() ?? 0}-${hash}`);
  if (!existsSync(shimPath)) compileShim(source, shimPath);
  return shimPath;
}

/**
 * reapWorkloads kills every workload and shim an engine started under `dataDir` and removes
 * their cgroups: engines hand workloads over on stop, so tests must end them themselves.
 */
export function reapWorkloads(dataDir: string): void {
  const runIds: string[] = [];
  for (const file of new Bun.Glob("services/*/runs/*/pids").scanSync({ cwd: dataDir })) {
    const [shim, child] = readFileSync(join(dataDir, file), "utf8").trim().split(" ").map(Number);
    runIds.push(file.split("/")[3] ?? "");
    const kill = (target: number) => {
      try {
        if (target !== 0) process.kill(target, "SIGKILL");
      } catch {
        // already gone
      }
    };
    kill(-(child ?? 0));
    kill(child ?? 0);
    // The shim reaps its workload: killed first, the workload's zombie would go to init, which
    // may reap it late, and userdel refuses a user with a process, zombies included.
    for (let waited = 0; child && existsSync(`/proc/${child}`) && waited < 1000; waited += 10) Bun.sleepSync(10);
    kill(shim ?? 0);
  }
  removeServiceUsers(dataDir);
  const cgroups = detectCgroupDriver();
  if (!cgroups.driver) return;
  for (const runId of runIds) {
    const dir = join(cgroups.driver.parent, runId);
    if (existsSync(dir)) cgroups.driver.remove(dir);
    try {
      rmdirSync(dir);
    } catch {
      // removed
    }
  }
}

/**
 * removeServiceUsers deletes the system users a root engine made for the services of `dataDir`
 * (their home is the service's data dir), so test runs leave no users behind; `only` limits it
 * to the users of those service names. A user whose processes still run, or that another engine
 * reuses, may stay: it is harmless and reused.
 */
export function removeServiceUsers(dataDir: string, only?: string[]): void {
  // The SIGKILLs of reapWorkloads take a moment (up to 2 s) to end the users' processes.
  removeServiceUsersOf(dataDir, { only, waitMs: 2000 });
}

/** nices are the nice values of every thread of `pid`, from /proc (field 19 of each task's stat). */
export function nices(pid: number): number[] {
  return readdirSync(`/proc/${pid}/task`).map((tid) => {
    const stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, "utf8");
    return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[16]);
  });
}

/** alive says whether a process of that pid exists (a zombie still does, until it is reaped). */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** stopGently ends a spawned process with SIGTERM, and SIGKILL if it is still there 10 s later. */
export async function stopGently(proc: Bun.Subprocess): Promise<number> {
  if (proc.exitCode === null) proc.kill("SIGTERM");
  const exited = await Promise.race([proc.exited, Bun.sleep(10000).then(() => null)]);
  if (exited !== null) return exited;
  proc.kill("SIGKILL");
  return proc.exited;
}

/**
 * collectOutput reads a spawned process's stdout and stderr as they come, and returns a
 * function that answers everything read so far (both streams, in arrival order).
 */
export function collectOutput(proc: { stdout: unknown; stderr: unknown }): () => string {
  return collectStreams(proc).all;
}

/** collectStreams is collectOutput that also answers each stream on its own. */
export function collectStreams(proc: { stdout: unknown; stderr: unknown }): { all(): string; stdout(): string; stderr(): string } {
  let text = "";
  const own = { stdout: "", stderr: "" };
  const pump = async (stream: ReadableStream<Uint8Array>, name: "stdout" | "stderr") => {
    const decoder = new TextDecoder();
    const reader = stream.getReader();
    for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) {
      const piece = decoder.decode(chunk.value, { stream: true });
      text += piece;
      own[name] += piece;
    }
  };
  void pump(proc.stdout as ReadableStream<Uint8Array>, "stdout");
  void pump(proc.stderr as ReadableStream<Uint8Array>, "stderr");
  return { all: () => text, stdout: () => own.stdout, stderr: () => own.stderr };
}

/**
 * workloadPath answers a copy of a file of this checkout that any service user can run or
 * read. A root engine runs each workload as its own user (eng-<name>), and a checkout may sit
 * in a private directory (`mktemp -d` makes one 0700), so a fixture program in the checkout,
 * or the Bun binary under node_modules, is out of a workload's reach there, as it would be for
 * a user's program kept in their home. The copy is made once per content, in a directory
 * others may enter, and shared by test processes.
 */
export function workloadPath(file: string): string {
  const stat = statSync(file);
  const dir = join(tmpdir(), "engine-test-workload-files");
  mkdirSync(dir, { recursive: true, mode: 0o755 });
  chmodSync(dir, 0o755);
  const key = new Bun.CryptoHasher("sha256").update(`${file}:${stat.size}:${stat.mtimeMs}`).digest("hex").slice(0, 16);
  const target = join(dir, `${key}-${basename(file)}`);
  if (existsSync(target)) return target;
  const temporary = `${target}.${process.pid}.tmp`;
  copyFileSync(file, temporary);
  chmodSync(temporary, (stat.mode & 0o777 & ~0o022) | 0o444);
  renameSync(temporary, target);
  return target;
}

/** workloadBun is the Bun binary where every service user may run it (see workloadPath). */
export const workloadBun = (): string => workloadPath(process.execPath);

/** eventually polls `check` until it returns a truthy value or the deadline passes. */
export async function eventually<T>(
  check: () => T | Promise<T>,
  { timeoutMs = 5000, intervalMs = 20 } = {},
): Promise<Exclude<T, null | undefined | false | 0 | "">> {
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown;
  while (Date.now() < deadline) {
    try {
      const value = await check();
      if (value) return value as Exclude<T, null | undefined | false | 0 | "">;
    } catch (error) {
      lastError = error;
    }
    await Bun.sleep(intervalMs);
  }
  throw new Error(`condition not met within ${timeoutMs} ms${lastError ? `: ${(lastError as Error).message}` : ""}`);
}

/**
 * waitProxied waits until the proxy's plain-HTTP port answers 200 for `host` (a `.localhost`
 * name) from the upstream fixture (test/fixtures/proxy/upstream.ts) running as `service`. A
 * route is up once its service runs; the upstream listens a moment later, longer on a loaded
 * machine, and the proxy answers 502 meanwhile.
 */
export async function waitProxied(httpPort: number, host: string, service: string, timeoutMs = 30_000): Promise<void> {
  await eventually(
    async () => {
      const response = await fetch(`http://127.0.0.1:${httpPort}/`, { headers: { host } });
      return response.status === 200 && ((await response.json()) as { service?: string }).service === service;
    },
    { timeoutMs },
  );
}

/** handedOutPorts are the ports freePort has answered in this process. */
const handedOutPorts = new Set<number>();

/** freePort returns a TCP port that was free a moment ago, found by listening on port 0, and not answered before in this process. */
export async function freePort(): Promise<number> {
  // A port handed out a moment ago may not be bound yet (a service deployed on it still starts),
  // and the kernel may offer it again: two upstreams of one test then declared the same port
  // and the second deploy was a 409. Each port goes out once per test process.
  for (let attempt = 0; ; attempt++) {
    const server = Bun.serve({ port: 0, fetch: () => new Response() });
    const port = server.port ?? 0;
    server.stop(true);
    if (!handedOutPorts.has(port) || attempt >= 100) {
      handedOutPorts.add(port);
      return port;
    }
  }
}

/**
 * curlVerified fetches `https://host:port/path` with curl, trusting only `caFile` and resolving
 * `host` to loopback, so the TLS server sees `host` as SNI as a real client's would.
 */
export async function curlVerified(
  host: string,
  port: number,
  caFile: string,
  path = "/",
  extra: string[] = [],
): Promise<{ code: number; out: string; err: string }> {
  const proc = Bun.spawn(
    [
      "curl",
      "-sS",
      "--max-time",
      "10",
      "--cacert",
      caFile,
      "--resolve",
      `${host}:${port}:127.0.0.1`,
      ...extra,
      `https://${host}:${port}${path}`,
    ],
    { stdout: "pipe", stderr: "pipe" },
  );
  const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  return { code, out, err };
}

export function tempDir(prefix = "engine-test-"): string {
  return mkdtempSync(join(tmpdir(), prefix));
}

/** MutableClock is a test clock that starts at the real time and can be moved forward. */
export class MutableClock implements Clock {
  offsetMs = 0;
  now(): Date {
    return new Date(Date.now() + this.offsetMs);
  }
  advance(ms: number): void {
    this.offsetMs += ms;
  }
}

export interface TestEngine {
  daemon: RunningDaemon;
  dataDir: string;
  url: string;
  adminToken: string;
  clock: MutableClock;
  call(method: string, path: string, options?: { token?: string | null; body?: unknown; raw?: string }): Promise<Response>;
  json<T = unknown>(
    method: string,
    path: string,
    options?: { token?: string | null; body?: unknown },
  ): Promise<{ status: number; body: T }>;
  close(): Promise<void>;
}

/** startTestEngine starts a real daemon on port 0 in a temp dir; close() stops it and removes the dir. */
export async function startTestEngine(config: ConfigInput = {}, options: DaemonOptions = {}): Promise<TestEngine> {
  const dataDir = config.dataDir ?? tempDir();
  const clock = new MutableClock();
  const daemon = await startDaemon(
    resolveConfig({ port: 0, logLevel: "info", logToStdout: false, shimPath: testShim(), proxy: false, ...config, dataDir }, {}),
    {
      clock,
      restart: () => undefined,
      ...options,
    },
  );
  const adminToken = readAdminTokenFile(dataDir) ?? config.adminToken ?? "";
  const call: TestEngine["call"] = (method, path, options = {}) => {
    const headers: Record<string, string> = {};
    const token = options.token === undefined ? adminToken : options.token;
    if (token !== null) headers.authorization = `Bearer ${token}`;
    let body: string | undefined;
    if (options.raw !== undefined) body = options.raw;
    else if (options.body !== undefined) body = JSON.stringify(options.body);
    if (body !== undefined) headers["content-type"] = "application/json";
    return fetch(`${daemon.url}${path}`, { method, headers, body });
  };
  return {
    daemon,
    dataDir,
    url: daemon.url,
    adminToken,
    clock,
    call,
    async json(method, path, options) {
      const response = await call(method, path, options);
      const text = await response.text();
      return { status: response.status, body: (text ? JSON.parse(text) : undefined) as never };
    },
    async close() {
      await daemon.stop();
      reapWorkloads(dataDir);
      if (!config.dataDir) rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** createToken makes a token through the API and returns its secret and id. */
export async function createToken(engine: TestEngine, body: Record<string, unknown>): Promise<{ id: string; secret: string }> {
  const { status, body: created } = await engine.json<{ id: string; token: string }>("POST", "/api/tokens", { body });
  if (status !== 201) throw new Error(`token creation failed with ${status}: ${JSON.stringify(created)}`);
  return { id: created.id, secret: created.token };
}

export const REPO_ROOT = join(import.meta.dir, "..");

export interface SpawnedEngine {
  proc: ReturnType<typeof Bun.spawn>;
  port: number;
  url: string;
  /** output is stdout and stderr together, in arrival order; stderr is the human lines alone. */
  output(): string;
  stderr(): string;
  stop(): Promise<number>;
}

/** ENGINE_ENTRY runs the CLI from source, as `npm start` does. */
export const ENGINE_ENTRY = [process.execPath, join(REPO_ROOT, "cli", "engine.ts")];

/**
 * spawnEngine starts `engine serve` as a real process and waits for its "listening" line.
 * `command` defaults to the source CLI; pass a compiled binary's path to test that instead.
 */
export async function spawnEngine(
  dataDir: string,
  {
    command = ENGINE_ENTRY,
    env = {},
    args = [],
    startTimeoutMs = 20000,
  }: { command?: string[]; env?: Record<string, string>; args?: string[]; startTimeoutMs?: number } = {},
): Promise<SpawnedEngine> {
  const proc = Bun.spawn([...command, "serve", "--data-dir", dataDir, "--port", "0", ...args], {
    env: {
      PATH: process.env.PATH ?? "/usr/bin:/bin",
      HOME: process.env.HOME ?? "/tmp",
      ENGINE_SHIM: testShim(),
      ENGINE_PROXY: "off",
      ...env,
    },
    stdout: "pipe",
    stderr: "pipe",
  });
  const streams = collectStreams(proc);
  const textOf = streams.all;
  const port = await eventually(
    () => {
      if (proc.exitCode !== null) throw new Error(`engine exited with ${proc.exitCode}: ${textOf()}`);
      const match = /"msg":"listening"/.test(textOf())
        ? /"port":(\d+)/.exec(textOf().slice(Math.max(0, textOf().lastIndexOf('"msg":"listening"') - 400)))
        : null;
      return match ? Number(match[1]) : 0;
    },
    { timeoutMs: startTimeoutMs },
  ).catch((error) => {
    proc.kill("SIGKILL"); // an engine that did not start in time is not left running
    throw error;
  });
  return {
    proc,
    port,
    url: `http://127.0.0.1:${port}`,
    output: textOf,
    stderr: streams.stderr,
    stop: () => stopGently(proc),
  };
}

/** runCli runs one CLI command to completion and returns its exit code and output. */
export async function runCli(args: string[], env: Record<string, string> = {}, command = ENGINE_ENTRY) {
  const proc = Bun.spawn([...command, ...args], {
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: process.env.HOME ?? "/tmp", ...env },
    stdout: "pipe",
    stderr: "pipe",
  });
  const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  return { code, stdout, stderr };
}

/**
 * engineScratch gives a test file data dirs and spawned engines that are cleaned up after each
 * test, in reverse order, every step even when one fails (so a failed stop never leaks
 * workloads): `scratch()` a data dir (workloads reaped, then removed), `started(dir)` an
 * `engine serve` on it (stopped), `defer(fn)` anything else.
 */
export function engineScratch(prefix: string) {
  const cleanups: (() => unknown)[] = [];
  afterEach(async () => {
    let failure: unknown;
    while (cleanups.length > 0) {
      try {
        await cleanups.pop()?.();
      } catch (error) {
        failure ??= error;
      }
    }
    if (failure) throw failure;
  });
  return {
    defer(cleanup: () => unknown): void {
      cleanups.push(cleanup);
    },
    scratch(): string {
      const dir = tempDir(prefix);
      cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
      cleanups.push(() => reapWorkloads(dir));
      return dir;
    },
    async started(dataDir: string): Promise<SpawnedEngine> {
      const engine = await spawnEngine(dataDir);
      cleanups.push(() => engine.stop());
      return engine;
    },
  };
}
