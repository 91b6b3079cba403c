import { describe, expect, test } from "bun:test";
import type { ServiceKind } from "../../../src/contract/engine";
import { type ExitFacts, planExit } from "../../../src/engine/scheduler/exit";
import type { RestartPolicy } from "../../../src/engine/services";
import type { ExitRecord } from "../../../src/engine/supervisor";
import { serviceRow } from "../services/rows";
import { launchOf } from "./hooks/launch";

const ENDED_AT = "2026-11-27T12:00:00.000Z";
const NOW_MS = Date.parse(ENDED_AT);
const RUN = { id: "run_1", service_id: "svc_app", version: 1, run_dir: "/x", started_at: "2026-11-27T11:00:00.000Z" };
const NO_BACKOFF: RestartPolicy = { policy: "always", max_restarts: 2, window_seconds: 60, backoff_s: 0 };

function exited(fields: Partial<ExitRecord> = {}): ExitRecord {
  return {
    exitCode: 1,
    signal: null,
    endedAt: ENDED_AT,
    execError: null,
    execStage: null,
    execMessage: null,
    oomKilled: false,
    lost: false,
    ...fields,
  };
}

function facts(exit: ExitRecord, fields: Partial<ExitFacts> = {}, kind: ServiceKind = "service", restart = NO_BACKOFF): ExitFacts {
  const { spec } = launchOf("/x", { kind, restart });
  const run = {
    ...RUN,
    shim_pid: 1,
    shim_start: 1,
    pid: 2,
    pid_start: 2,
    cgroup_dir: null,
    gpus: null,
    env_keys: [],
    ended_at: null,
    exit: null,
    end_reason: null,
  };
  return {
    ...{ service: serviceRow("app", { kind, status: "running" }), spec, run, exit, output: [], stopping: false, waited: false },
    ...{ healthKill: false, forcedKill: false, stopMethod: null, nowMs: NOW_MS, crashCause: () => null },
    ...fields,
  };
}

describe("planExit", () => {
  test.each([
    {
      name: "a run ended on purpose records only how it ended; whoever stopped it decides",
      facts: facts(exited({ signal: "SIGTERM", exitCode: null }), { stopping: true, waited: true, stopMethod: "SIGTERM" }),
      endReason: "stopped",
      status: undefined,
      retry: null,
    },
    {
      name: "a service stopped by request meanwhile is stopped",
      facts: facts(exited(), { service: serviceRow("app", { desired_state: "stopped", status: "running" }) }),
      endReason: "exit",
      status: "stopped",
      retry: null,
    },
    {
      name: "a batch job stopped by request meanwhile is cancelled",
      facts: facts(exited(), { service: serviceRow("app", { kind: "batch", desired_state: "stopped", status: "running" }) }, "batch"),
      endReason: "exit",
      status: "cancelled",
      retry: null,
    },
    {
      name: "a launch refused for lack of disk space is pending again, no crash counted",
      facts: facts(exited({ exitCode: null, execError: "ENOSPC", execStage: "setup", execMessage: "no space" })),
      endReason: "exit",
      status: "pending",
      retry: null,
      requeue: true,
    },
    {
      name: "an exec that failed fails at once: it would fail every time",
      facts: facts(exited({ exitCode: null, execError: "ENOENT", execStage: "exec", execMessage: "no such file" })),
      endReason: "exit",
      status: "failed",
      retry: null,
      errorClass: "command_not_found",
    },
    {
      name: "a crash with budget left restarts after the backoff",
      facts: facts(exited({ exitCode: 3 })),
      endReason: "exit",
      status: "restarting",
      retry: 0,
      errorClass: "exit_code",
    },
    {
      name: "a batch job that succeeded completes",
      facts: facts(exited({ exitCode: 0 }), {}, "batch", { ...NO_BACKOFF, policy: "on-failure" }),
      endReason: "exit",
      status: "completed",
      retry: null,
    },
    {
      name: "a health kill is counted and classified as such",
      facts: facts(exited({ exitCode: null, signal: "SIGTERM" }), { healthKill: true }),
      endReason: "health",
      status: "restarting",
      retry: 0,
      errorClass: "health_check_failed",
    },
  ])("$name", ({ facts: input, endReason, status, retry, requeue = false, errorClass }) => {
    const plan = planExit(input);
    expect(plan.endReason).toBe(endReason as ReturnType<typeof planExit>["endReason"]);
    expect(plan.patch.status).toBe(status);
    expect(plan.retryDelayMs).toBe(retry);
    expect(plan.requeue).toBe(requeue);
    if (errorClass) expect(plan.patch.forensics?.error?.class).toBe(errorClass);
  });

  test("an OOM kill that spends the budget stays oom_killed, with the give-up in its message", () => {
    const spent = { restarts: [ENDED_AT, ENDED_AT], last_exit_at: ENDED_AT, next_retry_at: null, backoff_s: 0 };
    const input = facts(exited({ exitCode: null, signal: "SIGKILL", oomKilled: true }), {
      service: serviceRow("app", { status: "running", restart_state: spent }),
    });
    const plan = planExit(input);
    expect(plan.patch.status).toBe("failed");
    expect(plan.patch.forensics?.error?.class).toBe("oom_killed");
    expect(plan.patch.forensics?.error?.message).toEndWith("gave up after 2 restarts in 60 s");
    expect(plan.runExit).toMatchObject({ oomKilled: true, gpu_oom: false, priv_denied: false });
  });

  test("the run's output names a GPU OOM", () => {
    const output = [
      {
        ts: "2026-11-27T11:59:59.000000000Z",
        stream: "stderr",
        line: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
      },
    ];
    const plan = planExit(facts(exited(), { output: output as ExitFacts["output"] }));
    expect(plan.runExit.gpu_oom).toBe(true);
    expect(plan.patch.forensics?.error?.class).toBe("gpu_oom");
  });
});
