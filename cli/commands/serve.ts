import { existsSync, writeSync } from "node:fs";
import { join, resolve } from "node:path";
import type { Command } from "commander";
import { ADMIN_TOKEN_FILE } from "../../src/engine/auth/bootstrap";
import { defaultDataDir, resolveConfig } from "../../src/engine/config";
import type { RunningDaemon } from "../../src/engine/daemon";

/** SHOWN_NAMES bounds how many service names the stop line lists before "and N more". */
const SHOWN_NAMES = 8;

/**
 * say writes human lines on stderr, beside the JSON log on stdout (docs/decisions.md 185):
 * synchronously, so the last ones are out before the process exits.
 */
function say(lines: string[]): void {
  try {
    writeSync(2, lines.map((line) => `engine: ${line}\n`).join(""));
  } catch {
    // stderr gone (a closed terminal): the JSON log still says it.
  }
}

/** shellWord quotes a path for a command line when it needs quoting. */
function shellWord(text: string): string {
  return /^[\w@%+=:,./-]+$/.test(text) ? text : `'${text.replaceAll("'", `'\\''`)}'`;
}

/**
 * startupLines tell a person where the engine is and how to get in: the URL of the API and the
 * web UI, `engine ui` for a sign-in link, and where the admin token is (the path, never the token).
 */
export function startupLines(daemon: Pick<RunningDaemon, "config" | "browserUrl" | "socketPath">, apexUrl: string | null): string[] {
  const { config } = daemon;
  // The CLI finds the default data dir by itself; any other must be named to it.
  const isDefault = config.dataDir === resolve(defaultDataDir({ ...process.env, ENGINE_DATA_DIR: undefined }));
  const ui = isDefault ? "engine ui" : `engine --data-dir ${shellWord(config.dataDir)} ui`;
  const tokenFile = join(config.dataDir, ADMIN_TOKEN_FILE);
  const token = existsSync(tokenFile)
    ? `the admin token is in ${tokenFile}`
    : config.adminToken !== undefined
      ? "the admin token is the one set in ENGINE_ADMIN_TOKEN"
      : `there is no ${ADMIN_TOKEN_FILE} (an admin token exists); the CLI on this machine needs none`;
  return [
    `API and web UI at ${daemon.browserUrl}${apexUrl ? ` (and ${apexUrl} through the proxy)` : ""}; the local CLI uses ${daemon.socketPath}`,
    `sign in to the web UI with \`${ui}\` (a one-time link); ${token}`,
  ];
}

/** stopLines say what a stop left running and how to stop it all. */
export function stopLines(keptRunning: readonly string[]): string[] {
  if (keptRunning.length === 0) return ["stopped; no service was running"];
  const shown = keptRunning.slice(0, SHOWN_NAMES).join(", ");
  const more = keptRunning.length > SHOWN_NAMES ? ` and ${keptRunning.length - SHOWN_NAMES} more` : "";
  const count = keptRunning.length === 1 ? "1 service keeps" : `${keptRunning.length} services keep`;
  return [
    `stopped. ${count} running (${shown}${more}); the next \`engine serve\` adopts them`,
    "to stop them all, run `engine services stop --all` while the engine runs",
  ];
}

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
        // The daemon's modules load with `serve`, not with every other command (decision 515).
        const { startDaemon, takeSuccessorRole } = await import("../../src/engine/daemon");
        // A restart starts this process to take over from the running engine: the variables
        // that say so are read and removed first, so that no workload inherits them.
        const successor = takeSuccessorRole(process.env);
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
        const daemon = await startDaemon(config, { successor });
        let apexUrl: string | null = null;
        try {
          const apex = daemon.proxy.status().apex;
          apexUrl = apex.routed ? apex.url : null;
        } catch {
          // the proxy is still starting or off: the API's own URL is enough
        }
        // A stand-in serves for a moment while the engine's own pid restarts: it says nothing.
        if (!daemon.standin) say(startupLines(daemon, apexUrl));
        let stopping = false;
        const shutdown = async (signal: string) => {
          if (stopping) return;
          stopping = true;
          daemon.log.info({ signal }, "stopping");
          await daemon.stop();
          say(stopLines(daemon.keptRunning));
          process.exit(0);
        };
        process.on("SIGINT", () => void shutdown("SIGINT"));
        process.on("SIGTERM", () => void shutdown("SIGTERM"));
      },
    );
}
