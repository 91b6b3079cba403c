import { chmodSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import type { HookHost, Launch } from "../../../../src/engine/scheduler/hooks";
import { defaultRestartPolicy, type ServiceSpec } from "../../../../src/engine/services";
import { serviceRow } from "../../services/rows";

/** launchOf is a launch of a service `app` (command `true`, no port) from `dataDir`, with `spec` fields changed. */
export function launchOf(dataDir: string, spec: Partial<ServiceSpec> = {}, fields: Partial<Launch> = {}): Launch {
  const full = {
    ...{ name: "app", kind: "service", command: ["true"], env: {}, secret_keys: [], bindings: [], port: null, cwd: null },
    ...{ gpus: 0, gpu_memory_mb: 0, memory_mb: null, priority: 0, restart: defaultRestartPolicy("service"), health: null },
    ...{ build: null, template_id: null, stop_timeout_s: 10, user: null, database: null },
    ...spec,
  } as ServiceSpec;
  const service = serviceRow("app");
  const version = { service_id: service.id, version: 1, spec: full, sealed_secrets: null, created_at: service.created_at };
  return {
    ...{ service, spec: full, runId: "run_1", runDir: join(dataDir, "services", service.id, "runs", "run_1") },
    version: { ...version, build_result: null, build_reason: null, build_commit: null, build_dir: null },
    ...{ dataDir: join(dataDir, "data", "app"), cwd: join(dataDir, "data", "app"), hold: null, database: null },
    ...{ parts: { engine: {}, bindings: {}, secrets: {}, gpu: {} }, env: {}, injectedKeys: [], envSource: "none", argv: full.command },
    ...{ user: null, signal: new AbortController().signal, status: () => {} },
    ...fields,
  };
}

/** hostOf is a HookHost over a real data dir, with what a test changes; what it does not set throws. */
export function hostOf(dataDir: string, fields: Partial<HookHost> = {}): HookHost {
  const unset = (what: string) => () => {
    throw new Error(`this test gave the host no ${what}`);
  };
  return {
    baseEnv: { PATH: "/usr/bin:/bin" },
    serviceDataDir: (name) => join(dataDir, "data", name),
    serviceDir: (serviceId) => join(dataDir, "services", serviceId),
    ensureDir: async (dir, mode = 0o700) => {
      mkdirSync(dir, { recursive: true, mode });
      chmodSync(dir, mode);
    },
    dataDirMode: () => 0o700,
    findService: () => null,
    boundService: unset("bound services"),
    openSecrets: unset("secrets"),
    workloadUser: async () => null,
    fileBindingGroups: () => [],
    appendLog: () => {},
    ...fields,
  };
}
