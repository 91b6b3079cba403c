import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { copyFileSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Browser } from "playwright-core";
import { freePort, reapWorkloads, removeServiceUsers, tempDir } from "../helpers";
import { buildBinaries } from "./binaries";
import { launchChromium } from "./processes";
import { Terminal } from "./terminal";

/**
 * The first hour, as a new user meets it (issue 19): the compiled `engine` put on the PATH as
 * the README says, driven through a real terminal (tmux), with the engine's own defaults except
 * where a test must differ (a temp data dir, free ports, no mDNS on the LAN). Start the daemon,
 * deploy a template and a command, watch the logs of a service that never printed (CLI and
 * browser), fix an OOM with the command the diagnosis prints, see a port clash explained, restore
 * a database and read its URL. Each step reads what the terminal shows, as a user reads it.
 */

let workDir: string;
let dataDir: string;
let term: Terminal;
let shell: string;
let serve: string;
let apiPort: number;
let browser: Browser | undefined;

beforeAll(async () => {
  workDir = tempDir("engine-walkthrough-");
  dataDir = join(workDir, "data");
  // The work dir stands in for /var/lib, where a root engine keeps its data by default: others
  // may traverse it (0755), as PostgreSQL's own user must to reach its data (README, "Where data
  // lives"); mktemp's 0700 would make the engine refuse it, naming this fix.
  Bun.spawnSync(["chmod", "755", workDir]);
  const bin = join(workDir, "bin");
  mkdirSync(bin);
  // README: "build the single binary and put it on the PATH".
  copyFileSync((await buildBinaries()).engine, join(bin, "engine"));
  Bun.spawnSync(["chmod", "755", join(bin, "engine")]);
  apiPort = await freePort();
  term = new Terminal("walkthrough", {
    PATH: `${bin}:${process.env.PATH ?? "/usr/bin:/bin"}`,
    HOME: process.env.HOME ?? "/tmp",
    TERM: "xterm-256color",
    // The data dir and ports of this test (README, Configuration); nothing else is set.
    ENGINE_DATA_DIR: dataDir,
    ENGINE_PORT: String(apiPort),
    ENGINE_HTTPS_PORT: "0",
    ENGINE_HTTP_PORT: "0",
    ENGINE_MDNS: "off",
  });
  serve = term.open(workDir);
  shell = term.open(workDir);
}, 240_000);

afterAll(async () => {
  await browser?.close();
  if (term) {
    // The transcript, to be read as a user would have seen it (test/e2e/screenshots/ is ignored by git).
    mkdirSync(join(import.meta.dir, "screenshots"), { recursive: true });
    writeFileSync(join(import.meta.dir, "screenshots", "walkthrough.txt"), `${term.screen(serve)}\n----\n${term.screen(shell)}`);
    // Ctrl-C as a user stops it; the services keep running and are reaped below.
    term.key(serve, "C-c");
    await term.waitFor(serve, /"msg":"stopped"|\$ $/m, 15_000).catch(() => undefined);
    term.close();
  }
  if (workDir) {
    if (existsSync(dataDir)) {
      reapWorkloads(dataDir);
      removeServiceUsers(dataDir);
    }
    rmSync(workDir, { recursive: true, force: true });
  }
});

