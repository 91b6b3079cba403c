import { EMPTY_RESTART_STATE } from "../../../src/engine/services/restart-policy";
import { EMPTY_FORENSICS, type RunRow, type ServiceRow } from "../../../src/engine/services/store";

/** serviceRow is a stored service named `name` (id `svc_<name>`), pending, with `fields` over it. */
export function serviceRow(name: string, fields: Partial<ServiceRow> = {}): ServiceRow {
  const at = "2026-11-27T00:00:00.000Z";
  const owner = { token_id: null, name: "local", max_gpus: null, max_concurrent_jobs: null };
  return {
    ...{ id: `svc_${name}`, name, kind: "service", version: 1, desired_state: "running", status: "pending", status_message: null },
    ...{ owner, priority: 0, submitted_at: at, created_at: at, updated_at: at, restart_state: EMPTY_RESTART_STATE },
    ...{ forensics: EMPTY_FORENSICS, current_run_id: null, run_as: null },
    ...fields,
  };
}

/** runRow is a run of the service named `service` as a launch records it, before its shim reported, with `fields` over it. */
export function runRow(service: string, id: string, fields: Partial<RunRow> = {}): RunRow {
  return {
    ...{ id, service_id: `svc_${service}`, version: 1, run_dir: `/runs/${id}`, shim_pid: null, shim_start: null, pid: null },
    ...{ pid_start: null, cgroup_dir: null, gpus: null, env_keys: [], started_at: "2026-11-27T00:00:05.000Z", ended_at: null },
    ...{ exit: null, end_reason: null },
    ...fields,
  };
}
