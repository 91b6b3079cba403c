import { describe, expect, test } from "bun:test";
import { processIds } from "../../src/lib/procfs";

describe("processIds", () => {
  test("lists this process and a child it started, and only numeric entries", async () => {
    const child = Bun.spawn(["sleep", "30"]);
    try {
      const pids = processIds();
      expect(pids).toContain(process.pid);
      expect(pids).toContain(child.pid);
      expect(pids.every((pid) => Number.isInteger(pid) && pid > 0)).toBe(true);
    } finally {
      child.kill();
      await child.exited;
    }
  });
});
