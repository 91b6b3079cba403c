import { Argument, type Command } from "commander";
import type { ServiceRecord } from "../../src/contract/engine";
import type { EngineClient } from "../client";
import { completionScript, SHELLS, type Shell } from "../completion";

/** NAMES_TIMEOUT_MS bounds how long a Tab waits for the engine to list its services. */
const NAMES_TIMEOUT_MS = 1000;

/**
 * registerCompletion adds `engine completion bash|zsh|fish`, which prints a completion script
 * generated from this very program, and the hidden `engine __complete services` the scripts
 * call for service names: one line each, nothing (and status 0) when the engine cannot say.
 */
export function registerCompletion(program: Command, client: () => EngineClient): void {
  program
    .command("completion")
    .description("print shell completion for engine: source <(engine completion bash), or zsh, or fish")
    .addArgument(new Argument("<shell>", "the shell").choices(SHELLS))
    .action((shell: Shell) => {
      process.stdout.write(completionScript(program, shell));
    });

  program
    .command("__complete", { hidden: true })
    .argument("<what>", "services")
    .action(async (what: string) => {
      if (what !== "services") return;
      const names = await Promise.race([
        client()
          .request<ServiceRecord[]>("GET", "/api/services")
          .then((services) => services.map((service) => service.name))
          .catch(() => [] as string[]),
        Bun.sleep(NAMES_TIMEOUT_MS).then(() => [] as string[]),
      ]);
      if (names.length > 0) process.stdout.write(`${names.join("\n")}\n`);
    });
}
