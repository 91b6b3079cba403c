import type { Command } from "commander";
import type { EngineClient } from "../client";
import { emit, type Output } from "../output";

interface LoginLink {
  code: string;
  path: string;
  url: string | null;
  expires_at: string;
}

/**
 * registerUi adds `engine ui`, which prints a one-time login link to the web UI, as Jupyter
 * does: it opens an admin session once, within five minutes. Minting one needs admin (the
 * unix socket, or an admin token).
 */
export function registerUi(program: Command, client: () => EngineClient, output: () => Output): void {
  program
    .command("ui")
    .description("print a one-time login link to the web UI (admin; valid once, for 5 minutes)")
    .action(async () => {
      const api = client();
      const link = await api.request<LoginLink>("POST", "/api/ui/login-links");
      const url = link.url ?? link.path;
      emit(output(), { ...link, url }, () =>
        process.stdout.write(`Open this link to sign in to the engine's web UI (once, until ${link.expires_at}):\n\n    ${url}\n\n`),
      );
    });
}
