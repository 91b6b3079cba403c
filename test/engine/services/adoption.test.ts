/**
 * Adoption: workloads outlive the daemon. A drain-and-restart (a hand-over to a stand-in, then
 * a re-exec in place) and a SIGKILL of the daemon must both leave running workloads untouched
 * and adopted by the next daemon, settle runs that ended while no daemon watched from the
 * shim's exit.json, and never adopt a recorded pid that now names another process.
 */
import { Database } from "bun:sqlite";
import { describe, expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { ServiceRecord } from "../../../src/contract/engine";
import { engineScratch, eventually, type SpawnedEngine } from "../../helpers";
import { processExists, ServiceClient } from "./harness";

/** TEST_TIMEOUT_MS covers two engine start-ups on a loaded machine; each test takes 0.5 to 2 s here. */
const TEST_TIMEOUT_MS = 20_000;
/** RESTART_TEST_TIMEOUT_MS covers a drain restart's two start-ups (a stand-in's, then the engine's own pid's) besides the first. */
const RESTART_TEST_TIMEOUT_MS = 45_000;

const { defer, scratch, started } = engineScratch("engine-adopt-");

/**
 * Client talks to a spawned engine at the port of its latest "listening" line: with
 * --port 0 a re-executed engine listens on a new port.
 */
class Client extends ServiceClient {
  constructor(
    readonly spawned: SpawnedEngine,
    readonly dataDir: string,
  ) {
    super({
      json: async <T>(method: string, path: string, options: { body?: unknown } = {}) => {
        const token = readFileSync(join(dataDir, "admin.token"), "utf8").trim();
        const response = await fetch(`${listeningUrl(spawned)}${path}`, {
          method,
          headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
          body: options.body === undefined ? undefined : JSON.stringify(options.body),
        });
        const text = await response.text();
        return { status: response.status, body: (text ? JSON.parse(text) : undefined) as T };
      },
    });
  }

  /** listenings counts the "listening" lines the engine printed so far, one per (re)start. */
  listenings(): number {
    return this.spawned.output().split('"msg":"listening"').length - 1;
  }

  json<T>(method: string, path: string, body?: unknown): Promise<{ status: number; body: T }> {
    return this.engine.json<T>(method, path, { body });
  }
}

function listeningUrl(engine: SpawnedEngine): string {
  const text = engine.output();
  const at = text.lastIndexOf('"msg":"listening"');
  const line = text.slice(text.lastIndexOf("\n", at) + 1, text.indexOf("\n", at) === -1 ? undefined : text.indexOf("\n", at));
  const port = /"port":(\d+)/.exec(line)?.[1];
  if (!port) throw new Error(`no port in the listening line: ${line}`);
  return `http://127.0.0.1:${port}`;
}

/** workloadPids lists the live processes with exactly this argv whose environment carries SERVICE_ID=serviceId. */
function workloadPids(argv: string[], serviceId: string): number[] {
  const wanted = `${argv.join("\0")}\0`;
  const pids: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (readFileSync(`/proc/${entry}/cmdline`, "utf8") !== wanted) continue;
      if (!readFileSync(`/proc/${entry}/environ`, "utf8").split("\0").includes(`SERVICE_ID=${serviceId}`)) continue;
      if (processExists(Number(entry))) pids.push(Number(entry));
    } catch {
      // it ended while we looked, or is not ours to read
    }
  }
  return pids;
}

/** runDirs lists the run directories the supervisor created for a service. */
function runDirs(dataDir: string, serviceId: string): string[] {
  const dir = join(dataDir, "services", serviceId, "runs");
  return existsSync(dir) ? readdirSync(dir) : [];
}

