import type { Command } from "commander";
import { startDaemon } from "../../src/engine/daemon";
import { resolveConfig } from "../../src/lib/config";

export function registerServe(program: Command): void {
  program
    .command("serve")
    .description("run the engine daemon (API, web UI and supervisor) in the foreground")
    .option("--port <port>", "TCP port of the API (ENGINE_PORT, default 9321; 0 picks a free one)")
    .option("--host <host>", "address to listen on (ENGINE_HOST, default 127.0.0.1)")
    .option("--log-level <level>", "fatal|error|warn|info|debug|trace|silent (ENGINE_LOG_LEVEL, default info)")
    .option("--templates-dir <dir>", "extra app templates (ENGINE_TEMPLATES_DIR, default <data-dir>/templates)")
    .action(async (options: { port?: string; host?: string; logLevel?: string; templatesDir?: string }) => {
      const globals = program.opts<{ dataDir?: string }>();
      const config = resolveConfig({
        dataDir: globals.dataDir,
        port: options.port,
        host: options.host,
        logLevel: options.logLevel,
        templatesDir: options.templatesDir,
      });
      const daemon = await startDaemon(config);
      let stopping = false;
      const shutdown = async (signal: string) => {
        if (stopping) return;
        stopping = true;
        daemon.log.info({ signal }, "stopping");
        await daemon.stop();
        process.exit(0);
      };
      process.on("SIGINT", () => void shutdown("SIGINT"));
      process.on("SIGTERM", () => void shutdown("SIGTERM"));
    });
}
