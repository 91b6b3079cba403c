/**
 * Shared bench helpers. Benchmarks print each figure next to its anchor measured in the same
 * run, as a ratio: this machine is small and noisy, so ratios are what we compare.
 */
export interface LoadResult {
  requests: number;
  errors: number;
  rps: number;
  p50: number;
  p99: number;
}

function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? Number.NaN;
}

/**
 * loadTest drives `url` with `concurrency` keep-alive loops for `durationMs` (bounded in time
 * and count) and reports throughput and latency percentiles in milliseconds.
 */
export async function loadTest(
  url: string,
  { headers = {}, concurrency = 32, durationMs = 3000, maxRequests = 200_000, warmupMs = 500 } = {},
): Promise<LoadResult> {
  const run = async (ms: number, record: boolean) => {
    const latencies: number[] = [];
    let errors = 0;
    let sent = 0;
    const deadline = performance.now() + ms;
    const loop = async () => {
      while (performance.now() < deadline && sent < maxRequests) {
        sent++;
        const start = performance.now();
        try {
          const response = await fetch(url, { headers });
          await response.arrayBuffer();
          if (!response.ok) errors++;
        } catch {
          errors++;
        }
        if (record) latencies.push(performance.now() - start);
      }
    };
    const started = performance.now();
    await Promise.all(Array.from({ length: concurrency }, loop));
    return { latencies, errors, elapsed: performance.now() - started };
  };
  await run(warmupMs, false);
  const { latencies, errors, elapsed } = await run(durationMs, true);
  latencies.sort((a, b) => a - b);
  return {
    requests: latencies.length,
    errors,
    rps: (latencies.length / elapsed) * 1000,
    p50: percentile(latencies, 50),
    p99: percentile(latencies, 99),
  };
}

/** waitForHttp polls a URL until it answers, or throws after the deadline. */
export async function waitForHttp(url: string, timeoutMs = 20000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    try {
      await fetch(url);
      return;
    } catch {
      await Bun.sleep(50);
    }
  }
  throw new Error(`${url} did not answer within ${timeoutMs} ms`);
}

export { freePort } from "../test/helpers";

/** numericArg reads `--name N` from the command line: a positive whole number, else the fallback. */
export function numericArg(name: string, fallback: number): number {
  const index = process.argv.indexOf(name);
  const value = index >= 0 ? Number(process.argv[index + 1]) : fallback;
  return Number.isFinite(value) && value > 0 ? Math.floor(value) : fallback;
}

export function fmt(n: number, digits = 2): string {
  return Number.isFinite(n) ? n.toFixed(digits) : "n/a";
}

export function printRows(title: string, columns: string[], rows: (string | number)[][]): void {
  const cells = rows.map((r) => r.map(String));
  const widths = columns.map((c, i) => Math.max(c.length, ...cells.map((r) => (r[i] ?? "").length)));
  console.log(`\n${title}`);
  console.log(columns.map((c, i) => c.padEnd(widths[i] ?? 0)).join("  "));
  for (const row of cells) console.log(row.map((c, i) => c.padEnd(widths[i] ?? 0)).join("  "));
}
