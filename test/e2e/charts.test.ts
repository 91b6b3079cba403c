import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Browser, Page } from "playwright-core";
import { fakeNvidiaSmiIn } from "../fixtures/gpu/fake";
import { eventually, reapWorkloads, runCli, type SpawnedEngine, spawnEngine, tempDir, workloadBun } from "../helpers";
import { installEngine } from "./binaries";
import { launchChromium } from "./processes";

/**
 * The web UI's usage charts (issue 18) in headless Chromium against the compiled dist/engine,
 * whose GPUs come from the fake nvidia-smi (ENGINE_NVIDIA_SMI) and whose service holds GPU
 * memory there: the GPUs page draws each GPU's utilization and memory, the services list a
 * sparkline per service, the service page its CPU, memory and GPU memory, all with data, and
 * nothing breaks the page's Content-Security-Policy. Screenshots go to test/e2e/screenshots/.
 */

const SCREENSHOTS = join(import.meta.dir, "screenshots");
const GPU0 = "GPU-3f9e1b62-c07a-4d58-e913-6a2b8c4d0f17";
const STEP_MS = 15_000;

let workDir: string;
let binary: string;
let engine: SpawnedEngine;
let adminToken: string;
let browser: Browser | undefined;
let page: Page;
const problems: string[] = [];

const shot = (name: string) => page.screenshot({ path: join(SCREENSHOTS, `engine-${name}.png`), fullPage: true });

async function api(method: string, path: string, body?: unknown) {
  const response = await fetch(`${engine.url}${path}`, {
    method,
    headers: { authorization: `Bearer ${adminToken}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

beforeAll(async () => {
  mkdirSync(SCREENSHOTS, { recursive: true });
  workDir = tempDir("engine-e2e-charts-");
  // The work dir stands in for /var/lib, where a root engine keeps its data: service users must
  // search it to reach their data dirs (README, "Where data lives").
  chmodSync(workDir, 0o755);
  binary = await installEngine(workDir);
  const apps = join(workDir, "apps.csv");
  writeFileSync(apps, "");
  const wrapper = fakeNvidiaSmiIn(workDir, { FAKE_NVIDIA_SMI_SCENARIO: "two-h100", FAKE_NVIDIA_SMI_APPS: apps });
  engine = await spawnEngine(join(workDir, "data"), { command: [binary], env: { ENGINE_SHIM: "", ENGINE_NVIDIA_SMI: wrapper } });
  adminToken = readFileSync(join(workDir, "data", "admin.token"), "utf8").trim();
  // A service that keeps some memory and spends some CPU, and "holds" 40 GiB on GPU 0.
  const busy =
    "const keep = Buffer.alloc(48 * 1024 * 1024, 1); setInterval(() => { let x = 0; for (let i = 0; i < 3e6; i++) x += i; keep[0] = x & 1; }, 100);";
  const deployed = await api("POST", "/api/services", { name: "trainer", command: [workloadBun(), "-e", busy] });
  expect(deployed.status).toBe(201);
  const pid = await eventually(async () => (await api("GET", "/api/services/trainer")).body.pid as number | null, { timeoutMs: STEP_MS });
  writeFileSync(apps, `${pid}, 40960, ${GPU0}\n`);
  browser = await launchChromium();
  page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.setDefaultTimeout(STEP_MS);
  page.on("console", (message) => {
    if (message.type() === "error") problems.push(message.text());
  });
  page.on("pageerror", (error) => problems.push(error.message));
}, 240_000);

afterAll(async () => {
  await browser?.close();
  await engine?.stop();
  if (workDir) {
    reapWorkloads(join(workDir, "data"));
    rmSync(workDir, { recursive: true, force: true });
  }
});

/** enoughSamples waits until the history has three samples with the service's GPU memory in the last. */
async function enoughSamples(): Promise<void> {
  await eventually(
    async () => {
      const history = (await api("GET", "/api/metrics/history?service=trainer")).body as {
        times: number[];
        services: { gpu_memory_mb: (number | null)[]; cpu_pct: (number | null)[] }[];
      };
      return (
        history.times.length >= 3 && history.services[0]?.gpu_memory_mb.at(-1) === 40960 && history.services[0]?.cpu_pct.at(-1) !== null
      );
    },
    { timeoutMs: 40_000, intervalMs: 500 },
  );
}

describe("usage charts in the web UI (compiled dist/engine, headless Chromium)", () => {
  test("the GPUs page draws each GPU's utilization and memory over the last hour", async () => {
    const { code, stdout } = await runCli(["--data-dir", join(workDir, "data"), "ui"], {}, [binary]);
    expect(code).toBe(0);
    await page.goto(/(http:\/\/\S+\/ui\/login\?code=\S+)/.exec(stdout)?.[1] ?? "");
    await page.getByRole("heading", { name: "Services" }).waitFor();
    await enoughSamples();
    await page.goto(`${engine.url}/#/gpus`);
    await page.getByRole("heading", { name: "Usage, last hour" }).waitFor();
    const gpu0 = page.getByRole("img", { name: /^GPU 0 · NVIDIA H100 80GB HBM3, last hour: now Utilization 87 %, Memory used 40 GiB/ });
    await gpu0.waitFor();
    await page.getByRole("img", { name: /^GPU 1 · NVIDIA H100 80GB HBM3, last hour: now Utilization 0\.0 %/ }).waitFor();
    // uPlot drew on a canvas, with every sample.
    expect(await gpu0.locator("canvas").count()).toBe(1);
    expect(Number(await gpu0.getAttribute("data-points"))).toBeGreaterThanOrEqual(3);
    const canvasSize = await gpu0.locator("canvas").evaluate((canvas: HTMLCanvasElement) => [canvas.width, canvas.height]);
    expect(canvasSize[0]).toBeGreaterThan(200);
    expect(await gpu0.locator(".u-legend").textContent()).toContain("Utilization");
    await shot("gpus-charts");
  }, 90_000);

  test("the services list shows a sparkline of CPU, memory and GPU memory per service", async () => {
    await page.goto(`${engine.url}/#/`);
    const row = page.getByRole("row", { name: /trainer/ });
    await row.getByRole("img", { name: /^GPU memory, last hour: now 40 GiB/ }).waitFor();
    await row.getByRole("img", { name: /^Memory, last hour: now \d+(\.\d)? MiB/ }).waitFor();
    await row.getByRole("img", { name: /^CPU, last hour: now \d/ }).waitFor();
    expect(await row.locator(".spark polyline").count()).toBe(3);
    await shot("services-sparklines");
  }, 60_000);

  test("the service page charts its CPU, memory and GPU memory", async () => {
    await page.goto(`${engine.url}/#/services/trainer`);
    await page.getByRole("heading", { name: "Usage, last hour" }).waitFor();
    const memory = page.getByRole("img", { name: /^Memory \(resident\), last hour: now Memory \d+(\.\d)? MiB/ });
    await memory.waitFor();
    await page.getByRole("img", { name: /^GPU memory, last hour: now GPU memory 40 GiB/ }).waitFor();
    await page.getByRole("img", { name: /^CPU, last hour: now CPU \d/ }).waitFor();
    expect(await page.locator("figure.chart canvas").count()).toBe(3);
    expect(Number(await memory.getAttribute("data-points"))).toBeGreaterThanOrEqual(3);
    await shot("service-charts");
    expect(problems).toEqual([]);
  }, 60_000);
});
