import type { Command } from "commander";
import type { GpuInventoryRecord, MetricsHistory, ServiceRecord, ServiceStatsRecord } from "../../src/contract/engine";
import { CliError, type EngineClient } from "../client";
import { type Output, printJson } from "../output";
import { cpuShares, renderTop, type TopSnapshot } from "../top-view";

/** DEFAULT_INTERVAL_S is how often the view refreshes: nvitop's and top's default is 2 s too. */
const DEFAULT_INTERVAL_S = 2;
/** ONE_SHOT_GAP_MS separates the two samples a single frame takes, so its CPU column is a real rate. */
const ONE_SHOT_GAP_MS = 1000;

// The terminal sequences the view uses (xterm's, which every terminal emulator in use speaks).
const ENTER_ALTERNATE_SCREEN = "\x1b[?1049h";
const LEAVE_ALTERNATE_SCREEN = "\x1b[?1049l";
const HIDE_CURSOR = "\x1b[?25l";
const SHOW_CURSOR = "\x1b[?25h";
const HOME = "\x1b[H";
const CLEAR_TO_END_OF_LINE = "\x1b[K";
const CLEAR_BELOW = "\x1b[J";
const CTRL_C = 0x03;

interface Sample {
  services: ServiceRecord[];
  gpus: GpuInventoryRecord;
  stats: ServiceStatsRecord | null;
  /** gpuUsedMb is each service's measured GPU memory, from the newest sample of the engine's history. */
  gpuUsedMb: Map<string, number>;
}

/** HISTORY_LOOKBACK_S is how far back `top` asks the history for: a few of its 5-s samples. */
const HISTORY_LOOKBACK_S = 15;

/** latestGpuMemory takes each service's newest measured GPU memory from a history answer. */
export function latestGpuMemory(history: MetricsHistory | null): Map<string, number> {
  const used = new Map<string, number>();
  for (const service of history?.services ?? []) {
    const value = service.gpu_memory_mb.findLast((mb) => mb !== null);
    if (value !== undefined && value !== null) used.set(service.name, value);
  }
  return used;
}

/**
 * sample reads the three routes one frame needs, together. An engine without GET /api/stats
 * (older than this CLI) still gets a view, without CPU and memory.
 */
async function sample(api: EngineClient): Promise<Sample> {
  const since = Math.floor(Date.now() / 1000) - HISTORY_LOOKBACK_S;
  const [services, gpus, stats, history] = await Promise.all([
    api.request<ServiceRecord[]>("GET", "/api/services"),
    api.request<GpuInventoryRecord>("GET", "/api/gpus"),
    api
      .exchange("GET", "/api/stats")
      .then((answer) => (answer.status === 200 ? (answer.body as ServiceStatsRecord) : null))
      .catch(() => null),
    api
      .exchange("GET", `/api/metrics/history?since=${since}`)
      .then((answer) => (answer.status === 200 ? (answer.body as MetricsHistory) : null))
      .catch(() => null),
  ]);
  return { services, gpus, stats, gpuUsedMb: latestGpuMemory(history) };
}

/** useColor follows the NO_COLOR convention (no-color.org): colour only on a terminal, unless NO_COLOR is set or TERM is dumb. */
export function useColor(env: Record<string, string | undefined>, isTty: boolean): boolean {
  return isTty && !env.NO_COLOR && env.TERM !== "dumb";
}

function parseInterval(text: string): number {
  const value = Number(text);
  if (!/^\d+(\.\d+)?$/.test(text) || value < 0.5 || value > 3600) {
    throw new CliError(`--interval takes seconds from 0.5 to 3600 (got ${JSON.stringify(text)})`);
  }
  return value;
}

/**
 * registerTop adds `engine top`: a live view of the GPUs and the services, refreshed in place
 * on the terminal's alternate screen until `q` or Ctrl-C, which leave the terminal as it was.
 * Anywhere else (a pipe, --once, --json) it prints one frame and exits.
 */
