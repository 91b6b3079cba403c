import { afterEach, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, readFileSync, rmSync, statfsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { isSameProcess, readProcessStat } from "../../../src/engine/supervisor";
import { eventually, tempDir, testShim } from "../../helpers";
import { mountTmpfs, type Tmpfs } from "../../tmpfs";

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const cleanup of cleanups.splice(0).reverse()) cleanup();
});

function mount(size: string): Tmpfs {
  const disk = mountTmpfs(size);
  cleanups.push(() => disk.unmount());
  return disk;
}

function scratch(): string {
  const dir = tempDir("engine-shim-disk-");
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** startShim starts the shim as the supervisor does, its run dir and log on `disk`. */
async function startShim(disk: Tmpfs, script: string, maxBytes = 64 << 20, makeRunDir = true) {
  const runDir = join(disk.dir, "run");
  if (makeRunDir) mkdirSync(runDir);
  const logFile = join(disk.dir, "out.log");
  const proc = Bun.spawn([testShim(), runDir, logFile, "-", String(maxBytes), "3", "-", "-", "--", "/bin/sh", "-c", script], {
    stdout: "pipe",
  });
  const report = (await new Response(proc.stdout).text()).trim();
  await proc.exited;
  const [, shimPid, childPid] = (/^ok (\d+) (\d+) \d+$/.exec(report) ?? []).map(Number);
  if (!shimPid || !childPid) throw new Error(`the shim did not start: ${report}`);
  const shimStart = readProcessStat(shimPid)?.startTime ?? 0;
  cleanups.push(() => {
    for (const pid of [-childPid, shimPid]) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // gone
      }
    }
  });
  return {
    runDir,
    logFile,
    exitFile: join(runDir, "exit.json"),
    alive: () => isSameProcess(shimPid, shimStart),
  };
}

const readJson = (path: string) => JSON.parse(readFileSync(path, "utf8"));

describe("engine-shim on a full disk (issue 13)", () => {
  test("a workload that exits while the disk is full still gets its exit.json (space reserved at start)", async () => {
    const disk = mount("1m");
    const go = join(scratch(), "go");
    const run = await startShim(disk, `while [ ! -e ${go} ]; do sleep 0.05; done; exit 7`);
    disk.fill();
    writeFileSync(go, "");
    await eventually(() => existsSync(run.exitFile), { timeoutMs: 5000 });
    expect(readJson(run.exitFile)).toMatchObject({ exit_code: 7, signal: null });
    expect(existsSync(join(run.runDir, "exit.json.tmp"))).toBe(false);
  });

  test("with no room even to reserve, the shim keeps trying and writes exit.json once space returns", async () => {
    const disk = mount("1m");
    disk.fill();
    const run = await startShim(disk, "exit 5");
    await Bun.sleep(1500);
    // Not written, and not given up: the shim waits, alive, and the daemon sees a run not yet ended.
    expect(existsSync(run.exitFile)).toBe(false);
    expect(run.alive()).toBe(true);
    disk.free();
    await eventually(() => existsSync(run.exitFile), { timeoutMs: 5000 });
    expect(readJson(run.exitFile)).toMatchObject({ exit_code: 5 });
    await eventually(() => !run.alive(), { timeoutMs: 5000 });
  });

  test("a flooding workload's log stops at the free-space floor, and a marker counts what was dropped once there is room", async () => {
    const disk = mount("8m");
    const dir = scratch();
    const flooded = join(dir, "flooded");
    const go = join(dir, "go");
    // 2 MiB that the test frees later, standing for whatever else used the disk.
    const filler = join(disk.dir, "filler");
    writeFileSync(filler, Buffer.alloc(2 << 20, 1));
    const run = await startShim(
      disk,
      `head -c 12000000 /dev/zero | tr '\\0' x | fold -w 100; touch ${flooded}; while [ ! -e ${go} ]; do echo after; sleep 0.05; done; exit 0`,
    );
    await eventually(() => existsSync(flooded), { timeoutMs: 30000 });
    const stats = statfsSync(disk.dir);
    const size = stats.blocks * stats.bsize;
    const free = stats.bavail * stats.bsize;
    const floor = Math.min(Math.floor(size / 100) * 5, 1 << 30);
    // Stopped at the floor: no further than one check interval (64 KiB) and a page past it.
    expect(free).toBeGreaterThanOrEqual(floor - (64 << 10) - 8192);
    expect(free).toBeLessThan(floor + (256 << 10));
    rmSync(filler);
    // The shim reads free space again within 250 ms: the workload's next lines are written.
    await eventually(() => readFileSync(run.logFile, "utf8").includes(" stdout F after\n"), { timeoutMs: 5000 });
    writeFileSync(go, "");
    await eventually(() => existsSync(run.exitFile), { timeoutMs: 10000 });
    const lines = readFileSync(run.logFile, "utf8").trimEnd().split("\n");
    const marker = lines.findIndex((line) => line.includes("[engine-shim] dropped"));
    expect(lines[marker]).toMatch(/ stderr F \[engine-shim\] dropped \d+ log lines while the disk was below its free-space floor or full$/);
    expect(Number(/dropped (\d+)/.exec(lines[marker] ?? "")?.[1])).toBeGreaterThan(10000);
    // The marker sits where the gap is: the flood before it, the workload's later lines after.
    expect(lines[marker - 1]).toMatch(/ stdout F x+$/);
    expect(lines[marker + 1]).toMatch(/ stdout F after$/);
    expect(lines.filter((line) => line.includes("[engine-shim]"))).toHaveLength(1);
  }, 60000);

  test("a log that cannot even be created (no inode left) is created once there is room; every line is written or counted", async () => {
    const disk = mountTmpfs("1m", "nr_inodes=64");
    cleanups.push(() => disk.unmount());
    const dir = scratch();
    const half = join(dir, "half");
    const go = join(dir, "go");
    mkdirSync(join(disk.dir, "run"));
    disk.fillInodes();
    const script = `for i in 1 2 3 4 5 6 7 8 9 10; do echo line; done; touch ${half}; while [ ! -e ${go} ]; do sleep 0.05; done; for i in 1 2 3 4 5 6 7 8 9 10; do echo line; done; echo last`;
    const run = await startShim(disk, script, 64 << 20, false);
    await eventually(() => existsSync(half));
    disk.freeInodes();
    writeFileSync(go, "");
    await eventually(() => existsSync(run.exitFile), { timeoutMs: 5000 });
    const lines = readFileSync(run.logFile, "utf8").trimEnd().split("\n");
    const marker = /\[engine-shim\] dropped (\d+) log lines/.exec(lines[0] ?? "");
    // The first ten lines were dropped (and counted in the marker, first in the file) or, if
    // the shim read them only after the inodes were freed, written: never silently lost.
    const written = lines.filter((line) => line.endsWith(" stdout F line")).length;
    expect(written + Number(marker?.[1] ?? 0)).toBe(20);
    expect(lines.filter((line) => line.includes("[engine-shim]")).length).toBe(marker ? 1 : 0);
    expect(lines.at(-1)).toMatch(/ stdout F last$/);
    expect(readJson(run.exitFile)).toMatchObject({ exit_code: 0 });
  });
});
