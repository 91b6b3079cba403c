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
    .option("--https-port <port>", "the proxy's HTTPS port (ENGINE_HTTPS_PORT; default 443 when permitted, else 8443)")
    .option("--http-port <port>", "the proxy's HTTP port: redirects and ACME (ENGINE_HTTP_PORT; default 80 when permitted, else 8080)")
    .option("--no-proxy", "run without the reverse proxy (ENGINE_PROXY=off)")
    .action(
      async (options: {
        port?: string;
        host?: string;
        logLevel?: string;
        templatesDir?: string;
        httpsPort?: string;
        httpPort?: string;
        proxy?: boolean;
      }) => {
        const globals = program.opts<{ dataDir?: string }>();
        const config = resolveConfig({
          dataDir: globals.dataDir,
          port: options.port,
          host: options.host,
          logLevel: options.logLevel,
          templatesDir: options.templatesDir,
          httpsPort: options.httpsPort,
          httpPort: options.httpPort,
          proxy: options.proxy === false ? false : undefined,
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
      },
    );
}
