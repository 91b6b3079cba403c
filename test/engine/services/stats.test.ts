import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { ServiceStatsRecord } from "../../../src/contract/engine";
import { createToken, eventually, startTestEngine, type TestEngine } from "../../helpers";
import { ServiceClient } from "./harness";

let engine: TestEngine;
let api: ServiceClient;
beforeAll(async () => {
  engine = await startTestEngine();
  api = new ServiceClient(engine);
});
afterAll(async () => {
  // The detached child left the workload's process group, so stopping the service does not
  // end it: this test does.
  try {
    process.kill(Number(readFileSync(join(engine.dataDir, "data", "hog", "detached"), "utf8")), "SIGKILL");
  } catch {
    // never started, or gone
  }
  await engine.close();
});

const stats = async (token?: string) => {
  const answer = await engine.json<ServiceStatsRecord>("GET", "/api/stats", { token });
  expect(answer.status).toBe(200);
  return answer.body;
};

// Holds 64 MiB it has written (so it is resident), burns half a second of CPU (its own time,
// not the clock's: the machine may be busy), then waits; a child in a session of its own
// (setsid) is still the workload's and must be counted with it.
const HOG = [
  `setsid sleep 600 & echo $! > "$SERVICE_DATA_DIR/detached"`,
  `exec python3 -c "import time; x = b'x' * (64 << 20)`,
  "while time.process_time() < 0.5: pass",
  `time.sleep(600)"`,
].join("\n");

describe("GET /api/stats", () => {
  test("a live workload's CPU time and resident memory, its detached child included; a stopped one is not listed", async () => {
    await api.deployed({ name: "hog", command: HOG });
    await api.deployed({ name: "idle", command: ["sleep", "600"] });
    const running = await api.waitFor("hog", "running");
    await api.waitFor("idle", "running");

    let last: ServiceStatsRecord | undefined;
    const sample = await eventually(
      async () => {
        last = await stats();
        const hog = last.services.find((s) => s.name === "hog");
        return hog && hog.cpu_seconds >= 0.4 && hog.rss_bytes >= 64 * 1024 * 1024 ? last : null;
      },
      { timeoutMs: 20_000 },
    ).catch((error: Error) => {
      throw new Error(`${error.message}; the last sample: ${JSON.stringify(last)}`);
    });
    expect(Date.parse(sample.sampled_at)).not.toBeNaN();
    const hog = sample.services.find((s) => s.name === "hog");
    expect(hog?.pid).toBe(running.pid as number);
    // python3 and the setsid'd sleep (a group of its own, but a child of the workload).
    expect(hog?.processes).toBe(2);
    const idle = sample.services.find((s) => s.name === "idle");
    expect(idle?.processes).toBe(1);
    expect(idle?.rss_bytes).toBeGreaterThan(0);
    expect(idle?.rss_bytes).toBeLessThan(64 * 1024 * 1024);

    expect((await api.control("idle", "stop")).status).toBe(200);
    await api.waitFor("idle", "stopped");
    expect((await stats()).services.map((s) => s.name)).toEqual(["hog"]);
  }, 60_000);

  test("a scoped token sees its own services only", async () => {
    const scoped = await createToken(engine, { name: "stats-scoped", role: "readonly", scope_services: ["idle"] });
    expect((await api.control("idle", "start")).status).toBe(200);
    await api.waitFor("idle", "running");
    expect((await stats(scoped.secret)).services.map((s) => s.name)).toEqual(["idle"]);
    expect((await stats()).services.map((s) => s.name).sort()).toEqual(["hog", "idle"]);
  }, 30_000);
});
