import { expect, test } from "bun:test";
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  HANDOVER_BOOST,
  lowerFor,
  lowerWhileStarting,
  raiseWhileHandingOver,
  restorePriority,
  STARTING_NICE,
} from "../../src/lib/priority";
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

/** runProbe runs `source` as a script of its own (its priorities are its own) and answers the JSON it prints. */
async function runProbe<T>(source: string): Promise<T> {
  const dir = mkdtempSync(join(tmpdir(), "engine-priority-"));
  try {
    writeFileSync(join(dir, "probe.ts"), source);
    const probe = Bun.spawn([process.execPath, join(dir, "probe.ts")], { stdout: "pipe", stderr: "pipe" });
    const [out, err] = await Promise.all([new Response(probe.stdout).text(), new Response(probe.stderr).text(), probe.exited]);
    return JSON.parse(out || err) as T;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** RAISE_PROBE raises its own process as a side of a hand-over, starts a process meanwhile, gives the raise back and says what it saw. */
const RAISE_PROBE = `
import { givePriorityBack, raiseWhileHandingOver } from ${JSON.stringify(join(import.meta.dir, "../../src/lib/priority"))};
import { nices } from ${JSON.stringify(join(import.meta.dir, "../helpers"))};
await require("node:fs/promises").readFile("/proc/self/stat"); // Bun's I/O pool: threads besides the first
const before = nices(process.pid);
const raised = raiseWhileHandingOver();
const during = nices(process.pid);
const child = Bun.spawn(["sleep", "30"]);
const childNice = nices(child.pid);
child.kill();
if (raised) givePriorityBack();
console.log(JSON.stringify({ before, raised, during, childNice, after: nices(process.pid) }));
`;

test.skipIf(process.getuid?.() !== 0)(
  "a side of a hand-over is raised on every thread, what it starts meanwhile is not, and the raise is given back",
  async () => {
    const seen = await runProbe<{ before: number[]; raised: boolean; during: number[]; childNice: number[]; after: number[] }>(RAISE_PROBE);
    expect(new Set(seen.before)).toEqual(new Set([0]));
    expect(seen.raised).toBe(true);
    expect(seen.during.length).toBeGreaterThan(1);
    expect(new Set(seen.during)).toEqual(new Set([-HANDOVER_BOOST]));
    // SCHED_RESET_ON_FORK: a process started while raised starts at 0, as it would have without the raise.
    expect(seen.childNice).toEqual([0]);
    expect(seen.after).toEqual(seen.before);
  },
);

test.skipIf(process.getuid?.() === 0)("as a user nothing is raised: only root could give the priority back", () => {
  const before = nices(process.pid);
  expect(raiseWhileHandingOver()).toBe(false);
  expect(nices(process.pid)).toEqual(before);
});

/** LOWER_PROBE runs a full collection through lowerFor, as a successor does before it binds, and says each thread's priority during and after. */
const LOWER_PROBE = `
import { lowerFor } from ${JSON.stringify(join(import.meta.dir, "../../src/lib/priority"))};
import { nices } from ${JSON.stringify(join(import.meta.dir, "../helpers"))};
await require("node:fs/promises").readFile("/proc/self/stat"); // Bun's I/O pool: threads besides the first
const before = nices(process.pid);
const during = lowerFor(() => { Bun.gc(true); return nices(process.pid); });
console.log(JSON.stringify({ before, during, after: nices(process.pid) }));
`;

test("lowerFor runs its work lowered on every thread as root, as it is as a user, and gives the priority back", async () => {
  const seen = await runProbe<{ before: number[]; during: number[]; after: number[] }>(LOWER_PROBE);
  const own = seen.before[0] ?? 0;
  expect(new Set(seen.before)).toEqual(new Set([own]));
  expect(seen.during.length).toBeGreaterThan(1);
  const lowered = process.getuid?.() === 0 ? Math.min(19, own + STARTING_NICE) : own;
  expect(new Set(seen.during)).toEqual(new Set([lowered]));
  // Every thread is given its priority back, those the collection started too.
  expect(new Set(seen.after)).toEqual(new Set([own]));
  // In this process it answers what its work answered.
  expect(lowerFor(() => 42)).toBe(42);
});
