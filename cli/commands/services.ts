import type { Command } from "commander";
import type {
  Diagnosis,
  GpuInventoryRecord,
  LogLine,
  ProxyStatus,
  RevealedConnection,
  ServiceDeploy,
  ServicePatch,
  ServiceRecord,
} from "../../src/contract/engine";
import { SERVICE_STATUSES } from "../../src/contract/engine";
import { CliError, type EngineClient } from "../client";
import { emit, formatPairs, type Output, printPairs, printTable } from "../output";

const KINDS = ["batch", "service", "model", "database"] as const;
const RESTART_POLICIES = ["always", "on-failure", "never"] as const;
const DATABASE_ENGINES = ["postgres", "mariadb", "redis", "sqlite"] as const;
const ACTIONS = {
  start: "start a stopped, failed or completed service",
  restart: "stop and start a service",
  pause: "freeze a service's processes (SIGSTOP)",
  resume: "continue a paused service (SIGCONT)",
} as const;
/**
 * SETTLED_STATUSES hold no process and start none by themselves: `stop --all` leaves them as
 * they are (a stop would turn a completed batch job into a cancelled one).
 */
const SETTLED_STATUSES = new Set(["stopped", "completed", "failed", "cancelled"]);
/** WAIT_DEFAULT_S is how long `services wait` waits without --timeout; MAX_WAIT_S is the most one blocking read waits. */
const WAIT_DEFAULT_S = 300;
const MAX_WAIT_S = 300;
/** DIAGNOSIS_LOG_LINES is how many of the diagnosis's log lines the human report shows. */
const DIAGNOSIS_LOG_LINES = 20;

function servicePath(ident: string, rest = ""): string {
  return `/api/services/${encodeURIComponent(ident)}${rest}`;
}

function wholeNumber(name: string, text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  if (!/^\d+$/.test(text)) throw new CliError(`${name} takes a whole number (got ${JSON.stringify(text)})`);
  return Number(text);
}

function oneOf<T extends string>(name: string, text: string | undefined, allowed: readonly T[]): T | undefined {
  if (text === undefined) return undefined;
  if (!(allowed as readonly string[]).includes(text)) {
    throw new CliError(`${name} takes ${allowed.slice(0, -1).join(", ")} or ${allowed.at(-1)} (got ${JSON.stringify(text)})`);
  }
  return text as T;
}

/**
 * waitForStatus watches a service with blocking reads (decision 503) until it has `wanted` and
 * answers its record; it throws when the service settles in another status (it will not get
 * there by itself) or once `timeoutS` has passed.
 */
async function waitForStatus(api: EngineClient, ident: string, wanted: string, timeoutS: number): Promise<ServiceRecord> {
  const deadline = Date.now() + timeoutS * 1000;
  let read = await api.requestWithHeaders<ServiceRecord>("GET", servicePath(ident));
  for (;;) {
    const record = read.body;
    if (record.status === wanted) return record;
    const said = statusLine(record);
    if (SETTLED_STATUSES.has(record.status)) throw new CliError(`${said}; it will not be ${wanted} by itself`, "not_reached");
    const leftS = Math.ceil((deadline - Date.now()) / 1000);
    const index = read.headers.get("x-engine-index");
    if (leftS <= 0 || !index) throw new CliError(`${said}; not ${wanted} after ${timeoutS} s`, "timeout");
    read = await api.requestWithHeaders<ServiceRecord>(
      "GET",
      servicePath(ident, `?index=${encodeURIComponent(index)}&wait=${Math.min(leftS, MAX_WAIT_S)}`),
    );
  }
}

/** statusText is `status — message`; statusLine is the same after the service's name, as the control commands print a service. */
function statusText(record: ServiceRecord): string {
  return `${record.status}${record.status_message ? ` — ${record.status_message}` : ""}`;
}

function statusLine(record: ServiceRecord): string {
  return `${record.name}: ${statusText(record)}`;
}

/** waitSeconds reads `--wait [seconds]`: given bare, the default wait. */
function waitSeconds(value: string | boolean | undefined): number | null {
  if (value === undefined || value === false) return null;
  const seconds = value === true ? WAIT_DEFAULT_S : (wholeNumber("--wait", value) as number);
  if (seconds < 1) throw new CliError("--wait takes at least 1 second");
  return seconds;
}

/** collect lets an option be given many times; commander hands each value to it in turn. */
function collect(value: string, previous: string[] = []): string[] {
  return [...previous, value];
}

/** keyValues turns repeated `K=V` options into a map; the value may itself contain "=". */
function keyValues(name: string, pairs: string[] | undefined): Record<string, string> | undefined {
  if (!pairs || pairs.length === 0) return undefined;
  const map: Record<string, string> = {};
  for (const pair of pairs) {
    const equals = pair.indexOf("=");
    if (equals <= 0) throw new CliError(`${name} takes KEY=VALUE (got ${JSON.stringify(pair)})`);
    map[pair.slice(0, equals)] = pair.slice(equals + 1);
  }
  return map;
}

/**
 * parseHealth reads the --health shorthand: `http:/path` (or `http:PORT/path`, or `http` for
 * "/"), `tcp` (or `tcp:PORT`), `exec:COMMAND` (run by /bin/sh), or `none` for no health check.
 */
