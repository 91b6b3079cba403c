/**
 * bench/restart.ts: what a drain restart (POST /api/daemon/restart) of the compiled binary
 * costs, the table of issue 17. Each run starts a fresh engine with its proxy (2 processes),
 * an upstream service routed through it and a few sleepers, then restarts it `--restarts`
 * times in a row while:
 *
 * - two API pollers send GET /api/health back to back, 1 ms apart (one on a kept-alive
 *   connection, one opening a connection per request): the longest time between two answers
 *   is the longest time the API answered nothing; a failed request is counted;
 * - `wrk -t2 -c32` sends GET / for web.localhost through the proxy's HTTPS port on kept-alive
 *   connections (the issue's load): its socket errors and non-2xx answers are the failures;
 *   `--proxied-loops N` adds N in-process clients over the HTTP port (three in four kept-alive),
 *   every failed or wrong answer counted;
 * - the services' pids are read before and after: they must be kept;
 * - after the restarts, the same pollers under the same load watch three windows as long as a
 *   restart took, with no restart: the longest silence of each is the machine's own stalls, the
 *   anchor of the silence per restart (on a small, loaded machine gaps appear with no restart).
 *
 * Printed per binary: the median of the runs and their spread, and where each hand-over's
 * window went (the steps the engine logs, decision 440). The anchor is a bare Bun.serve
 * killed and started again on its port (spawn to first answer), measured in the same process;
 * each engine's own start (its spawn to its first answer, before the restarts) is printed as a
 * ratio to it. This machine is small and shared, so the ratios and the zero counts say more
 * than the ms.
 *
 * Usage: bun bench/restart.ts [--runs 5] [--restarts 10] [--sleepers 3] [--rebuild] [--baseline <binary>] [--no-wrk] [--wrk-close] [--proxied-loops 8] [--verbose] [--silences-over 40]
 *   --wrk-close has wrk send `Connection: close`, so that every request opens a connection (and a
 *   TLS handshake) through the proxy generations' hand-over: the connects and handshakes a restart
 *   could refuse, hundreds of times more often than kept-alive load makes them.
 *   --baseline measures another compiled engine the same way (say, a build of main) in the same run.
 *   --sleepers sets how many `sleep` services run beside the upstream (the adoption's share of the window grows with them).
 *   --verbose prints each silence over `--silences-over` ms among the hand-overs' logged moments (printTimeline).
 */
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os, { tmpdir } from "node:os";
import { join } from "node:path";
import { reapWorkloads, workloadBun, workloadPath } from "../test/helpers";
import { fmt, freePort, machineOf, measureKillAnchor, median, numericArg, printRows } from "./lib";

const root = join(import.meta.dir, "..");
const runs = numericArg("--runs", 5);
const restarts = numericArg("--restarts", 10);
/** SLEEPERS are the services beside the upstream: each is adopted in every hand-over's window. */
const SLEEPERS = numericArg("--sleepers", 3);
/** QUIET_WINDOWS is how many windows with no restart are watched after the restarts, for the silence's anchor. */
const QUIET_WINDOWS = 3;
const UPSTREAM = join(root, "test", "fixtures", "proxy", "upstream.ts");
/** DRAIN_TIMEOUT_S lets requests in flight finish; a restart waits for them only (none are long here). */
const DRAIN_TIMEOUT_S = 10;
const baselineIndex = process.argv.indexOf("--baseline");
const baseline = baselineIndex >= 0 ? process.argv[baselineIndex + 1] : undefined;
const verbose = process.argv.includes("--verbose");
/** silencesOverMs: with --verbose, the silences longer than this are placed among the hand-overs' moments. */
const silencesOverMs = numericArg("--silences-over", 40);
/**
 * proxiedLoopCount is how many in-process clients send through the proxy's HTTP port (three in
 * four on kept-alive connections); by default none, as wrk loads it (below).
 */
