/**
 * bench/ui.ts: how fast the web UI's dashboard paints from the compiled binary. Headless
 * Chromium (playwright-core, Debian's /usr/bin/chromium) opens `/` in a fresh context (empty
 * cache) with a signed-in session and 10 running services, and reads, from the Performance API:
 * - FCP: navigation start to first contentful paint;
 * - dashboard: navigation start to the services table being in the page (the script fetched,
 *   the session read, /api/services and /api/proxy/status answered, the table rendered), read
 *   from the `engine:services-rendered` mark the page sets; for the anchor, its load event.
 * The anchor, measured in the same run by the same browser, is a static HTML page of the same
 * size served by a bare Bun.serve. The target is a dashboard within 1 s (docs: issue 7).
 *
 * Usage: bun bench/ui.ts [--rounds 15] [--services 10]
 */
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Browser } from "playwright-core";
import { launchChromium } from "../test/e2e/processes";
import { reapWorkloads } from "../test/helpers";
import { fmt, numericArg, printRows, waitForHttp } from "./lib";

const root = join(import.meta.dir, "..");
const rounds = numericArg("--rounds", 15);
const serviceCount = numericArg("--services", 10);
const work = mkdtempSync(join(tmpdir(), "engine-bench-ui-"));
const binary = join(work, "engine");

// Build into the temp dir, so the figure is of this tree's UI, never a stale dist/engine.
const build = Bun.spawnSync([process.execPath, join(root, "build.ts"), "--outfile", binary, "--only", "engine"], {
  stdout: "ignore",
  stderr: "inherit",
});
if (build.exitCode !== 0) process.exit(1);

const dataDir = join(work, "data");
mkdirSync(dataDir);
const engine = Bun.spawn([binary, "serve", "--data-dir", dataDir, "--port", "0"], {
  env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: process.env.HOME ?? "/tmp", ENGINE_PROXY: "off" },
  stdout: "pipe",
  stderr: "pipe",
});
let engineOut = "";
void (async () => {
  const decoder = new TextDecoder();
  const reader = (engine.stdout as ReadableStream<Uint8Array>).getReader();
  for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) engineOut += decoder.decode(chunk.value);
})();

const anchorPage = (size: number) =>
  `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>anchor</title></head><body><main><h1>Services</h1><table><tbody>${"<tr><td>service</td><td>running</td></tr>".repeat(
    Math.max(1, Math.floor(size / 40)),
  )}</tbody></table></main></body></html>`;

