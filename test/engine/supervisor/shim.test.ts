import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { isSameProcess, readProcessStat } from "../../../src/engine/supervisor";
import { eventually, tempDir, testShim } from "../../helpers";

const dir = tempDir("engine-shim-");
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** runShim starts the shim as the supervisor does and returns its one-line report. */
async function runShim(name: string, argv: string[], { maxBytes = 1 << 20, maxFiles = 3, credentials = "-" } = {}) {
  const runDir = join(dir, name);
  Bun.spawnSync(["mkdir", "-p", runDir]);
  const proc = Bun.spawn(
    [testShim(), runDir, join(runDir, "out.log"), "-", String(maxBytes), String(maxFiles), "-", credentials, "--", ...argv],
    { stdout: "pipe" },
  );
  const report = (await new Response(proc.stdout).text()).trim();
  await proc.exited;
  return { runDir, report, exit: () => JSON.parse(readFileSync(join(runDir, "exit.json"), "utf8")) };
}

describe("engine-shim", () => {
  test("reports the pids, detaches, logs both streams in CRI format and records the exit code", async () => {
    const { runDir, report, exit } = await runShim("basic", ["/bin/sh", "-c", "echo out; echo err >&2; printf tail; exit 4"]);
    const match = /^ok (\d+) (\d+) \d+$/.exec(report);
    expect(match).not.toBeNull();
    await eventually(() => existsSync(join(runDir, "exit.json")));
    expect(exit()).toMatchObject({ exit_code: 4, signal: null });
    const lines = readFileSync(join(runDir, "out.log"), "utf8").trim().split("\n");
    expect(lines.map((line) => line.split(" ").slice(1).join(" ")).sort()).toEqual(
      ["stderr F err", "stdout F out", "stdout F tail"].sort(),
    );
    expect(lines[0]).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{9}Z /);
  });

  test("an exec failure is reported at once with its errno, never as a run", async () => {
    const { report, exit } = await runShim("enoent", ["/no/such/program"]);
    expect(report).toBe("err 2 exec");
    expect(exit()).toMatchObject({ exec_error: "ENOENT", stage: "exec", exit_code: null });
  });

  test("the workload leads its own process group in the shim's session; the shim is not the daemon's child", async () => {
    const { runDir, report } = await runShim("group", ["sleep", "30"]);
    const [, shimPid, childPid, childStart] = (/^ok (\d+) (\d+) (\d+)$/.exec(report) ?? []).map(Number);
    const shim = readProcessStat(shimPid as number);
    const child = readProcessStat(childPid as number);
    expect(child?.pgid).toBe(childPid as number);
    // The report's start time is the workload's own, as /proc tells it.
    expect(childStart).toBe(child?.startTime as number);
    expect(shim?.ppid).not.toBe(process.pid);
    expect(child?.ppid).toBe(shimPid as number);
    process.kill(childPid as number, "SIGKILL");
    await eventually(() => existsSync(join(runDir, "exit.json")));
    expect(JSON.parse(readFileSync(join(runDir, "exit.json"), "utf8"))).toMatchObject({ signal: "SIGKILL", signal_number: 9 });
    await eventually(() => !isSameProcess(shimPid as number, shim?.startTime ?? 0));
  });

  test("the workload starts with no signal blocked or ignored, whatever the shim blocks and ignores around its start", async () => {
    const { runDir, report } = await runShim("signals", ["sleep", "30"]);
    const [, , childPid] = (/^ok (\d+) (\d+) \d+$/.exec(report) ?? []).map(Number);
    const status = readFileSync(`/proc/${childPid}/status`, "utf8");
    const mask = (name: string) =>
      /^(\w+):\s+([0-9a-f]+)$/m.exec(status.split("\n").find((line) => line.startsWith(`${name}:`)) ?? "")?.[2];
    expect(mask("SigBlk")).toBe("0000000000000000");
    expect(mask("SigIgn")).toBe("0000000000000000");
    // So a plain SIGTERM ends it, as it would a process started from a shell.
    process.kill(childPid as number, "SIGTERM");
    await eventually(() => existsSync(join(runDir, "exit.json")));
    expect(JSON.parse(readFileSync(join(runDir, "exit.json"), "utf8"))).toMatchObject({ signal: "SIGTERM" });
  });

  test("a shim whose run directory was removed under it ends once its workload does, instead of retrying for ever", async () => {
    const { runDir, report } = await runShim("removed", ["sleep", "0.3"]);
    const [, shimPid] = (/^ok (\d+) (\d+) \d+$/.exec(report) ?? []).map(Number);
    const shimStart = readProcessStat(shimPid as number)?.startTime ?? 0;
    rmSync(runDir, { recursive: true, force: true });
    await eventually(() => !isSameProcess(shimPid as number, shimStart), { timeoutMs: 5000 });
  });

  test("leftovers of the group are killed when the main process exits, and the shim does not wait on them", async () => {
    const { runDir, report } = await runShim("leftover", ["/bin/sh", "-c", "sleep 300 & echo started; exit 0"]);
    expect(report).toStartWith("ok ");
    await eventually(() => existsSync(join(runDir, "exit.json")), { timeoutMs: 3000 });
    expect(JSON.parse(readFileSync(join(runDir, "exit.json"), "utf8")).exit_code).toBe(0);
  });

  test("the log rotates at the size bound and keeps at most LOG_MAX_FILES files", async () => {
    const { runDir } = await runShim(
      "rotate",
      ["/bin/sh", "-c", "i=0; while [ $i -lt 2000 ]; do echo line-$i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done"],
      {
        maxBytes: 8192,
        maxFiles: 3,
      },
    );
    await eventually(() => existsSync(join(runDir, "exit.json")), { timeoutMs: 5000 });
    const files = ["out.log", "out.log.1", "out.log.2", "out.log.3"].map((name) => join(runDir, name));
    expect(files.slice(0, 3).every((file) => existsSync(file))).toBe(true);
    expect(existsSync(files[3] as string)).toBe(false);
    for (const file of files.slice(0, 3)) expect(readFileSync(file).length).toBeLessThanOrEqual(8192);
    const last = readFileSync(files[0] as string, "utf8")
      .trim()
      .split("\n")
      .at(-1);
    expect(last).toContain("line-1999-");
  });

  const asRoot = process.geteuid?.() === 0 ? test : test.skip;

  asRoot("with CREDENTIALS the workload runs as that uid, gid and groups while the shim stays root", async () => {
    const { runDir, report, exit } = await runShim(
      "credentials",
      ["/bin/sh", "-c", 'grep -E "^(Uid|Gid|Groups):" /proc/self/status; cat /proc/$PPID/status | grep "^Uid:"'],
      { credentials: "65534:65534:44,65533" },
    );
    expect(report).toStartWith("ok ");
    await eventually(() => existsSync(join(runDir, "exit.json")));
    expect(exit()).toMatchObject({ exit_code: 0 });
    const text = readFileSync(join(runDir, "out.log"), "utf8");
    const fields = text.split("\n").map((line) => line.split(" ").slice(3).join(" ").replace(/\s+/g, " ").trim());
    expect(fields).toContain("Uid: 65534 65534 65534 65534");
    expect(fields).toContain("Gid: 65534 65534 65534 65534");
    expect(fields).toContain("Groups: 44 65533");
    // The shim (the workload's parent) still runs as root: it keeps writing the log and exit.json.
    expect(fields).toContain("Uid: 0 0 0 0");
    expect(statSync(join(runDir, "exit.json")).uid).toBe(0);
  });

  test("malformed CREDENTIALS are refused before anything starts", async () => {
    const { report } = await runShim("bad-credentials", ["true"], { credentials: "nobody" });
    expect(report).toBe("");
  });
  test("with --spare it makes the next run's directory once the workload runs, and the next run takes it by a rename", async () => {
    const runs = join(dir, "spare", "runs");
    const start = async (name: string, spare: boolean, argv: string[]) => {
      const runDir = join(runs, name);
      const proc = Bun.spawn(
        [testShim(), ...(spare ? ["--spare"] : []), runDir, join(runs, "..", "out.log"), "-", "1048576", "2", "-", "-", "--", ...argv],
        { stdout: "pipe" },
      );
      const report = (await new Response(proc.stdout).text()).trim();
      await proc.exited;
      return { runDir, report };
    };
    // Without --spare, nothing is made ahead.
    const plain = await start("run-0", false, ["true"]);
    expect(plain.report).toStartWith("ok ");
    await eventually(() => existsSync(join(plain.runDir, "exit.json")));
    expect(readdirSync(join(runs, "..")).sort()).toEqual(["out.log", "runs"]);

    const first = await start("run-1", true, ["sleep", "30"]);
    const [, , firstChild] = (/^ok (\d+) (\d+) \d+$/.exec(first.report) ?? []).map(Number);
    // Beside runs/, in the service's directory: runs/ holds runs only.
    const spare = join(runs, "..", ".next-run");
    await eventually(() => existsSync(spare));
    // The room of the exit record is reserved, the pids file is there, and nothing else is.
    expect(readdirSync(spare).sort()).toEqual(["exit.json.tmp", "pids.tmp"]);
    expect(statSync(join(spare, "exit.json.tmp")).size).toBe(4096);
    expect(statSync(join(spare, "exit.json.tmp")).blocks).toBeGreaterThan(0);
    expect(statSync(spare).mode & 0o777).toBe(0o750 & ~process.umask());
    const spareInode = statSync(spare).ino;

    const second = await start("run-2", false, ["/bin/sh", "-c", "exit 3"]);
    expect(second.report).toStartWith("ok ");
    // The spare became the run's directory: the same inode, and no spare is left.
    expect(statSync(second.runDir).ino).toBe(spareInode);
    expect(existsSync(spare)).toBe(false);
    await eventually(() => existsSync(join(second.runDir, "exit.json")));
    expect(JSON.parse(readFileSync(join(second.runDir, "exit.json"), "utf8"))).toMatchObject({ exit_code: 3, signal: null });
    // The record was cut to its length; the pids file names the second shim and its workload.
    expect(readFileSync(join(second.runDir, "exit.json"), "utf8")).toEndWith("}\n");
    const [shimPid, childPid] = readFileSync(join(second.runDir, "pids"), "utf8").trim().split(" ").map(Number);
    expect(second.report).toStartWith(`ok ${shimPid} ${childPid} `);
    expect(readdirSync(second.runDir).sort()).toEqual(["exit.json", "pids"]);

    process.kill(firstChild as number, "SIGKILL");
    await eventually(() => existsSync(join(first.runDir, "exit.json")));
    expect(JSON.parse(readFileSync(join(first.runDir, "exit.json"), "utf8"))).toMatchObject({ signal: "SIGKILL" });
    // Only directories of runs, and no half-made spare, are left behind.
    expect(readdirSync(runs).sort()).toEqual(["run-0", "run-1", "run-2"]);
    expect(readdirSync(join(runs, "..")).sort()).toEqual(["out.log", "runs"]);
  });
  // strace counts the shim's syncs; .ci/run installs it.
  test.skipIf(!Bun.which("strace"))("a run's end syncs its exit record, and its log only when the run wrote to it", async () => {
    const syncs = async (name: string, argv: string[]) => {
      const runDir = join(dir, name);
      Bun.spawnSync(["mkdir", "-p", runDir]);
      const trace = join(dir, `${name}.strace`);
      const proc = Bun.spawn(
        [
          "strace",
          "-f",
          "-qq",
          "-e",
          "trace=fsync",
          "-o",
          trace,
          testShim(),
          runDir,
          join(runDir, "out.log"),
          "-",
          "1048576",
          "3",
          "-",
          "-",
          "--",
          ...argv,
        ],
        { stdout: "pipe" },
      );
      expect((await new Response(proc.stdout).text()).trim()).toStartWith("ok ");
      // strace ends once every process it follows has: the shim, after its syncs.
      expect(await proc.exited).toBe(0);
      expect(existsSync(join(runDir, "exit.json"))).toBe(true);
      return readFileSync(trace, "utf8")
        .split("\n")
        .filter((line) => /fsync\(\d+\)\s+= 0$/.test(line)).length;
    };
    expect(await syncs("sync-silent", ["true"])).toBe(1);
    expect(await syncs("sync-output", ["/bin/sh", "-c", "echo out"])).toBe(2);
  });
});
