import { plainCommand, shellCommand } from "../../lib/shell";
import { inheritedEnv } from "../config";
import { asWorkloadUser } from "../users";
import type { HealthSpec, ProbeResult, ProbeTarget } from "./spec";

/** ProbeOptions lets a caller cancel a probe in flight. */
export interface ProbeOptions {
  /** signal cancels the probe: a request is aborted, a connection dropped, an exec probe's process group killed. */
  signal?: AbortSignal;
}

/**
 * The most body an http probe reads. It reads the whole answer so the connection ends cleanly;
 * a longer one is cut there, which resets the connection (decision 170).
 */
const HTTP_BODY_LIMIT = 1024 * 1024;
/** The most output an exec probe keeps per stream; the rest is read and dropped so the child never blocks on a full pipe. */
const EXEC_OUTPUT_LIMIT = 4096;
/** How long an exec probe waits for its pipes to close after the process group is gone (a child that escaped the group may hold them). */
const PIPE_GRACE_MS = 100;
const DETAIL_LIMIT = 200;

interface Outcome {
  ok: boolean;
  detail: string;
}

/**
 * Deadline combines the probe's timeout and the caller's signal into one AbortSignal and
 * remembers which of the two fired, so the detail can say "timed out" or "aborted".
 */
class Deadline {
  readonly controller = new AbortController();
  #timedOut = false;
  #timer: ReturnType<typeof setTimeout>;
  #external?: AbortSignal;
  #onExternalAbort = () => this.controller.abort();

  constructor(
    readonly timeoutMs: number,
    external?: AbortSignal,
  ) {
    this.#timer = setTimeout(() => {
      this.#timedOut = true;
      this.controller.abort();
    }, timeoutMs);
    this.#external = external;
    if (external?.aborted) this.controller.abort();
    else external?.addEventListener("abort", this.#onExternalAbort, { once: true });
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** fired resolves when the deadline passes or the caller aborts. */
  fired(): Promise<void> {
    if (this.signal.aborted) return Promise.resolve();
    return new Promise((resolve) => this.signal.addEventListener("abort", () => resolve(), { once: true }));
  }

  describe(): string {
    return this.#timedOut ? `timed out after ${this.timeoutMs} ms` : "aborted";
  }

  dispose(): void {
    clearTimeout(this.#timer);
    this.#external?.removeEventListener("abort", this.#onExternalAbort);
  }
}

/**
 * runProbe probes a target once and never throws. An http probe GETs
 * `http://host:port<path>` without following redirects, reads the answer to its end (at most
 * HTTP_BODY_LIMIT of it) on a connection of its own and passes on 200–399; a tcp probe
 * passes when a connection opens, and closes it at once; an exec probe runs the command in its
 * own process group with the target's cwd and env and passes on exit 0. A probe that outlives
 * `timeout_s` fails with "timed out after N ms"; an exec probe's whole process group is then
 * killed, as it is when `options.signal` aborts.
 */
export async function runProbe(spec: HealthSpec, target: ProbeTarget, options: ProbeOptions = {}): Promise<ProbeResult> {
  const startedAt = new Date();
  const started = performance.now();
  const deadline = new Deadline(Math.round(spec.timeout_s * 1000), options.signal);
  let outcome: Outcome;
  try {
    if (spec.type === "http") outcome = await probeHttp(spec, target, deadline);
    else if (spec.type === "tcp") outcome = await probeTcp(spec, target, deadline);
    else if (spec.type === "exec") outcome = await probeExec(spec, target, deadline);
    else outcome = { ok: false, detail: `unknown probe type ${JSON.stringify(spec.type)}` };
  } catch (error) {
    outcome = { ok: false, detail: `probe failed: ${errorMessage(error)}` };
  } finally {
    deadline.dispose();
  }
  return {
    ok: outcome.ok,
    at: startedAt.toISOString(),
    duration_ms: Math.round(performance.now() - started),
    detail: truncate(outcome.detail),
  };
}

async function probeHttp(spec: HealthSpec, target: ProbeTarget, deadline: Deadline): Promise<Outcome> {
  const port = spec.port ?? target.port;
  if (port === null || port === undefined) return { ok: false, detail: "no port to probe" };
  const path = spec.path ? (spec.path.startsWith("/") ? spec.path : `/${spec.path}`) : "/";
  const url = `http://${urlHost(target.host)}:${port}${path}`;
  try {
    // keepalive false and "Connection: close": one connection per probe, closed once the answer
    // is read, so no pooled socket outlives a workload that restarts between two probes.
    const response = await fetch(url, {
      method: "GET",
      redirect: "manual",
      signal: deadline.signal,
      keepalive: false,
      headers: { connection: "close" },
    });
    // Cancelling an unread body resets the connection, and servers log that (Python's
    // http.server prints a ConnectionResetError traceback): the body is read to the end.
    const body = await drainBody(response.body, HTTP_BODY_LIMIT);
    // The status decides; a body that outlives the deadline fails the probe like a late answer.
    if (deadline.signal.aborted) return { ok: false, detail: deadline.describe() };
    const ok = response.status >= 200 && response.status < 400;
    return { ok, detail: body === "whole" ? `HTTP ${response.status}` : `HTTP ${response.status} (${body})` };
  } catch (error) {
    if (deadline.signal.aborted) return { ok: false, detail: deadline.describe() };
    return { ok: false, detail: describeNetworkError(error, target.host, port) };
  }
}

/**
 * drainBody reads a response body to its end and drops it. It answers "whole", or says why it
 * stopped: the body went past `limit` bytes (the rest is cancelled, not read), or the read
 * failed (the deadline fired, or the server broke the connection).
 */
async function drainBody(body: ReadableStream<Uint8Array> | null, limit: number): Promise<string> {
  if (!body) return "whole";
  const reader = body.getReader();
  let read = 0;
  try {
    for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) {
      read += chunk.value.byteLength;
      if (read > limit) {
        await reader.cancel().catch(() => undefined);
        return `body over ${limit} bytes: the rest was not read`;
      }
    }
    return "whole";
  } catch (error) {
    return `body cut short: ${errorMessage(error)}`;
  }
}

