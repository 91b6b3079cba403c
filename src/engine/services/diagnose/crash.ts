import { readFileSync } from "node:fs";
import { basename } from "node:path";
import type { LogLine } from "../../../contract/engine";
import type { Logger } from "../../../lib/logger";
import { type RunHandle, readProcessStat } from "../../supervisor";
import { type BoundService, bindingVariables } from "../env";
import type { ServiceSecrets } from "../secrets";
import type { ServiceRow, ServiceStore, VersionRow } from "../store";
import { findLogCause, type LogCause, redactor } from "./causes";
import { explainPortClash } from "./ports";

/** SECRET_NAME marks env values a Diagnosis must never show by their variable's name. */
const SECRET_NAME = /PASS|SECRET|TOKEN|KEY|CREDENTIAL|AUTH|PRIVATE/i;

/** LiveRun is a run a runner holds now, named by its service. */
export interface LiveRun {
  service: string;
  handle: RunHandle;
}

export interface CrashReaderContext {
  store: ServiceStore;
  log: Logger;
  secrets: ServiceSecrets;
  /** boundService is what a binding to `service` hands over: its secrets are redacted too. */
  boundService(service: ServiceRow): BoundService;
  /** liveRuns are the runs the runners hold now, to name who holds a clashing port. */
  liveRuns(): Iterable<LiveRun>;
}

/**
 * CrashReader reads a crashed run's output for its key line and cause (LOG_CAUSES), with the
 * service's secrets redacted, and for a port clash finds who holds the port: an engine service
 * by its run, or another process. A runner asks it when a run exits (RunnerHost.crashCause).
 */
export class CrashReader {
  constructor(private readonly ctx: CrashReaderContext) {}

  causeOf(service: ServiceRow, version: VersionRow, lines: LogLine[]): LogCause | null {
    // A run that said nothing names no cause: no secrets are opened for a redactor with nothing to redact.
    if (lines.length === 0) return null;
    try {
      const cause = findLogCause(lines, redactor(this.secretValuesOf(version)));
      if (cause?.class !== "port_in_use") return cause;
      return explainPortClash(cause, version.spec, (pid) => serviceOfPid(pid, this.ctx.liveRuns()));
    } catch (error) {
      this.ctx.log.warn({ err: error, service: service.name }, "cannot read the cause of a run's exit from its output");
      return null;
    }
  }

  /**
   * secretValuesOf lists the values a Diagnosis must never show: the service's secrets, its env
   * values under secret-looking names, and the secrets of the services bound to it.
   */
  private secretValuesOf(version: VersionRow): string[] {
    const values = Object.values(this.ctx.secrets.open(version));
    for (const [key, value] of Object.entries(version.spec.env)) if (SECRET_NAME.test(key)) values.push(value);
    for (const name of version.spec.bindings) {
      const bound = this.ctx.store.findService(name);
      if (!bound) continue;
      const service = this.ctx.boundService(bound);
      values.push(...Object.values(service.secrets));
      for (const [key, value] of Object.entries(bindingVariables(service))) if (SECRET_NAME.test(key)) values.push(value);
    }
    return values;
  }
}

/**
 * serviceOfPid names the engine service a process belongs to: one whose live run is the
 * process or one of its ancestors, or whose run's cgroup (named by the run id) holds it.
 */
export function serviceOfPid(pid: number, runs: Iterable<LiveRun>): string | null {
  const byPid = new Map<number, string>();
  const byRun = new Map<string, string>();
  const holders = new Map<number, string | null>();
  for (const { service, handle } of runs) {
    byPid.set(handle.pid, service);
    byRun.set(handle.runId, service);
    // A shim that holds one run names its service; a launcher holding several names none.
    holders.set(handle.shimPid, holders.has(handle.shimPid) ? null : service);
  }
  for (const [holder, name] of holders) if (name !== null && !byPid.has(holder)) byPid.set(holder, name);
  let current = pid;
  for (let depth = 0; depth < 64 && current > 1; depth++) {
    const name = byPid.get(current);
    if (name) return name;
    current = readProcessStat(current)?.ppid ?? 0;
  }
  try {
    for (const line of readFileSync(`/proc/${pid}/cgroup`, "utf8").split("\n")) {
      const name = byRun.get(basename(line.split(":").slice(2).join(":")));
      if (name) return name;
    }
  } catch {
    // gone, or no cgroups
  }
  return null;
}
