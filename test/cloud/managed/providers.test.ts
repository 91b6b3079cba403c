import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { type BoxProvider, LocalProvider, ScriptedProvider } from "../../../src/cloud/managed";
import { isAppError } from "../../../src/lib/errors";
import { createLogger } from "../../../src/lib/logger";
import { VERSION } from "../../../src/lib/version";
import { eventually, tempDir, testShim } from "../../helpers";
import { alive, boxPids, ENGINE_SOURCE, NEXT_VERSION, reapBoxes } from "./helpers";

/**
 * The provider contract (src/cloud/managed/providers/provider.ts), run against real boxes:
 * every operation is idempotent and keyed by the box id, status comes from the process table,
 * sleep frees the box's processes and keeps its data, update needs a stopped box, a backup
 * restores into a new box with the same services, destroy of an unknown box is done. The
 * same suite runs on the local provider and on the scripted wrapper with no faults (Hono's
 * one conformance suite for interchangeable implementations).
 */

const dirs: string[] = [];
afterAll(() => {
  for (const dir of dirs) {
    reapBoxes(dir);
    rmSync(dir, { recursive: true, force: true });
  }
});

function makeLocal(): { local: LocalProvider; dir: string } {
  const dir = tempDir("engine-boxes-");
  dirs.push(dir);
  const local = new LocalProvider({
    root: join(dir, "boxes"),
    backupsRoot: join(dir, "backups"),
    releases: { [VERSION]: [process.execPath, ENGINE_SOURCE], [NEXT_VERSION]: [process.execPath, ENGINE_SOURCE] },
    env: { ENGINE_SHIM: testShim() },
    log: createLogger({ level: "silent", dataDir: dir, stdout: false, fileName: "provider.log" }).log,
  });
  return { local, dir };
}

