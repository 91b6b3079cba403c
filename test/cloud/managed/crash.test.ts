import { afterAll, beforeAll, expect, test } from "bun:test";
import { existsSync, rmSync } from "node:fs";
import { join } from "node:path";
import { LocalProvider } from "../../../src/cloud/managed";
import { createLogger } from "../../../src/lib/logger";
import { VERSION } from "../../../src/lib/version";
import { collectOutput, eventually, REPO_ROOT, tempDir } from "../../helpers";
import { startTestCloud, type TestCloud } from "../helpers";
import { alive, boxPids, ENGINE_SOURCE, reapBoxes } from "./helpers";

/**
 * kill -9 of the provisioner mid-operation (issue 15): the provisioner runs as its own process
 * (`engine-cloud serve --role provisioner`, from source, as an operator runs it) beside a
 * console that serves the API; a fault script holds its answer after a step is done, the test
 * kills it there, starts another, and counts the box engines in the process table: the step is
 * finished, and no box is leaked or made twice.
 */

const CLOUD_ENTRY = [process.execPath, join(REPO_ROOT, "cli", "cloud.ts")];
let dataDir: string;
let api: TestCloud;
let local: LocalProvider;
const running: Bun.Subprocess[] = [];

/** startProvisioner runs `engine-cloud serve --role provisioner` on the shared data dir, with a fault script. */
async function startProvisioner(faults?: unknown): Promise<{ proc: Bun.Subprocess; output: () => string }> {
  const proc = Bun.spawn([...CLOUD_ENTRY, "--data-dir", dataDir, "serve", "--role", "provisioner", "--port", "0"], {
    env: {
      PATH: process.env.PATH ?? "/usr/bin:/bin",
      HOME: process.env.HOME ?? "/tmp",
      ...(faults ? { ENGINE_CLOUD_BOX_PROVIDER: "scripted", ENGINE_CLOUD_BOX_FAULTS: JSON.stringify(faults) } : {}),
    },
    stdout: "pipe",
    stderr: "pipe",
  });
  running.push(proc);
  const output = collectOutput(proc);
  await eventually(() => output().includes('"role":"provisioner"'), { timeoutMs: 20_000 });
  return { proc, output };
}

async function kill9(proc: Bun.Subprocess): Promise<void> {
  proc.kill("SIGKILL");
  await proc.exited;
}

beforeAll(async () => {
  dataDir = tempDir("engine-cloud-crash-");
  api = await startTestCloud("sqlite", { dataDir, databaseUrl: `sqlite://${join(dataDir, "cloud.db")}`, role: "api" });
  await api.deps.managed.setPlaces("launch", 1);
  local = new LocalProvider({
    root: join(dataDir, "boxes"),
    backupsRoot: join(dataDir, "backups"),
    releases: { [VERSION]: [process.execPath, ENGINE_SOURCE] },
    log: createLogger({ level: "silent", dataDir, stdout: false, fileName: "provider.log" }).log,
  });
});
afterAll(async () => {
  for (const proc of running) if (proc.exitCode === null) await kill9(proc);
  await api?.stop();
  reapBoxes(dataDir);
  await api?.close();
  rmSync(dataDir, { recursive: true, force: true });
});

test("kill -9 while a box is started, and again while it is destroyed: the next provisioner finishes, with one box and then none", async () => {
  const { token, accountId } = await api.signIn("crash@example.com", { paid: true });
  const row = async () => (await api.deps.db.sql`SELECT * FROM managed_allocations WHERE account_id = ${accountId}`)[0];

  // 1. The start is done (the box answers) but its answer is held: killed there.
  const one = await startProvisioner({ start: [{ kind: "slow_after", ms: 120_000, times: 1 }] });
  const id = (await api.api("POST", "/api/managed/allocation", { token })).body.id as string;
  try {
    await eventually(async () => (await local.status(id)).state === "running" && (await row()).operation === "start", {
      timeoutMs: 60_000,
    });
  } catch (error) {
    process.stderr.write(`${one.output().slice(-3000)}\n${JSON.stringify(await row())}\n${JSON.stringify(await local.status(id))}\n`);
    throw error;
  }
  const [box] = boxPids(dataDir) as [number];
  expect((await row()).status).toBe("provisioning");
  await kill9(one.proc);
  expect(alive(box)).toBe(true);

  const two = await startProvisioner();
  await eventually(async () => (await row()).status === "ready", { timeoutMs: 60_000 });
  expect(boxPids(dataDir)).toEqual([box]);
  expect(two.output()).toContain("resuming an operation a provisioner left");
  const health = await fetch(`${api.url}/boxes/${id}/api/health`, { headers: { authorization: `Bearer ${token}` } });
  expect(health.status).toBe(200);
  await kill9(two.proc);

  // 2. The destroy is done but its answer is held: killed there; the next one finds nothing left and finishes.
  const three = await startProvisioner({ destroy: [{ kind: "slow_after", ms: 120_000, times: 1 }] });
  expect((await api.api("DELETE", "/api/managed/allocation", { token })).status).toBe(202);
  await eventually(async () => !existsSync(local.boxDir(id)) && (await row()).operation === "destroy", { timeoutMs: 60_000 });
  expect(boxPids(dataDir)).toEqual([]);
  expect((await row()).status).toBe("deleting");
  await kill9(three.proc);

  const four = await startProvisioner();
  await eventually(async () => (await row()).status === "deleted", { timeoutMs: 60_000 });
  expect(boxPids(dataDir)).toEqual([]);
  expect(existsSync(local.boxDir(id))).toBe(false);
  const [audits] = await api.deps.db.sql`SELECT COUNT(*) AS n FROM audit WHERE action = 'managed.deleted' AND subject = ${id}`;
  expect(Number(audits.n)).toBe(1);
  await kill9(four.proc);
}, 180_000);