const proxiedLoopCount = process.argv.includes("--proxied-loops") ? Number(process.argv[process.argv.indexOf("--proxied-loops") + 1]) : 0;
/** WRK is the issue's proxied load: `wrk -t2 -c32` over HTTPS, kept-alive, for the whole run; `--no-wrk` leaves it out (the API alone). */
const WRK_CONNECTIONS = 32;
const wrk = process.argv.includes("--no-wrk") ? null : Bun.which("wrk");
/** WRK_CLOSE: wrk opens a connection per request (`--wrk-close`). */
const WRK_CLOSE = process.argv.includes("--wrk-close");
if (!wrk && !process.argv.includes("--no-wrk")) console.error("wrk is not installed: no HTTPS load (apt-get install wrk)");

/** WrkCount is what wrk answered when stopped: requests, and failures (socket errors and non-2xx answers). */
interface WrkCount {
  requests: number;
  failed: number;
  detail: string;
}

/**
 * FAILED_ANSWERS_SCRIPT has wrk note each answer it counts as failed (status above 399) in the
 * file named by its first script argument: the status and the start of the body (the proxy's
 * error pages name their cause), so that a failure says what it was.
 */
const FAILED_ANSWERS_SCRIPT = `
local path
function init(args) path = args[1] end
function response(status, headers, body)
  if status > 399 then
    local file = io.open(path, "a")
    if file then
      file:write(status, " ", (body or ""):sub(1, 160):gsub("%s+", " "), "\\n")
      file:close()
    end
  end
end
`;

/** startWrk loads `url` (Host: web.localhost) until the returned stop() is called, which interrupts wrk and reads its counts. */
function startWrk(url: string): () => Promise<WrkCount> {
  const dir = mkdtempSync(join(tmpdir(), "engine-bench-wrk-"));
  const script = join(dir, "failed-answers.lua");
  const failedAnswers = join(dir, "failed-answers");
  writeFileSync(script, FAILED_ANSWERS_SCRIPT);
  const argv = [wrk as string, "-t2", `-c${WRK_CONNECTIONS}`, "-d3600s", "--timeout", "5s", "-s", script, "-H", "Host: web.localhost"];
  if (WRK_CLOSE) argv.push("-H", "Connection: close");
  const proc = Bun.spawn([...argv, url, "--", failedAnswers], { stdout: "pipe", stderr: "pipe" });
  return async () => {
    proc.kill("SIGINT");
    const killer = setTimeout(() => proc.kill("SIGKILL"), 10_000);
    const [out] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
    clearTimeout(killer);
    const answers = existsSync(failedAnswers) ? readFileSync(failedAnswers, "utf8") : "";
    rmSync(dir, { recursive: true, force: true });
    const requests = Number(/(\d+) requests in/.exec(out)?.[1] ?? Number.NaN);
    const socket = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(out);
    const non2xx = Number(/Non-2xx or 3xx responses: (\d+)/.exec(out)?.[1] ?? 0);
    const failed = non2xx + (socket ? socket.slice(1).reduce((sum, count) => sum + Number(count), 0) : 0);
    if (!Number.isFinite(requests)) throw new Error(`wrk printed no count: ${out.slice(0, 300)}`);
    const counts = `${socket ? `${socket[0]}; ` : ""}non-2xx ${non2xx}`;
    return { requests, failed, detail: non2xx > 0 ? `${counts}: ${summarizeAnswers(answers)}` : counts };
  };
}

/** summarizeAnswers counts the failed answers wrk noted by status and body, most frequent first: `2 × 502 <!doctype html>…`. */
function summarizeAnswers(text: string): string {
  const counts = new Map<string, number>();
  for (const answer of text.split("\n").map((line) => line.trim())) if (answer) counts.set(answer, (counts.get(answer) ?? 0) + 1);
  if (counts.size === 0) return "not noted";
  return [...counts]
    .sort((a, b) => b[1] - a[1])
    .map(([answer, count]) => `${count} × ${answer}`)
    .join("; ");
}