/** box calls a box's engine API over its socket, as the console's proxy does. */
async function box(provider: BoxProvider, id: string, method: string, path: string, body?: unknown) {
  const endpoint = provider.endpoint(id);
  const response = await fetch(`${endpoint.url}${path}`, {
    method,
    unix: endpoint.unix,
    headers: body === undefined ? {} : { "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  } as RequestInit);
  const text = await response.text();
  return { status: response.status, body: text ? JSON.parse(text) : null };
}

async function codeOf(promise: Promise<unknown>): Promise<string> {
  try {
    await promise;
    return "resolved";
  } catch (error) {
    return isAppError(error) ? error.code : (error as Error).message;
  }
}

/** workloadPid is the pid of a service's workload, from the run record the box's engine wrote. */
function workloadPids(local: LocalProvider, id: string): number[] {
  const data = local.dataDir(id);
  const pids: number[] = [];
  for (const file of new Bun.Glob("services/*/runs/*/pids").scanSync({ cwd: data })) {
    const [, child] = readFileSync(join(data, file), "utf8").trim().split(" ").map(Number);
    if (child && existsSync(`/proc/${child}`)) pids.push(child);
  }
  return pids;
}

const implementations: [string, () => { provider: BoxProvider; local: LocalProvider; dir: string }][] = [
  [
    "local",
    () => {
      const made = makeLocal();
      return { provider: made.local, ...made };
    },
  ],
  [
    "scripted (no faults)",
    () => {
      const made = makeLocal();
      return { provider: new ScriptedProvider(made.local), ...made };
    },
  ],
];

for (const [name, make] of implementations) {
  describe(`provider conformance: ${name}`, () => {
    const { provider, local, dir } = make();
    const spec = { version: VERSION, templateVersion: "1" };

    test("create is idempotent and makes a stopped box; an unknown box is absent", async () => {
      expect(await provider.status("box_unknown")).toEqual({ state: "absent", version: null, pids: [] });
      await provider.create("box_one", spec);
      await provider.create("box_one", { version: NEXT_VERSION, templateVersion: "9" });
      expect(await provider.status("box_one")).toEqual({ state: "stopped", version: VERSION, pids: [] });
      expect(await codeOf(provider.create("../escape", spec))).toBe("invalid_request");
      expect(await codeOf(provider.create("box_bad_version", { version: "9.9.9", templateVersion: "1" }))).toBe("version_unknown");
      expect(await codeOf(provider.start("box_unknown"))).toBe("box_absent");
    });

    test("start runs one engine that answers; a second start is the same process", async () => {
      await provider.start("box_one");
      const first = await provider.status("box_one");
      expect(first.state).toBe("running");
      expect(first.pids).toHaveLength(1);
      await Promise.all([provider.start("box_one"), provider.start("box_one")]);
      expect((await provider.status("box_one")).pids).toEqual(first.pids);
      expect(boxPids(dir)).toEqual(first.pids);
      const health = await box(provider, "box_one", "GET", "/api/health");
      expect(health.status).toBe(200);
      expect(health.body.pid).toBe(first.pids[0]);
    });

    test("stop (sleep) ends the engine and its workloads and keeps the data; start brings the box back", async () => {
      const deployed = await box(provider, "box_one", "POST", "/api/services", { name: "web", kind: "service", command: ["sleep", "600"] });
      expect(deployed.status).toBe(201);
      const workloads = await eventually(() => (workloadPids(local, "box_one").length > 0 ? workloadPids(local, "box_one") : null), {
        timeoutMs: 15_000,
      });
      expect(workloads).toHaveLength(1);
      await provider.stop("box_one");
      expect(await provider.status("box_one")).toEqual({ state: "stopped", version: VERSION, pids: [] });
      expect(boxPids(dir)).toEqual([]);
      for (const pid of workloads) expect(alive(pid)).toBe(false);
      expect(existsSync(join(local.dataDir("box_one"), "engine.db"))).toBe(true);
      await provider.stop("box_one");
      await provider.stop("box_unknown");
      await provider.start("box_one");
      const services = await box(provider, "box_one", "GET", "/api/services");
      expect(services.body.map((s: { name: string }) => s.name)).toEqual(["web"]);
    });

    test("update needs a stopped box and an offered release, and is idempotent", async () => {
      expect(await codeOf(provider.update("box_one", NEXT_VERSION))).toBe("box_running");
      await provider.stop("box_one");
      expect(await codeOf(provider.update("box_one", "9.9.9"))).toBe("version_unknown");
      await provider.update("box_one", NEXT_VERSION);
      await provider.update("box_one", NEXT_VERSION);
      expect((await provider.status("box_one")).version).toBe(NEXT_VERSION);
      await provider.start("box_one");
      expect((await provider.status("box_one")).state).toBe("running");
      expect(await codeOf(provider.update("box_unknown", NEXT_VERSION))).toBe("box_absent");
    });

    test("a backup of a running box restores into a new box with the same services", async () => {
      const taken = await provider.backup("box_one", "bak_first");
      expect(taken.sizeBytes).toBeGreaterThan(0);
      expect(await provider.backup("box_one", "bak_first")).toEqual(taken);
      await provider.restore("box_one", "bak_first", "box_two", spec);
      await provider.restore("box_one", "bak_first", "box_two", spec);
      expect(await codeOf(provider.restore("box_one", "bak_missing", "box_three", spec))).toBe("not_found");
      await provider.start("box_two");
      const restored = await box(provider, "box_two", "GET", "/api/services");
      expect(restored.body.map((s: { name: string }) => s.name)).toEqual(["web"]);
      // Two boxes, one engine each; the restored box adopted none of the first box's processes.
      // A box engine's spawn (the restored service's shim launcher, say) is for an instant, until
      // its exec, a copy of the engine's own command line: the two views are compared once none is.
      const views = await eventually(async () => {
        const [one, two] = [(await provider.status("box_one")).pids, (await provider.status("box_two")).pids];
        const all = boxPids(dir).sort();
        return JSON.stringify(all) === JSON.stringify([...one, ...two].sort()) ? { one, two, all } : null;
      });
      expect([views.one.length, views.two.length, views.all.length]).toEqual([1, 1, 2]);
      await provider.forgetBackup("box_one", "bak_first");
      await provider.forgetBackup("box_one", "bak_first");
    });

    test("destroy removes a box with everything it runs; an unknown box is done", async () => {
      expect(await provider.destroy("box_unknown")).toBe("done");
      for (const id of ["box_one", "box_two"]) {
        expect(await provider.destroy(id)).toBe("done");
        expect(await provider.status(id)).toEqual({ state: "absent", version: null, pids: [] });
        expect(existsSync(local.boxDir(id))).toBe(false);
        expect(await provider.destroy(id)).toBe("done");
      }
      expect(boxPids(dir)).toEqual([]);
    }, 30_000);
  });
}

test("a box engine's fork that has not exec'd yet is not counted as a second engine", async () => {
  const { local } = makeLocal();
  // perl forks without an exec: parent and child share the command line an engine has.
  const engine = Bun.spawn(["perl", "-e", "fork; sleep 30", "serve", "--data-dir", local.dataDir("box_fork")], {
    stdio: ["ignore", "ignore", "ignore"],
  });
  try {
    const lookalikes = () =>
      readdirSync("/proc").filter(
        (entry) => /^\d+$/.test(entry) && readQuietly(`/proc/${entry}/cmdline`).includes(local.dataDir("box_fork")),
      );
    await eventually(() => lookalikes().length === 2);
    expect(local.enginePids("box_fork")).toEqual([engine.pid]);
  } finally {
    // Both perl processes go, found by their command line.
    for (const pid of readdirSync("/proc").filter((entry) => /^\d+$/.test(entry))) {
      if (readQuietly(`/proc/${pid}/cmdline`).includes(local.dataDir("box_fork"))) process.kill(Number(pid), "SIGKILL");
    }
    await engine.exited;
  }
});

function readQuietly(path: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return "";
  }
}

describe("the scripted provider's faults", () => {
  const { local } = makeLocal();
  const scripted = new ScriptedProvider(local);
  const spec = { version: VERSION, templateVersion: "1" };

  test("fail refuses as many calls as asked, then calls through", async () => {
    scripted.inject("create", { kind: "fail", times: 2 });
    expect(await codeOf(scripted.create("box_f", spec))).toBe("provider_failed");
    expect(await codeOf(scripted.create("box_f", spec))).toBe("provider_failed");
    expect((await scripted.status("box_f")).state).toBe("absent");
    await scripted.create("box_f", spec);
    expect((await scripted.status("box_f")).state).toBe("stopped");
  });

  test("hang never answers; slow answers late; lose takes the box away", async () => {
    scripted.inject("status", { kind: "hang", times: 1 });
    const hung = await Promise.race([scripted.status("box_f").then(() => "answered"), Bun.sleep(300).then(() => "hung")]);
    expect(hung).toBe("hung");
    scripted.inject("update", { kind: "slow", ms: 200, times: 1 });
    const started = Date.now();
    await scripted.update("box_f", VERSION);
    expect(Date.now() - started).toBeGreaterThanOrEqual(190);
    scripted.inject("status", { kind: "lose", times: 1 });
    expect((await scripted.status("box_f")).state).toBe("absent");
    expect(existsSync(local.boxDir("box_f"))).toBe(false);
  });

  test("calls on one box that overlap are counted; calls on different boxes are not", async () => {
    const counting = new ScriptedProvider(local, { create: [{ kind: "slow", ms: 100 }] });
    await Promise.all([counting.create("box_a", spec), counting.create("box_b", spec)]);
    expect(counting.maxOverlap()).toBe(0);
    await Promise.all([counting.create("box_a", spec), counting.create("box_a", spec)]);
    expect(counting.maxOverlap()).toBe(1);
    for (const id of ["box_a", "box_b"]) await local.destroy(id);
  });

  test("the fault script reads from JSON and names a bad entry", () => {
    expect(ScriptedProvider.parseFaults('{"start":[{"kind":"slow_after","ms":10}]}')).toEqual({ start: [{ kind: "slow_after", ms: 10 }] });
    expect(() => ScriptedProvider.parseFaults('{"reboot":[]}')).toThrow("reboot");
    expect(() => ScriptedProvider.parseFaults('{"start":[{"kind":"explode"}]}')).toThrow("unknown kind");
    expect(() => ScriptedProvider.parseFaults("{")).toThrow("not JSON");
  });
});
