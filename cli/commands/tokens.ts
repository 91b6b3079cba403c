import type { Command } from "commander";
import type { CreatedToken, Token } from "../../src/contract/engine";
import { CliError, type EngineClient } from "../client";
import { emit, type Output, printTable } from "../output";

function parseDuration(text: string): number {
  const match = /^(\d+)([smhdw])$/.exec(text);
  if (!match) throw new CliError(`--expires-in takes a number and a unit s, m, h, d or w (got ${JSON.stringify(text)})`);
  const unit = { s: 1, m: 60, h: 3600, d: 86400, w: 604800 }[match[2] as "s" | "m" | "h" | "d" | "w"];
  return Number(match[1]) * unit * 1000;
}

function integerOption(name: string, text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  if (!/^\d+$/.test(text)) throw new CliError(`${name} takes a whole number (got ${JSON.stringify(text)})`);
  return Number(text);
}

export function registerTokens(program: Command, client: () => EngineClient, output: () => Output): void {
  const tokens = program.command("tokens").description("manage access tokens");

  tokens
    .command("list")
    .description("list tokens")
    .action(async () => {
      const list = await client().request<Token[]>("GET", "/api/tokens");
      emit(output(), list, () =>
        printTable(
          ["id", "name", "role", "state", "max_gpus", "max_jobs", "scope", "expires_at", "last_used_at"],
          list.map((t) => [
            t.id,
            t.name,
            t.role,
            t.revoked ? "revoked" : t.expires_at && Date.parse(t.expires_at) <= Date.now() ? "expired" : "active",
            t.max_gpus,
            t.max_concurrent_jobs,
            t.scope_services.join(","),
            t.expires_at,
            t.last_used_at,
          ]),
        ),
      );
    });

  tokens
    .command("create <name>")
    .description("create a token and print its secret once")
    .option("--role <role>", "admin | submitter | readonly", "readonly")
    .option("--max-gpus <n>", "GPUs the token's services may hold at once")
    .option("--max-concurrent-jobs <n>", "services the token may run at once")
    .option("--scope <services>", "comma-separated service names the token may touch")
    .option("--expires-in <duration>", "lifetime such as 12h, 30d or 4w")
    .option("--expires-at <date-time>", "expiry as an RFC 3339 date-time")
    .action(async (name: string, options: Record<string, string | undefined>) => {
      if (options.expiresIn && options.expiresAt) throw new CliError("give --expires-in or --expires-at, not both");
      const body = {
        name,
        role: options.role,
        max_gpus: integerOption("--max-gpus", options.maxGpus),
        max_concurrent_jobs: integerOption("--max-concurrent-jobs", options.maxConcurrentJobs),
        scope_services: options.scope
          ? options.scope
              .split(",")
              .map((s) => s.trim())
              .filter(Boolean)
          : undefined,
        expires_at: options.expiresIn ? new Date(Date.now() + parseDuration(options.expiresIn)).toISOString() : options.expiresAt,
      };
      const created = await client().request<CreatedToken>("POST", "/api/tokens", body);
      emit(output(), created, () => {
        process.stdout.write(`created ${created.role} token ${created.name} (${created.id})\n`);
        process.stdout.write(`secret (shown once, store it now): ${created.token}\n`);
      });
    });

  tokens
    .command("revoke <id-or-name>")
    .description("revoke a token by id or by name")
    .action(async (ident: string) => {
      const api = client();
      let id = ident;
      if (!ident.startsWith("tok_")) {
        const match = (await api.request<Token[]>("GET", "/api/tokens")).find((t) => t.name === ident && !t.revoked);
        if (!match) throw new CliError(`no active token named ${JSON.stringify(ident)}`, "token_not_found");
        id = match.id;
      }
      const revoked = await api.request<Token>("DELETE", `/api/tokens/${encodeURIComponent(id)}`);
      emit(output(), revoked, () => process.stdout.write(`revoked ${revoked.name} (${revoked.id})\n`));
    });
}