/** expectUntouched asserts that a service still runs its first and only run, with the same pid, never restarted. */
async function expectUntouched(client: Client, dataDir: string, before: ServiceRecord): Promise<void> {
  const after = await client.get(before.name);
  expect(after.status).toBe("running");
  expect(after.pid).toBe(before.pid);
  expect(after.started_at).toBe(before.started_at);
  expect(after.restarts).toBe(0);
  const diagnosis = await client.diagnose(before.name);
  expect(diagnosis.restarts.count).toBe(0);
  expect(diagnosis.last_run?.pid).toBe(before.pid);
  expect(diagnosis.last_run?.ended_at).toBeNull();
  expect(processExists(before.pid ?? -1)).toBe(true);
  expect(runDirs(dataDir, before.id)).toHaveLength(1);
  expect(workloadPids(["sleep", "300"], before.id)).toEqual([before.pid ?? -1]);
}

describe("adoption of workloads across daemon restarts", () => {
  test(
    "a drain-and-restart keeps running services and lets the batch job complete",
    async () => {
      const dataDir = scratch();
      const engine = await started(dataDir);
      const client = new Client(engine, dataDir);
      await client.deployed({ name: "a", command: "exec sleep 300" });
      await client.deployed({ name: "job", kind: "batch", command: "sleep 1; exit 0" });
      const a = await client.waitFor("a", "running", (record) => record.pid !== null);
      // On a slow machine the job may already have completed; the drain then has nothing to wait for.
      await eventually(async () => ["running", "completed"].includes((await client.get("job")).status), { timeoutMs: 10_000 });
      const health = await client.json<{ pid: number }>("GET", "/api/health");
      expect(health.body.pid).toBe(engine.proc.pid);

      const listenings = client.listenings();
      const restart = await client.json("POST", "/api/daemon/restart", { drain_timeout_s: 5 });
      expect(restart.status).toBe(202);
      expect(restart.body).toEqual({});

      // The stand-in, then the re-executed engine, print a "listening" line each (decision 361).
      await eventually(() => client.listenings() >= listenings + 2, { timeoutMs: 30_000 });
      const again = await eventually(() => client.json<{ pid: number }>("GET", "/api/health"), { timeoutMs: 5000 });
      expect(again.status).toBe(200);
      expect(again.body.pid).toBe(engine.proc.pid);
      expect(engine.proc.exitCode).toBeNull();

      await expectUntouched(client, dataDir, a);
      const job = await client.waitFor("job", "completed", () => true, 5000);
      expect(job.restarts).toBe(0);
      const jobDiagnosis = await client.diagnose("job");
      expect(jobDiagnosis.last_run?.exit_code).toBe(0);
      expect(runDirs(dataDir, job.id)).toHaveLength(1);
    },
    RESTART_TEST_TIMEOUT_MS,
  );

  test(
    "after a SIGKILL of the daemon, the next one adopts the survivors and settles the run that ended meanwhile",
    async () => {
      const dataDir = scratch();
      const first = await started(dataDir);
      const client = new Client(first, dataDir);
      await client.deployed({ name: "keep", command: "exec sleep 300" });
      // `dies` exits with 7 once told to, so that it ends while no daemon runs, at a moment the test chooses.
      await client.deployed({
        name: "dies",
        command: 'while [ ! -e "$SERVICE_DATA_DIR/go" ]; do sleep 0.05; done; exit 7',
        restart: { policy: "never" },
      });
      const keep = await client.waitFor("keep", "running", (record) => record.pid !== null);
      const dies = await client.waitFor("dies", "running", (record) => record.pid !== null);

      first.proc.kill("SIGKILL");
      await first.proc.exited;
      writeFileSync(join(dataDir, "data", "dies", "go"), "");
      await eventually(() => !processExists(dies.pid ?? -1), { timeoutMs: 5000 });
      // The shim records the exit in exit.json; with no daemon to tell, that file is all that is left.
      await eventually(
        () => runDirs(dataDir, dies.id).some((run) => existsSync(join(dataDir, "services", dies.id, "runs", run, "exit.json"))),
        {
          timeoutMs: 5000,
        },
      );

      const second = await started(dataDir);
      const next = new Client(second, dataDir);
      await expectUntouched(next, dataDir, keep);

      const failed = await next.waitFor("dies", "failed", () => true, 5000);
      expect(failed.restarts).toBe(0);
      const diagnosis = await next.diagnose("dies");
      expect(diagnosis.forensics.last_exit_code).toBe(7);
      expect(diagnosis.last_run?.pid).toBe(dies.pid);
      expect(diagnosis.last_run?.exit_code).toBe(7);
      expect(diagnosis.last_run?.end_reason).toBe("exit");
      expect(diagnosis.restarts.count).toBe(0);
      expect(runDirs(dataDir, dies.id)).toHaveLength(1);
    },
    TEST_TIMEOUT_MS,
  );

  test(
    "a recorded pid now held by another process is not adopted: the run counts as lost and restarts",
    async () => {
      const dataDir = scratch();
      const first = await started(dataDir);
      const client = new Client(first, dataDir);
      const deployed = await client.deployed({ name: "reused", command: "exec sleep 300" });
      const before = await client.waitFor("reused", "running", (record) => record.pid !== null);
      expect(await first.stop()).toBe(0);

      // End the run behind the engine's back without an exit.json (shim first), then let an
      // unrelated process hold the recorded pids, as if the kernel had reused them.
      const runId = runDirs(dataDir, deployed.id)[0] ?? "";
      const [shimPid, workloadPid] = readFileSync(join(dataDir, "services", deployed.id, "runs", runId, "pids"), "utf8")
        .trim()
        .split(" ")
        .map(Number);
      process.kill(shimPid ?? -1, "SIGKILL");
      process.kill(-(workloadPid ?? 0), "SIGKILL");
      await eventually(() => !processExists(shimPid ?? -1) && !processExists(workloadPid ?? -1), { timeoutMs: 5000 });
      const impostor = Bun.spawn(["sleep", "300"], { stdout: "ignore", stderr: "ignore" });
      defer(() => impostor.kill("SIGKILL"));
      const db = new Database(join(dataDir, "engine.db"));
      db.query("UPDATE runs SET shim_pid = ?, pid = ? WHERE id = ?").run(impostor.pid, impostor.pid, runId);
      db.close();

      const second = await started(dataDir);
      const next = new Client(second, dataDir);
      const after = await next.waitFor("reused", "running", (record) => record.pid !== null && record.pid !== impostor.pid, 10_000);
      expect(after.pid).not.toBe(before.pid);
      expect(after.restarts).toBe(1);
      expect(processExists(impostor.pid)).toBe(true);
      expect(impostor.exitCode).toBeNull();
      expect(runDirs(dataDir, deployed.id)).toHaveLength(2);
    },
    TEST_TIMEOUT_MS,
  );

  test(
    "a run recorded before its shim reported is recovered from the run directory, not started twice",
    async () => {
      const dataDir = scratch();
      const first = await started(dataDir);
      const client = new Client(first, dataDir);
      const deployed = await client.deployed({ name: "early", command: "exec sleep 300" });
      const before = await client.waitFor("early", "running", (record) => record.pid !== null);
      expect(await first.stop()).toBe(0);
      // As if the daemon had died between starting the shim and recording its pids.
      const db = new Database(join(dataDir, "engine.db"));
      db.query("UPDATE runs SET shim_pid = NULL, shim_start = NULL, pid = NULL, pid_start = NULL WHERE service_id = ?").run(deployed.id);
      db.query("UPDATE services SET status = 'scheduled' WHERE id = ?").run(deployed.id);
      db.close();
      const second = await started(dataDir);
      const next = new Client(second, dataDir);
      const after = await next.waitFor("early", "running", (record) => record.pid !== null);
      expect(after.pid).toBe(before.pid);
      expect(after.restarts).toBe(0);
      expect(runDirs(dataDir, deployed.id)).toHaveLength(1);
      expect(workloadPids(["sleep", "300"], deployed.id)).toEqual([before.pid ?? -1]);
    },
    TEST_TIMEOUT_MS,
  );
});
