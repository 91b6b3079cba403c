import { isAbsolute, resolve } from "node:path";
import type { Command } from "commander";
import { CliError, type EngineClient } from "../client";
import { emit, type Output } from "../output";

/** DEFAULT_DRAIN_TIMEOUT_S is how long a restart lets work in flight finish by default. */
const DEFAULT_DRAIN_TIMEOUT_S = 30;
/** DEFAULT_HEALTH_TIMEOUT_S is how long an upgrade's new binary has to answer before the old one is put back. */
const DEFAULT_HEALTH_TIMEOUT_S = 60;
/** WAIT_MARGIN_S is what `engine upgrade --wait` allows beyond the drain and health timeouts (two starts of the engine). */
const WAIT_MARGIN_S = 120;

/** seconds reads a whole number of seconds from a flag, within bounds. */
function seconds(flag: string, value: string, min: number, max: number): number {
  if (!/^\d+$/.test(value) || Number(value) < min || Number(value) > max) {
    throw new CliError(`${flag} takes a whole number of seconds from ${min} to ${max} (got ${JSON.stringify(value)})`);
  }
  return Number(value);
}

interface UpgradeAccepted {
  from_version: string;
  to_version: string;
  binary: string;
  previous: string;
  store_schema: string;
}

export function registerDaemon(program: Command, client: () => EngineClient, output: () => Output): void {
  program
    .command("restart")
    .description("drain the daemon and restart it in place (workloads keep running)")
    .option("--drain-timeout <seconds>", "how long to let requests in flight finish", String(DEFAULT_DRAIN_TIMEOUT_S))
    .action(async (options: { drainTimeout: string }) => {
      if (!/^\d+$/.test(options.drainTimeout) || Number(options.drainTimeout) > 3600) {
        throw new CliError(`--drain-timeout takes a whole number of seconds up to 3600 (got ${JSON.stringify(options.drainTimeout)})`);
      }
      const drainTimeoutS = Number(options.drainTimeout);
      const api = client();
      await api.request<Record<string, never>>("POST", "/api/daemon/restart", { drain_timeout_s: drainTimeoutS });
      emit(output(), { restarting: true, drain_timeout_s: drainTimeoutS }, () =>
        process.stdout.write(
          `the daemon at ${api.describe()} is draining (up to ${drainTimeoutS} s) and restarting; \`engine version\` shows when it is back\n`,
        ),
      );
    });
  program
    .command("upgrade <binary>")
    .description(
      "replace the daemon's binary with a new build and restart into it with no gap (compiled engine only); the previous binary is kept as <path>.previous and put back if the new one does not start",
    )
    .option("--drain-timeout <seconds>", "how long to let requests in flight finish", String(DEFAULT_DRAIN_TIMEOUT_S))
    .option(
      "--health-timeout <seconds>",
      "how long the new binary has to answer before the old one is put back",
      String(DEFAULT_HEALTH_TIMEOUT_S),
    )
    .option("--wait", "wait until the daemon runs the new version (exit 1 if it was rolled back)")
    .action(async (binary: string, options: { drainTimeout: string; healthTimeout: string; wait?: boolean }) => {
      const drainTimeoutS = seconds("--drain-timeout", options.drainTimeout, 0, 3600);
      const healthTimeoutS = seconds("--health-timeout", options.healthTimeout, 1, 600);
      // The daemon reads the path on its machine: a relative one is taken from here.
      const path = isAbsolute(binary) ? binary : resolve(binary);
      const api = client();
      const accepted = await api.request<UpgradeAccepted>("POST", "/api/daemon/upgrade", {
        binary: path,
        drain_timeout_s: drainTimeoutS,
        health_timeout_s: healthTimeoutS,
      });
      const said = () =>
        process.stdout.write(
          `upgrading ${accepted.from_version} -> ${accepted.to_version}: the new binary is in place at ${accepted.binary} (the previous one kept as ${accepted.previous}); the daemon at ${api.describe()} is draining (up to ${drainTimeoutS} s) and restarting into it\n`,
        );
      if (!options.wait) {
        emit(output(), { upgrading: true, ...accepted }, said);
        return;
      }
      if (!output().json) said();
      const deadline = Date.now() + (drainTimeoutS + healthTimeoutS + WAIT_MARGIN_S) * 1000;
      const before = await api.request<{ pid: number }>("GET", "/api/health").catch(() => null);
      // Done when the daemon's own pid (re-executed in place) answers with the new version.
      for (;;) {
        const health = await api.request<{ version: string; pid: number }>("GET", "/api/health").catch(() => null);
        if (health && health.version === accepted.to_version && (before === null || health.pid === before.pid)) {
          emit(output(), { upgraded: true, ...accepted, pid: health.pid }, () =>
            process.stdout.write(`the daemon runs ${health.version} (pid ${health.pid})\n`),
          );
          return;
        }
        if (Date.now() > deadline) {
          throw new CliError(
            `the daemon did not come back with ${accepted.to_version} in time (it answers ${health ? `${health.version}, pid ${health.pid}` : "nothing"}): the upgrade was rolled back or is stuck; the engine's log says why`,
            "upgrade_failed",
          );
        }
        await Bun.sleep(200);
      }
    });
}
