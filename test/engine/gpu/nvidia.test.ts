/**
 * The engine on a machine with a real NVIDIA GPU and PyTorch: the inventory it reads from the
 * real nvidia-smi, a workload pinned by CUDA_VISIBLE_DEVICES, a second one waiting for the GPU,
 * the GPU memory the metrics attribute to a service, and a real CUDA out-of-memory error that
 * `diagnose` classifies. The engine runs as a user runs it (`engine serve`, its defaults, the
 * nvidia-smi on PATH). Without a GPU (CI, laptops) these tests are skipped: the same paths run
 * everywhere against test/fixtures/gpu/nvidia-smi, which prints the real format, and against the
 * outputs this file's run captured on an H200 (test/fixtures/gpu/h200/, read by h200.test.ts).
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { NVIDIA_SMI_QUERY } from "../../../src/engine/gpu/inventory";
import { eventually, reapWorkloads, type SpawnedEngine, spawnEngine, tempDir } from "../../helpers";
import { ServiceClient } from "../services/harness";

const smi = Bun.which("nvidia-smi");
const listed = smi ? Bun.spawnSync([smi, "-L"], { stdout: "pipe", stderr: "pipe" }) : null;
const realGpu = listed?.exitCode === 0 && /^GPU \d+: /m.test(listed.stdout.toString());
const python = realGpu ? Bun.which("python3") : null;
const torch =
  python !== null &&
  Bun.spawnSync([python, "-c", "import torch; assert torch.cuda.is_available()"], { stdout: "ignore", stderr: "ignore" }).exitCode === 0;

/** py is a workload command that runs a Python program with the python3 that holds PyTorch. */
const py = (program: string) => [python ?? "python3", "-u", "-c", program];

/** HOLD allocates 1 GiB on the one GPU the workload sees, reports what it sees, and stays up. */
const HOLD = `
import os, time, torch
held = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
seen = "%s|%d|GPU-%s" % (os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count(), torch.cuda.get_device_properties(0).uuid)
open(os.path.join(os.environ["SERVICE_DATA_DIR"], "seen"), "w").write(seen)
print("holding 1 GiB on", seen, flush=True)
time.sleep(600)
`;

/** OOM asks for 1 TiB at once, more than any GPU has: PyTorch raises torch.OutOfMemoryError. */
const OOM = `
import torch
torch.empty(1 << 40, dtype=torch.uint8, device="cuda")
`;

let engine: SpawnedEngine;
let api: ServiceClient;
let dataDir: string;
let token: string;

