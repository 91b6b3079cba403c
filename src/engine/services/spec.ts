import { accessSync, constants, existsSync, statSync } from "node:fs";
import { isAbsolute, join } from "node:path";
import type { ServiceDeploy, ServiceKind, ServicePatch } from "../../contract/engine";
import { AppError } from "../../lib/errors";
import { SHELL_SYNTAX, SHELL_WORDS, shellCommand } from "../../lib/shell";
import { InputError, type ValidationDetail } from "../../lib/validation";
import type { BuildSpec } from "../builds";
import type { DatabaseEngineName } from "../databases";
import { type HealthSpec, parseHealthShorthand, SHORTHAND_DEFAULTS } from "../health";
import type { TemplateCatalog } from "../templates";
import { defaultRestartPolicy, type RestartPolicy } from "./restart-policy";

/** ServiceSpec is one version of a service, normalized: every default applied, secrets split off. */
export interface ServiceSpec {
  name: string;
  kind: ServiceKind;
  command: string[];
  template_id: string | null;
  cwd: string | null;
  env: Record<string, string>;
  secret_keys: string[];
  gpus: number;
  gpu_memory_mb: number;
  memory_mb: number | null;
  port: number | null;
  priority: number;
  stop_timeout_s: number;
  restart: RestartPolicy;
  health: HealthSpec | null;
  build: BuildSpec | null;
  bindings: string[];
  /**
   * database names the adapter that manages a database service (its start, readiness, clean
   * stop, credentials and restores); null (or absent, in versions written before it existed)
   * for services that run their own command.
   */
  database?: { engine: DatabaseEngineName } | null;
  /**
   * user is the OS user an admin chose for the workload (checked to exist at deploy); null or
   * absent: the service's own user when the engine runs as root, else the engine's user.
   */
  user?: string | null;
}

export const DEFAULT_STOP_TIMEOUT_S = 10;

/**
 * defaultStartPeriod is a probe's start period when neither the deploy nor its template sets
 * one: 10 s covers a server binding its port, 600 s a model server loading weights.
 */
export function defaultStartPeriod(kind: ServiceKind): number {
  return kind === "model" ? 600 : 10;
}

type Detail = Omit<ValidationDetail, "ctx"> & { ctx?: Record<string, unknown> };

function detail(loc: (string | number)[], msg: string, type: string, input: unknown): Detail {
  return { loc: ["body", ...loc], msg, type, input };
}

function kindOfCategory(category: string): ServiceKind {
  return category === "model" || category === "database" || category === "batch" ? category : "service";
}

/**
 * normalizeDeploy turns a deploy request (and the template it names) into a ServiceSpec and
 * the secrets, or throws: `template_not_found`, or 422 naming every bad field at once.
 */
