import { afterAll, describe, expect, test } from "bun:test";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { processTreeUsage } from "../../../src/engine/supervisor";
import { tempDir } from "../../helpers";

interface FakeProcess {
  pid: number;
  ppid: number;
  pgid: number;
  state?: string;
  /** ticks: utime, stime, cutime, cstime */
  ticks?: [number, number, number, number];
  rssKb?: number;
}

const dirs: string[] = [];
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

/** fakeProc writes a /proc of the given processes: `stat` in the kernel's layout and `status` with VmRSS. */
function fakeProc(processes: FakeProcess[]): string {
  const dir = tempDir("engine-proc-");
  dirs.push(dir);
  mkdirSync(join(dir, "self"));
  for (const p of processes) {
    const [utime, stime, cutime, cstime] = p.ticks ?? [0, 0, 0, 0];
    // A command name with a space and a ')' as programs may choose: fields are counted from the last ')'.
    const fields = [p.state ?? "S", p.ppid, p.pgid, p.pgid, 0, -1, 4194560, 0, 0, 0, 0, utime, stime, cutime, cstime, 20, 0, 1, 0, 1234];
    mkdirSync(join(dir, String(p.pid)));
    writeFileSync(join(dir, String(p.pid), "stat"), `${p.pid} (odd) name) ${fields.join(" ")} 0 0\n`);
    writeFileSync(join(dir, String(p.pid), "status"), `Name:\todd\nVmRSS:\t  ${p.rssKb ?? 0} kB\n`);
  }
  return dir;
}

describe("processTreeUsage", () => {
  const tree: FakeProcess[] = [
    { pid: 1, ppid: 0, pgid: 1 },
    { pid: 50, ppid: 1, pgid: 50 }, // the shim: not the workload's
    { pid: 100, ppid: 50, pgid: 100, ticks: [150, 50, 0, 0], rssKb: 1000 }, // the workload
    { pid: 101, ppid: 100, pgid: 100, ticks: [10, 0, 5, 5], rssKb: 200 }, // its child, same group
    { pid: 102, ppid: 101, pgid: 102, ticks: [100, 0, 0, 0], rssKb: 300 }, // a grandchild in a session of its own
    { pid: 103, ppid: 1, pgid: 100, ticks: [20, 0, 0, 0], rssKb: 50 }, // reparented to init, still in the group
    { pid: 104, ppid: 100, pgid: 100, state: "Z", ticks: [999, 0, 0, 0] }, // a zombie: gone
    { pid: 200, ppid: 50, pgid: 200, ticks: [7, 3, 0, 0], rssKb: 40 }, // another workload
    { pid: 300, ppid: 1, pgid: 300, ticks: [500, 0, 0, 0], rssKb: 9000 }, // not a workload
  ];

  test.each([
    {
      name: "a workload counts its group and its descendants, never its parent, zombies or strangers",
      roots: [100, 200],
      expected: [
        [100, { processes: 4, cpuSeconds: 3.4, rssBytes: 1550 * 1024 }],
        [200, { processes: 1, cpuSeconds: 0.1, rssBytes: 40 * 1024 }],
      ],
    },
    {
      name: "a root that is gone is left out",
      roots: [100, 999],
      expected: [[100, { processes: 4, cpuSeconds: 3.4, rssBytes: 1550 * 1024 }]],
    },
    { name: "no roots, no answer", roots: [], expected: [] },
  ])("$name", ({ roots, expected }) => {
    expect([...processTreeUsage(roots, fakeProc(tree)).entries()]).toEqual(expected as never);
  });

  test("an unreadable /proc answers nothing rather than throwing", () => {
    expect(processTreeUsage([100], "/nonexistent-proc").size).toBe(0);
  });
});
