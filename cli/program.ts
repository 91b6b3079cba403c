import { Command, CommanderError } from "commander";
import { STORE_MIGRATIONS } from "../src/engine/store";
import { isAppError } from "../src/lib/errors";
import { VERSION } from "../src/lib/version";
import { CliError, EngineClient } from "./client";
import { registerCompletion } from "./commands/completion";
import { registerDaemon } from "./commands/daemon";
import { registerInstall } from "./commands/install";
import { registerLink } from "./commands/link";
import { registerMcp } from "./commands/mcp";
import { registerRestore } from "./commands/restore";
import { registerServe } from "./commands/serve";
import { registerServices } from "./commands/services";
import { registerTemplates } from "./commands/templates";
import { registerTls } from "./commands/tls";
import { registerTokens } from "./commands/tokens";
import { registerTop } from "./commands/top";
import { registerUi } from "./commands/ui";
import { emit, hintHelpAfterError, type Output } from "./output";

/** buildProgram assembles the `engine` command line. */
export function buildProgram(): Command {
  const program = new Command("engine")
    .description("engine: a self-healing platform for one GPU workstation")
    .version(VERSION, "-V, --version-flag", "print the CLI version")
    .option("--json", "machine-readable JSON output")
    .option("--data-dir <dir>", "data directory (ENGINE_DATA_DIR, default ~/.local/share/engine; /var/lib/engine as root)")
    .option("--url <url>", "engine API base URL (ENGINE_URL); default: the local unix socket")
    .option("--token <token>", "bearer token (ENGINE_TOKEN); default: <data-dir>/admin.token")
    .exitOverride();

  const globals = () => program.opts<{ json?: boolean; dataDir?: string; url?: string; token?: string }>();
  const client = () => new EngineClient({ url: globals().url, token: globals().token, dataDir: globals().dataDir });
  const output = (): Output => ({ json: globals().json === true });

  registerServe(program);
  registerTokens(program, client, output);
  registerTemplates(program, client, output);
  registerServices(program, client, output);
  registerRestore(program, client, output);
  registerDaemon(program, client, output);
  registerTls(program, output);
  registerLink(program, output, { client });
  registerUi(program, client, output);
  registerMcp(program, client);
  registerTop(program, client, output);
  registerInstall(program, output);
  registerCompletion(program, client);

  program
    .command("version")
    .description("print the CLI version, the store schema it knows and, when reachable, the daemon's version")
    .option("--no-daemon", "leave the daemon out (what `engine upgrade` asks of a new binary)")
    .action(async (options: { daemon: boolean }) => {
      const daemon = options.daemon
        ? await client()
            .request<{ version: string; pid: number }>("GET", "/api/health")
            .catch(() => undefined)
        : undefined;
      // The store schema is the newest migration this binary knows; `engine upgrade` refuses a
      // binary that does not know every migration the data dir has (docs/decisions.md 365).
      const storeSchema = STORE_MIGRATIONS.at(-1) ?? "";
      const value = {
        cli: VERSION,
        ...(options.daemon ? { daemon: daemon?.version ?? null } : {}),
        store_schema: storeSchema,
        store_migrations: [...STORE_MIGRATIONS],
      };
      const daemonPart = !options.daemon ? "" : daemon ? ` (daemon ${daemon.version}, pid ${daemon.pid})` : " (daemon not reachable)";
      emit(output(), value, () => process.stdout.write(`engine ${VERSION}, store schema ${storeSchema}${daemonPart}\n`));
    });
  hintHelpAfterError(program, "engine");
  return program;
}

/** main runs the CLI; user errors print one line and exit non-zero, never a stack trace. */
export async function main(argv: string[]): Promise<number> {
  const program = buildProgram();
  try {
    await program.parseAsync(argv);
    return 0;
  } catch (error) {
    if (error instanceof CommanderError) return error.exitCode;
    if (error instanceof CliError || isAppError(error)) {
      const code = (error as { code: string }).code;
      process.stderr.write(`engine: ${error.message}${code && code !== "error" ? ` [${code}]` : ""}\n`);
      return 1;
    }
    process.stderr.write(`engine: unexpected error: ${(error as Error).message}\n`);
    return 1;
  }
}
