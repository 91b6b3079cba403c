import { afterEach, describe, expect, test } from "bun:test";
import { closeSync, openSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { ENGINE_ENTRY, eventually, freePort, reapWorkloads, tempDir, testShim } from "../../helpers";
import { mountTmpfs, type Tmpfs } from "../../tmpfs";

const cleanups: (() => void | Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

function mount(size = "8m"): Tmpfs {
  const disk = mountTmpfs(size);
  cleanups.push(() => disk.unmount());
  return disk;
}

describe("a full disk (issue 13)", () => {
  test("with stdout on a full filesystem the engine still serves, and its log says what was dropped", async () => {
    const disk = mount("1m");
    const dataDir = tempDir();
    cleanups.push(() => rmSync(dataDir, { recursive: true, force: true }));
    disk.fill();
    const stdoutPath = join(disk.dir, "stdout.log");
    const stdout = openSync(stdoutPath, "a");
    cleanups.push(() => closeSync(stdout));
    const port = await freePort();
    const proc = Bun.spawn([...ENGINE_ENTRY, "serve", "--data-dir", dataDir, "--port", String(port)], {
      env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: process.env.HOME ?? "/tmp", ENGINE_SHIM: testShim(), ENGINE_PROXY: "off" },
      stdout,
      stderr: "pipe",
    });
    cleanups.push(async () => {
      proc.kill("SIGKILL");
      await proc.exited;
      reapWorkloads(dataDir);
    });
    const health = await eventually(
      async () => {
        if (proc.exitCode !== null) throw new Error(`engine exited with ${proc.exitCode}`);
        const response = await fetch(`http://127.0.0.1:${port}/api/health`).catch(() => null);
        return response?.status === 200 ? response.json() : null;
      },
      { timeoutMs: 20000, intervalMs: 100 },
    );
    expect(health).toMatchObject({ status: "ok" });
    // The data dir's log works and says, once, that stdout does not.
    const notices = readFileSync(join(dataDir, "engine.log"), "utf8")
      .split("\n")
      .filter((line) => line.includes('"sink":"stdout"'));
    expect(notices).toHaveLength(1);
    expect(JSON.parse(notices[0] ?? "{}").msg).toBe("stdout is not writable (ENOSPC): dropping log lines until it is");
  }, 40000);
});