export function parseHealth(text: string | undefined): ServiceDeploy["health"] {
  if (text === undefined) return undefined;
  if (text === "none") return null;
  const colon = text.indexOf(":");
  const type = colon < 0 ? text : text.slice(0, colon);
  const rest = colon < 0 ? "" : text.slice(colon + 1);
  const bad = () =>
    new CliError(`--health takes http:/path, http:PORT/path, tcp, tcp:PORT, exec:COMMAND or none (got ${JSON.stringify(text)})`);
  if (type === "exec") {
    if (rest.trim() === "") throw bad();
    return { type: "exec", command: rest };
  }
  if (type === "tcp") {
    if (rest === "") return { type: "tcp" };
    if (!/^\d+$/.test(rest)) throw bad();
    return { type: "tcp", port: Number(rest) };
  }
  if (type === "http") {
    const match = /^(\d+)?(\/.*)?$/.exec(rest);
    if (!match) throw bad();
    return { type: "http", path: match[2] ?? "/", ...(match[1] ? { port: Number(match[1]) } : {}) };
  }
  throw bad();
}

interface DeployOptions {
  kind?: string;
  template?: string;
  command?: string;
  env?: string[];
  secret?: string[];
  gpus?: string;
  gpuMemoryMb?: string;
  memoryMb?: string;
  port?: string;
  priority?: string;
  restart?: string;
  maxRestarts?: string;
  windowSeconds?: string;
  backoffS?: string;
  health?: string;
  healthStartPeriod?: string;
  cwd?: string;
  bind?: string[];
  repo?: string;
  ref?: string;
  subdir?: string;
  build?: string;
  engine?: string;
  user?: string;
}

/**
 * SettingOption is one flag of `services deploy` and `services update`: its commander flags
 * and help, whether it may be given many times, the API field it sets (so an error about
 * that field names the flag), and for `update` whether `--clear` may reset it.
 */
interface SettingOption {
  flags: string;
  description: string;
  repeatable?: boolean;
  /** field is the path of the request body's field the flag sets ("memory_mb", "restart.policy"). */
  field: string;
  /** deployOnly: what the service is (its kind, template, database engine) is set at deploy, never updated. */
  deployOnly?: boolean;
  /** clearable: `update --clear <name>` resets the field (the API's null). */
  clearable?: boolean;
}

/** SETTING_OPTIONS are the flags deploy and update share: one table, so the two cannot drift. */
const SETTING_OPTIONS: SettingOption[] = [
  {
    flags: "--kind <kind>",
    description: "batch | service | model | database (default: service, or the template's)",
    field: "kind",
    deployOnly: true,
  },
  { flags: "--template <id>", description: "start from an app template", field: "template_id", deployOnly: true },
  {
    flags: "--command <string>",
    description: "the command as one shell string (run by /bin/sh -c), instead of argv after --",
    field: "command",
  },
  { flags: "--env <KEY=VALUE>", description: "an environment variable (repeatable)", repeatable: true, field: "env" },
  {
    flags: "--secret <KEY=VALUE>",
    description: "a secret environment variable, stored encrypted (repeatable)",
    repeatable: true,
    field: "secrets",
  },
  { flags: "--gpus <n>", description: "whole GPUs to hold", field: "gpus", clearable: true },
  { flags: "--gpu-memory-mb <n>", description: "a share of one GPU, in MiB", field: "gpu_memory_mb", clearable: true },
  { flags: "--memory-mb <n>", description: "memory limit in MiB", field: "memory_mb", clearable: true },
  { flags: "--port <n>", description: "the port the service listens on", field: "port", clearable: true },
  { flags: "--priority <n>", description: "scheduling priority, -1000 to 1000", field: "priority", clearable: true },
  { flags: "--restart <policy>", description: "always | on-failure | never", field: "restart.policy" },
  {
    flags: "--max-restarts <n>",
    description: "restarts allowed within the window before the service is failed",
    field: "restart.max_restarts",
  },
  { flags: "--window-seconds <n>", description: "the restart window", field: "restart.window_seconds" },
  { flags: "--backoff-s <n>", description: "first delay before a restart; it doubles", field: "restart.backoff_s" },
  {
    flags: "--health <check>",
    description: "http:/path, http:PORT/path, tcp, tcp:PORT, exec:COMMAND or none",
    field: "health",
    clearable: true,
  },
  {
    flags: "--health-start-period <s>",
    description: "seconds after start in which failed probes do not count (default: the template's, 600 for models, else 10; 0: none)",
    field: "health.start_period_s",
  },
  { flags: "--cwd <dir>", description: "working directory (absolute)", field: "cwd", clearable: true },
  {
    flags: "--bind <services...>",
    description: "services this one needs (their connection env is injected)",
    field: "bindings",
    clearable: true,
  },
  { flags: "--repo <url>", description: "build from this git repository", field: "build.repo_url", clearable: true },
  { flags: "--ref <ref>", description: "branch, tag or commit to build (with --repo)", field: "build.ref" },
  { flags: "--subdir <dir>", description: "directory inside the repository (with --repo)", field: "build.subdir" },
  { flags: "--build <command>", description: "build command (with --repo)", field: "build.command" },
  {
    flags: "--engine <engine>",
    description: "a database the engine manages: postgres | sqlite (mariadb, redis where available); no command needed",
    field: "engine",
    deployOnly: true,
  },
  {
    flags: "--user <user>",
    description: "admin only: the OS user (name or uid) to run as instead of the service's own, root included",
    field: "user",
    clearable: true,
  },
];

/** optionName is a flag's name without dashes or argument: "--memory-mb <n>" → "memory-mb". */
function optionName(option: SettingOption): string {
  return (option.flags.split(" ")[0] ?? "").replace(/^--/, "");
}