const binary = join(root, "dist", "engine");
if (!existsSync(binary) || process.argv.includes("--rebuild")) {
  const build = Bun.spawnSync([process.execPath, join(root, "build.ts"), "--only", "engine"], { stdout: "inherit", stderr: "inherit" });
  if (build.exitCode !== 0) process.exit(1);
}

interface RunResult {
  proxiedFailed: number;
  proxiedAnswered: number;
  apiFailed: number;
  apiAnswered: number;
  /** longestSilenceMs is the longest time between two API answers over all the restarts. */
  longestSilenceMs: number;
  /** perRestartMs is the longest silence within each restart. */
  perRestartMs: number[];
  /**
   * quietMs is the longest silence within each of QUIET_WINDOWS windows with no restart under
   * way, as long as a restart took (its median), under the same load, after the restarts: the
   * machine's own stalls, which the per-restart figure includes too.
   */
  quietMs: number[];
  pidsKept: boolean;
  enginePidKept: boolean;
  restartSeconds: number[];
  /**
   * startMs is the engine's own start, before the restarts: from its spawn (a fresh data dir,
   * the proxy on) to its first answer, polled every 2 ms; the anchor's figure is the same for a
   * bare Bun.serve (decision 515).
   */
  startMs: number;
  /** phases are the hand-over steps' times the engine logged (decision 440), by side. */
  phases: PhaseLines;
}

/**
 * PhaseLines are the `phases_ms` of each hand-over's log lines: the stand-in's take-over, the
 * re-executed pid's, the releases; and each release's `modules_ms` (its modules' stops).
 */
interface PhaseLines {
  standin: Record<string, number>[];
  reexec: Record<string, number>[];
  release: Record<string, number>[];
  stops: Record<string, number>[];
  /** kept counts, by side, the take-overs that kept the rows read while preparing (`store_kept`, decision 533); null where the engine does not say. */
  kept: { standin: number; reexec: number } | null;
}

/** HandoverRecord is a hand-over's line of an engine's log: its time, its message and the fields the bench reads. */
interface HandoverRecord {
  time: string;
  msg: string;
  pid: number;
  standin?: boolean;
  phases_ms?: Record<string, number>;
  modules_ms?: Record<string, number>;
  window_ms?: number;
  store_kept?: boolean;
}

/** SAID are the hand-over's other log lines printTimeline places, by message, with their short names. */
const SAID: Record<string, string> = {
  "handing over to the new process": "hands over",
  "the new process serves; re-executing in place to take the work back from it": "re-executes",
};

/**
 * handoverRecords reads the hand-over's lines from an engine's log: those with the steps' times
 * (decision 440) and those of SAID; none when there is no log.
 */
function handoverRecords(dataDir: string): HandoverRecord[] {
  let text = "";
  try {
    text = readFileSync(join(dataDir, "engine.log"), "utf8");
  } catch {
    return [];
  }
  const records: HandoverRecord[] = [];
  for (const line of text.split("\n")) {
    if (!line.includes("phases_ms") && !Object.keys(SAID).some((msg) => line.includes(msg))) continue;
    try {
      records.push(JSON.parse(line) as HandoverRecord);
    } catch {
      // a line cut short
    }
  }
  return records;
}

/** readPhases collects the hand-over steps' times from an engine's log (docs/decisions.md 440). */
function readPhases(dataDir: string): PhaseLines {
  const lines: PhaseLines = { standin: [], reexec: [], release: [], stops: [], kept: null };
  for (const record of handoverRecords(dataDir)) {
    if (!record.phases_ms) continue;
    if (record.msg === "took the work over") {
      const side = record.standin ? "standin" : "reexec";
      lines[side].push({ ...record.phases_ms, window: record.window_ms ?? Number.NaN });
      if (record.store_kept !== undefined) {
        lines.kept ??= { standin: 0, reexec: 0 };
        if (record.store_kept) lines.kept[side] += 1;
      }
    } else {
      lines.release.push(record.phases_ms);
      if (record.modules_ms) lines.stops.push(record.modules_ms);
    }
  }
  return lines;
}

