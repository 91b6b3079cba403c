import type { Command } from "commander";
import type { AppTemplate } from "../../src/contract/engine";
import type { EngineClient } from "../client";
import { emit, type Output, printPairs, printTable } from "../output";

export function registerTemplates(program: Command, client: () => EngineClient, output: () => Output): void {
  const templates = program.command("templates").description("browse app templates");

  templates
    .command("list")
    .description("list app templates")
    .action(async () => {
      const list = await client().request<AppTemplate[]>("GET", "/api/app-templates");
      emit(output(), list, () =>
        printTable(
          ["id", "name", "category", "gpus", "port", "ref"],
          list.map((t) => [t.id, t.name, t.category, t.deploy_defaults.gpus, t.deploy_defaults.port, t.ref]),
        ),
      );
    });

  templates
    .command("show <id>")
    .description("show one app template")
    .action(async (id: string) => {
      const template = await client().request<AppTemplate>("GET", `/api/app-templates/${encodeURIComponent(id)}`);
      emit(output(), template, () => {
        const env = template.env_schema.map((e) => `${e.name}${e.required ? " (required)" : ""}${e.secret ? " (secret)" : ""}`);
        const rows: [string, string][] = [
          ["id", template.id],
          ["name", `${template.icon} ${template.name}`],
          ["category", template.category],
          ["repo", `${template.repo_url} @ ${template.ref}${template.subdir ? ` (${template.subdir})` : ""}`],
          ["start", template.deploy_defaults.start],
          ["port", String(template.deploy_defaults.port)],
          ["gpus", String(template.deploy_defaults.gpus)],
          ["health", template.deploy_defaults.health || "-"],
          ["env", env.join(", ") || "-"],
          ["hint", template.ai_hint],
        ];
        printPairs(rows);
      });
    });
}
