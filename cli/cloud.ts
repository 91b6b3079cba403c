#!/usr/bin/env bun
import { Command, CommanderError, Option } from "commander";
import { type Account, type AccountChanges, AccountStore, STANDINGS, type Standing } from "../src/cloud/accounts";
import { SessionStore } from "../src/cloud/auth/sessions";
import { CLOUD_ROLES, type CloudConfig, resolveCloudConfig } from "../src/cloud/config";
import { Database } from "../src/cloud/db";
import { startCloud } from "../src/cloud/server";
import { AppError, isAppError } from "../src/lib/errors";
import { VERSION } from "../src/lib/version";
import { registerManaged } from "./commands/managed";
import { hintHelpAfterError } from "./output";

/** serving is set once `serve` has started the console, which then runs until a signal. */
let serving = false;

interface Globals {
  dataDir?: string;
  databaseUrl?: string;
  json?: boolean;
}

/** withDatabase opens and migrates the configured database for an operator command, and closes it. */
async function withDatabase<T>(globals: Globals, fn: (db: Database, config: CloudConfig) => Promise<T>): Promise<T> {
  const config = resolveCloudConfig({ dataDir: globals.dataDir, databaseUrl: globals.databaseUrl });
  const db = await Database.open(config.databaseUrl);
  try {
    await db.migrate();
    return await fn(db, config);
  } finally {
    await db.close();
  }
}

function accountLine(account: Account): string {
  const flags = [account.paid ? "paid" : "unpaid", account.remoteLink ? "remote-link" : "no-remote-link"];
  return `${account.id}  ${account.email}  ${account.standing}  ${flags.join(" ")}  node-limit ${account.nodeLimit}  trials ${account.trialsLeft}`;
}

function print(globals: Globals, value: unknown, human: string): void {
  process.stdout.write(globals.json ? `${JSON.stringify(value, null, 2)}\n` : `${human}\n`);
}

const onOff = (raw: string): boolean => {
  if (["on", "yes", "true", "1"].includes(raw)) return true;
  if (["off", "no", "false", "0"].includes(raw)) return false;
  throw new AppError("invalid_request", `expected on or off, got ${JSON.stringify(raw)}`);
};
const integer = (raw: string): number => {
  if (!/^\d+$/.test(raw)) throw new AppError("invalid_request", `expected a whole number, got ${JSON.stringify(raw)}`);
  return Number(raw);
};

function accountOptions(command: Command): Command {
  return command
    .option("--name <name>", "display name")
    .addOption(new Option("--standing <standing>", "account standing").choices(STANDINGS as string[]))
    .option("--remote-link <on|off>", "the remote-link entitlement (assistant flows)")
    .option("--paid <on|off>", "whether the account pays (full hosted machine rather than a trial)")
    .option("--node-limit <n>", "how many machines the account may link")
    .option("--trials <n>", "hosted-machine trials left");
}

function changesFrom(options: Record<string, string | undefined>): AccountChanges {
  return {
    name: options.name,
    standing: options.standing as Standing | undefined,
    remoteLink: options.remoteLink === undefined ? undefined : onOff(options.remoteLink),
    paid: options.paid === undefined ? undefined : onOff(options.paid),
    nodeLimit: options.nodeLimit === undefined ? undefined : integer(options.nodeLimit),
    trialsLeft: options.trials === undefined ? undefined : integer(options.trials),
  };
}