export function normalizeDeploy(body: ServiceDeploy, templates: TemplateCatalog): { spec: ServiceSpec; secrets: Record<string, string> } {
  const problems: Detail[] = [];
  const template = body.template_id ? templates.get(body.template_id) : null;
  if (body.template_id && !template) {
    throw new AppError("template_not_found", `no app template with id ${JSON.stringify(body.template_id)}`);
  }
  const env: Record<string, string> = { ...(body.env ?? {}) };
  const secrets: Record<string, string> = { ...(body.secrets ?? {}) };
  const engine = body.engine ?? template?.deploy_defaults.engine ?? null;
  if (template) {
    for (const entry of template.env_schema) {
      // A secret the template declares is kept as a secret even when sent in `env`.
      if (entry.secret && entry.name in env) {
        secrets[entry.name] = env[entry.name] as string;
        delete env[entry.name];
      }
      // A managed database generates its credentials: a template's required secrets may be left out.
      if (entry.required && !(entry.name in env) && !(entry.name in secrets) && !(engine && entry.secret)) {
        problems.push(detail(["env", entry.name], `template ${template.id} requires ${entry.name}`, "missing", null));
      }
    }
  }
  for (const key of Object.keys(secrets)) delete env[key];

  let command: string[] = [];
  if (engine) {
    // The adapter provides the command when the service launches (it depends on the host's tools).
    if (body.command !== undefined) {
      problems.push(
        detail(["command"], `a ${engine} database runs the engine's own command: leave out command`, "value_error", body.command),
      );
    }
    if (body.build) problems.push(detail(["build"], `a ${engine} database is not built from a repository`, "value_error", body.build));
    if (body.user !== undefined) {
      problems.push(
        detail(["user"], `a ${engine} database runs as the user its adapter chooses: leave out user`, "value_error", body.user),
      );
    }
  } else if (body.command !== undefined) command = typeof body.command === "string" ? shellCommand(body.command) : body.command;
  else if (template) command = shellCommand(template.deploy_defaults.start);
  else problems.push(detail(["command"], "give a command (string or argv), a template_id or a database engine", "missing", null));

  if (engine && body.kind !== undefined && body.kind !== "database") {
    problems.push(detail(["kind"], `a ${engine} database is a service of kind database`, "value_error", body.kind));
  }
  const kind: ServiceKind = engine ? "database" : (body.kind ?? (template ? kindOfCategory(template.category) : "service"));
  const gpus = body.gpus ?? (template && body.gpu_memory_mb === undefined ? template.deploy_defaults.gpus : 0);
  const gpuMemory = body.gpu_memory_mb ?? 0;
  if (gpus > 0 && gpuMemory > 0) {
    problems.push(
      detail(["gpu_memory_mb"], "ask for whole GPUs (gpus) or a share of one GPU (gpu_memory_mb), not both", "value_error", gpuMemory),
    );
  }
  // A managed database gets a free port at deploy unless one is given (the manager picks it).
  const port = body.port ?? (template && template.deploy_defaults.port > 0 && !engine ? template.deploy_defaults.port : null);

  // A managed database is running only once its adapter's readiness check passed: no probe by default.
  const templateHealth = template && !engine ? parseHealthShorthand(template.deploy_defaults.health, null) : null;
  let health: HealthSpec | null = body.health === undefined ? templateHealth : null;
  if (body.health?.type) health = { ...SHORTHAND_DEFAULTS, ...body.health, type: body.health.type };
  else if (body.health && templateHealth) health = { ...templateHealth, ...body.health, type: templateHealth.type };
  else if (body.health) {
    const why = template ? `template ${template.id} has no probe to change` : "no template gives one";
    problems.push(detail(["health", "type"], `give the probe's type (http, tcp or exec): ${why}`, "missing", null));
  }
  if (health && health.start_period_s === undefined) {
    health.start_period_s = template?.deploy_defaults.health_start_period_s ?? defaultStartPeriod(kind);
  }
  if (health && (health.type === "http" || health.type === "tcp") && !health.port && !port) {
    problems.push(
      detail(
        ["health", "port"],
        `a ${health.type} health check needs a port to probe: give the service its port (or the check one of its own)`,
        "missing",
        null,
      ),
    );
  }
  if (health?.type === "exec" && !health.command) {
    problems.push(detail(["health", "command"], "an exec probe needs a command", "missing", null));
  }
  if (body.build?.subdir && (isAbsolute(body.build.subdir) || body.build.subdir.split("/").includes(".."))) {
    problems.push(detail(["build", "subdir"], "subdir must be a relative path inside the repository", "value_error", body.build.subdir));
  }
  if (body.bindings?.includes(body.name)) {
    problems.push(detail(["bindings"], "a service cannot bind to itself", "value_error", body.bindings));
  }
  if (body.cwd !== undefined && !body.build) {
    if (!existsSync(body.cwd) || !statSync(body.cwd).isDirectory()) {
      problems.push(detail(["cwd"], `${body.cwd} is not a directory on this host`, "value_error", body.cwd));
    }
  }
  if (problems.length > 0) throw new InputError(problems);

  const spec: ServiceSpec = {
    name: body.name,
    kind,
    command,
    template_id: template?.id ?? null,
    cwd: body.cwd ?? null,
    env,
    secret_keys: Object.keys(secrets).sort(),
    gpus,
    gpu_memory_mb: gpuMemory,
    memory_mb: body.memory_mb ?? null,
    port,
    priority: body.priority ?? 0,
    stop_timeout_s: body.stop_timeout_s ?? DEFAULT_STOP_TIMEOUT_S,
    restart: { ...defaultRestartPolicy(kind), ...(body.restart ?? {}) },
    health,
    build: body.build ?? null,
    bindings: body.bindings ?? [],
    database: engine ? { engine } : null,
    user: body.user ?? null,
  };
  if (!spec.build && !engine) assertCommandExists(spec.command, spec.cwd, env.PATH ?? process.env.PATH ?? "");
  return { spec, secrets };
}

/**
 * deployOf is the deploy request that makes `spec` again: every setting spelled out, so that
 * no default (the template's included) is applied a second time. It is the base a patch is
 * merged into (decision 180). Secrets are given back in `secrets`, opened by the caller.
 */
export function deployOf(spec: ServiceSpec, secrets: Record<string, string>): ServiceDeploy {
  const engine = spec.database?.engine;
  const body: ServiceDeploy = {
    name: spec.name,
    kind: spec.kind,
    // A managed database's command is its adapter's, chosen again at every deploy.
    command: engine ? undefined : spec.command,
    template_id: spec.template_id ?? undefined,
    cwd: spec.cwd ?? undefined,
    env: { ...spec.env },
    secrets: { ...secrets },
    gpus: spec.gpus,
    gpu_memory_mb: spec.gpu_memory_mb > 0 ? spec.gpu_memory_mb : undefined,
    memory_mb: spec.memory_mb ?? undefined,
    port: spec.port ?? undefined,
    priority: spec.priority,
    stop_timeout_s: spec.stop_timeout_s,
    restart: { ...spec.restart },
    // null, not left out: a template's probe must not come back for a service deployed without one.
    health: spec.health ? { ...spec.health } : null,
    build: spec.build ? { ...spec.build } : undefined,
    bindings: [...spec.bindings],
    engine,
    user: spec.user ?? undefined,
  };
  return body;
}