/**
 * printTimeline (--verbose) places each silence longer than `overMs` among the restarts'
 * moments, on the wall clock: when the bench asked, and what the engine logged: a predecessor's
 * hello from its successor ("hands over"), its release and its re-execution, and each
 * successor's bind (its first answer less its window) and first answer. A silence that starts
 * before a bind, or ends well after a first answer, is not the hand-over's window.
 */
function printTimeline(
  dataDir: string,
  silences: { at: number; ms: number; endedBy: string }[],
  overMs: number,
  marks: { at: number; what: string }[],
): void {
  const events = [...marks];
  for (const record of handoverRecords(dataDir)) {
    const at = Date.parse(record.time);
    if (SAID[record.msg]) events.push({ at, what: `${record.pid} ${SAID[record.msg]}` });
    else if (record.msg === "took the work over") {
      const who = record.standin ? "stand-in" : "re-executed";
      events.push({ at: at - (record.window_ms ?? 0), what: `${who} ${record.pid} binds` });
      events.push({ at, what: `${who} ${record.pid} first answer` });
    } else events.push({ at, what: `${record.pid} released` });
  }
  for (const silence of silences.filter((one) => one.ms > overMs)) {
    const near = events
      .filter((event) => event.at > silence.at - 300 && event.at < silence.at + silence.ms + 300)
      .map((event) => `${event.what} ${event.at >= silence.at ? "+" : ""}${fmt(event.at - silence.at, 0)}`);
    console.error(
      `  silence of ${fmt(silence.ms, 0)} ms (ended by ${silence.endedBy}): ${near.join(", ") || "no hand-over within 300 ms"}`,
    );
  }
}

/** Loop keeps one client sending until stopped, counting what it got. */
class Loop {
  answered = 0;
  failed = 0;
  errors = new Map<string, number>();
  private running = true;
  private readonly done: Promise<void>;

  constructor(
    readonly name: string,
    private readonly call: () => Promise<Response>,
    private readonly check: (body: string) => boolean,
    private readonly onAnswer: (now: number, sentAt: number, loop: string) => void = () => undefined,
    pauseMs = 1,
  ) {
    this.done = (async () => {
      while (this.running) {
        const sentAt = performance.now();
        try {
          const response = await this.call();
          const body = await response.text();
          if (response.ok && this.check(body)) {
            this.answered += 1;
            this.onAnswer(performance.now(), sentAt, this.name);
          } else this.fail(`${response.status} ${body.slice(0, 120).replace(/\s+/g, " ")}`);
        } catch (error) {
          this.fail((error as Error).message.slice(0, 60));
        }
        if (pauseMs > 0) await Bun.sleep(pauseMs);
      }
    })();
  }

  private fail(reason: string): void {
    this.failed += 1;
    this.errors.set(reason, (this.errors.get(reason) ?? 0) + 1);
  }

  async stop(): Promise<void> {
    this.running = false;
    await this.done;
  }
}

