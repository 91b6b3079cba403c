import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Browser, Page } from "playwright-core";
import { DEFAULT_RESTORE_TIMEOUT_S } from "../../src/contract/defaults";
import { RedisEngine } from "../../src/engine/databases";
import { eventually, freePort, reapWorkloads, runCli, type SpawnedEngine, spawnEngine, tempDir } from "../helpers";
import { installEngine } from "./binaries";
import { launchChromium } from "./processes";

/**
 * The engine's web UI in headless Chromium against the compiled dist/engine: sign in with the
 * one-time link of `engine ui` and with a token, deploy a template from the gallery and watch
 * its logs arrive, see a crashed service's diagnosis, create a token (shown once) and revoke
 * it, delete a service after confirming. Each main page is saved under test/e2e/screenshots/
 * (ignored by git) to be looked at.
 */

const SCREENSHOTS = join(import.meta.dir, "screenshots");
const STEP_MS = 15_000;

/** HELLO_TEMPLATE runs without network or GPU: a template whose start command prints and waits. */
const HELLO_TEMPLATE = {
  id: "hello",
  name: "Hello",
  icon: "👋",
  category: "tool",
  repo_url: "",
  ref: "",
  subdir: "",
  ai_hint: "Prints a greeting and waits: the web UI's end-to-end test deploys it from the gallery.",
  // The port is set to a free one at start-up, so the proxy can route a domain to it.
  deploy_defaults: { port: 0, gpus: 0, start: 'echo "hello $GREETING"; exec sleep 300', health: "" },
  env_schema: [
    { name: "GREETING", required: true, secret: false },
    { name: "API_KEY", required: false, secret: true },
  ],
};

/** GPU_TEMPLATE suggests a GPU: on a host without one, the deploy form starts at 0 and says why. */
const GPU_TEMPLATE = {
  ...HELLO_TEMPLATE,
  id: "cuda-demo",
  name: "CUDA Demo",
  icon: "🧪",
  ai_hint: "Suggests one GPU: the deploy form's GPU count follows the host's inventory.",
  deploy_defaults: { port: 0, gpus: 1, start: "exec sleep 300", health: "" },
  env_schema: [],
};

/** hostHasColourEmoji says whether fontconfig knows a colour font that draws 👋 (the Hello template's icon). */
function hostHasColourEmoji(): boolean | null {
  const listed = Bun.spawnSync(["fc-list", ":color=true:charset=1f44b", "family"], { stdout: "pipe", stderr: "ignore" });
  return listed.exitCode === 0 ? listed.stdout.toString().trim() !== "" : null;
}

let workDir: string;
let binary: string;
let engine: SpawnedEngine;
let adminToken: string;
let browser: Browser | undefined;
let page: Page;

const shot = (name: string) => page.screenshot({ path: join(SCREENSHOTS, `engine-${name}.png`), fullPage: true });

beforeAll(async () => {
  mkdirSync(SCREENSHOTS, { recursive: true });
  workDir = tempDir("engine-e2e-ui-");
  // The work dir stands in for /var/lib, where a root engine keeps its data by default: service
  // users must search it to reach their data dirs (README, "Where data lives"; the engine warns
  // at start when they cannot). mktemp's 0700 would leave the SQLite restore's user outside.
  chmodSync(workDir, 0o755);
  binary = await installEngine(workDir);
  const templates = join(workDir, "templates");
  mkdirSync(templates, { recursive: true });
  const port = await freePort();
  writeFileSync(
    join(templates, "hello.json"),
    JSON.stringify({ ...HELLO_TEMPLATE, deploy_defaults: { ...HELLO_TEMPLATE.deploy_defaults, port } }),
  );
  writeFileSync(join(templates, "cuda-demo.json"), JSON.stringify(GPU_TEMPLATE));
  engine = await spawnEngine(join(workDir, "data"), {
    command: [binary],
    // The proxy runs (one process, free ports, no mDNS) so a domain can be added from the deploy form.
    env: {
      ENGINE_SHIM: "",
      ENGINE_PROXY: "on",
      ENGINE_HTTPS_PORT: "0",
      ENGINE_HTTP_PORT: "0",
      ENGINE_MDNS: "off",
      ENGINE_PROXY_PROCESSES: "1",
      ENGINE_TEMPLATES_DIR: templates,
    },
  });
  adminToken = readFileSync(join(workDir, "data", "admin.token"), "utf8").trim();
  browser = await launchChromium();
  page = await browser.newPage({ viewport: { width: 1200, height: 800 } });
  page.setDefaultTimeout(STEP_MS);
}, 240_000);

