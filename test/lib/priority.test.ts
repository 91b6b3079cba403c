import { expect, test } from "bun:test";
import { readdirSync } from "node:fs";
import { HANDOVER_BOOST, lowerWhileStarting, raised, raiseWhileHandingOver, restorePriority, STARTING_NICE } from "../../src/lib/priority";
import { eventually, nices } from "../helpers";

/** withThreadedChild runs `check` on a Bun process that has threads besides its first, as the engine has (its I/O pool, GC and JIT helpers). */
async function withThreadedChild(check: (pid: number) => void): Promise<void> {
  // A file read starts Bun's I/O pool.
  const script = "await require('node:fs/promises').readFile('/proc/self/stat'); setInterval(() => {}, 1000)";
  const child = Bun.spawn([process.execPath, "-e", script], { stdout: "ignore", stderr: "ignore" });
  try {
    await eventually(() => readdirSync(`/proc/${child.pid}/task`).length > 2, { timeoutMs: 4_000 });
    check(child.pid);
  } finally {
    child.kill("SIGKILL");
    await child.exited;
  }
}

test.skipIf(process.getuid?.() !== 0)("a process lowered while it starts is lowered, and given back, on every thread it has", async () => {
  await withThreadedChild((pid) => {
    const own = lowerWhileStarting(pid);
    expect(own).not.toBeNull();
    expect(new Set(nices(pid))).toEqual(new Set([Math.min(19, (own ?? 0) + STARTING_NICE)]));
    restorePriority(pid, own ?? 0);
    expect(new Set(nices(pid))).toEqual(new Set([own ?? 0]));
  });
});

test.skipIf(process.getuid?.() !== 0)("a side of a hand-over is raised on every thread it has, and given back", async () => {
  await withThreadedChild((pid) => {
    const before = nices(pid);
    const own = raiseWhileHandingOver(pid);
    expect(own).not.toBeNull();
    expect(new Set(before)).toEqual(new Set([own ?? 0]));
    expect(new Set(nices(pid))).toEqual(new Set([Math.max(-20, (own ?? 0) - HANDOVER_BOOST)]));
    restorePriority(pid, own ?? 0);
    expect(nices(pid)).toEqual(before);
  });
});

test("a raise stays within the kernel's range", () => {
  expect(raised(0)).toBe(-HANDOVER_BOOST);
  expect(raised(-18)).toBe(-20);
});

test.skipIf(process.getuid?.() === 0)("as a user nothing is raised: only root could give the priority back", async () => {
  await withThreadedChild((pid) => {
    const before = nices(pid);
    expect(raiseWhileHandingOver(pid)).toBeNull();
    expect(nices(pid)).toEqual(before);
  });
});