/** addSettingOptions registers the shared flags on a command (for update, those a service may change). */
function addSettingOptions(command: Command, forUpdate: boolean): Command {
  for (const option of SETTING_OPTIONS) {
    if (forUpdate && option.deployOnly) continue;
    if (option.repeatable) command.option(option.flags, option.description, collect);
    else command.option(option.flags, option.description);
  }
  return command;
}

/** settingsOf turns the shared flags (and a command after --) into the settings of a deploy or patch request. */
function settingsOf(argv: string[], options: DeployOptions): Omit<ServiceDeploy, "name"> {
  if (options.command !== undefined && argv.length > 0) {
    throw new CliError("give the command after -- (as argv) or with --command (as a shell string), not both");
  }
  const restart = {
    policy: oneOf("--restart", options.restart, RESTART_POLICIES),
    max_restarts: wholeNumber("--max-restarts", options.maxRestarts),
    window_seconds: wholeNumber("--window-seconds", options.windowSeconds),
    backoff_s: wholeNumber("--backoff-s", options.backoffS),
  };
  let health = parseHealth(options.health);
  const startPeriod = wholeNumber("--health-start-period", options.healthStartPeriod);
  if (startPeriod !== undefined) {
    if (health === null) throw new CliError("--health-start-period needs a health check, not --health none");
    // Without --health it changes the template's probe.
    health = { ...health, start_period_s: startPeriod };
  }
  const priority = options.priority;
  if (priority !== undefined && !/^-?\d+$/.test(priority)) {
    throw new CliError(`--priority takes a whole number (got ${JSON.stringify(priority)})`);
  }
  return {
    kind: oneOf("--kind", options.kind, KINDS),
    command: argv.length > 0 ? argv : options.command,
    template_id: options.template,
    cwd: options.cwd,
    env: keyValues("--env", options.env),
    secrets: keyValues("--secret", options.secret),
    gpus: wholeNumber("--gpus", options.gpus),
    gpu_memory_mb: wholeNumber("--gpu-memory-mb", options.gpuMemoryMb),
    memory_mb: wholeNumber("--memory-mb", options.memoryMb),
    port: wholeNumber("--port", options.port),
    priority: priority === undefined ? undefined : Number(priority),
    restart: Object.values(restart).some((value) => value !== undefined) ? restart : undefined,
    health,
    build: options.repo ? { repo_url: options.repo, ref: options.ref, subdir: options.subdir, command: options.build } : undefined,
    bindings: options.bind
      ?.flatMap((entry) => entry.split(","))
      .map((entry) => entry.trim())
      .filter(Boolean),
    engine: oneOf("--engine", options.engine, DATABASE_ENGINES),
    user: options.user,
  };
}

/** deployBody turns the deploy command's arguments into a ServiceDeploy request. */
export function deployBody(name: string, argv: string[], options: DeployOptions): ServiceDeploy {
  if (!options.repo && (options.ref || options.subdir || options.build)) {
    throw new CliError("--ref, --subdir and --build need --repo");
  }
  // Leave unset fields out, so the engine applies its defaults (and the template's).
  return JSON.parse(JSON.stringify({ name, ...settingsOf(argv, options) })) as ServiceDeploy;
}

interface UpdateOptions extends DeployOptions {
  unsetEnv?: string[];
  unsetSecret?: string[];
  clear?: string[];
}

/**
 * patchBody turns the update command's arguments into a ServicePatch (decision 180): the
 * flags set what they name, `--env K=V` sets or overrides one key and `--unset-env K` removes
 * one (likewise for secrets), `--clear <flag>` resets a setting. `currentBuild` is the
 * service's build, which --ref, --subdir or --build alone change in place.
 */
export function patchBody(argv: string[], options: UpdateOptions, currentBuild?: ServiceDeploy["build"]): ServicePatch {
  const settings = settingsOf(argv, options);
  const patch: Record<string, unknown> = { ...settings };
  for (const key of ["kind", "template_id", "engine"]) delete patch[key];
  if (!options.repo && (options.ref || options.subdir || options.build)) {
    if (!currentBuild) throw new CliError("--ref, --subdir and --build need --repo: the service is not built from a repository");
    patch.build = { ...currentBuild, ...JSON.parse(JSON.stringify({ ref: options.ref, subdir: options.subdir, command: options.build })) };
  }
  const unset = (name: string, keys: string[] | undefined): Record<string, null> | undefined => {
    if (!keys || keys.length === 0) return undefined;
    for (const key of keys)
      if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(key)) throw new CliError(`${name} takes a variable name (got ${JSON.stringify(key)})`);
    return Object.fromEntries(keys.map((key) => [key, null]));
  };
  const unsetEnv = unset("--unset-env", options.unsetEnv);
  const unsetSecrets = unset("--unset-secret", options.unsetSecret);
  for (const key of Object.keys(unsetEnv ?? {}))
    if (settings.env && key in settings.env) throw new CliError(`--env and --unset-env both name ${key}`);
  for (const key of Object.keys(unsetSecrets ?? {}))
    if (settings.secrets && key in settings.secrets) throw new CliError(`--secret and --unset-secret both name ${key}`);
  if (unsetEnv) patch.env = { ...(settings.env ?? {}), ...unsetEnv };
  if (unsetSecrets) patch.secrets = { ...(settings.secrets ?? {}), ...unsetSecrets };
  const clearable = SETTING_OPTIONS.filter((option) => option.clearable);
  for (const name of options.clear ?? []) {
    const option = clearable.find((candidate) => optionName(candidate) === name.replace(/^--/, ""));
    if (!option) throw new CliError(`--clear takes ${clearable.map(optionName).join(", ")} (got ${JSON.stringify(name)})`);
    const field = option.field.split(".")[0] as string;
    if (patch[field] !== undefined) throw new CliError(`--${optionName(option)} is both set and cleared`);
    patch[field] = null;
  }
  const body = JSON.parse(JSON.stringify(patch)) as ServicePatch;
  if (Object.keys(body).length === 0) {
    throw new CliError("give at least one setting to change (see engine services update --help)");
  }
  return body;
}