afterAll(async () => {
  await browser?.close();
  await engine?.stop();
  if (workDir) {
    reapWorkloads(join(workDir, "data"));
    rmSync(workDir, { recursive: true, force: true });
  }
});

const bearer = (token: string) => ({ authorization: `Bearer ${token}` });
const redisTools = new RedisEngine().detectTools({ PATH: process.env.PATH ?? "" }).missing.length === 0;

describe("the engine's web UI in a browser (compiled dist/engine, headless Chromium)", () => {
  test("`engine ui` prints a link that signs the browser in once; signing out returns to the token form", async () => {
    const { code, stdout } = await runCli(["--data-dir", join(workDir, "data"), "ui"], {}, [binary]);
    expect(code).toBe(0);
    const link = /(http:\/\/\S+\/ui\/login\?code=\S+)/.exec(stdout)?.[1] ?? "";
    expect(link).toStartWith(`${engine.url}/ui/login?code=`);
    await page.goto(link);
    await page.getByRole("heading", { name: "Services" }).waitFor();
    // The spent code left the address bar.
    expect(page.url()).toBe(`${engine.url}/`);
    const cookies = await page.context().cookies(engine.url);
    const session = cookies.find((cookie) => cookie.name === "engine_ui_session");
    expect(session?.httpOnly).toBe(true);
    expect(session?.sameSite).toBe("Strict");
    await page.getByRole("button", { name: "Sign out" }).click();
    await page.getByRole("heading", { name: "Sign in" }).waitFor();
    await shot("signin");
    // The same link again: refused.
    const again = await page.goto(link);
    expect(again?.status()).toBe(401);
  }, 60_000);

  test("signing in with a token opens the services list", async () => {
    await page.goto(`${engine.url}/`);
    await page.getByLabel("Access token").fill("eng_notARealTokenAtAll0123456789");
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.getByRole("alert").waitFor();
    await page.getByLabel("Access token").fill(adminToken);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.getByRole("heading", { name: "Services" }).waitFor();
    await page.getByRole("navigation", { name: "Main" }).getByText("(admin)").waitFor();
  }, 60_000);

  test("a template deploys from the gallery with its env form, and its logs arrive live", async () => {
    await page.getByRole("link", { name: "Templates" }).click();
    await page.getByRole("heading", { name: "Hello" }).waitFor();
    await shot("templates");
    // The icon is the emoji where the browser draws it in colour, else the name's initials.
    const icon = page.getByRole("heading", { name: "Hello" }).locator(".icon, .icon-badge");
    expect(await icon.count()).toBe(1);
    const colourEmoji = hostHasColourEmoji();
    if (colourEmoji !== null) {
      expect(await icon.getAttribute("class")).toBe(colourEmoji ? "icon" : "icon-badge");
      expect(await icon.textContent()).toBe(colourEmoji ? "👋" : "He");
    }

    // A template that suggests a GPU starts at what this host has: 0, with the hint, on a host without GPUs.
    const inventory = (await (await fetch(`${engine.url}/api/gpus`, { headers: bearer(adminToken) })).json()) as { devices: unknown[] };
    await page.getByRole("button", { name: "Deploy CUDA Demo" }).click();
    await page.getByRole("heading", { name: "Deploy CUDA Demo" }).waitFor();
    const gpus = page.getByLabel("GPUs", { exact: true });
    expect(await gpus.inputValue()).toBe(String(Math.min(1, inventory.devices.length)));
    const gpuHint = await page.locator(`#${await gpus.getAttribute("aria-describedby")}`).textContent();
    expect(gpuHint).toBe(
      inventory.devices.length === 0
        ? "no GPUs on this host (the template suggests 1)"
        : `${inventory.devices.length} GPU${inventory.devices.length === 1 ? "" : "s"} on this host`,
    );
    await shot("template-gpu-form");
    await page.getByRole("button", { name: "Cancel" }).click();

    await page.getByRole("button", { name: "Deploy Hello" }).click();
    await page.getByRole("heading", { name: "Deploy Hello" }).waitFor();
    // The form follows env_schema: a required field, a secret one as a password input.
    expect(await page.getByLabel("GREETING (required)").getAttribute("required")).not.toBeNull();
    expect(await page.getByLabel("API_KEY — secret").getAttribute("type")).toBe("password");
    await page.getByLabel("GREETING (required)").fill("from-the-gallery");
    await page.getByLabel("API_KEY — secret").fill("s3cret-value");
    await page.getByLabel("Domain (optional)").fill("hello-ui.localhost");
    await page.getByRole("button", { name: "Deploy", exact: true }).click();
    await page.waitForURL(`${engine.url}/#/services/hello`);
    await page.getByRole("log", { name: "Logs of hello" }).getByText("hello from-the-gallery").waitFor();
    await page.locator(".badge", { hasText: "running" }).first().waitFor();
    await shot("service");
    // The secret went in as a secret: its name is listed, its value never is.
    const record = (await (await fetch(`${engine.url}/api/services/hello`, { headers: bearer(adminToken) })).json()) as {
      secret_keys: string[];
      env: Record<string, string>;
    };
    expect(record.secret_keys).toContain("API_KEY");
    expect(record.env.GREETING).toBe("from-the-gallery");

    // More lines arrive over the open stream, not on reload.
    await page.getByRole("button", { name: "Restart" }).click();
    await eventually(async () => ((await page.getByRole("log").textContent()) ?? "").split("hello from-the-gallery").length > 2, {
      timeoutMs: STEP_MS,
    });

    await page.getByRole("link", { name: "Services" }).first().click();
    const row = page.getByRole("row", { name: /hello/ });
    await row.getByText("running").waitFor();
    await row.getByRole("link", { name: "hello-ui.localhost" }).waitFor();
    await shot("services");
  }, 90_000);

  test("a crashed service shows its diagnosis: cause, key log line and remediation first, then forensics", async () => {
    await page.goto(`${engine.url}/#/`);
    await page.getByLabel("Name", { exact: true }).fill("crasher");
    await page.getByLabel("Command", { exact: true }).fill("echo about to fail: cannot open model.bin >&2; exit 1");
    await page.getByLabel("Kind", { exact: true }).selectOption("batch");
    await page.getByRole("button", { name: "Deploy", exact: true }).click();
    await page.waitForURL(`${engine.url}/#/services/crasher`);
    const report = page.getByRole("region", { name: "Diagnosis" });
    await report.locator(".verdict.problem").waitFor();
    await page.locator(".badge", { hasText: "failed" }).first().waitFor();
    const text = (await report.textContent()) ?? "";
    expect(text.indexOf("Cause")).toBeLessThan(text.indexOf("Forensics"));
    // The line of its output that says what went wrong, and the class and fix it implies.
    expect(await report.locator(".key-line").textContent()).toBe("about to fail: cannot open model.bin");
    expect(text.indexOf("Key log line")).toBeLessThan(text.indexOf("Remediation"));
    expect(await report.locator(".cause").textContent()).toStartWith("file_not_found: it could not open a file: model.bin");
    expect(await report.locator(".remediation code").textContent()).toBe("provide_file");
    expect(text).toContain("Restart window");
    const exitCode = report.locator("dt", { hasText: "Last exit code" }).locator("xpath=following-sibling::dd[1]");
    await eventually(async () => (await exitCode.textContent()) === "1", { timeoutMs: STEP_MS });
    // A root engine runs each service as its own user; as a user, as the engine's own.
    const runsAs = report.locator("dt", { hasText: "Runs as" }).locator("xpath=following-sibling::dd[1]");
    expect(await runsAs.textContent()).toBe(process.getuid?.() === 0 ? "eng-crasher" : "the engine's own user");
    await page.getByRole("log", { name: "Logs of crasher" }).getByText("about to fail").first().waitFor();
    await shot("diagnosis");
    // The logs are above the report: its remedy does not send the reader "below".
    expect((await report.textContent()) ?? "").not.toMatch(/\bbelow\b/);

    // The services list says why it failed: the message column of `engine services list`.
    const failed = (await (await fetch(`${engine.url}/api/services/crasher`, { headers: bearer(adminToken) })).json()) as {
      status: string;
      status_message: string | null;
    };
    expect(failed.status).toBe("failed");
    expect(failed.status_message).toContain("exited with code 1");
    await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Services" }).click();
    const row = page.getByRole("row", { name: /crasher/ });
    await row.getByText(failed.status_message ?? "").waitFor();
    const headers = await page.locator("thead th").allTextContents();
    const cells = await row.locator("td").allTextContents();
    expect(cells[headers.indexOf("Message")]).toBe(failed.status_message ?? "");
  }, 60_000);

  test("the logs of a service that has printed nothing say so at once, instead of connecting forever", async () => {
    const deployed = await fetch(`${engine.url}/api/services`, {
      method: "POST",
      headers: { ...bearer(adminToken), "content-type": "application/json" },
      body: JSON.stringify({ name: "quiet", command: "exec sleep 300" }),
    });
    expect(deployed.status).toBe(201);
    await page.goto(`${engine.url}/#/services/quiet`);
    const panel = page.getByRole("region", { name: /^Logs/ });
    await panel.getByText("No output yet.").waitFor({ timeout: STEP_MS });
    expect(await panel.getByText("live").count()).toBe(1);
  }, 60_000);

  test("a service's page watches its record with blocking reads: a crash answers the one held and it asks again with the new index", async () => {
    const watched = (index?: string) =>
      page.waitForRequest(
        (request) => {
          const url = new URL(request.url());
          return (
            url.pathname === "/api/services/quiet" &&
            url.searchParams.has("wait") &&
            (index === undefined || url.searchParams.get("index") !== index)
          );
        },
        { timeout: STEP_MS },
      );
    const first = watched();
    await page.reload();
    const held = new URL((await first).url()).searchParams.get("index") ?? "";
    expect(held).toMatch(/^[0-9a-z]+$/);
    // The workload dies: the engine restarts it, the held read answers, and the page asks again.
    const again = watched(held);
    const record = (await (await fetch(`${engine.url}/api/services/quiet`, { headers: bearer(adminToken) })).json()) as { pid: number };
    process.kill(record.pid, "SIGKILL");
    expect(new URL((await again).url()).searchParams.get("index")).not.toBe(held);
    await page.locator(".badge", { hasText: "running" }).first().waitFor();
  }, 60_000);

  test("action buttons that cannot apply are disabled, with the reason as their title", async () => {
    const actions = page.getByRole("group", { name: "Service actions" });
    const button = (name: string) => actions.getByRole("button", { name, exact: true });
    await page.locator(".badge", { hasText: "running" }).first().waitFor();
    // Running: Pause and Stop apply, Start does not.
    await eventually(async () => (await button("Pause").isEnabled()) && !(await button("Start").isEnabled()), { timeoutMs: STEP_MS });
    expect(await button("Start").getAttribute("title")).toBe("The service is running: stop it first, or use Restart");
    expect(await button("Stop").isEnabled()).toBe(true);

    await button("Stop").click();
    await page.locator(".badge", { hasText: "stopped" }).first().waitFor();
    await eventually(async () => !(await button("Pause").isEnabled()), { timeoutMs: STEP_MS });
    expect(await button("Pause").getAttribute("title")).toBe("Only a running process can be paused; the service is stopped");
    expect(await button("Stop").isEnabled()).toBe(false);
    expect(await button("Stop").getAttribute("title")).toBe("The service is already stopped");
    expect(await button("Start").isEnabled()).toBe(true);
    expect(await button("Start").getAttribute("title")).toBeNull();
    await shot("service-stopped");
    // The engine agrees: pausing a stopped service is refused.
    const paused = await fetch(`${engine.url}/api/services/quiet/pause`, { method: "POST", headers: bearer(adminToken) });
    expect(paused.status).toBe(409);
    await fetch(`${engine.url}/api/services/quiet`, { method: "DELETE", headers: bearer(adminToken) });
  }, 60_000);

  test("a health probe reads as one line, not JSON", async () => {
    const port = await freePort();
    const deployed = await fetch(`${engine.url}/api/services`, {
      method: "POST",
      headers: { ...bearer(adminToken), "content-type": "application/json" },
      body: JSON.stringify({
        name: "probed",
        command: "exec sleep 300",
        port,
        health: { type: "http", path: "/health", interval_s: 10, timeout_s: 2, failure_threshold: 3 },
      }),
    });
    expect(deployed.status).toBe(201);
    await page.goto(`${engine.url}/#/services/probed`);
    const report = page.getByRole("region", { name: "Diagnosis" });
    const probe = report.locator("dt", { hasText: /^Probe$/ }).locator("xpath=following-sibling::dd[1]");
    await probe.waitFor();
    expect(await probe.textContent()).toBe(`HTTP GET :${port}/health every 10 s, timeout 2 s, 3 failures, start period 10 s`);
    expect(await report.locator("dt", { hasText: "Last probe" }).count()).toBe(1);
    expect((await report.textContent()) ?? "").not.toContain('"type"');
    await fetch(`${engine.url}/api/services/probed`, { method: "DELETE", headers: bearer(adminToken) });
  }, 60_000);

  test("a token is created with its secret shown once, and revoked", async () => {
    await page.getByRole("link", { name: "Tokens" }).click();
    await page.getByRole("heading", { name: "Create a token" }).waitFor();
    await page.getByLabel("Name", { exact: true }).fill("e2e-ui");
    await page.getByLabel("Role", { exact: true }).selectOption("submitter");
    await page.getByRole("button", { name: "Create" }).click();
    const secret = await page.getByLabel("New token").inputValue();
    expect(secret.length).toBeGreaterThan(20);
    expect((await fetch(`${engine.url}/api/services`, { headers: bearer(secret) })).status).toBe(200);
    await shot("tokens");
    // Shown once: the page never has it again.
    await page.reload();
    await page.getByRole("row", { name: /e2e-ui/ }).waitFor();
    expect(await page.getByLabel("New token").count()).toBe(0);
    expect(await page.content()).not.toContain(secret);

    await page.getByRole("button", { name: "Revoke e2e-ui" }).click();
    await page.getByRole("dialog").getByRole("button", { name: "Revoke" }).click();
    await page
      .getByRole("row", { name: /e2e-ui/ })
      .getByText("revoked")
      .waitFor();
    expect((await fetch(`${engine.url}/api/services`, { headers: bearer(secret) })).status).toBe(401);
  }, 60_000);

  test("deleting a service asks first", async () => {
    await page.goto(`${engine.url}/#/services/crasher`);
    await page.getByRole("button", { name: "Delete…" }).click();
    await page.getByRole("dialog").getByRole("button", { name: "Cancel" }).click();
    expect((await fetch(`${engine.url}/api/services/crasher`, { headers: bearer(adminToken) })).status).toBe(200);
    await page.getByRole("button", { name: "Delete…" }).click();
    await page.getByRole("dialog").getByRole("button", { name: "Delete" }).click();
    await page.waitForURL(`${engine.url}/#/`);
    await eventually(async () => (await fetch(`${engine.url}/api/services/crasher`, { headers: bearer(adminToken) })).status === 404, {
      timeoutMs: STEP_MS,
    });
  }, 60_000);

  test("a dump is restored into a SQLite database service from the databases page", async () => {
    const deployed = await fetch(`${engine.url}/api/services`, {
      method: "POST",
      headers: { ...bearer(adminToken), "content-type": "application/json" },
      body: JSON.stringify({ name: "notes", engine: "sqlite" }),
    });
    expect(deployed.status).toBe(201);
    await eventually(
      async () =>
        ((await (await fetch(`${engine.url}/api/services/notes`, { headers: bearer(adminToken) })).json()) as { status: string }).status ===
        "running",
      { timeoutMs: 30_000 },
    );
    const dump = join(workDir, "notes.sql");
    writeFileSync(
      dump,
      "PRAGMA foreign_keys=OFF;\nBEGIN TRANSACTION;\nCREATE TABLE notes (id INTEGER, body TEXT);\nINSERT INTO notes VALUES (1, 'restored');\nCOMMIT;\n",
    );
    await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Databases" }).click();
    await page.getByRole("heading", { name: "Restore a dump" }).waitFor();
    // The form's timeout is the CLI's default, which `engine restore --help` shows.
    expect(await page.getByLabel("Timeout (seconds)").inputValue()).toBe(String(DEFAULT_RESTORE_TIMEOUT_S));
    const help = await runCli(["restore", "--help"], {}, [binary]);
    expect(help.stdout).toContain(`(default: "${DEFAULT_RESTORE_TIMEOUT_S}")`);
    await page.getByLabel("Database", { exact: true }).selectOption("notes");
    await page.getByLabel("Dump", { exact: true }).fill(dump);
    await page.getByRole("button", { name: "Restore" }).click();
    await page
      .getByRole("status")
      .getByText(/Restored into notes \(sqlite\)/)
      .waitFor({ timeout: 30_000 });
    await shot("databases");
    // The database's page reads its last restore as labelled rows: file, size, time; result.
    await page.goto(`${engine.url}/#/services/notes`);
    const report = page.getByRole("region", { name: "Diagnosis" });
    const row = (label: string) => report.locator("dt", { hasText: new RegExp(`^${label}$`) }).locator("xpath=following-sibling::dd[1]");
    await row("Last dump").waitFor();
    const size = statSync(dump).size;
    expect(await row("Last dump").textContent()).toStartWith(`${dump}, ${size} B, `);
    expect(await row("Result").textContent()).toMatch(/^restored in \d/);
    expect((await report.textContent()) ?? "").not.toContain('"total_bytes"');
    await shot("database-last-dump");
  }, 60_000);

  (redisTools ? test : test.skip)(
    "a database's page shows its connection URL masked; an admin's Reveal shows the password, Hide masks it again",
    async () => {
      const password = "ui-reveal-pw-42";
      const deployed = await fetch(`${engine.url}/api/services`, {
        method: "POST",
        headers: { ...bearer(adminToken), "content-type": "application/json" },
        body: JSON.stringify({ name: "kv", engine: "redis", secrets: { REDIS_PASSWORD: password } }),
      });
      expect(deployed.status).toBe(201);
      await page.goto(`${engine.url}/#/services/kv`);
      await page.getByRole("heading", { name: "Connection" }).waitFor();
      const url = page.locator("code.connection-url");
      await expect(url.textContent()).resolves.toMatch(/^redis:\/\/:\*\*\*\*@127\.0\.0\.1:\d+\/0$/);
      expect(await page.content()).not.toContain(password);
      await page.getByRole("button", { name: "Reveal" }).click();
      await page.getByRole("button", { name: "Hide" }).waitFor();
      await expect(url.textContent()).resolves.toContain(`:${password}@`);
      await shot("connection");
      await page.getByRole("button", { name: "Hide" }).click();
      await expect(url.textContent()).resolves.toContain(":****@");
      await fetch(`${engine.url}/api/services/kv/stop`, { method: "POST", headers: bearer(adminToken) });
    },
    60_000,
  );

  test("a readonly token's session sees no deploy, action or token-creation controls", async () => {
    const created = await fetch(`${engine.url}/api/tokens`, {
      method: "POST",
      headers: { ...bearer(adminToken), "content-type": "application/json" },
      body: JSON.stringify({ name: "e2e-readonly", role: "readonly" }),
    });
    const { token } = (await created.json()) as { token: string };
    const context = await (browser as Browser).newContext();
    try {
      const readonly = await context.newPage();
      readonly.setDefaultTimeout(STEP_MS);
      await readonly.goto(`${engine.url}/`);
      await readonly.getByLabel("Access token").fill(token);
      await readonly.getByRole("button", { name: "Sign in" }).click();
      await readonly.getByRole("row", { name: /hello/ }).waitFor();
      expect(await readonly.getByRole("heading", { name: "Deploy a command" }).count()).toBe(0);
      await readonly.goto(`${engine.url}/#/services/hello`);
      await readonly.getByRole("heading", { name: "Diagnosis" }).waitFor();
      expect(await readonly.getByRole("button", { name: "Restart" }).count()).toBe(0);
      if (redisTools) {
        // The masked connection, without a Reveal button: only an admin may reveal it.
        await readonly.goto(`${engine.url}/#/services/kv`);
        await readonly.getByRole("heading", { name: "Connection" }).waitFor();
        expect(await readonly.locator("code.connection-url").textContent()).toContain(":****@");
        expect(await readonly.getByRole("button", { name: "Reveal" }).count()).toBe(0);
      }
      await readonly.goto(`${engine.url}/#/tokens`);
      await readonly.getByRole("row", { name: /e2e-readonly/ }).waitFor();
      expect(await readonly.getByRole("heading", { name: "Create a token" }).count()).toBe(0);
    } finally {
      await context.close();
    }
  }, 60_000);

  test("every form control on the main pages has an accessible name", async () => {
    for (const hash of ["#/", "#/tokens", "#/databases"]) {
      await page.goto(`${engine.url}/${hash}`);
      await page.locator("main h1").waitFor();
      await page.locator("main input, main select").first().waitFor();
      const unnamed = await page.evaluate(() =>
        Array.from(document.querySelectorAll("main input, main select"))
          .filter((element) => (element as HTMLInputElement).labels?.length === 0 && !element.getAttribute("aria-label"))
          .map((element) => element.outerHTML),
      );
      expect({ hash, unnamed }).toEqual({ hash, unnamed: [] });
    }
    // The page has its landmarks and a skip link to the content.
    expect(await page.getByRole("banner").count()).toBe(1);
    expect(await page.getByRole("main").count()).toBe(1);
    await page.reload();
    await page.locator("main h1").waitFor();
    await page.keyboard.press("Tab");
    expect(await page.evaluate(() => document.activeElement?.textContent)).toBe("Skip to content");
  }, 60_000);

  test("the other pages render: GPUs, proxy, link", async () => {
    for (const [link, heading, name] of [
      ["GPUs", "GPUs", "gpus"],
      ["Proxy", "Proxy", "proxy"],
      ["Link", "Link to the cloud console", "link"],
    ] as const) {
      await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: link }).click();
      await page.getByRole("heading", { name: heading, exact: true }).waitFor();
      expect(await page.getByRole("alert").count()).toBe(0);
      if (name === "proxy") {
        // The CA's fingerprint, and the domain added at deploy with its certificate's expiry.
        await page.getByText(/^([0-9A-F]{2}:){31}[0-9A-F]{2}$/i).waitFor();
        const row = page.getByRole("row", { name: /hello-ui\.localhost/ });
        await row.waitFor();
        expect(await row.textContent()).toMatch(/\d{4}/);
      }
      await shot(name);
    }
    // Narrow screens: the same page without horizontal scrolling of the page itself.
    await page.setViewportSize({ width: 390, height: 800 });
    await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Services" }).click();
    await page.getByRole("heading", { name: "Services" }).waitFor();
    expect(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth + 1)).toBe(true);
    await shot("services-narrow");
  }, 60_000);
});
