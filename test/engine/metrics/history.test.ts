import { describe, expect, test } from "bun:test";
import { History, parseStatLine, scanProcesses, sessionOfPid } from "../../../src/engine/metrics";

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
    expect(parseStatLine(4242, `${line} 0 0\n`)).toEqual({ pid: 4242, session: 4240, cpuTicks: 310, rssPages: 2560 });
  });

  test("parseStatLine refuses what is not a stat line", () => {
    expect(parseStatLine(1, "garbage")).toBeNull();
  });

  test("scanProcesses finds this process in its session, summed", () => {
    const session = sessionOfPid(process.pid) as number;
    const table = scanProcesses(new Set([session]));
    expect(table.sessionOf.get(process.pid)).toBe(session);
    const usage = table.sessions.get(session);
    expect(usage?.processes).toBeGreaterThanOrEqual(1);
    expect(usage?.rssPages).toBeGreaterThan(0);
    expect([...table.sessions.keys()]).toEqual([session]);
  });
});