/** buildCloudProgram assembles the `engine-cloud` command line. */
export function buildCloudProgram(): Command {
  const program = new Command("engine-cloud")
    .description("engine-cloud: the cloud console API (sign-in, machine linking, keys, approvals, hosted machines)")
    .version(VERSION, "-V, --version", "print the version")
    .option("--data-dir <dir>", "data directory (ENGINE_CLOUD_DATA_DIR, default ~/.local/share/engine-cloud)")
    .option("--database-url <url>", "sqlite://<file> or postgres://... (DATABASE_URL, default sqlite in the data dir)")
    .option("--json", "machine-readable JSON output")
    .exitOverride();
  const globals = () => program.opts<Globals>();

  program
    .command("serve", { isDefault: true })
    .description("run the console in the foreground")
    .option("--port <port>", "TCP port (ENGINE_CLOUD_PORT, default 8787; 0 picks a free one)")
    .option("--host <host>", "address to listen on (ENGINE_CLOUD_HOST, default 127.0.0.1)")
    .addOption(new Option("--role <role>", "which modules run (ENGINE_CLOUD_ROLE, default all)").choices(CLOUD_ROLES as string[]))
    .option("--public-url <url>", "where browsers and machines reach the console (ENGINE_CLOUD_PUBLIC_URL)")
    .option("--log-level <level>", "fatal|error|warn|info|debug|trace|silent (ENGINE_CLOUD_LOG_LEVEL, default info)")
    .action(async (options: { port?: string; host?: string; role?: string; publicUrl?: string; logLevel?: string }) => {
      const config = resolveCloudConfig({
        dataDir: globals().dataDir,
        databaseUrl: globals().databaseUrl,
        port: options.port,
        host: options.host,
        role: options.role,
        publicUrl: options.publicUrl,
        logLevel: options.logLevel,
      });
      const cloud = await startCloud(config);
      serving = true;
      let stopping = false;
      const shutdown = async () => {
        if (stopping) return;
        stopping = true;
        await cloud.stop();
        process.exit(0);
      };
      process.on("SIGINT", () => void shutdown());
      process.on("SIGTERM", () => void shutdown());
    });

  const accounts = program.command("accounts").description("manage accounts (operators)");
  accountOptions(accounts.command("add <email>").description("create an account")).action(
    async (email: string, options: Record<string, string | undefined>) => {
      const account = await withDatabase(globals(), (db) => new AccountStore(db).add(email, changesFrom(options)));
      print(globals(), account, accountLine(account));
    },
  );
  accountOptions(accounts.command("set <email>").description("change an account's standing, entitlement, payment or limits")).action(
    async (email: string, options: Record<string, string | undefined>) => {
      const account = await withDatabase(globals(), async (db) => {
        const store = new AccountStore(db);
        const found = await store.byEmail(email);
        if (!found) throw new AppError("account_not_found", `no account for ${email}`);
        return store.set(found.id, changesFrom(options));
      });
      print(globals(), account, accountLine(account));
    },
  );
  accounts
    .command("list")
    .description("list accounts")
    .action(async () => {
      const list = await withDatabase(globals(), (db) => new AccountStore(db).list());
      print(globals(), list, list.map(accountLine).join("\n") || "no accounts");
    });

  program
    .command("sessions")
    .description("manage console sessions (operators)")
    .command("mint")
    .description("mint a session token for an account (automation and tests); the token is the last line")
    .requiredOption("--email <email>", "the account's email")
    .option("--create", "create the account if it does not exist")
    .action(async (options: { email: string; create?: boolean }) => {
      const minted = await withDatabase(globals(), async (db, config) => {
        const store = new AccountStore(db);
        const account = (await store.byEmail(options.email)) ?? (options.create ? await store.add(options.email) : null);
        if (!account) throw new AppError("account_not_found", `no account for ${options.email} (add it, or pass --create)`);
        const sessions = new SessionStore(db, { idleMs: config.sessionIdleMs, absoluteMs: config.sessionAbsoluteMs });
        const { token, session } = await sessions.mint(account.id, "minted");
        return { token, session, account };
      });
      if (globals().json) print(globals(), { token: minted.token, session_id: minted.session.id, account_id: minted.account.id }, "");
      else {
        process.stderr.write(
          `session ${minted.session.id} for ${minted.account.email}, until ${new Date(minted.session.expiresAt).toISOString()}\n`,
        );
        process.stdout.write(`${minted.token}\n`);
      }
    });
  registerManaged(program, {
    withDatabase: (fn) => withDatabase(globals(), fn),
    print: (value, human) => print(globals(), value, human),
  });
  hintHelpAfterError(program, "engine-cloud");
  return program;
}

/** mainCloud runs the CLI; user errors print one line and exit non-zero, never a stack trace. */
export async function mainCloud(argv: string[]): Promise<number> {
  try {
    await buildCloudProgram().parseAsync(argv);
    return 0;
  } catch (error) {
    if (error instanceof CommanderError) return error.exitCode;
    if (isAppError(error)) {
      process.stderr.write(`engine-cloud: ${error.message} [${error.code}]\n`);
      return 1;
    }
    process.stderr.write(`engine-cloud: unexpected error: ${(error as Error).message}\n`);
    return 1;
  }
}

if (import.meta.main) {
  const code = await mainCloud(process.argv);
  // `serve` keeps running on its own; every other command ends here.
  if (code !== 0 || !serving) process.exit(code);
}