/**
 * applyPatch merges a patch into a deploy request, field by field (decision 180): a field the
 * patch leaves out keeps its value, null resets it to the deploy's default, `env`, `secrets`
 * and `restart` merge key by key (a key set to null is removed), a probe without its type
 * changes the current probe's fields, and the rest is replaced.
 * Whole GPUs and a share of one are alternatives: asking for one drops the other.
 */
export function applyPatch(base: ServiceDeploy, patch: ServicePatch): ServiceDeploy {
  const next: ServiceDeploy = { ...base };
  const set = <K extends keyof ServicePatch & keyof ServiceDeploy>(key: K) => {
    if (!(key in patch) || patch[key] === undefined) return;
    const value = patch[key];
    if (value === null) delete next[key];
    else (next as Record<string, unknown>)[key] = value;
  };
  for (const key of [
    "command",
    "cwd",
    "gpus",
    "gpu_memory_mb",
    "memory_mb",
    "port",
    "priority",
    "stop_timeout_s",
    "bindings",
    "user",
  ] as const) {
    set(key);
  }
  // A probe without its type changes the service's own probe (only start_period_s, say).
  if (patch.health !== undefined)
    next.health = patch.health && !patch.health.type && base.health ? { ...base.health, ...patch.health } : patch.health;
  if (patch.build !== undefined) {
    if (patch.build === null) delete next.build;
    else next.build = patch.build;
  }
  if (patch.restart !== undefined) next.restart = patch.restart === null ? undefined : { ...(base.restart ?? {}), ...patch.restart };
  for (const key of ["env", "secrets"] as const) {
    const changes = patch[key];
    if (changes === undefined) continue;
    const merged: Record<string, string> = changes === null ? {} : { ...(base[key] ?? {}) };
    for (const [name, value] of Object.entries(changes ?? {})) {
      if (value === null) delete merged[name];
      else merged[name] = value;
    }
    next[key] = merged;
  }
  if (typeof patch.gpus === "number" && patch.gpus > 0 && patch.gpu_memory_mb === undefined) delete next.gpu_memory_mb;
  if (typeof patch.gpu_memory_mb === "number" && patch.gpus === undefined) delete next.gpus;
  for (const key of Object.keys(next) as (keyof ServiceDeploy)[]) if (next[key] === undefined) delete next[key];
  return next;
}

/**
 * assertCommandExists refuses a deploy whose program cannot be found, so that a typo is a
 * clear 422 rather than a crash loop. For `sh -c` strings it checks the first word when the
 * string is a plain command; a string with shell syntax is the shell's to judge at run time.
 */
export function assertCommandExists(argv: string[], cwd: string | null, path: string): void {
  let program = argv[0] ?? "";
  if (argv.length === 3 && argv[0] === "/bin/sh" && argv[1] === "-c") {
    const text = (argv[2] ?? "").trim();
    const first = text.split(/\s+/)[0] ?? "";
    if (first === "" || SHELL_SYNTAX.test(first) || NOT_A_PROGRAM.has(first)) return;
    program = first;
  }
  if (program.includes("/")) {
    const full = isAbsolute(program) ? program : join(cwd ?? process.cwd(), program);
    if (existsSync(full)) return;
    throw new InputError([detail(["command"], `the command ${program} does not exist (looked for ${full})`, "command_not_found", program)]);
  }
  if (onPath(program, path, cwd)) return;
  throw new InputError([detail(["command"], `the command ${program} is not on the PATH of this host`, "command_not_found", program)]);
}

/** FOUND_ON_PATH remembers where a program was found on a PATH (and cwd, for relative entries); bounded. */
const FOUND_ON_PATH = new Map<string, string>();
const FOUND_ON_PATH_LIMIT = 256;

/**
 * onPath says whether `program` is an executable on `path`. Where it was found before on the same
 * PATH, the file still being there and executable answers it with one system call: a flood of
 * jobs running the same program walked every PATH entry for each deploy. A file that went is
 * looked for again, so a program moved elsewhere on the PATH is still found.
 */
function onPath(program: string, path: string, cwd: string | null): boolean {
  const key = `${path}\0${cwd ?? ""}\0${program}`;
  const known = FOUND_ON_PATH.get(key);
  if (known !== undefined) {
    try {
      accessSync(known, constants.X_OK);
      return true;
    } catch {
      FOUND_ON_PATH.delete(key);
    }
  }
  const found = Bun.which(program, { PATH: path, cwd: cwd ?? undefined });
  if (!found) return false;
  if (FOUND_ON_PATH.size >= FOUND_ON_PATH_LIMIT) FOUND_ON_PATH.clear();
  FOUND_ON_PATH.set(key, found);
  return true;
}

/** NOT_A_PROGRAM are the shell's words, and wrappers whose program is a later word: a deploy does not look for them on the PATH. */
const NOT_A_PROGRAM = new Set([...SHELL_WORDS, "env", "nohup", "sleep"]);
