import { expect, test } from "bun:test";
import { allowedCpus, cpuOfSlot, parseCpuList } from "../../src/lib/affinity";

test.each([
  ["0", [0]],
  ["0-3", [0, 1, 2, 3]],
  ["0-1,4,6-7", [0, 1, 4, 6, 7]],
  ["3,1,1-2", [1, 2, 3]],
  [" 2-3 \n", [2, 3]],
  ["", null],
  ["1-", null],
  ["3-1", null],
  ["a", null],
  ["0-99999", null],
])("the CPU list %j reads as %j", (text, expected) => {
  expect(parseCpuList(text)).toEqual(expected);
});

test("the allowed CPUs come from Cpus_allowed_list, and this process's agree with the kernel's count of them", () => {
  expect(allowedCpus("Name:\tbun\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\nMems_allowed:\t1\n")).toEqual([0, 1]);
  expect(allowedCpus("Name:\tbun\n")).toBeNull();
  const own = allowedCpus();
  expect(own).not.toBeNull();
  expect(own?.length).toBeGreaterThan(0);
  // nproc counts the CPUs this process may use, unless OMP_NUM_THREADS or OMP_THREAD_LIMIT says otherwise: neither is passed.
  const affinity = Bun.spawnSync(["nproc"], { env: { PATH: process.env.PATH ?? "/usr/bin:/bin" } })
    .stdout.toString()
    .trim();
  expect(own?.length).toBe(Number(affinity));
});

test("slots take the allowed CPUs in turn, and go round them again past the last", () => {
  expect([0, 1, 2, 3, 4].map((slot) => cpuOfSlot([2, 5, 7], slot))).toEqual([2, 5, 7, 2, 5]);
  expect(cpuOfSlot([], 0)).toBeNull();
});

/** inChild runs `body` in a fresh Bun process (a pin is for the thread that asks, and lasts) and answers what it printed. */
function inChild(body: string): string {
  const source = `import { pinCallingThread } from ${JSON.stringify(`${import.meta.dir}/../../src/lib/affinity`)};\nimport { readFileSync } from "node:fs";\n${body}`;
  const child = Bun.spawnSync([process.execPath, "-e", source], { stdout: "pipe", stderr: "pipe" });
  if (child.exitCode !== 0) throw new Error(child.stderr.toString());
  return child.stdout.toString().trim();
}

test("pinCallingThread binds the calling thread to one CPU and leaves the process's other threads theirs", () => {
  const own = allowedCpus() ?? [];
  const cpu = own[own.length - 1] ?? 0;
  const out = inChild(`
    const pinned = pinCallingThread(${cpu});
    const line = (file) => /Cpus_allowed_list:\\s*(\\S+)/.exec(readFileSync(file, "utf8"))[1];
    const others = require("node:fs").readdirSync("/proc/self/task").filter((tid) => tid !== String(process.pid)).map((tid) => line("/proc/self/task/" + tid + "/status"));
    console.log(JSON.stringify({ pinned, main: line("/proc/thread-self/status"), others }));
  `);
  const { pinned, main, others } = JSON.parse(out) as { pinned: boolean; main: string; others: string[] };
  expect(pinned).toBe(true);
  expect(main).toBe(String(cpu));
  expect(others.length).toBeGreaterThan(0);
  for (const list of others) expect(parseCpuList(list)).toEqual(own);
});

test("a CPU the process may not use is refused, and nothing changes", () => {
  const own = allowedCpus() ?? [];
  const outside = Math.max(...own) + 1;
  const out = inChild(`
    const refused = [pinCallingThread(${outside}), pinCallingThread(-1), pinCallingThread(1.5), pinCallingThread(1e6)];
    console.log(JSON.stringify({ refused, main: /Cpus_allowed_list:\\s*(\\S+)/.exec(readFileSync("/proc/thread-self/status", "utf8"))[1] }));
  `);
  const { refused, main } = JSON.parse(out) as { refused: boolean[]; main: string };
  expect(refused).toEqual([false, false, false, false]);
  expect(parseCpuList(main)).toEqual(own);
});
