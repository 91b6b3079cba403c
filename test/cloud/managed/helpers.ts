import { existsSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { CloudConfigInput } from "../../../src/cloud/config";
import type { Dialect } from "../../../src/cloud/db";
import { LocalProvider, type ManagedService, type ProvisionerOptions, ScriptedProvider } from "../../../src/cloud/managed";
import { createLogger } from "../../../src/lib/logger";
import { VERSION } from "../../../src/lib/version";
import { eventually, MutableClock, REPO_ROOT, reapWorkloads, removeServiceUsers, tempDir, testShim } from "../../helpers";
import { startTestCloud, type TestCloud } from "../helpers";

/** ENGINE_SOURCE is this checkout's engine CLI, which boxes run from source in these tests. */
export const ENGINE_SOURCE = join(REPO_ROOT, "cli", "engine.ts");
/** NEXT_VERSION is a second release label for update tests: the same engine, offered as newer. */
export const NEXT_VERSION = VERSION.replace(/\.(\d+)$/, (_, patch: string) => `.${Number(patch) + 1}`);

/**
 * boxPids lists the box engines running under a console's data dir: the processes whose
 * arguments hold `serve --data-dir <data-dir>/boxes/…`. It is how tests count boxes.
 */
export function boxPids(cloudDataDir: string): number[] {
  const prefix = `${join(cloudDataDir, "boxes")}/`;
  const found: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const argv = readFileSync(`/proc/${entry}/cmdline`, "utf8").split("\0");
      const at = argv.indexOf("--data-dir");
      if (at < 0 || !argv[at + 1]?.startsWith(prefix) || !argv.includes("serve")) continue;
      if (/\) Z /.test(readFileSync(`/proc/${entry}/stat`, "utf8"))) continue;
      found.push(Number(entry));
    } catch {
      // gone while read
    }
  }
  return found;
}

/** goneBoxesWithUsers names the boxes under `boxes` that are gone but whose service users (home `<box>/data/data/<service>`) are still in /etc/passwd. */
function goneBoxesWithUsers(boxes: string): string[] {
  let passwd = "";
  try {
    passwd = readFileSync("/etc/passwd", "utf8");
  } catch {
    return [];
  }
  const found = new Set<string>();
  for (const line of passwd.split("\n")) {
    const home = line.split(":")[5] ?? "";
    if (!home.startsWith(`${boxes}/`)) continue;
    const box = home.slice(boxes.length + 1).split("/")[0] ?? "";
    if (box && !existsSync(join(boxes, box))) found.add(box);
  }
  return [...found];
}

/** reapBoxes kills every box engine a console started under its data dir, and their workloads. */
export function reapBoxes(cloudDataDir: string): void {
  for (const pid of boxPids(cloudDataDir)) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // gone
    }
  }
  for (let waited = 0; boxPids(cloudDataDir).length > 0 && waited < 5000; waited += 20) Bun.sleepSync(20);
  const boxes = join(cloudDataDir, "boxes");
  if (!existsSync(boxes)) return;
  for (const box of readdirSync(boxes)) {
    const data = join(boxes, box, "data");
    if (existsSync(data)) reapWorkloads(data);
  }
  // A box destroyed during the test took its files, and the users its root engine made unless a
  // process of theirs was still being reaped: those go now.
  for (const box of goneBoxesWithUsers(boxes)) removeServiceUsers(join(boxes, box, "data"));
  // Shims and anything else still naming a box's path (a shim spawned but not yet recorded).
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const argv = readFileSync(`/proc/${entry}/cmdline`, "utf8").split("\0");
      if (argv.some((arg) => arg.startsWith(`${boxes}/`))) process.kill(Number(entry), "SIGKILL");
    } catch {
      // gone
    }
  }
}

/** ManagedCloud is a test console with hosted machines: its scripted provider, clock and service. */
export interface ManagedCloud extends TestCloud {
  provider: ScriptedProvider;
  local: LocalProvider;
  clock: MutableClock;
  managed: ManagedService;
  /** allocation reads the account's newest allocation row. */
  row(accountId: string): Promise<Record<string, unknown>>;
  /** auditCount counts audit rows of an action about a subject. */
  auditCount(action: string, subject: string): Promise<number>;
  /** waitFor polls the account's allocation view until `check` holds. */
  // biome-ignore lint/suspicious/noExplicitAny: a test reads whichever fields it asserts on.
  waitFor(token: string, check: (view: any) => boolean, timeoutMs?: number): Promise<any>;
}

/**
 * startManagedCloud starts a console (role `all`, so its provisioner runs in-process) whose
 * boxes are real engines from this checkout, behind a scripted provider the test can fault,
 * on a clock the test can move. Places are opened (`launch`, `trial`) as asked.
 */
export async function startManagedCloud(
  dialect: Dialect,
  options: {
    places?: { launch?: number; trial?: number };
    releases?: string[];
    input?: CloudConfigInput;
    provisioner?: ProvisionerOptions;
    role?: "all" | "api";
  } = {},
): Promise<ManagedCloud> {
  const clock = new MutableClock();
  const releases = Object.fromEntries((options.releases ?? [VERSION]).map((v) => [v, [process.execPath, ENGINE_SOURCE]]));
  const dataDir = tempDir("engine-cloud-managed-");
  const local = new LocalProvider({
    root: join(dataDir, "boxes"),
    backupsRoot: join(dataDir, "backups"),
    releases,
    // The test shim, compiled once per test process, instead of one compile per box.
    env: { ENGINE_SHIM: testShim() },
    log: createLogger({ level: "silent", dataDir, stdout: false, fileName: "provider.log" }).log,
  });
  const provider = new ScriptedProvider(local);
  let cloud: TestCloud;
  try {
    cloud = await startTestCloud(
      dialect,
      { role: options.role ?? "all", dataDir, ...options.input },
      {
        clock: () => clock.now().getTime(),
        provisioner: { intervalMs: 100, recheckMs: 300, leaseMs: 15_000, operationTimeoutMs: 30_000, ...options.provisioner },
        provider,
      },
    );
  } catch (error) {
    rmSync(dataDir, { recursive: true, force: true });
    throw error;
  }
  const managed = cloud.deps.managed;
  if (options.places?.launch !== undefined) await managed.setPlaces("launch", options.places.launch);
  if (options.places?.trial !== undefined) await managed.setPlaces("trial", options.places.trial);
  const close = cloud.close;
  return {
    ...cloud,
    dataDir,
    provider,
    local,
    clock,
    managed,
    async row(accountId) {
      const [row] = await cloud.deps.db.sql`SELECT * FROM managed_allocations WHERE account_id = ${accountId}
        ORDER BY created_at DESC LIMIT 1`;
      return row;
    },
    async auditCount(action, subject) {
      const [row] = await cloud.deps.db.sql`SELECT COUNT(*) AS n FROM audit WHERE action = ${action} AND subject = ${subject}`;
      return Number(row.n);
    },
    async waitFor(token, check, timeoutMs = 30_000) {
      return eventually(
        async () => {
          const answer = await cloud.api("GET", "/api/managed/allocation", { token });
          return check(answer.body) ? answer.body : undefined;
        },
        { timeoutMs },
      );
    },
    async close() {
      // The provisioner stops first (no new box), then every box it left is ended, then the console's files go.
      await cloud.stop();
      reapBoxes(dataDir);
      await close();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** alive says whether a process runs (a zombie not yet reaped by its parent does not count). */
export function alive(pid: number): boolean {
  try {
    return !/\) Z /.test(readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch {
    return false;
  }
}
