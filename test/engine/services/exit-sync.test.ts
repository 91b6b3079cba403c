import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { alive, ENGINE_ENTRY, eventually, reapWorkloads, spawnEngine, tempDir } from "../../helpers";

const dir = tempDir("engine-exit-sync-");
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** syncs are the sync calls strace saw, each with the path of the file it synced (-y). */
function syncs(trace: string): { call: string; path: string }[] {
  if (!existsSync(trace)) return [];
  return readFileSync(trace, "utf8")
    .split("\n")
    .map((line) => /\b(fsync|fdatasync)\(\d+<([^>]*)>\)\s+= 0$/.exec(line))
    .filter((match): match is RegExpExecArray => match !== null)
    .map((match) => ({ call: match[1] ?? "", path: match[2] ?? "" }));
}

/** tracedChild is the process strace (`pid`) started: the daemon. */
function tracedChild(pid: number): number | null {
  try {
    const first = readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim().split(/\s+/)[0];
    return first ? Number(first) : null;
  } catch {
    return null;
  }
}

describe("a run's exit on disk", () => {
  // strace sees the syncs of the daemon, its launcher and their threads; .ci/run installs it.
  test.skipIf(!Bun.which("strace"))(
    "a job's exit told to the daemon is synced in the store's WAL, and its exit record is left to the page cache",
    async () => {
      const dataDir = join(dir, "data");
      const trace = join(dir, "engine.strace");
      const engine = await spawnEngine(dataDir, {
        command: ["strace", "-f", "-qq", "-y", "-e", "trace=fsync,fdatasync", "-o", trace, ...ENGINE_ENTRY],
        startTimeoutMs: 60_000,
      });
      try {
        const token = readFileSync(join(dataDir, "admin.token"), "utf8").trim();
        const api = async (method: string, path: string, body?: unknown) => {
          const response = await fetch(`${engine.url}${path}`, {
            method,
            headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
            body: body === undefined ? undefined : JSON.stringify(body),
          });
          return { status: response.status, body: (await response.json()) as { status: string; id: string } };
        };
        const walSyncs = () => syncs(trace).filter((sync) => sync.path.endsWith("engine.db-wal")).length;
        const before = walSyncs();
        const names = ["sync-a", "sync-b", "sync-c"];
        for (const name of names) expect((await api("POST", "/api/services", { name, kind: "batch", command: ["true"] })).status).toBe(201);
        for (const name of names) await eventually(async () => (await api("GET", `/api/services/${name}`)).body.status === "completed");
        // The exits went into the store, and the store's WAL was synced after them.
        await eventually(() => walSyncs() > before);
        for (const name of names) {
          const { id } = (await api("GET", `/api/services/${name}`)).body;
          expect(existsSync(join(dataDir, "services", id, "runs"))).toBe(true);
        }
        // The launcher told the daemon of each exit on its stdout: it synced none of their
        // records (the daemon's WAL holds them), nor their empty logs.
        expect(syncs(trace).filter((sync) => sync.path.includes(`${join(dataDir, "services")}/`))).toEqual([]);
      } finally {
        // engine.proc is strace: stopping it would leave the daemon it started running. The
        // daemon is stopped first, as a user's would be, then strace ends with its tracees.
        const daemon = tracedChild(engine.proc.pid);
        if (daemon !== null) {
          process.kill(daemon, "SIGTERM");
          await eventually(() => !alive(daemon), { timeoutMs: 30_000 });
        }
        await engine.stop();
        reapWorkloads(dataDir); // and the users a root engine made for the jobs
      }
    },
    90_000,
  );
});
