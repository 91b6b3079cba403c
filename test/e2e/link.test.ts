import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { eventually, runCli, tempDir } from "../helpers";
import { type Binaries, buildBinaries } from "./binaries";
import { Children, cloudListening, linkEvent, mintSession, type Running, userCodeIn } from "./processes";

/**
 * The compiled `engine` links to a compiled `engine-cloud` by each route a user has: the
 * device flow (the code shown, approved over the console's API), a pre-authorized key and a
 * link code; a denial and Ctrl-C end the device flow cleanly.
 */

/** finish waits for a child to exit (at most `timeoutMs`) and lets its output drain. */
async function finish(running: Running, timeoutMs = 60_000): Promise<number> {
  const code = await Promise.race([running.proc.exited, Bun.sleep(timeoutMs).then(() => null)]);
  if (code === null) throw new Error(`still running after ${timeoutMs} ms: ${running.stdout()} ${running.stderr()}`);
  await Bun.sleep(50);
  return code;
}

const children = new Children();
let binaries: Binaries;
let workDir: string;
let cloud: Running;
let cloudUrl: string;
let session: string;

const engine = (dataDir: string, ...args: string[]) => runCli(["--data-dir", dataDir, ...args], {}, [binaries.engine]);

async function api(method: string, path: string, body?: unknown) {
  const response = await fetch(`${cloudUrl}${path}`, {
    method,
    headers: { authorization: `Bearer ${session}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  // biome-ignore lint/suspicious/noExplicitAny: a test reads whichever fields it asserts on.
  return { status: response.status, body: (await response.json().catch(() => null)) as any };
}

async function status(dataDir: string) {
  const shown = await engine(dataDir, "link", "status", "--json");
  expect(shown.code).toBe(0);
  return JSON.parse(shown.stdout) as Record<string, unknown>;
}

beforeAll(async () => {
  binaries = await buildBinaries();
  workDir = tempDir("engine-e2e-link-");
  const cloudDir = join(workDir, "cloud");
  cloud = children.start([binaries.cloud, "--data-dir", cloudDir, "serve", "--port", "0", "--log-level", "info"]);
  cloudUrl = await cloudListening(cloud);
  session = await mintSession(binaries.cloud, cloudDir, "--email", "e2e@example.com", "--create");
  expect(session.length).toBeGreaterThan(20);
}, 240_000);

afterAll(async () => {
  await children.stopAll();
  if (workDir) rmSync(workDir, { recursive: true, force: true });
});

describe("engine link against engine-cloud (compiled)", () => {
  test("device flow: the code is shown, approved over the API, and the engine is linked", async () => {
    const dataDir = join(workDir, "device");
    const linking = children.start([binaries.engine, "--data-dir", dataDir, "link", "--cloud", cloudUrl]);
    const userCode = await eventually(() => userCodeIn(linking.stdout()), { timeoutMs: 20_000 });
    expect(linking.stdout()).toContain(`${cloudUrl}`);
    expect(linking.stdout()).toMatch(/user_code=|Or open this link/);
    const approved = await api("POST", "/api/nodes/device-approvals/approve", { user_code: userCode });
    expect(approved.status).toBe(200);
    expect(await finish(linking)).toBe(0);
    expect(linking.stdout()).toContain("linked: this machine is");

    const shown = await status(dataDir);
    expect(shown).toMatchObject({
      linked: true,
      node_id: approved.body.node_id,
      slug: approved.body.slug,
      cloud_url: cloudUrl,
      hosted_base_domain: "hosted.localhost",
    });
    expect(Object.keys(shown)).not.toContain("node_credential");
    const identityPath = join(dataDir, "link", "identity.json");
    expect(statSync(identityPath).mode & 0o777).toBe(0o600);
    expect(statSync(join(dataDir, "link")).mode & 0o777).toBe(0o700);
    expect(readFileSync(identityPath, "utf8")).toContain("sealed_node_credential");

    // Linked already: a second `engine link` refuses instead of replacing the identity.
    const again = await engine(dataDir, "link", "--cloud", cloudUrl);
    expect(again.code).not.toBe(0);
    expect(again.stderr).toContain("already linked");

    const unlinked = await engine(dataDir, "unlink");
    expect(unlinked.code).toBe(0);
    expect(unlinked.stdout).toContain(`removed node ${approved.body.slug}`);
    expect(await status(dataDir)).toMatchObject({ linked: false });
  }, 90_000);

  test("a pre-authorized key links without a browser (--json prints the identity as a JSON line)", async () => {
    const key = await api("POST", "/api/preauth-keys", { max_uses: 1 });
    expect(key.status).toBe(201);
    const dataDir = join(workDir, "key");
    const linked = await engine(dataDir, "--json", "link", "--cloud", cloudUrl, "--key", key.body.key);
    expect(linked.code).toBe(0);
    const line = JSON.parse(linked.stdout.trim().split("\n").at(-1) ?? "{}");
    expect(line).toMatchObject({ event: "linked", cloud_url: cloudUrl, hosted_base_domain: "hosted.localhost" });
    expect(linked.stdout).not.toContain(key.body.key);
    expect(await status(dataDir)).toMatchObject({ linked: true, node_id: line.node_id, slug: line.slug });

    // The key had one use: a second machine is refused with a clear message.
    const refused = await engine(join(workDir, "key-2"), "link", "--cloud", cloudUrl, "--key", key.body.key);
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toMatch(/^engine: .+ \[\w+\]\n$/);
  }, 60_000);

  test("a link code links once; the cloud URL then comes from ENGINE_CLOUD_URL", async () => {
    const code = await api("POST", "/api/link/codes", {});
    expect(code.status).toBe(201);
    const dataDir = join(workDir, "code");
    const linked = await runCli(["--data-dir", dataDir, "link", "--code", code.body.code], { ENGINE_CLOUD_URL: cloudUrl }, [
      binaries.engine,
    ]);
    expect(linked.code).toBe(0);
    expect(await status(dataDir)).toMatchObject({ linked: true, cloud_url: cloudUrl });
    const reused = await engine(join(workDir, "code-2"), "link", "--cloud", cloudUrl, "--code", code.body.code);
    expect(reused.code).not.toBe(0);
  }, 60_000);

  test("a denied request ends `engine link --json` with a failed line and a non-zero exit", async () => {
    const dataDir = join(workDir, "denied");
    const linking = children.start([binaries.engine, "--data-dir", dataDir, "--json", "link", "--cloud", cloudUrl]);
    const device = await linkEvent(linking, "device");
    const denied = await api("POST", "/api/nodes/device-approvals/deny", { user_code: device.user_code });
    expect(denied.status).toBe(200);
    expect(await finish(linking)).not.toBe(0);
    const last = JSON.parse(linking.stdout().trim().split("\n").at(-1) ?? "{}");
    expect(last).toMatchObject({ event: "failed", code: "access_denied" });
    expect(linking.stderr()).toContain("denied");
    expect(await status(dataDir)).toMatchObject({ linked: false });
  }, 90_000);

  test("Ctrl-C while waiting stops `engine link` cleanly, linking nothing", async () => {
    const dataDir = join(workDir, "interrupted");
    const linking = children.start([binaries.engine, "--data-dir", dataDir, "link", "--cloud", cloudUrl]);
    await eventually(() => userCodeIn(linking.stdout()), { timeoutMs: 20_000 });
    linking.proc.kill("SIGINT");
    expect(await finish(linking, 10_000)).not.toBe(0);
    expect(linking.stderr()).toContain("cancelled");
    expect(await status(dataDir)).toMatchObject({ linked: false });
  }, 60_000);
});