/**
 * flagFor names what set a request field, for errors: the flag that sets it ("--memory-mb",
 * "--env GREETING"), or the name the user typed. A probe's port the CLI did not send is the
 * service's: "--port" is what fixes it.
 */
export function flagFor(loc: (string | number)[], sent: Record<string, unknown>): string {
  const path = loc[0] === "body" ? loc.slice(1) : loc;
  const [head, next] = path;
  if (path.length === 0) return loc.join(".");
  if (head === "name") return "name";
  if (head === "command") return sent.command === undefined || Array.isArray(sent.command) ? "command" : "--command";
  if ((head === "env" || head === "secrets") && next !== undefined) return `${head === "env" ? "--env" : "--secret"} ${next}`;
  if (head === "health" && next === "port") {
    const health = sent.health as { port?: number } | null | undefined;
    return health?.port !== undefined ? "--health" : "--port";
  }
  const joined = path.join(".");
  const exact = SETTING_OPTIONS.find((option) => option.field === joined || option.field === `${head}.${next}`);
  const parent = SETTING_OPTIONS.find((option) => option.field === head || option.field.startsWith(`${String(head)}.`));
  const option = exact ?? parent;
  return option ? `--${optionName(option)}` : joined;
}

/** speakingFlags re-words a 422 from the engine with the flags that set each field. */
async function speakingFlags<T>(sent: Record<string, unknown>, request: () => Promise<T>): Promise<T> {
  try {
    return await request();
  } catch (error) {
    if (!(error instanceof CliError) || !error.detail) throw error;
    const parts = error.detail.map((entry) => {
      const label = flagFor(entry.loc, sent);
      return label === "name" && typeof entry.input === "string"
        ? `name ${JSON.stringify(entry.input)}: ${entry.msg}`
        : `${label}: ${entry.msg}`;
    });
    throw new CliError(parts.join("; "), error.code, error.detail);
  }
}

