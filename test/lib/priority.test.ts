import { expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { lowerWhileStarting, restorePriority, STARTING_NICE } from "../../src/lib/priority";
import { eventually } from "../helpers";

/** nices are the nice values of every thread of `pid`, from /proc (field 19 of each task's stat). */
function nices(pid: number): number[] {
  return readdirSync(`/proc/${pid}/task`).map((tid) => {
    const stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, "utf8");
    return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[16]);
  });
}

test.skipIf(process.getuid?.() !== 0)("a process lowered while it starts is lowered, and given back, on every thread it has", async () => {
  // A file read starts Bun's I/O pool: threads besides the first, as the engine has (and its GC and JIT helpers).
  const script = "await require('node:fs/promises').readFile('/proc/self/stat'); setInterval(() => {}, 1000)";
  const child = Bun.spawn([process.execPath, "-e", script], { stdout: "ignore", stderr: "ignore" });
  try {
    await eventually(() => readdirSync(`/proc/${child.pid}/task`).length > 2, { timeoutMs: 4_000 });
    const own = lowerWhileStarting(child.pid);
    expect(own).not.toBeNull();
    expect(new Set(nices(child.pid))).toEqual(new Set([Math.min(19, (own ?? 0) + STARTING_NICE)]));
    restorePriority(child.pid, own ?? 0);
    expect(new Set(nices(child.pid))).toEqual(new Set([own ?? 0]));
  } finally {
    child.kill("SIGKILL");
    await child.exited;
  }
});