describe.skipIf(!realGpu)("a real NVIDIA GPU", () => {
  beforeAll(async () => {
    dataDir = tempDir("engine-nvidia-");
    engine = await spawnEngine(dataDir);
    token = readFileSync(join(dataDir, "admin.token"), "utf8").trim();
    api = new ServiceClient({
      async json<T>(method: string, path: string, options: { body?: unknown } = {}) {
        const response = await fetch(`${engine.url}${path}`, {
          method,
          headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
          body: options.body === undefined ? undefined : JSON.stringify(options.body),
        });
        return { status: response.status, body: (await response.json()) as T };
      },
    });
  });
  afterAll(async () => {
    engine?.proc.kill("SIGTERM");
    await engine?.proc.exited;
    if (dataDir) reapWorkloads(dataDir);
  });

  test("the inventory is the real nvidia-smi's", async () => {
    const rows = Bun.spawnSync([smi as string, ...NVIDIA_SMI_QUERY], { stdout: "pipe" })
      .stdout.toString()
      .trim()
      .split("\n")
      .map((line) => line.split(", ").slice(0, 4));
    const inventory = await api.engine.json<{
      source: string;
      devices: { index: number; uuid: string; name: string; memory_total_mb: number }[];
    }>("GET", "/api/gpus");
    console.log(`nvidia-smi -L:\n${listed?.stdout.toString().trim()}\nGET /api/gpus: ${JSON.stringify(inventory.body)}`);
    expect(inventory.body.source).toBe("nvidia-smi");
    expect(inventory.body.devices.map((d) => [String(d.index), d.uuid, d.name, String(d.memory_total_mb)])).toEqual(rows);
  });

  test.skipIf(!torch)(
    "a workload sees only the GPU it was given; a second waits for it and gets it when it is free",
    async () => {
      const { body: inventory } = await api.engine.json<{ devices: { uuid: string }[] }>("GET", "/api/gpus");
      const count = inventory.devices.length;
      // Fill every GPU with a holder, then one more must wait.
      const holders = Array.from({ length: count }, (_, i) => `hold-${i}`);
      try {
        for (const name of holders) await api.deployed({ name, command: py(HOLD), gpus: 1 });
        const seen = async (name: string) =>
          eventually(
            () => {
              try {
                return readFileSync(join(dataDir, "data", name, "seen"), "utf8");
              } catch {
                return "";
              }
            },
            { timeoutMs: 60_000, intervalMs: 100 },
          );
        const given: string[] = [];
        for (const name of holders) {
          await api.waitFor(name, "running", () => true, 30_000);
          const [visible, devices, uuid] = (await seen(name)).split("|");
          console.log(`${name}: CUDA_VISIBLE_DEVICES=${visible}, torch sees ${devices} device(s), ${uuid}`);
          expect(devices).toBe("1");
          expect(uuid).toBe(visible as string); // the engine names the GPU by UUID, and that is the one CUDA opened
          given.push(visible as string);
        }
        expect([...given].sort()).toEqual(inventory.devices.map((d) => d.uuid).sort());

        await api.deployed({ name: "waiter", command: py(HOLD), gpus: 1 });
        const waiting = await api.waitFor("waiter", "pending", (r) => (r.status_message ?? "").includes("GPU"), 15_000);
        console.log(`waiter: ${waiting.status_message}`);
        expect((await api.diagnose("waiter")).remediation?.code).toBe("wait_for_gpu");

        // The metrics attribute each holder's GPU memory (nvidia-smi --query-compute-apps) to it.
        const metric = async () => {
          const text = await (await fetch(`${engine.url}/metrics`, { headers: { authorization: `Bearer ${token}` } })).text();
          const match = /^engine_service_gpu_memory_bytes\{service="hold-0"\} (\S+)$/m.exec(text);
          return match ? Number(match[1]) : 0;
        };
        const attributed = await eventually(
          async () => {
            const bytes = await metric();
            return bytes >= 1 << 30 ? bytes : 0;
          },
          {
            timeoutMs: 30_000,
            intervalMs: 500,
          },
        );
        console.log(`engine_service_gpu_memory_bytes{service="hold-0"} ${attributed}`);

        await api.control("hold-0", "stop");
        await api.waitFor("waiter", "running", () => true, 30_000);
        expect((await seen("waiter")).split("|")[0]).toBe(given[0] as string); // the GPU hold-0 gave back
      } finally {
        for (const name of [...holders, "waiter"]) await api.control(name, "stop");
      }
    },
    180_000,
  );

  test.skipIf(!torch)(
    "a real PyTorch CUDA out-of-memory error is diagnosed gpu_oom",
    async () => {
      await api.deployed({ name: "oom", kind: "batch", command: py(OOM), gpus: 1, restart: { policy: "never" } });
      await api.waitFor("oom", "failed", () => true, 60_000);
      const diagnosis = await api.diagnose("oom");
      console.log(
        `diagnose oom: ${JSON.stringify({ error: diagnosis.error, forensics: diagnosis.forensics, remediation: diagnosis.remediation })}`,
      );
      expect(diagnosis.forensics.gpu_oom).toBe(true);
      expect(diagnosis.forensics.oom_killed).toBe(false);
      expect(diagnosis.remediation?.code).toBe("reduce_batch_or_gpu_memory");
    },
    120_000,
  );
});