async function measureRun(engineBinary: string): Promise<RunResult> {
  const dataDir = mkdtempSync(join(tmpdir(), "engine-bench-restart-"));
  const port = await freePort();
  const spawnedAt = performance.now();
  const engine = Bun.spawn([engineBinary, "serve", "--data-dir", dataDir, "--port", String(port), "--log-level", "info"], {
    env: {
      ...process.env,
      ENGINE_PROXY: "on",
      ENGINE_HTTPS_PORT: "0",
      ENGINE_HTTP_PORT: "0",
      ENGINE_MDNS: "off",
      ENGINE_PROXY_PROCESSES: "2",
      ENGINE_SHIM: "",
    },
    stdout: "ignore",
    stderr: verbose ? "inherit" : "ignore",
  });
  const base = `http://127.0.0.1:${port}`;
  const loops: Loop[] = [];
  let stopWrk: (() => Promise<WrkCount>) | null = null;
  try {
    const deadline = Date.now() + 60_000;
    while (
      !(await fetch(`${base}/api/health`)
        .then((r) => r.ok)
        .catch(() => false))
    ) {
      if (Date.now() > deadline || engine.exitCode !== null) throw new Error(`the engine did not start (exit ${engine.exitCode})`);
      await Bun.sleep(2);
    }
    const startMs = performance.now() - spawnedAt;
    const headers = {
      authorization: `Bearer ${readFileSync(join(dataDir, "admin.token"), "utf8").trim()}`,
      "content-type": "application/json",
    };
    const upstreamPort = await freePort();
    const deploys = [
      { name: "web", port: upstreamPort, command: [workloadBun(), workloadPath(UPSTREAM)], env: { SERVICE_NAME: "web" } },
      ...Array.from({ length: SLEEPERS }, (_, index) => ({ name: `sleeper-${index}`, command: "exec sleep 600" })),
    ];
    for (const body of deploys) {
      const response = await fetch(`${base}/api/services`, { method: "POST", headers, body: JSON.stringify(body) });
      if (response.status !== 201) throw new Error(`deploy ${body.name}: ${response.status} ${await response.text()}`);
    }
    const servicePids = async () => {
      const list = (await (await fetch(`${base}/api/services`, { headers })).json()) as {
        name: string;
        status: string;
        pid: number | null;
      }[];
      return new Map(list.filter((service) => service.status === "running").map((service) => [service.name, service.pid]));
    };
    let httpPort = 0;
    let httpsPort = 0;
    while (httpPort === 0) {
      if (Date.now() > deadline) throw new Error("the upstream was not routed in time");
      const status = (await (await fetch(`${base}/api/proxy/status`, { headers })).json()) as {
        https_port: number;
        tls: { http_port: number };
        routes: { items: { host: string; state: string }[] };
      };
      if (status.routes.items.some((route) => route.host === "web.localhost" && route.state === "up")) {
        httpPort = status.tls.http_port;
        httpsPort = status.https_port;
      } else await Bun.sleep(50);
    }
    let pids = await servicePids();
    while (pids.size < deploys.length) {
      if (Date.now() > deadline) throw new Error("not every service ran in time");
      await Bun.sleep(50);
      pids = await servicePids();
    }
    const enginePid = ((await (await fetch(`${base}/api/health`)).json()) as { pid: number }).pid;

    // The API's silences: the time between two answers of either poller.
    let lastAnswer = performance.now();
    let longest = 0;
    let restartAt = performance.now();
    const silences: string[] = [];
    /** longSilences are the silences over --silences-over ms on the wall clock (--verbose), for printTimeline. */
    const longSilences: { at: number; ms: number; endedBy: string }[] = [];
    /** restartMarks are when each restart was asked and answered 202, on the wall clock (--verbose). */
    const restartMarks: { at: number; what: string }[] = [];
    const answered = (now: number, sentAt: number, loop: string) => {
      if (verbose && now - lastAnswer > 50) silences.push(`${fmt(lastAnswer - restartAt, 0)}+${fmt(now - lastAnswer, 0)}`);
      if (verbose && now - lastAnswer > silencesOverMs)
        // On the wall clock, as the engine's log (performance.timeOrigin drifts from it as NTP slews the clock).
        longSilences.push({
          at: Date.now() - (performance.now() - lastAnswer),
          ms: now - lastAnswer,
          endedBy: `${loop}, asked at ${sentAt >= lastAnswer ? "+" : ""}${fmt(sentAt - lastAnswer, 0)}`,
        });
      longest = Math.max(longest, now - lastAnswer);
      lastAnswer = now;
    };
    const ok = (body: string) => body.includes('"status":"ok"');
    const web = (body: string) => body.includes('"web"');
    const apiLoops = [
      new Loop("API kept-alive", () => fetch(`${base}/api/health`, { signal: AbortSignal.timeout(5000) }), ok, answered),
      new Loop(
        "API new connections",
        () => fetch(`${base}/api/health`, { keepalive: false, signal: AbortSignal.timeout(5000) }),
        ok,
        answered,
      ),
    ];
    const proxied = (keepalive: boolean) =>
      new Loop(
        keepalive ? "proxied kept-alive" : "proxied new connections",
        () =>
          fetch(`http://127.0.0.1:${httpPort}/`, { headers: { host: "web.localhost" }, keepalive, signal: AbortSignal.timeout(10_000) }),
        web,
        undefined,
        0,
      );
    const proxiedLoops = [
      ...Array.from({ length: Math.ceil((proxiedLoopCount * 3) / 4) }, () => proxied(true)),
      ...Array.from({ length: Math.floor(proxiedLoopCount / 4) }, () => proxied(false)),
    ];
    loops.push(...apiLoops, ...proxiedLoops);
    stopWrk = wrk ? startWrk(`https://127.0.0.1:${httpsPort}/`) : null;
    await Bun.sleep(300);
    lastAnswer = performance.now();
    longest = 0;
    const perRestartMs: number[] = [];
    let refusedRestarts = 0;
    const restartSeconds: number[] = [];
    for (let round = 0; round < restarts; round++) {
      const since = performance.now();
      restartAt = since;
      longest = 0;
      // A stand-in that still holds a kept-alive connection of this client answers 503 draining
      // until it exits: the restart is asked again then (counted).
      let response: Response;
      for (let attempt = 0; ; attempt++) {
        response = await fetch(`${base}/api/daemon/restart`, {
          method: "POST",
          headers,
          body: JSON.stringify({ drain_timeout_s: DRAIN_TIMEOUT_S }),
        });
        if (response.status !== 503 || attempt >= 100) break;
        refusedRestarts += 1;
        await Bun.sleep(100);
      }
      if (verbose) {
        console.error(`  restart ${round + 1}: 202 after ${fmt(performance.now() - since, 0)} ms`);
        restartMarks.push({ at: Date.now() - (performance.now() - since), what: `restart ${round + 1} asked` });
      }
      if (response.status !== 202) throw new Error(`restart: ${response.status} ${await response.text()}`);
      // Done when the engine's own pid answers again from a new image (a fresh uptime).
      for (;;) {
        const health = await fetch(`${base}/api/health`)
          .then((r) => r.json() as Promise<{ pid: number; uptime_s: number }>)
          .catch(() => null);
        const elapsedS = (performance.now() - since) / 1000;
        if (health && health.pid === enginePid && health.uptime_s < elapsedS - 0.05) break;
        if (elapsedS > 120) throw new Error("the restart did not finish within 120 s");
        await Bun.sleep(20);
      }
      restartSeconds.push((performance.now() - since) / 1000);
      await Bun.sleep(300); // the old processes finish draining under load
      perRestartMs.push(longest);
      if (verbose)
        console.error(
          `  restart ${round + 1}: silences over 50 ms (start after the request + length, ms): ${silences.splice(0).join(" ") || "none"}`,
        );
    }
    // The anchor: the same pollers under the same load with no restart, window by window.
    const windowMs = median(restartSeconds) * 1000 + 300;
    const quietMs: number[] = [];
    for (let window = 0; window < QUIET_WINDOWS; window++) {
      restartAt = performance.now();
      longest = 0;
      await Bun.sleep(windowMs);
      quietMs.push(longest);
      if (verbose)
        console.error(`  quiet window ${window + 1}: silences over 50 ms (start + length, ms): ${silences.splice(0).join(" ") || "none"}`);
    }
    for (const loop of loops) await loop.stop();
    loops.length = 0;
    const wrkCount = (await stopWrk?.()) ?? { requests: 0, failed: 0, detail: "" };
    stopWrk = null;
    if (wrkCount.failed > 0) console.error(`  wrk: ${wrkCount.failed} failed (${wrkCount.detail})`);
    if (refusedRestarts > 0) console.error(`  a restart was refused (503) ${refusedRestarts} times before it was taken`);
    const after = await servicePids();
    const enginePidAfter = ((await (await fetch(`${base}/api/health`)).json()) as { pid: number }).pid;
    const errors = [...apiLoops, ...proxiedLoops].flatMap((loop) =>
      [...loop.errors].map(([reason, count]) => `${loop.name}: ${count}x ${reason}`),
    );
    if (errors.length > 0) console.error(`  failures: ${errors.join("; ")}`);
    if (verbose) printTimeline(dataDir, longSilences, silencesOverMs, restartMarks);
    return {
      proxiedFailed: proxiedLoops.reduce((sum, loop) => sum + loop.failed, 0) + wrkCount.failed,
      proxiedAnswered: proxiedLoops.reduce((sum, loop) => sum + loop.answered, 0) + wrkCount.requests - wrkCount.failed,
      apiFailed: apiLoops.reduce((sum, loop) => sum + loop.failed, 0),
      apiAnswered: apiLoops.reduce((sum, loop) => sum + loop.answered, 0),
      longestSilenceMs: Math.max(...perRestartMs),
      perRestartMs,
      quietMs,
      pidsKept: [...pids].every(([name, pid]) => after.get(name) === pid),
      enginePidKept: enginePidAfter === enginePid,
      restartSeconds,
      startMs,
      phases: readPhases(dataDir),
    };
  } finally {
    for (const loop of loops) await loop.stop();
    await stopWrk?.().catch(() => undefined);
    engine.kill("SIGTERM");
    await Promise.race([engine.exited, Bun.sleep(15_000)]);
    if (engine.exitCode === null) engine.kill("SIGKILL");
    reapWorkloads(dataDir);
    rmSync(dataDir, { recursive: true, force: true });
  }
}