describe("the first hour in a terminal (compiled engine, tmux)", () => {
  test("engine serve starts and says where the API, the UI and the admin token are", async () => {
    term.type(serve, "engine serve");
    const screen = await term.waitFor(serve, /engine: sign in to the web UI with `engine .*ui`/, 60_000);
    // The human lines beside the JSON log: where the API and UI are, how to sign in, the token's file.
    expect(screen).toContain(`http://127.0.0.1:${apiPort}`);
    expect(screen).toContain(join(dataDir, "admin.token"));
    expect(screen).not.toContain(readFileSync(join(dataDir, "admin.token"), "utf8").trim());
    const version = await term.run(shell, "engine version");
    expect(version.code).toBe(0);
  }, 90_000);

  test("a template and a command deploy, and the list shows them running", async () => {
    const templates = await term.run(shell, "engine templates list");
    expect(templates.out).toMatch(/^postgres\s+PostgreSQL/m);
    expect((await term.run(shell, "engine services deploy db --template postgres", 60_000)).code).toBe(0);
    expect((await term.run(shell, "engine services deploy quiet --command 'sleep 600'")).code).toBe(0);
    await waitStatus("db", "running", 90_000);
    await waitStatus("quiet", "running");
  }, 180_000);

  test("the logs of a service that never printed say so, in the terminal and in the browser", async () => {
    const logs = await term.run(shell, "engine logs quiet");
    expect(logs).toEqual({ code: 0, out: "quiet has printed nothing yet" });
    const follow = term.open(workDir);
    term.type(follow, "engine logs -f quiet");
    await term.waitFor(follow, /quiet has printed nothing yet; waiting for output \(Ctrl-C to stop\)/, 15_000);
    term.key(follow, "C-c");

    const link = /(http:\/\/\S+\/ui\/login\?code=\S+)/.exec((await term.run(shell, "engine ui")).out)?.[1] ?? "";
    expect(link).toContain(`127.0.0.1:${apiPort}/ui/login?code=`);
    browser = await launchChromium();
    const page = await browser.newPage();
    page.setDefaultTimeout(15_000);
    await page.goto(link);
    await page.getByRole("heading", { name: "Services" }).waitFor();
    await page.goto(`http://127.0.0.1:${apiPort}/#/services/quiet`);
    await page.getByRole("log", { name: "Logs of quiet" }).getByText("No output yet.").waitFor();
  }, 90_000);

  test("an OOM is fixed with the command the diagnosis prints", async () => {
    // 48 MiB of Python objects in a 32 MiB cgroup: the kernel kills it; twice that is enough.
    const script = join(workDir, "hog.py");
    writeFileSync(script, "x = bytearray(48 * 1024 * 1024)\nprint('allocated', len(x))\n");
    Bun.spawnSync(["chmod", "644", script]);
    expect((await term.run(shell, `engine services deploy hog --kind batch --memory-mb 32 -- python3 ${script}`)).code).toBe(0);
    const diagnosis = await until(async () => {
      const run = await term.run(shell, "engine diagnose hog");
      return /oom_killed/.test(run.out) ? run.out : "";
    });
    const fix = /`?(engine services update hog --memory-mb \d+)`?/.exec(diagnosis)?.[1];
    if (!fix) throw new Error(`no update command in the diagnosis:\n${diagnosis}`);
    expect((await term.run(shell, fix ?? "false")).code).toBe(0);
    await waitStatus("hog", "completed", 60_000);
    expect((await term.run(shell, "engine logs --raw hog")).out).toContain("allocated 50331648");
  }, 120_000);

  test("a port clash is refused when declared and explained when not", async () => {
    const port = await freePort();
    expect(
      (await term.run(shell, `engine services deploy web --port ${port} -- python3 -m http.server ${port} --bind 127.0.0.1`)).code,
    ).toBe(0);
    await waitStatus("web", "running");
    const declared = await term.run(shell, `engine services deploy web2 --port ${port} -- python3 -m http.server ${port} --bind 127.0.0.1`);
    expect(declared.code).toBe(1);
    expect(declared.out).toContain("web");
    expect(declared.out).toContain("[port_taken]");
    // Undeclared: the engine can't know before it runs; the diagnosis names the cause and the holder.
    expect((await term.run(shell, `engine services deploy web3 -- python3 -m http.server ${port} --bind 127.0.0.1`)).code).toBe(0);
    const diagnosis = await until(async () => {
      const run = await term.run(shell, "engine diagnose web3");
      return /port/i.test(run.out.split("\n")[0] ?? "") ? run.out : "";
    }, 60_000);
    const head = diagnosis.split("\n").slice(0, 3).join("\n");
    expect(head).toContain(String(port));
    expect(head).toContain("web");
    expect(head).toContain("Address already in use");
  }, 120_000);

  test("a database is restored and its URL read, masked and then revealed", async () => {
    const dump = join(workDir, "walk.sql");
    writeFileSync(dump, "CREATE TABLE walk (step text);\nINSERT INTO walk VALUES ('restored');\n");
    Bun.spawnSync(["chmod", "644", dump]);
    const restored = await term.run(shell, `engine restore db ${dump}`, 120_000);
    expect(restored.code).toBe(0);
    const shown = await term.run(shell, "engine services show db");
    expect(shown.out).toMatch(/postgres(ql)?:\/\/\S+:\*{3,}@127\.0\.0\.1:\d+\/\S+/);
    const revealed = await term.run(shell, "engine services show db --reveal");
    const url = /(postgres(?:ql)?:\/\/\S+:[^*\s]+@127\.0\.0\.1:\d+\/\S+)/.exec(revealed.out)?.[1];
    expect(url).toBeDefined();
    const read = await term.run(shell, `psql '${url}' -Atc 'SELECT step FROM walk'`);
    expect(read).toEqual({ code: 0, out: "restored" });
  }, 180_000);

  test("Ctrl-C stops the daemon and says the services keep running; the next start adopts them; stop --all ends them", async () => {
    term.key(serve, "C-c");
    const stopped = await term.waitFor(serve, /engine: to stop them all, run `engine services stop --all`/, 30_000);
    expect(stopped).toMatch(/engine: stopped\. \d+ services keep running \(.*quiet.*\); the next `engine serve` adopts them/);
    term.type(serve, "clear; engine serve");
    await term.waitFor(serve, /engine: sign in to the web UI with `engine .*ui`/, 60_000);
    await waitStatus("quiet", "running");
    const all = await term.run(shell, "engine services stop --all", 60_000);
    expect(all.code).toBe(0);
    expect(all.out).toContain("quiet");
    const list = await term.run(shell, "engine services list");
    expect(list.out).not.toMatch(/\brunning\b/);
  }, 120_000);
});

/** until re-runs a check (each a terminal command) until it gives a value, or fails at the deadline. */
async function until<T>(check: () => Promise<T>, timeoutMs = 30_000): Promise<Exclude<T, "" | null | undefined>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value as Exclude<T, "" | null | undefined>;
    if (Date.now() > deadline) throw new Error(`not met within ${timeoutMs} ms; the terminal shows:\n${term.screen(shell).slice(-3000)}`);
    await Bun.sleep(500);
  }
}

/** waitStatus reads `engine services list` in the terminal until the service has the status. */
function waitStatus(name: string, status: string, timeoutMs = 30_000): Promise<string> {
  return until(async () => {
    const list = await term.run(shell, "engine services list");
    return new RegExp(`^${name}\\s+\\S+\\s+${status}\\b`, "m").test(list.out) ? list.out : "";
  }, timeoutMs);
}
