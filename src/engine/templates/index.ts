import { existsSync, readdirSync, readFileSync } from "node:fs";
import { basename, join } from "node:path";
import { Value } from "@sinclair/typebox/value";
import { type AppTemplate, AppTemplate as AppTemplateSchema } from "../../contract/engine";
import { AppError } from "../../lib/errors";
import type { Logger } from "../../lib/logger";
import { toValidationDetail } from "../../lib/validation";

export { type TemplateRouteDeps, templateRoutes } from "./routes";

/** TemplateSource is one template file's name and text, read from disk or embedded in the binary. */
export interface TemplateSource {
  file: string;
  text: string;
}

/** TemplateProblem is a template file that was skipped, and why. */
export interface TemplateProblem {
  file: string;
  problem: string;
}

// build.ts defines this as the JSON of the repository's templates/ so the compiled binary carries them.
declare const __ENGINE_EMBEDDED_TEMPLATES__: string | undefined;

/** bundledTemplateSources returns the templates shipped with the engine: embedded in the binary, else read from templates/. */
export function bundledTemplateSources(): TemplateSource[] {
  if (typeof __ENGINE_EMBEDDED_TEMPLATES__ === "string") return JSON.parse(__ENGINE_EMBEDDED_TEMPLATES__) as TemplateSource[];
  return readTemplateDir(join(import.meta.dir, "..", "..", "..", "templates"));
}

/** readTemplateDir reads every `*.json` file of a directory; a missing directory has none. */
export function readTemplateDir(dir: string): TemplateSource[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir)
    .filter((name) => name.endsWith(".json"))
    .sort()
    .map((name) => ({ file: join(dir, name), text: readFileSync(join(dir, name), "utf8") }));
}

/** parseTemplate validates one template file against the AppTemplate schema. */
export function parseTemplate(source: TemplateSource): AppTemplate | TemplateProblem {
  let value: unknown;
  try {
    value = JSON.parse(source.text);
  } catch (error) {
    return { file: source.file, problem: `not valid JSON: ${(error as Error).message}` };
  }
  if (!Value.Check(AppTemplateSchema, value)) {
    const detail = toValidationDetail("template", [...Value.Errors(AppTemplateSchema, value)]);
    const first = detail.slice(0, 3).map((d) => `${d.loc.slice(1).join(".") || "(root)"}: ${d.msg}`);
    return { file: source.file, problem: first.join("; ") };
  }
  const template = value as AppTemplate;
  const expectedId = basename(source.file, ".json");
  if (template.id !== expectedId) {
    return { file: source.file, problem: `id ${JSON.stringify(template.id)} does not match the file name ${expectedId}.json` };
  }
  return template;
}

/**
 * TemplateCatalog is the store of app templates. Templates come from the engine's bundled set
 * and then from user directories; a later file with the same id replaces an earlier one, so a
 * user can override a bundled template. A broken file is reported and skipped, never fatal.
 */
export class TemplateCatalog {
  readonly #templates = new Map<string, AppTemplate>();
  readonly problems: TemplateProblem[] = [];

  constructor(sources: TemplateSource[], log?: Logger) {
    for (const source of sources) {
      const parsed = parseTemplate(source);
      if ("problem" in parsed) {
        this.problems.push(parsed);
        log?.warn({ file: parsed.file, problem: parsed.problem }, "skipped a broken app template");
        continue;
      }
      this.#templates.set(parsed.id, parsed);
    }
  }

  #listJson: string | undefined;

  list(): AppTemplate[] {
    return [...this.#templates.values()].sort((a, b) => a.id.localeCompare(b.id));
  }

  /** listJson is list() serialized once: the catalog does not change after start-up. */
  listJson(): string {
    this.#listJson ??= JSON.stringify(this.list());
    return this.#listJson;
  }

  get(id: string): AppTemplate {
    const template = this.#templates.get(id);
    if (!template) throw new AppError("template_not_found", `no app template with id ${JSON.stringify(id)}`);
    return template;
  }
}
