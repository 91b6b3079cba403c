import { Database } from "bun:sqlite";
import { afterEach, describe, expect, test } from "bun:test";
import { chmodSync, closeSync, existsSync, openSync, readFileSync, rmSync, statfsSync, statSync } from "node:fs";
import { join } from "node:path";
import type { Ready, ServiceRecord } from "../../../src/contract/engine";
import { ENGINE_ENTRY, eventually, freePort, reapWorkloads, startTestEngine, tempDir, testShim } from "../../helpers";
import { mountTmpfs, type Tmpfs } from "../../tmpfs";
import { ServiceClient } from "../services/harness";

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

  test("on a full data dir: writes answer 507 disk_full with nothing half-made, reads answer, an exit is recorded once space returns, and everything resumes", async () => {
    const disk = mount("8m");
    const engine = await startTestEngine({ dataDir: disk.dir });
    cleanups.push(() => engine.close());
    const api = new ServiceClient(engine);
    const go = join(tempDir(), "go");
    // The flag's dir is the test's, not the engine's: as root the workload runs as its own user and must see it.
    chmodSync(join(go, ".."), 0o755);
    cleanups.push(() => rmSync(join(go, ".."), { recursive: true, force: true }));
    await api.deployed({
      name: "waiter",
      kind: "batch",
      command: `while [ ! -e ${go} ]; do sleep 0.05; done; echo leaving; exit 3`,
      restart: { policy: "never" },
    });
    await api.waitFor("waiter", "running");

    disk.fill();
    // A write that cannot be stored: the envelope, 507, and no trace of the service.
    const refused = await engine.json<{ error: { code: string; message: string; request_id: string } }>("POST", "/api/services", {
      body: { name: "late", command: ["sleep", "100"], env: { PAD: "x".repeat(64 * 1024) } },
    });
    expect(refused.status).toBe(507);
    expect(refused.body.error.code).toBe("disk_full");
    expect(refused.body.error.request_id).toBeString();
    const token = await engine.json<{ error: { code: string } }>("POST", "/api/tokens", {
      body: { name: "refused", role: "readonly" },
    });
    expect(token.status).toBe(507);
    expect(token.body.error.code).toBe("disk_full");
    // Each refusal is logged; past the log file's last page they are dropped and counted, and
    // the daemon neither blocks nor dies on it.
    for (let i = 0; i < 30; i++)
      expect((await engine.call("POST", "/api/tokens", { body: { name: `r${i}`, role: "readonly" } })).status).toBe(507);
    // Reads keep answering; ready says why writes do not, health stays what it was.
    expect((await engine.call("GET", "/api/health")).status).toBe(200);
    const full = await engine.json<Ready>("GET", "/api/ready", { token: null });
    expect(full.status).toBe(200);
    expect(full.body).toMatchObject({ ready: false, database: true, data_dir_writable: false });
    expect(full.body.data_dir_free_bytes).toBeLessThan(4096);
    const listed = await engine.json<ServiceRecord[]>("GET", "/api/services");
    expect(listed.status).toBe(200);
    expect(listed.body.map((service) => service.name)).toEqual(["waiter"]);
    expect((await engine.json<{ name: string }[]>("GET", "/api/tokens")).body.map((t) => t.name)).not.toContain("refused");

    // The workload exits while the disk is full: known at once, recorded once there is room.
    Bun.write(go, "");
    await eventually(async () => (await api.get("waiter")).pid === null, { timeoutMs: 10000 });
    disk.free();
    const settled = await api.waitFor("waiter", "failed", () => true, 15000);
    expect(settled.status_message).toBe("exited with code 3");
    expect((await api.diagnose("waiter")).forensics.last_exit_code).toBe(3);

    // Everything resumes, with no restart: writes, launches, logging.
    const late = await api.deploy({ name: "late", command: ["sleep", "100"], env: { PAD: "x".repeat(64 * 1024) } });
    expect(late.status).toBe(201);
    await api.waitFor("late", "running");
    expect((await engine.json("POST", "/api/tokens", { body: { name: "after", role: "readonly" } })).status).toBe(201);
    const ready = await engine.json<Ready>("GET", "/api/ready", { token: null });
    expect(ready.body).toMatchObject({ ready: true, database: true, data_dir_writable: true, log_writable: true });
    expect(ready.body.data_dir_free_bytes).toBeGreaterThan(1 << 20);
    const log = readFileSync(join(disk.dir, "engine.log"), "utf8");
    expect(log).toMatch(new RegExp(`"msg":"dropped \\d+ log lines while ${join(disk.dir, "engine.log")} was not writable"`));

    const db = new Database(join(disk.dir, "engine.db"), { readonly: true });
    try {
      expect(db.query<{ integrity_check: string }, []>("PRAGMA integrity_check").get()?.integrity_check).toBe("ok");
    } finally {
      db.close();
    }
  }, 60000);

  test("a daemon started on a full disk serves, and records an exit that happened while it was away once space returns", async () => {
    const disk = mount("8m");
    const first = await startTestEngine({ dataDir: disk.dir });
    let firstOpen = true;
    cleanups.push(() => (firstOpen ? first.close() : undefined));
    const api = new ServiceClient(first);
    const go = join(tempDir(), "go");
    // The flag's dir is the test's, not the engine's: as root the workload runs as its own user and must see it.
    chmodSync(join(go, ".."), 0o755);
    cleanups.push(() => rmSync(join(go, ".."), { recursive: true, force: true }));
    await api.deployed({
      name: "away",
      kind: "batch",
      command: `while [ ! -e ${go} ]; do sleep 0.05; done; exit 4`,
      restart: { policy: "never" },
    });
    await api.waitFor("away", "running");
    // The daemon goes (handing the workload over), the workload ends, the disk fills.
    await first.daemon.stop();
    firstOpen = false;
    Bun.write(go, "");
    await eventually(
      () =>
        existsSync(join(disk.dir, "services")) && [...new Bun.Glob("services/*/runs/*/exit.json").scanSync({ cwd: disk.dir })].length > 0,
    );
    disk.fill();

    const second = await startTestEngine({ dataDir: disk.dir });
    cleanups.push(() => second.close());
    const again = new ServiceClient(second);
    expect((await second.call("GET", "/api/health")).status).toBe(200);
    const waiting = await again.get("away");
    expect(waiting.pid).toBeNull();
    expect(waiting.status_message).toBe("exited with code 4; recorded once the disk has room");
    disk.free();
    const settled = await again.waitFor("away", "failed", () => true, 15000);
    expect(settled.status_message).toBe("exited with code 4");
  }, 60000);

  test("a service flooding its log stops at the free-space floor: the engine keeps room to work", async () => {
    const disk = mount("8m");
    const engine = await startTestEngine({ dataDir: disk.dir, serviceLogMaxBytes: 64 << 20 });
    cleanups.push(() => engine.close());
    const api = new ServiceClient(engine);
    await api.deployed({ name: "flood", command: "yes 'a line of a service that logs far too much'" });
    const stats = () => statfsSync(disk.dir);
    const floor = Math.floor((stats().blocks * stats().bsize) / 100) * 5;
    // The log grows until the floor, then stops growing. The shim looks at the free space once
    // per 64 KiB it writes (FLOOR_CHECK_BYTES): near the floor, it may write that much more
    // before it stops, so the test first waits for two looks 300 ms apart to agree.
    await eventually(() => stats().bavail * stats().bsize < floor + (256 << 10), { timeoutMs: 20000 });
    const logFile = [...new Bun.Glob("services/*/logs/output.log").scanSync({ cwd: disk.dir })][0] ?? "";
    const logSize = () => statSync(join(disk.dir, logFile)).size;
    let sizeAtFloor = logSize();
    await eventually(
      async () => {
        await Bun.sleep(300);
        const grew = logSize() - sizeAtFloor;
        sizeAtFloor += grew;
        return grew < 64 << 10;
      },
      { timeoutMs: 10000 },
    );
    // An absence (no growth) needs a window to be seen in: `yes` writes megabytes in it.
    await Bun.sleep(500);
    expect(logSize() - sizeAtFloor).toBeLessThan(64 << 10);
    expect(stats().bavail * stats().bsize).toBeGreaterThan(floor - (128 << 10));
    // The engine still stores what it is asked to.
    expect((await engine.json("POST", "/api/tokens", { body: { name: "room", role: "readonly" } })).status).toBe(201);
    expect((await engine.json<Ready>("GET", "/api/ready", { token: null })).body).toMatchObject({ ready: true, data_dir_writable: true });
    expect((await api.control("flood", "stop")).status).toBe(200);
  }, 60000);

  /** ranOnceOnFewInodes runs `name` once on a small tmpfs with few inodes, and stops it. */
  async function ranOnceOnFewInodes(name: string) {
    // No inode left is ENOSPC too, and it lets the run directory be refused while the
    // database (whose files exist) still takes writes.
    const disk = mountTmpfs("8m", "nr_inodes=1000");
    cleanups.push(() => disk.unmount());
    const engine = await startTestEngine({ dataDir: disk.dir });
    cleanups.push(() => engine.close());
    const api = new ServiceClient(engine);
    const { id } = await api.deployed({ name, command: ["sleep", "300"] });
    const first = await api.waitFor(name, "running");
    expect((await api.control(name, "stop")).status).toBe(200);
    await api.waitFor(name, "stopped");
    // The shim makes the next run's directory before it handles a stop: it is there by now.
    return { disk, api, first, spare: join(disk.dir, "services", id, ".next-run") };
  }

  test("a service that cannot start for lack of space waits, pending, and starts once there is room (not failed)", async () => {
    const { disk, api, spare } = await ranOnceOnFewInodes("again");
    // The next run's directory made while it ran needs no inode (the next test): without it, a run does.
    rmSync(spare, { recursive: true, force: true });

    disk.fillInodes();
    expect((await api.control("again", "start")).status).toBe(200);
    const waiting = await api.waitFor("again", "pending", (record) => record.status_message?.includes("disk is full") ?? false);
    expect(waiting.status_message).toBe("could not start: the disk is full; trying again when it has room");
    expect(waiting.restarts).toBe(0);
    disk.freeInodes();
    await api.waitFor("again", "running", () => true, 15000);
  }, 60000);

  test("a service whose next run's directory was made while it ran starts again with no inode left", async () => {
    const { disk, api, first, spare } = await ranOnceOnFewInodes("ready");
    expect(existsSync(spare)).toBe(true);

    disk.fillInodes();
    expect((await api.control("ready", "start")).status).toBe(200);
    // Its directory, exit record and pids file were all there: the run needs no new inode.
    const second = await api.waitFor("ready", "running", (record) => record.pid !== first.pid);
    expect(second.restarts).toBe(0);
    // With no inode for another spare, the one after it would wait for room; this one stops cleanly.
    expect((await api.control("ready", "stop")).status).toBe(200);
    await api.waitFor("ready", "stopped");
    disk.freeInodes();
  }, 60000);

  test.each([
    ["full", 0, "alive"],
    ["bug", 1, ""],
  ])(
    "a background rejection (%s): the daemon survives only a write the disk refused",
    async (kind, code, out) => {
      const dataDir = tempDir();
      cleanups.push(() => rmSync(dataDir, { recursive: true, force: true }));
      const fixture = join(import.meta.dir, "../../fixtures/background-rejection.ts");
      const proc = Bun.spawn([process.execPath, fixture, dataDir, kind, testShim()], { stdout: "pipe", stderr: "pipe" });
      const [stdout, exitCode] = await Promise.all([new Response(proc.stdout).text(), proc.exited]);
      expect(exitCode).toBe(code);
      expect(stdout.trim()).toBe(out);
      if (kind === "full")
        expect(readFileSync(join(dataDir, "engine.log"), "utf8")).toContain("a background write was refused for lack of space");
    },
    30000,
  );
});