async function probeTcp(spec: HealthSpec, target: ProbeTarget, deadline: Deadline): Promise<Outcome> {
  const port = spec.port ?? target.port;
  if (port === null || port === undefined) return { ok: false, detail: "no port to probe" };
  const connecting = Bun.connect({
    hostname: target.host,
    port,
    socket: { data() {}, error() {}, close() {} },
  });
  const winner = await Promise.race([
    connecting.then(
      (socket) => ({ socket }),
      (error: unknown) => ({ error }),
    ),
    deadline.fired().then(() => null),
  ]);
  if (winner === null) {
    // The connection may still open after the deadline; close it then.
    connecting.then(
      (socket) => socket.end(),
      () => undefined,
    );
    return { ok: false, detail: deadline.describe() };
  }
  if ("error" in winner) return { ok: false, detail: describeNetworkError(winner.error, target.host, port) };
  winner.socket.end();
  return { ok: true, detail: `connected to ${target.host}:${port}` };
}

async function probeExec(spec: HealthSpec, target: ProbeTarget, deadline: Deadline): Promise<Outcome> {
  // A plain command string runs without the shell, as a service's does (scheduler/hooks/command.ts).
  const shell = typeof spec.command === "string" ? shellCommand(spec.command) : null;
  const plain = shell ? plainCommand(shell) : null;
  const argv = plain ?? shell ?? (typeof spec.command === "string" ? null : spec.command);
  const empty = typeof spec.command === "string" ? spec.command.trim() === "" : !argv || argv.length === 0;
  if (!argv || empty) return { ok: false, detail: "no command to run" };
  if (deadline.signal.aborted) return { ok: false, detail: deadline.describe() };
  let proc: ReturnType<typeof Bun.spawn<"ignore", "pipe", "pipe">>;
  try {
    proc = Bun.spawn(asWorkloadUser(target.user ?? null, argv), {
      cwd: target.cwd,
      env: { ...inheritedEnv(target.inherited), ...(plain && target.cwd ? { PWD: target.cwd } : {}), ...target.env },
      stdin: "ignore",
      stdout: "pipe",
      stderr: "pipe",
      // setsid: the probe leads its own process group, so a timeout can kill everything it started.
      detached: true,
    });
  } catch (error) {
    return { ok: false, detail: `spawn failed: ${errorMessage(error)}` };
  }
  const stdout = readBounded(proc.stdout);
  const stderr = readBounded(proc.stderr);
  const finished = await Promise.race([proc.exited.then(() => true), deadline.fired().then(() => false)]);
  // Killing the group after a normal exit too removes background children the command left behind.
  killProcessGroup(proc.pid);
  await proc.exited;
  const [out, err] = await settleWithin([stdout.text, stderr.text], PIPE_GRACE_MS, () => {
    stdout.cancel();
    stderr.cancel();
  });
  if (!finished) return { ok: false, detail: deadline.describe() };
  const line = firstLine(out ?? "") || firstLine(err ?? "");
  const status = proc.exitCode !== null ? `exit ${proc.exitCode}` : `killed by ${proc.signalCode}`;
  return { ok: proc.exitCode === 0, detail: line ? `${status}: ${line}` : status };
}

/** killProcessGroup sends SIGKILL to a process group led by pid; a group that is already gone is fine. */
function killProcessGroup(pid: number): void {
  try {
    process.kill(-pid, "SIGKILL");
  } catch {
    // ESRCH: every member has exited.
  }
}

function readBounded(stream: ReadableStream<Uint8Array>): { text: Promise<string>; cancel(): void } {
  const reader = stream.getReader();
  const text = (async () => {
    const chunks: Uint8Array[] = [];
    let kept = 0;
    try {
      for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) {
        if (kept < EXEC_OUTPUT_LIMIT) {
          const part = chunk.value.subarray(0, EXEC_OUTPUT_LIMIT - kept);
          chunks.push(part);
          kept += part.length;
        }
      }
    } catch {
      // A cancelled read ends the output.
    }
    return Buffer.concat(chunks).toString("utf8");
  })();
  return { text, cancel: () => void reader.cancel().catch(() => undefined) };
}

async function settleWithin<T>(promises: Promise<T>[], ms: number, onLate: () => void): Promise<(T | undefined)[]> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<void>((resolve) => {
    timer = setTimeout(resolve, ms);
  });
  const all = Promise.all(promises);
  const done = await Promise.race([all.then(() => true), late.then(() => false)]);
  clearTimeout(timer);
  if (!done) onLate();
  return all;
}

function describeNetworkError(error: unknown, host: string, port: number): string {
  const code = (error as { code?: unknown })?.code;
  if (code === "ENOTFOUND") return `getaddrinfo ENOTFOUND ${host}`;
  if (typeof code === "string" && /^E[A-Z]+$/.test(code)) return `connect ${code} ${host}:${port}`;
  return errorMessage(error);
}

function urlHost(host: string): string {
  return host.includes(":") && !host.startsWith("[") ? `[${host}]` : host;
}

function firstLine(text: string): string {
  return (
    text
      .split(/\r?\n/)
      .map((line) => line.trim())
      .find((line) => line !== "") ?? ""
  );
}

function truncate(text: string): string {
  return text.length > DETAIL_LIMIT ? `${text.slice(0, DETAIL_LIMIT - 1)}…` : text;
}

function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