const spread = (values: number[], digits = 0) => `${fmt(Math.min(...values), digits)}–${fmt(Math.max(...values), digits)}`;

/**
 * measureBinaries runs each binary `runs` times, taking turns run by run (this build, the
 * baseline, this build, ...), so that the machine's drift over the minutes of a set (its load,
 * what earlier runs left in the file system) falls on both alike; a table row each.
 */
async function measureBinaries(binaries: [label: string, engineBinary: string][]): Promise<string[][]> {
  const results = binaries.map((): RunResult[] => []);
  for (let index = 0; index < runs; index++) {
    for (const [which, [label, engineBinary]] of binaries.entries()) {
      const result = await measureRun(engineBinary);
      console.error(
        `${label} run ${index + 1}: proxied failed ${result.proxiedFailed}/${result.proxiedAnswered + result.proxiedFailed}, API failed ${result.apiFailed}, longest silence ${fmt(result.longestSilenceMs, 1)} ms (per restart: ${result.perRestartMs.map((ms) => fmt(ms, 0)).join(" ")}), restart ${fmt(median(result.restartSeconds), 2)} s`,
      );
      results[which]?.push(result);
    }
  }
  return binaries.map(([label], which) => summarizeBinary(label, results[which] ?? []));
}

function summarizeBinary(label: string, results: RunResult[]): string[] {
  const proxiedFailed = results.map((result) => result.proxiedFailed);
  const apiFailed = results.map((result) => result.apiFailed);
  const silences = results.map((result) => result.longestSilenceMs);
  const perRestart = results.flatMap((result) => result.perRestartMs);
  const quiet = results.flatMap((result) => result.quietMs);
  const restartS = results.flatMap((result) => result.restartSeconds);
  const startMs = results.map((result) => result.startMs);
  phaseSummaries.push(...summarizePhases(label, results));
  return [
    label,
    `${median(proxiedFailed)} (${spread(proxiedFailed)}) of ~${Math.round(median(results.map((r) => r.proxiedAnswered)))}`,
    `${median(apiFailed)} (${spread(apiFailed)})`,
    `${fmt(median(silences), 1)} (${spread(silences, 1)})`,
    `${fmt(median(perRestart), 1)} (${spread(perRestart, 1)})`,
    `${fmt(median(quiet), 1)} (${spread(quiet, 1)})`,
    results.every((result) => result.pidsKept) ? "kept" : "CHANGED",
    results.every((result) => result.enginePidKept) ? "kept" : "changed",
    `${fmt(median(restartS), 2)} (${spread(restartS, 2)})`,
    `${fmt(median(startMs), 0)} (${spread(startMs)}), ${fmt(median(startMs) / median(anchorWindows), 1)}× the anchor's`,
  ];
}

