import { describe, expect, test } from "bun:test";
import { isSameProcess, type ProcessStat, readProcessStat } from "../../../src/engine/supervisor";

describe("isSameProcess", () => {
  test("a pid reused or ended is not the same process; one pass's reads are shared through `seen`", async () => {
    const child = Bun.spawn(["sleep", "30"]);
    const start = readProcessStat(child.pid)?.startTime ?? -1;
    expect(start).toBeGreaterThan(0);
    const seen = new Map<number, ProcessStat | null>();
    try {
      expect(isSameProcess(child.pid, start, seen)).toBe(true);
      expect(isSameProcess(child.pid, start + 1)).toBe(false);
      expect(seen.get(child.pid)?.startTime).toBe(start);
    } finally {
      child.kill("SIGKILL");
      await child.exited;
    }
    // Gone: a fresh read says so, while the pass that read it alive keeps its one view of it.
    expect(isSameProcess(child.pid, start)).toBe(false);
    expect(isSameProcess(child.pid, start, seen)).toBe(true);
    // A pid read as gone is remembered as gone.
    const none = new Map<number, ProcessStat | null>();
    expect(isSameProcess(child.pid, start, none)).toBe(false);
    expect(none.get(child.pid)).toBeNull();
  });
});
