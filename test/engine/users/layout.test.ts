import { afterAll, describe, expect, test } from "bun:test";
import { mkdirSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { canSwitchUsers, secureDataDir, spreadServiceTrees } from "../../../src/engine/users";
import { startTestEngine, tempDir } from "../../helpers";

const made: string[] = [];
afterAll(() => {
  for (const dir of made) rmSync(dir, { recursive: true, force: true });
});

/**
 * topDirFlag reads chattr's `T` of a directory with lsattr (e2fsprogs), or null where its file
 * system keeps no inode flags at all (lsattr cannot read them there).
 */
function topDirFlag(dir: string): boolean | null {
  const listed = Bun.spawnSync(["lsattr", "-d", dir], { stderr: "pipe" });
  if (listed.exitCode !== 0) return null;
  const [flags = ""] = listed.stdout.toString().trim().split(/\s+/);
  return flags.includes("T");
}

/**
 * topDirFlagWorks says whether the file system under `parent` takes chattr's `T`, tried with
 * chattr itself on a directory of its own (ext2/3/4 do; tmpfs, XFS and btrfs refuse it).
 */
function topDirFlagWorks(parent: string): boolean {
  const probe = join(parent, `.top-dir-probe-${process.pid}`);
  mkdirSync(probe);
  try {
    return Bun.spawnSync(["chattr", "+T", probe], { stderr: "ignore" }).exitCode === 0 && topDirFlag(probe) === true;
  } finally {
    rmSync(probe, { recursive: true, force: true });
  }
}

describe("secureDataDir and spreadServiceTrees", () => {
  test("makes data/ and services/ with the layout's modes and marks them as tops of hierarchies where the file system has the flag", () => {
    const dataDir = tempDir("engine-layout-");
    made.push(dataDir);
    secureDataDir(dataDir, true);
    const marked = spreadServiceTrees(dataDir);
    expect(statSync(join(dataDir, "data")).mode & 0o777).toBe(0o711);
    expect(statSync(join(dataDir, "services")).mode & 0o777).toBe(0o700);
    const flags = [join(dataDir, "data"), join(dataDir, "services")].map(topDirFlag);
    // ext4 (this machine's /tmp) has the flag; elsewhere nothing is marked and nothing fails.
    if (topDirFlagWorks(dataDir)) {
      expect(flags).toEqual([true, true]);
      expect(marked).toEqual([join(dataDir, "data"), join(dataDir, "services")]);
    } else {
      expect(flags).not.toContain(true);
      expect(marked).toEqual([]);
    }
    // Once more: nothing to make, the flag kept, and an unprivileged layout's data/ is private.
    secureDataDir(dataDir, true);
    expect(spreadServiceTrees(dataDir)).toEqual(marked);
    const own = tempDir("engine-layout-");
    made.push(own);
    secureDataDir(own, false);
    spreadServiceTrees(own);
    expect(statSync(join(own, "data")).mode & 0o777).toBe(0o700);
  });

  test("on a file system without the flag (tmpfs) it makes the directories and marks nothing", () => {
    const dir = join("/dev/shm", `engine-layout-${process.pid}`);
    mkdirSync(dir, { mode: 0o700 });
    made.push(dir);
    secureDataDir(dir, false);
    expect(spreadServiceTrees(dir)).toEqual([]);
    expect(statSync(join(dir, "services")).isDirectory()).toBe(true);
    // tmpfs keeps a few flags since Linux 6.0 (lsattr reads them), never this one.
    expect(topDirFlag(join(dir, "services"))).not.toBe(true);
  });

  test("a started engine has marked its data/ and services/, and a service's trees are made under them", async () => {
    const engine = await startTestEngine();
    try {
      const services = join(engine.dataDir, "services");
      const data = join(engine.dataDir, "data");
      expect(statSync(data).mode & 0o777).toBe(canSwitchUsers() ? 0o711 : 0o700);
      expect(statSync(services).mode & 0o777).toBe(0o700);
      const flags = [data, services].map(topDirFlag);
      if (topDirFlagWorks(engine.dataDir)) expect(flags).toEqual([true, true]);
      else expect(flags).not.toContain(true);
      const { status, body } = await engine.json<{ id: string }>("POST", "/api/services", {
        body: { name: "job", kind: "batch", command: ["true"] },
      });
      expect(status).toBe(201);
      const deadline = Date.now() + 20_000;
      let state = "";
      while (Date.now() < deadline && state !== "completed") {
        state = (await engine.json<{ status: string }>("GET", "/api/services/job")).body.status;
        if (state !== "completed") await Bun.sleep(20);
      }
      expect(state).toBe("completed");
      expect(statSync(join(services, body.id, "logs")).isDirectory()).toBe(true);
      expect(statSync(join(data, "job")).isDirectory()).toBe(true);
    } finally {
      await engine.close();
    }
  });
});