/** phaseSummaries are the rows of the phases table: the median (and the largest) of each step over every hand-over. */
const phaseSummaries: string[][] = [];

function summarizePhases(label: string, results: RunResult[]): string[][] {
  const sides: [string, Exclude<keyof PhaseLines, "kept">][] = [
    ["stand-in takes over", "standin"],
    ["re-executed pid takes over", "reexec"],
    ["predecessor releases", "release"],
    ["of which its modules' stops", "stops"],
  ];
  return sides.flatMap(([side, key]) => {
    const records = results.flatMap((result) => result.phases[key]);
    if (records.length === 0) return [];
    const names = [...new Set(records.flatMap((record) => Object.keys(record)))];
    let steps = names.map((name) => {
      const values = records.map((record) => record[name]).filter((value): value is number => Number.isFinite(value));
      return { name, median: median(values), max: Math.max(...values) };
    });
    // The modules' stops: the slowest first, those that never took a millisecond left out.
    if (key === "stops") steps = steps.filter((step) => step.max >= 1).sort((a, b) => b.median - a.median);
    const cells = steps.map((step) => `${step.name} ${fmt(step.median, 1)} (${fmt(step.max, 0)})`);
    // How many take-overs kept the rows their successor read while it prepared (decision 533).
    const said = (key === "standin" || key === "reexec") && results.every((result) => result.phases.kept);
    const keptCell = said ? `, rows kept in ${results.reduce((sum, result) => sum + (result.phases.kept?.[key] ?? 0), 0)}` : "";
    return [[label, side, `${records.length}${keptCell}`, cells.join(", ")]];
  });
}

