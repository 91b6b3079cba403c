/**
 * bench/hosted.ts: what a hosted machine costs the user in time, on the local provider, over
 * N boxes (default 20), each measured on its own, one after the other:
 *
 *  - allocation → answering: POST /api/managed/allocation until the box's engine answers
 *    GET /api/health through the URL the allocation gives (the console's /boxes/ proxy);
 *  - wake → answering: the boxes put to sleep (idle past their sleep setting, on the console's
 *    clock), then POST /api/managed/allocation/wake until the box answers through its URL;
 *  - delete → freed: DELETE /api/managed/allocation until the box's engine process is gone,
 *    its directory removed and the allocation `deleted`.
 *
 * The anchor is a bare `engine serve --data-dir <fresh> --port 0 --no-proxy` of the same
 * engine, spawn to first answer of /api/health on its socket, N times in the same run; the
 * figures are p50/p99 and their ratio to the anchor's.
 *
 * Usage: bun bench/hosted.ts [--boxes 20] [--engine path/to/engine (default dist/engine if built, else cli/engine.ts)]
 */
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { resolveCloudConfig } from "../src/cloud/config";
import { LocalProvider } from "../src/cloud/managed";
import { startCloud } from "../src/cloud/server";
import { createLogger } from "../src/lib/logger";
import { VERSION } from "../src/lib/version";
import { fmt, numericArg, printRows } from "./lib";

const root = join(import.meta.dir, "..");
const boxes = numericArg("--boxes", 20);
const engineArg = process.argv.indexOf("--engine") >= 0 ? process.argv[process.argv.indexOf("--engine") + 1] : undefined;
const enginePath = engineArg ?? (existsSync(join(root, "dist", "engine")) ? join(root, "dist", "engine") : join(root, "cli", "engine.ts"));
const engineCommand = enginePath.endsWith(".ts") ? [process.execPath, enginePath] : [enginePath];
/** STEP_DEADLINE_MS bounds one measured step. */
const STEP_DEADLINE_MS = 120_000;

function percentile(values: number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? Number.NaN;
}

async function until(check: () => Promise<boolean>, what: string): Promise<void> {
  const deadline = performance.now() + STEP_DEADLINE_MS;
  while (!(await check().catch(() => false))) {
    if (performance.now() > deadline) throw new Error(`${what} did not happen within ${STEP_DEADLINE_MS} ms`);
    await Bun.sleep(10);
  }
}

/** anchor starts a bare engine N times: spawn to the first answer of /api/health on its socket. */
async function anchor(): Promise<number[]> {
  const times: number[] = [];
  for (let i = 0; i < boxes; i++) {
    const dir = mkdtempSync(join(tmpdir(), "engine-bench-bare-"));
    const socket = join(dir, "data", "engine.sock");
    const started = performance.now();
    const proc = Bun.spawn([...engineCommand, "serve", "--data-dir", join(dir, "data"), "--port", "0", "--no-proxy"], {
      env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: process.env.HOME ?? "/root", ENGINE_MDNS: "off", ENGINE_PROXY: "off" },
      stdout: "ignore",
      stderr: "ignore",
    });
    try {
      await until(async () => (await fetch("http://box/api/health", { unix: socket } as RequestInit)).ok, "a bare engine answering");
      times.push(performance.now() - started);
    } finally {
      proc.kill("SIGTERM");
      await proc.exited;
      rmSync(dir, { recursive: true, force: true });
    }
  }
  return times;
}

async function hosted(): Promise<{ allocate: number[]; wake: number[]; remove: number[] }> {
  const dataDir = mkdtempSync(join(tmpdir(), "engine-bench-hosted-"));
  let offset = 0;
  const log = createLogger({ level: "warn", dataDir, stdout: false, fileName: "cloud.log" }).log;
  const provider = new LocalProvider({
    root: join(dataDir, "boxes"),
    backupsRoot: join(dataDir, "backups"),
    releases: { [VERSION]: engineCommand },
    log,
  });
  const cloud = await startCloud(resolveCloudConfig({ dataDir, port: 0, logLevel: "warn", logToStdout: false }, {}), {
    log,
    clock: () => Date.now() + offset,
    provider,
    provisioner: { intervalMs: 50, recheckMs: 200 },
  });
  const { managed, accounts, sessions } = cloud.deps;
  const result = { allocate: [] as number[], wake: [] as number[], remove: [] as number[] };
  const owners: { token: string; id: string; url: string }[] = [];
  try {
    await managed.setPlaces("launch", boxes);
    const call = (token: string, method: string, path: string) =>
      fetch(`${cloud.url}${path}`, { method, headers: { authorization: `Bearer ${token}` } });
    const answers = async (token: string, url: string) => (await call(token, "GET", `${new URL(url).pathname}api/health`)).ok;
    for (let i = 0; i < boxes; i++) {
      const account = await accounts.add(`bench-${i}@example.com`, { paid: true });
      const { token } = await sessions.mint(account.id, "minted");
      const started = performance.now();
      const created = (await (await call(token, "POST", "/api/managed/allocation")).json()) as { id: string };
      let url = "";
      await until(async () => {
        const view = (await (await call(token, "GET", "/api/managed/allocation")).json()) as { url: string | null };
        url = view.url ?? "";
        return url !== "" && (await answers(token, url));
      }, "a box answering");
      result.allocate.push(performance.now() - started);
      owners.push({ token, id: created.id, url });
    }
    // Everyone idle past the sleep setting: the provisioner puts every box to sleep.
    offset += cloud.deps.config.managed.sleepAfterMs + 60_000;
    for (const owner of owners) {
      await until(async () => (await managed.store.byId(owner.id))?.power === "asleep", "a box asleep");
    }
    for (const owner of owners) {
      const started = performance.now();
      const woken = await call(owner.token, "POST", "/api/managed/allocation/wake");
      if (woken.status !== 202) throw new Error(`wake answered ${woken.status}`);
      await until(() => answers(owner.token, owner.url), "a woken box answering");
      result.wake.push(performance.now() - started);
    }
    for (const owner of owners) {
      const started = performance.now();
      await call(owner.token, "DELETE", "/api/managed/allocation");
      await until(async () => {
        const row = await managed.store.byId(owner.id);
        return row?.status === "deleted" && provider.enginePids(owner.id).length === 0 && !existsSync(provider.boxDir(owner.id));
      }, "a box freed");
      result.remove.push(performance.now() - started);
    }
  } finally {
    await cloud.stop();
    for (const owner of owners) await provider.destroy(owner.id).catch(() => undefined);
    rmSync(dataDir, { recursive: true, force: true });
  }
  return result;
}

console.log(`hosted machines: ${boxes} boxes of ${enginePath}, local provider, SQLite console in this process`);
const bare = await anchor();
const measured = await hosted();
const bareP50 = percentile(bare, 50);
const bareP99 = percentile(bare, 99);
const row = (name: string, values: number[]) => {
  const p50 = percentile(values, 50);
  const p99 = percentile(values, 99);
  return [name, fmt(p50, 0), fmt(p99, 0), fmt(p50 / bareP50), fmt(p99 / bareP99)];
};
printRows(
  "Hosted machines, ms (ratio to a bare engine serve start in the same run)",
  ["step", "p50", "p99", "p50 ratio", "p99 ratio"],
  [
    ["bare engine serve → answering (anchor)", fmt(bareP50, 0), fmt(bareP99, 0), "1.00", "1.00"],
    row("allocation → box answering", measured.allocate),
    row("wake → box answering", measured.wake),
    row("delete → process gone, dir removed, deleted", measured.remove),
  ],
);
