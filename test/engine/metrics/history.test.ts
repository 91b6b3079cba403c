import { describe, expect, test } from "bun:test";
import { History, parseStatLine, scanProcesses } from "../../../src/engine/metrics";
import { eventually } from "../../helpers";

/** The history's ring (docs/decisions.md 331) and the /proc reading behind each service's numbers (332). */

describe("History", () => {
  test("keeps the last `capacity` samples, oldest first, with null where a series was not measured", () => {
    const history = new History(3);
    history.push(10, new Map([["a", 1]]));
    history.push(15, new Map([["b", 2]]));
    history.push(
      20,
      new Map([
        ["a", 3],
        ["b", 4],
      ]),
    );
    history.push(25, new Map([["a", 5]]));
    const slots = history.slots();
    expect(history.timesAt(slots)).toEqual([15, 20, 25]);
    expect(history.valuesAt("a", slots)).toEqual([null, 3, 5]);
    expect(history.valuesAt("b", slots)).toEqual([2, 4, null]);
    expect(history.valuesAt("unknown", slots)).toEqual([null, null, null]);
    expect(history.timesAt(history.slots(20))).toEqual([25]);
    history.forget((key) => key === "b");
    expect(history.has("b")).toBe(false);
    expect(history.valuesAt("b", slots)).toEqual([null, null, null]);
  });
});

describe("/proc", () => {
  test.each([
    ["a plain name", "4242 (python3) S 1 4242 4240 0 -1 4194560 100 0 0 0 250 50 7 3 20 0 4 0 12345 1000000 2560"],
    ["a name with spaces and parentheses", "4242 (a b) (c)) S 1 4242 4240 0 -1 4194560 100 0 0 0 250 50 7 3 20 0 4 0 12345 1000000 2560"],
  ])("parseStatLine reads %s", (_label, line) => {
    expect(parseStatLine(4242, `${line} 0 0\n`)).toEqual({ pid: 4242, ppid: 1, pgid: 4242, cpuTicks: 310, rssPages: 2560 });
  });

  test("parseStatLine refuses what is not a stat line", () => {
    expect(parseStatLine(1, "garbage")).toBeNull();
  });

  test("scanProcesses sums each workload's group and descendants, apart from its siblings", async () => {
    // Two workloads under one parent (as a shim launcher holds them): each leads its group, one
    // with a child in that group and one with a child that left it for a session of its own.
    const start = (script: string) => Bun.spawn(["setsid", "/bin/sh", "-c", script], { stdout: "ignore" });
    const a = start("sleep 30 & sleep 30 & wait");
    const b = start("setsid sleep 30 & wait");
    try {
      const pids = new Set([a.pid, b.pid]);
      await eventually(() => {
        const table = scanProcesses(pids);
        return table.workloads.get(a.pid)?.processes === 3 && table.workloads.get(b.pid)?.processes === 2;
      });
      const table = scanProcesses(pids);
      expect(table.workloads.get(a.pid)?.rssPages).toBeGreaterThan(0);
      const owned = [...table.ownerOf.entries()];
      expect(owned.filter(([, owner]) => owner === a.pid)).toHaveLength(3);
      expect(owned.filter(([, owner]) => owner === b.pid)).toHaveLength(2);
      // This process (their parent) belongs to neither.
      expect(table.ownerOf.has(process.pid)).toBe(false);
    } finally {
      const left = [...scanProcesses(new Set([a.pid, b.pid])).ownerOf.keys()];
      for (const pid of [-a.pid, -b.pid, ...left]) {
        try {
          process.kill(pid, "SIGKILL");
        } catch {
          // gone
        }
      }
    }
  });
});