const loadBefore = os
  .loadavg()
  .map((load) => fmt(load, 1))
  .join(" ");
const anchorWindows = await measureKillAnchor(5);
const RESTART_COLUMNS = [
  "binary",
  `proxied failed (${restarts} restarts)`,
  "API failed",
  "longest API silence ms",
  "silence per restart ms",
  "same, no restart (anchor) ms",
  "service pids",
  "engine pid",
  "restart s",
  "start ms (spawn → first answer)",
];
const rows = await measureBinaries([["this build", binary], ...(baseline ? [["baseline", baseline] as [string, string]] : [])]);
const anchorMs = median(anchorWindows);
printRows(
  `Drain restart of the compiled engine: ${restarts} restarts a run, median of ${runs} runs (spread); proxy 2 processes, 1 upstream + ${SLEEPERS} sleepers; API polled every 1 ms by 2 clients; proxied load: ${wrk ? `wrk -t2 -c${WRK_CONNECTIONS} over HTTPS${WRK_CLOSE ? ", a connection per request" : ""}` : "no wrk"}${proxiedLoopCount > 0 ? ` and ${proxiedLoopCount} in-process clients over HTTP` : ""}; load average before ${loadBefore}, after ${os
    .loadavg()
    .map((load) => fmt(load, 1))
    .join(" ")}`,
  RESTART_COLUMNS,
  rows,
);
printRows(
  "Where a hand-over's window goes (ms, median and largest over every hand-over; from the engine's log, decision 440)",
  ["binary", "side", "hand-overs", "steps"],
  phaseSummaries,
);
const machine = machineOf();
console.log(`\nmachine: hypervisor ${machine.hypervisor}; a fresh page's first write ${fmt(machine.pageFaultUs, 1)} µs (decision 504)`);
console.log(
  `anchor: a bare Bun.serve killed and spawned again answers after ${fmt(anchorMs, 1)} ms (median of 5: ${anchorWindows.map((ms) => fmt(ms, 0)).join(" / ")})`,
);
// A run that changed a service's pid fails the bench.
const pidsColumn = RESTART_COLUMNS.indexOf("service pids");
if (!rows.every((row) => row[pidsColumn] === "kept")) process.exit(1);