let browser: Browser | undefined;
const anchor = Bun.serve({ port: 0, fetch: () => new Response("", { status: 404 }) });
try {
  const started = Date.now();
  let port = 0;
  while (port === 0) {
    const match = /"msg":"listening"[^\n]*"port":(\d+)|"port":(\d+)[^\n]*"msg":"listening"/.exec(engineOut);
    if (match) port = Number(match[1] ?? match[2]);
    else if (Date.now() - started > 20_000) throw new Error(`the engine did not start: ${engineOut}`);
    else await Bun.sleep(20);
  }
  const url = `http://127.0.0.1:${port}`;
  await waitForHttp(`${url}/api/health`);
  const token = readFileSync(join(dataDir, "admin.token"), "utf8").trim();
  const headers = { authorization: `Bearer ${token}`, "content-type": "application/json" };
  for (let i = 0; i < serviceCount; i++) {
    await fetch(`${url}/api/services`, { method: "POST", headers, body: JSON.stringify({ name: `svc-${i}`, command: "exec sleep 600" }) });
  }
  // A session cookie, from the sign-in route the page itself uses.
  const signIn = await fetch(`${url}/ui/session`, {
    method: "POST",
    headers: { "content-type": "application/json", origin: url },
    body: JSON.stringify({ token }),
  });
  const cookie = /engine_ui_session=([^;]+)/.exec(signIn.headers.get("set-cookie") ?? "")?.[1];
  if (!cookie) throw new Error(`sign-in failed: ${signIn.status}`);

  const shell = await (await fetch(`${url}/`)).text();
  const script = await (await fetch(`${url}/ui/app.js`)).text();
  const html = anchorPage(shell.length + script.length);
  anchor.reload({ fetch: () => new Response(html, { headers: { "content-type": "text/html; charset=utf-8" } }) });
  const anchorUrl = `http://127.0.0.1:${anchor.port}/`;

  browser = await launchChromium();

  /** measure opens `target` in a fresh context and returns FCP and the time `selector` appeared, in ms. */
  const measure = async (target: string, selector: string, withCookie: boolean) => {
    const context = await (browser as Browser).newContext();
    if (withCookie) await context.addCookies([{ name: "engine_ui_session", value: cookie, url }]);
    const page = await context.newPage();
    await page.goto(target);
    await page.waitForSelector(selector, { timeout: 15_000 });
    const ready = await page.evaluate(() => {
      const mark = performance.getEntriesByName("engine:services-rendered")[0];
      if (mark) return mark.startTime;
      const navigation = performance.getEntriesByType("navigation")[0] as PerformanceNavigationTiming | undefined;
      return navigation?.loadEventEnd ?? Number.NaN;
    });
    const fcp = await page.evaluate(
      () =>
        new Promise<number>((resolve) => {
          const entry = performance.getEntriesByName("first-contentful-paint")[0];
          if (entry) return resolve(entry.startTime);
          new PerformanceObserver((list) => resolve(list.getEntries()[0]?.startTime ?? Number.NaN)).observe({
            type: "paint",
            buffered: true,
          });
        }),
    );
    await context.close();
    return { fcp, ready };
  };

  const samples = { engineFcp: [] as number[], engineReady: [] as number[], anchorFcp: [] as number[], anchorReady: [] as number[] };
  // One warm-up of each: the browser's own start-up is not the page's cost.
  await measure(`${url}/`, "table tbody tr td a", true);
  await measure(anchorUrl, "table", false);
  for (let round = 0; round < rounds; round++) {
    const dashboard = await measure(`${url}/`, "table tbody tr td a", true);
    const plain = await measure(anchorUrl, "table", false);
    samples.engineFcp.push(dashboard.fcp);
    samples.engineReady.push(dashboard.ready);
    samples.anchorFcp.push(plain.fcp);
    samples.anchorReady.push(plain.ready);
  }
  const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] ?? Number.NaN;
  const worst = (values: number[]) => Math.max(...values);
  const anchorFcp = median(samples.anchorFcp);
  printRows(
    `web UI first paint, compiled binary, ${serviceCount} services, ${rounds} fresh contexts (ms from navigation start; ratios to the anchor's median FCP)`,
    ["page", "FCP median", "FCP max", "FCP ratio", "ready median", "ready max", "ready ratio", "target: ready ≤ 1000 ms"],
    [
      [
        "static page, bare Bun.serve (anchor; ready = load)",
        fmt(anchorFcp, 1),
        fmt(worst(samples.anchorFcp), 1),
        "1.00",
        fmt(median(samples.anchorReady), 1),
        fmt(worst(samples.anchorReady), 1),
        fmt(median(samples.anchorReady) / anchorFcp),
        "",
      ],
      [
        "engine dashboard (ready = services table rendered)",
        fmt(median(samples.engineFcp), 1),
        fmt(worst(samples.engineFcp), 1),
        fmt(median(samples.engineFcp) / anchorFcp),
        fmt(median(samples.engineReady), 1),
        fmt(worst(samples.engineReady), 1),
        fmt(median(samples.engineReady) / anchorFcp),
        median(samples.engineReady) <= 1000 ? "met" : "MISSED",
      ],
    ],
  );
} finally {
  await browser?.close();
  anchor.stop(true);
  engine.kill("SIGTERM");
  await Promise.race([engine.exited, Bun.sleep(5000)]);
  if (engine.exitCode === null) engine.kill("SIGKILL");
  reapWorkloads(dataDir);
  rmSync(work, { recursive: true, force: true });
}
