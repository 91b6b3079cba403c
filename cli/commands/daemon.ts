import type { Command } from "commander";
import { CliError, type EngineClient } from "../client";
import { emit, type Output } from "../output";

/** DEFAULT_DRAIN_TIMEOUT_S is how long a restart lets work in flight finish by default. */
const DEFAULT_DRAIN_TIMEOUT_S = 30;

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
}