export function registerTop(program: Command, client: () => EngineClient, output: () => Output): void {
  program
    .command("top")
    .description("a live view of the GPUs and services: utilization, memory, CPU, restarts (q quits)")
    .option("--interval <seconds>", "seconds between refreshes", String(DEFAULT_INTERVAL_S))
    .option("--once", "print one frame and exit (what a pipe gets)")
    .action(async (options: { interval: string; once?: boolean }) => {
      const intervalS = parseInterval(options.interval);
      const api = client();
      const interactive = process.stdout.isTTY === true && !options.once && !output().json;
      // The first sample is taken before the screen changes: an engine that cannot be reached
      // is one line on the normal screen, as for every other command.
      const first = await sample(api);
      if (!interactive) {
        await Bun.sleep(ONE_SHOT_GAP_MS);
        const second = await sample(api);
        const snapshot = snapshotOf(api, second, first.stats, intervalS, null);
        if (output().json) {
          const { gpuUsedMb, ...rest } = second;
          printJson({ ...rest, cpu_percent: Object.fromEntries(snapshot.cpuPercent), gpu_memory_used_mb: Object.fromEntries(gpuUsedMb) });
          return;
        }
        const width = process.stdout.columns || Number(process.env.COLUMNS) || 120;
        const lines = renderTop(snapshot, {
          width,
          height: Number.POSITIVE_INFINITY,
          color: useColor(process.env, process.stdout.isTTY === true),
          interactive: false,
        });
        process.stdout.write(`${lines.join("\n")}\n`);
        return;
      }
      await runInteractive(api, first, intervalS);
    });
}

function snapshotOf(
  api: EngineClient,
  current: Sample,
  previousStats: ServiceStatsRecord | null,
  intervalS: number,
  error: string | null,
): TopSnapshot {
  return {
    target: api.describe(),
    at: new Date(),
    intervalS,
    services: current.services,
    gpus: current.gpus,
    stats: current.stats,
    cpuPercent: cpuShares(previousStats, current.stats),
    gpuUsedMb: current.gpuUsedMb,
    error,
  };
}

/**
 * runInteractive draws frames until the user quits. The terminal is put back however it ends
 * (q, Ctrl-C, SIGTERM, SIGHUP): the cursor shown, the normal screen and its scrollback back,
 * the keyboard out of raw mode.
 */
function runInteractive(api: EngineClient, first: Sample, intervalS: number): Promise<void> {
  const stdout = process.stdout;
  const stdin = process.stdin;
  const color = useColor(process.env, true);
  let last = first;
  let snapshot = snapshotOf(api, first, null, intervalS, null);
  let timer: ReturnType<typeof setTimeout> | undefined;
  let done = false;

  const draw = () => {
    if (done) return;
    const lines = renderTop(snapshot, { width: stdout.columns || 80, height: stdout.rows || 24, color, interactive: true });
    stdout.write(`${HOME}${lines.map((line) => `${line}${CLEAR_TO_END_OF_LINE}`).join("\r\n")}${CLEAR_BELOW}`);
  };

  const refresh = async () => {
    clearTimeout(timer);
    try {
      const next = await sample(api);
      snapshot = snapshotOf(api, next, last.stats, intervalS, null);
      last = next;
    } catch (error) {
      // Keep the last frame's data and say why it is old: a daemon restarting comes back.
      snapshot = { ...snapshot, at: new Date(), error: `${(error as Error).message}; retrying every ${intervalS}s` };
    }
    draw();
    if (!done) timer = setTimeout(refresh, intervalS * 1000);
  };

  return new Promise<void>((resolve) => {
    const onKey = (chunk: Buffer | string) => {
      const keys = typeof chunk === "string" ? Buffer.from(chunk) : chunk;
      for (const key of keys) {
        if (key === CTRL_C || key === 0x71 /* q */ || key === 0x51 /* Q */) return quit();
        if (key === 0x72 /* r */) void refresh();
      }
    };
    const onResize = () => draw();
    const quit = () => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      stdin.off("data", onKey);
      stdout.off("resize", onResize);
      for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.off(signal, quit);
      process.off("SIGWINCH", onResize);
      process.off("exit", restore);
      restore();
      resolve();
    };
    const restore = () => {
      if (stdin.isTTY) stdin.setRawMode(false);
      stdin.pause();
      stdout.write(`${SHOW_CURSOR}${LEAVE_ALTERNATE_SCREEN}`);
    };

    stdout.write(`${ENTER_ALTERNATE_SCREEN}${HIDE_CURSOR}`);
    // Raw mode: q is read without Enter, and Ctrl-C arrives as a key rather than a signal, so
    // the terminal is restored before the process ends. Without a terminal on stdin, the
    // signals below still quit.
    if (stdin.isTTY) stdin.setRawMode(true);
    stdin.resume();
    stdin.on("data", onKey);
    stdout.on("resize", onResize);
    process.on("SIGWINCH", onResize);
    for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.on(signal, quit);
    process.on("exit", restore);
    draw();
    timer = setTimeout(refresh, intervalS * 1000);
  });
}