/** quoteArgv writes an argv as a shell would need it typed. */
function quoteArgv(argv: string[]): string {
  if (argv.length === 3 && argv[0] === "/bin/sh" && argv[1] === "-c") return argv[2] ?? "";
  return argv.map((arg) => (/^[\w@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replaceAll("'", "'\\''")}'`)).join(" ");
}

/** gpuCell says what a service asked for and, when it runs, which devices it holds: "1 [0]", "8000 MiB [1]". */
function gpuCell(service: ServiceRecord): string {
  const wanted = service.gpus > 0 ? String(service.gpus) : service.gpu_memory_mb > 0 ? `${service.gpu_memory_mb} MiB` : "";
  const held = service.gpu_devices.join(",");
  if (wanted && held) return `${wanted} [${held}]`;
  return wanted || held;
}

function describeHealth(health: Record<string, unknown> | null): string {
  if (!health) return "";
  const where =
    health.type === "exec"
      ? ` ${Array.isArray(health.command) ? quoteArgv(health.command as string[]) : String(health.command)}`
      : `${health.port ? ` port ${health.port}` : ""}${health.type === "http" ? ` ${health.path ?? "/"}` : ""}`;
  const every = health.interval_s === undefined ? "" : `, every ${health.interval_s} s`;
  const threshold = health.failure_threshold === undefined ? "" : `, ${health.failure_threshold} failures to fail`;
  const grace = health.start_period_s ? `, ${health.start_period_s} s start period` : "";
  return `${health.type}${where}${every}${threshold}${grace}`;
}

/** ServiceExtras are what `services show` adds to the record: its HTTPS names and, with --reveal, the full connection. */
interface ServiceExtras {
  https: string;
  revealed: RevealedConnection | null;
}

/**
 * httpsNames lists the addresses the proxy serves a service at ("https://web-box.local:8443/"),
 * one a line, and says so when the proxy is not serving them.
 */
export function httpsNames(status: ProxyStatus | null, service: ServiceRecord): string {
  if (!status) return "-";
  if (status.state === "disabled") return "- (the proxy is off: ENGINE_PROXY=off)";
  const urls = status.domains.filter((domain) => domain.service === service.name).map((domain) => domain.url);
  if (urls.length === 0) {
    if (service.kind === "database") return "- (a database: clients connect to its port; see connection)";
    return service.port === null ? "- (no port: the proxy routes services that declare one)" : "-";
  }
  const note = status.state === "running" ? "" : `\n(the proxy is ${status.state}${status.tls.error ? `: ${status.tls.error}` : ""})`;
  return `${urls.join("\n")}${note}`;
}

function printService(service: ServiceRecord, extras: ServiceExtras): void {
  const restart = service.restart;
  const connection = extras.revealed ?? service.connection;
  printPairs([
    ["name", service.name],
    ["id", service.id],
    ["kind", service.kind],
    ["status", `${service.status}${service.status_message ? ` — ${service.status_message}` : ""}`],
    ["desired", service.desired_state],
    ["version", String(service.version)],
    ["pid", service.pid === null ? "-" : String(service.pid)],
    ["port", service.port === null ? "-" : String(service.port)],
    ["command", quoteArgv(service.command) || "-"],
    ["template", service.template_id ?? "-"],
    ["cwd", service.cwd ?? "-"],
    ["user", service.user ?? "the engine's"],
    [
      "env",
      Object.entries(service.env)
        .map(([key, value]) => `${key}=${value}`)
        .join("\n") || "-",
    ],
    ["secrets", service.secret_keys.join(", ") || "-"],
    ["gpus", gpuCell(service) || "-"],
    ["memory", service.memory_mb === null ? "no limit" : `${service.memory_mb} MiB`],
    ["priority", String(service.priority)],
    [
      "restart",
      `${restart.policy}, at most ${restart.max_restarts} in ${restart.window_seconds} s, backoff ${restart.backoff_s} s (${service.restarts} in this window)`,
    ],
    ["health", describeHealth(service.health) || "-"],
    [
      "build",
      service.build
        ? `${service.build.repo_url}${service.build.ref ? ` @ ${service.build.ref}` : ""}${service.build.subdir ? ` (${service.build.subdir})` : ""}${service.build.command ? `: ${service.build.command}` : ""}`
        : "-",
    ],
    ["bindings", service.bindings.join(", ") || "-"],
    ...(connection ? ([["connection", connection.url]] as [string, string][]) : []),
    ["https", extras.https],
    ["created", service.created_at],
    ["updated", service.updated_at],
    ["started", service.started_at ?? "-"],
  ]);
}

function plural(count: number, noun: string): string {
  return `${count} ${noun}${count === 1 ? "" : "s"}`;
}

function formatLogLine(line: LogLine, raw: boolean): string {
  return raw ? `${line.line}\n` : `${line.ts} ${line.stream} ${line.line}\n`;
}

/**
 * stopAll stops every service the caller sees that is not settled (SETTLED_STATUSES), all at
 * once, and reports each: what it stopped, and what it could not stop with the engine's reason
 * (a readonly token may stop none). It fails, after stopping all it could, when any was refused.
 */
async function stopAll(api: EngineClient, out: Output): Promise<void> {
  const targets = (await api.request<ServiceRecord[]>("GET", "/api/services")).filter((service) => !SETTLED_STATUSES.has(service.status));
  type Outcome =
    | { name: string; was: string; status: string; error?: undefined }
    | { name: string; was: string; status?: undefined; error: { code: string; message: string } };
  const results = await Promise.all(
    targets.map(async (service): Promise<Outcome> => {
      try {
        const record = await api.request<ServiceRecord>("POST", servicePath(service.id, "/stop"));
        return { name: service.name, was: service.status, status: record.status };
      } catch (error) {
        if (!(error instanceof CliError)) throw error;
        return { name: service.name, was: service.status, error: { code: error.code, message: error.message } };
      }
    }),
  );
  const stopped = results.flatMap((result) =>
    result.error === undefined ? [{ name: result.name, was: result.was, status: result.status }] : [],
  );
  const failed = results.flatMap((result) =>
    result.error !== undefined ? [{ name: result.name, was: result.was, error: result.error }] : [],
  );
  emit(out, { stopped, failed }, () => {
    if (targets.length === 0) process.stdout.write("nothing to stop: no service is running\n");
    for (const result of stopped) process.stdout.write(`stopped ${result.name} (was ${result.was}, now ${result.status})\n`);
    for (const result of failed)
      process.stderr.write(`engine: could not stop ${result.name}: ${result.error.message} [${result.error.code}]\n`);
  });
  if (failed.length > 0) {
    throw new CliError(
      `${failed.length} of ${targets.length} services could not be stopped`,
      failed.every((f) => f.error.code === "forbidden") ? "forbidden" : "error",
    );
  }
}

/** RECONNECTABLE are the failures of a followed log after which `engine logs -f` opens the stream again. */
const RECONNECTABLE = new Set(["daemon_not_running", "stream_broken", "draining"]);
/** RECONNECT_WINDOW_MS is how long `engine logs -f` keeps trying to take a stream back (a restart takes seconds). */
const RECONNECT_WINDOW_MS = 60_000;
const RECONNECT_PAUSE_MS = 200;

export function registerServices(program: Command, client: () => EngineClient, output: () => Output): void {
  const services = program.command("services").description("deploy, list and control services");

  services
    .command("list")
    .description("list services")
    .action(async () => {
      const list = await client().request<ServiceRecord[]>("GET", "/api/services");
      emit(output(), list, () =>
        printTable(
          ["name", "kind", "status", "pid", "gpus", "restarts", "version", "message"],
          list.map((s) => [s.name, s.kind, s.status, s.pid, gpuCell(s), s.restarts, s.version, s.status_message]),
        ),
      );
    });

  addSettingOptions(
    services
      .command("deploy <name> [command...]")
      .description("deploy a service, or a new version of one; give its command after --")
      .usage("<name> [options] [-- command args...]")
      .option(
        "--wait [seconds]",
        `then wait until it runs (a batch job: until it completes), watching it; fail if it settles otherwise or after the seconds (${WAIT_DEFAULT_S})`,
      ),
    false,
  ).action(async (name: string, argv: string[], options: DeployOptions & { wait?: string | boolean }) => {
    const waitS = waitSeconds(options.wait);
    const body = deployBody(name, argv, options);
    let record: ServiceRecord;
    try {
      record = await speakingFlags(body, () => client().request<ServiceRecord>("POST", "/api/services", body));
    } catch (error) {
      throw await withUpdateHint(error, name, body);
    }
    if (!output().json) process.stdout.write(`deployed ${record.name} version ${record.version} (${record.id}): ${statusText(record)}\n`);
    if (waitS !== null) record = await waitForStatus(client(), record.name, record.kind === "batch" ? "completed" : "running", waitS);
    emit(output(), record, () => {
      if (waitS !== null) process.stdout.write(`${statusLine(record)}\n`);
    });
  });

  /**
   * withUpdateHint adds, to a deploy of an existing service refused for want of a command,
   * that `services update` changes some settings without repeating the whole deploy.
   */
  const withUpdateHint = async (error: unknown, name: string, body: ServiceDeploy): Promise<unknown> => {
    const missingCommand =
      error instanceof CliError && error.detail?.some((entry) => entry.loc.at(-1) === "command" && entry.type === "missing");
    if (!missingCommand || body.command !== undefined) return error;
    const exists = await client()
      .request<ServiceRecord>("GET", servicePath(name))
      .then(() => true)
      .catch(() => false);
    if (!exists) return error;
    return new CliError(
      `${error.message}. ${name} exists: to change only some of its settings, use engine services update ${name} (e.g. --memory-mb 400)`,
      error.code,
      error.detail,
    );
  };

  addSettingOptions(
    services
      .command("update <name> [command...]")
      .description(
        "change some settings of a service: a new version from its latest one, with only what you give changed; a running service restarts on it, a stopped one stays stopped",
      )
      .usage("<name> [options] [-- command args...]")
      .option("--unset-env <KEY>", "remove an environment variable (repeatable); --env KEY=VALUE sets or overrides one", collect)
      .option("--unset-secret <KEY>", "remove a secret (repeatable)", collect)
      .option(
        "--clear <setting>",
        `reset a setting to its default (repeatable): ${SETTING_OPTIONS.filter((option) => option.clearable)
          .map(optionName)
          .join(", ")}`,
        collect,
      ),
    true,
  ).action(async (ident: string, argv: string[], options: UpdateOptions) => {
    const before = await client().request<ServiceRecord>("GET", servicePath(ident));
    const body = patchBody(argv, options, (before.build as ServiceDeploy["build"]) ?? undefined);
    const record = await speakingFlags(body, () => client().request<ServiceRecord>("PATCH", servicePath(ident), body));
    // A version that builds first runs once its build succeeds: the build's version is the new one.
    const building = record.build
      ? (await client().request<Diagnosis>("GET", servicePath(ident, "/diagnose"))).build.version
      : record.version;
    const latest = Math.max(record.version, building ?? 0);
    emit(output(), record, () => {
      if (latest === before.version && record.version === before.version) {
        process.stdout.write(`${record.name} unchanged: version ${record.version} already has these settings\n`);
        return;
      }
      const state = statusText(record);
      process.stdout.write(
        latest > record.version
          ? `updated ${record.name} to version ${latest}, building; version ${record.version} runs until it succeeds: ${state}\n`
          : `updated ${record.name} to version ${record.version} (${record.id}): ${state}\n`,
      );
    });
  });

  services
    .command("show <name>")
    .description("show one service: its settings, its HTTPS names and, for a database, how to connect (password masked)")
    .option("--reveal", "admin only: show a database's connection URL with its password (the reveal is logged)")
    .action(async (ident: string, options: { reveal?: boolean }) => {
      const record = await client().request<ServiceRecord>("GET", servicePath(ident));
      const revealed = options.reveal ? await revealConnection(ident) : null;
      const shown = revealed ? { ...record, connection: revealed } : record;
      // The names are the proxy's: a reader that may not see its status still sees the service.
      const proxy = output().json
        ? null
        : await client()
            .request<ProxyStatus>("GET", "/api/proxy/status")
            .catch(() => null);
      emit(output(), shown, () => printService(record, { https: httpsNames(proxy, record), revealed }));
    });

  /** revealConnection asks for a database's connection in full, saying plainly why a non-admin is refused. */
  const revealConnection = async (ident: string): Promise<RevealedConnection> => {
    try {
      return await client().request<RevealedConnection>("GET", servicePath(ident, "/connection"));
    } catch (error) {
      if (error instanceof CliError && error.code === "forbidden") {
        throw new CliError(
          `--reveal needs an admin token: the connection URL holds the database's password, which only an admin may read (without --reveal it is shown masked)`,
          "forbidden",
        );
      }
      throw error;
    }
  };

  services
    .command("stop [name]")
    .description("stop a service (a batch job is cancelled); --all stops every service you may stop")
    .option("--all", "stop every service that is not stopped already and that this token may stop, and say which")
    .action(async (ident: string | undefined, options: { all?: boolean }) => {
      if (options.all && ident !== undefined) throw new CliError("give a service name or --all, not both");
      if (options.all) {
        await stopAll(client(), output());
        return;
      }
      if (ident === undefined) throw new CliError("give the service to stop, or --all to stop every one");
      const record = await client().request<ServiceRecord>("POST", servicePath(ident, "/stop"));
      emit(output(), record, () => process.stdout.write(`${statusLine(record)}\n`));
    });

  for (const [action, description] of Object.entries(ACTIONS)) {
    services
      .command(`${action} <name>`)
      .description(description)
      .action(async (ident: string) => {
        const record = await client().request<ServiceRecord>("POST", servicePath(ident, `/${action}`));
        emit(output(), record, () => process.stdout.write(`${statusLine(record)}\n`));
      });
  }

  services
    .command("wait <name>")
    .description(
      "wait until a service has a status (running unless --for says another), watching it with blocking reads rather than polling; fails at once if it settles in another status (stopped, failed, completed, cancelled)",
    )
    .option("--for <status>", `the status to wait for: ${SERVICE_STATUSES.join(", ")}`, "running")
    .option("--timeout <s>", "give up after this many seconds", String(WAIT_DEFAULT_S))
    .action(async (ident: string, options: { for: string; timeout: string }) => {
      const wanted = oneOf("--for", options.for, SERVICE_STATUSES) as string;
      const timeoutS = wholeNumber("--timeout", options.timeout) as number;
      if (timeoutS < 1) throw new CliError("--timeout takes at least 1 second");
      const record = await waitForStatus(client(), ident, wanted, timeoutS);
      emit(output(), record, () => process.stdout.write(`${statusLine(record)}\n`));
    });

  services
    .command("rm <name>")
    .alias("delete")
    .description("stop and delete a service (its data directory is kept)")
    .action(async (ident: string) => {
      const removed = await client().request<{ id: string; name: string; deleted: boolean }>("DELETE", servicePath(ident));
      emit(output(), removed, () => process.stdout.write(`removed ${removed.name} (${removed.id})\n`));
    });

  program
    .command("logs <service>")
    .description("print a service's latest log lines; -f follows them until Ctrl-C")
    .option("-f, --follow", "keep printing lines as they are written")
    .option("--tail <n>", "how many of the latest lines", "100")
    .option("--raw", "print only the lines, without time and stream")
    .action(async (ident: string, options: { follow?: boolean; tail: string; raw?: boolean }) => {
      const tail = wholeNumber("--tail", options.tail);
      const raw = options.raw === true;
      const json = output().json;
      const print = (line: LogLine) => process.stdout.write(json ? `${JSON.stringify(line)}\n` : formatLogLine(line, raw));
      if (!options.follow) {
        const lines = await client().request<LogLine[]>("GET", servicePath(ident, `/logs?tail=${tail}`));
        emit(output(), lines, () => {
          for (const line of lines) process.stdout.write(formatLogLine(line, raw));
          // Said on stderr, so a pipe still reads only log lines: an empty answer is not an error.
          if (lines.length === 0) process.stderr.write(`${ident} has printed nothing yet\n`);
        });
        return;
      }
      // Following: Ctrl-C (or SIGTERM) ends the stream and the command, with status 0.
      const stop = new AbortController();
      const onSignal = () => stop.abort();
      process.once("SIGINT", onSignal);
      process.once("SIGTERM", onSignal);
      // A stream the engine ends (a restart or an upgrade hands it over) is opened again with
      // the id of the last event, and resumes after it: no line is missed or printed twice.
      let lastEventId: string | undefined;
      let lostSince: number | null = null;
      try {
        while (!stop.signal.aborted) {
          try {
            for await (const event of client().events(servicePath(ident, `/logs?tail=${tail}&follow=true`), stop.signal, lastEventId)) {
              lostSince = null;
              if (event.id !== undefined) lastEventId = event.id;
              if (event.event === "line") print(JSON.parse(event.data) as LogLine);
              // The stream opens with `ready {lines}`: a service that never printed says so at once
              // instead of leaving an empty terminal (on stderr, so a pipe reads only lines).
              else if (event.event === "ready") {
                const ready = JSON.parse(event.data) as { lines?: number; resumed?: boolean };
                if (!json && !ready.resumed && (tail ?? 0) > 0 && ready.lines === 0)
                  process.stderr.write(`${ident} has printed nothing yet; waiting for output (Ctrl-C to stop)\n`);
              }
            }
          } catch (error) {
            if (stop.signal.aborted) break;
            if (!RECONNECTABLE.has((error as CliError).code ?? "")) throw error;
          }
          if (stop.signal.aborted) break;
          lostSince ??= Date.now();
          if (Date.now() - lostSince > RECONNECT_WINDOW_MS) {
            throw new CliError(
              `the engine closed the log stream and did not take it back within ${RECONNECT_WINDOW_MS / 1000} s`,
              "stream_closed",
            );
          }
          await Bun.sleep(RECONNECT_PAUSE_MS);
        }
      } finally {
        process.off("SIGINT", onSignal);
        process.off("SIGTERM", onSignal);
      }
    });

  program
    .command("diagnose <service>")
    .description("explain a service's state: the cause first, then restarts, health, bindings, build and logs")
    .action(async (ident: string) => {
      const diagnosis = await client().request<Diagnosis>("GET", servicePath(ident, "/diagnose"));
      emit(output(), diagnosis, () => process.stdout.write(diagnosisReport(diagnosis)));
    });

  program
    .command("gpus")
    .description("list the GPUs and which services hold them")
    .action(async () => {
      const inventory = await client().request<GpuInventoryRecord>("GET", "/api/gpus");
      emit(output(), inventory, () => {
        if (inventory.devices.length === 0) {
          process.stdout.write("no GPUs: nvidia-smi found none and ENGINE_GPUS declares none\n");
        } else {
          printTable(
            ["index", "name", "memory", "used", "source", "reserved", "holders"],
            inventory.devices.map((d) => [
              d.index,
              `${d.name}${d.mig_profile ? ` (MIG ${d.mig_profile})` : ""}`,
              `${d.memory_total_mb} MiB`,
              d.memory_used_mb === null ? null : `${d.memory_used_mb} MiB`,
              d.source === "declared" ? "declared (ENGINE_GPUS, not detected)" : d.source,
              d.reserved_mb > 0 ? `${d.reserved_mb} MiB` : null,
              d.holders.map((h) => (h.whole ? h.service : `${h.service} (${h.memory_mb} MiB)`)).join(", "),
            ]),
          );
        }
        for (const warning of inventory.warnings) process.stdout.write(`warning: ${warning}\n`);
      });
    });
}

/**
 * diagnosisReport renders a Diagnosis for people: what is wrong, the log line that says it
 * and what to do first, then the facts behind it (restarts, forensics, health, bindings,
 * build, env, last run), then the logs.
 */
export function diagnosisReport(d: Diagnosis): string {
  const lines: string[] = [];
  lines.push(`${d.service_name}: ${d.status}${d.error ? ` — ${d.error.class}: ${d.error.message}` : ""}`);
  if (d.error?.key_line) lines.push(`key line: ${d.error.key_line}`);
  if (d.remediation) lines.push(`fix (${d.remediation.code}): ${d.remediation.detail}`);
  else if (!d.error) lines.push("nothing to fix");
  lines.push("");

  const rows: [string, string][] = [];
  rows.push(["kind", `${d.kind}, desired ${d.desired_state}`]);
  const r = d.restarts;
  const restartParts = [`${r.count}/${r.max_restarts} in ${r.window_seconds} s (policy ${r.policy})`, `backoff ${r.backoff_s} s`];
  if (r.next_retry_in_s !== null) restartParts.push(`next retry in ${r.next_retry_in_s} s`);
  if (r.window_start) restartParts.push(`window since ${r.window_start}`);
  if (r.last_exit_at) restartParts.push(`last exit ${r.last_exit_at}`);
  rows.push(["restarts", restartParts.join(", ")]);

  const f = d.forensics;
  const flags = [f.oom_killed && "oom_killed", f.gpu_oom && "gpu_oom", f.priv_denied && "priv_denied"].filter(Boolean);
  const forensics = [
    `exit code ${f.last_exit_code ?? "-"}`,
    flags.length > 0 ? `flags ${flags.join(", ")}` : "no oom/gpu_oom/priv_denied",
    ...(f.last_crash_at ? [`last crash ${f.last_crash_at}`] : []),
  ];
  rows.push(["forensics", forensics.join(", ")]);

  const health = d.health;
  if (!health.spec) rows.push(["health", "no health check"]);
  else {
    const probe = health.probe as {
      ok?: boolean;
      at?: string;
      duration_ms?: number;
      detail?: string;
      consecutive_failures?: number;
      in_start_period?: boolean;
      start_period_left_s?: number | null;
      start_period_failures?: number;
    } | null;
    const parts = [describeHealth(health.spec)];
    if (probe) {
      parts.push(
        `last probe ${probe.ok ? "ok" : "failed"} at ${probe.at} (${probe.detail}, ${probe.duration_ms} ms), ${plural(probe.consecutive_failures ?? 0, "consecutive failure")}`,
      );
      const uncounted = plural(probe.start_period_failures ?? 0, "failed probe");
      if (probe.in_start_period) {
        parts.push(`in start period: ${probe.start_period_left_s} s of ${health.spec.start_period_s} s left, ${uncounted} not counted`);
      } else if (probe.start_period_failures) parts.push(`start period over, ${uncounted} in it not counted`);
    } else parts.push("not probed yet");
    rows.push(["health", [parts.join("; "), ...health.observations.map((o) => `  ${o}`)].join("\n")]);
  }

  rows.push([
    "bindings",
    d.bindings.messages.length > 0 ? `${d.bindings.waiting ? "waiting: " : ""}${d.bindings.messages.join("; ")}` : "-",
  ]);
  rows.push([
    "build",
    d.build.last_result ? `version ${d.build.version}: ${d.build.last_result}${d.build.reason ? ` — ${d.build.reason}` : ""}` : "-",
  ]);
  const env = [`${d.injected_env_keys.join(", ") || "-"} (${d.injected_env_keys_source})`];
  if (d.pending_env_keys.length > 0) env.push(`pending until restart: ${d.pending_env_keys.join(", ")}`);
  rows.push(["env keys", env.join("\n")]);

  const run = d.last_run as {
    id?: string;
    version?: number;
    pid?: number | null;
    started_at?: string;
    ended_at?: string | null;
    exit_code?: number | null;
    signal?: string | null;
    exec_error?: string | null;
    end_reason?: string | null;
    gpu_devices?: string[];
  } | null;
  if (run) {
    const how = run.exec_error
      ? `could not start (${run.exec_error})`
      : run.signal
        ? `killed by ${run.signal}`
        : run.exit_code !== null && run.exit_code !== undefined
          ? `exit ${run.exit_code}`
          : run.ended_at
            ? "ended"
            : "running";
    const parts = [
      `${run.id} (version ${run.version}${run.pid ? `, pid ${run.pid}` : ""}${run.gpu_devices?.length ? `, gpus ${run.gpu_devices.join(",")}` : ""})`,
      `started ${run.started_at}`,
      ...(run.ended_at ? [`ended ${run.ended_at}`] : []),
      `${how}${run.end_reason ? ` (${run.end_reason})` : ""}`,
    ];
    rows.push(["last run", parts.join(", ")]);
  } else rows.push(["last run", "never ran"]);

  lines.push(...formatPairs(rows));

  const logs = d.logs.slice(-DIAGNOSIS_LOG_LINES) as Partial<LogLine>[];
  lines.push("");
  if (logs.length === 0) lines.push("no log lines");
  else {
    lines.push(`last ${plural(logs.length, "log line")}:`);
    for (const line of logs) lines.push(`  ${line.ts ?? ""} ${line.stream ?? ""} ${line.line ?? ""}`);
  }
  return `${lines.join("\n")}\n`;
}
