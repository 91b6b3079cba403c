import type { Command } from "commander";
import type { Diagnosis, GpuInventoryRecord, LogLine, ServiceDeploy, ServiceRecord } from "../../src/contract/engine";
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

/** deployBody turns the deploy command's arguments into a ServiceDeploy request. */
export function deployBody(name: string, argv: string[], options: DeployOptions): ServiceDeploy {
  if (options.command !== undefined && argv.length > 0) {
    throw new CliError("give the command after -- (as argv) or with --command (as a shell string), not both");
  }
  if (!options.repo && (options.ref || options.subdir || options.build)) {
    throw new CliError("--ref, --subdir and --build need --repo");
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
  const body: ServiceDeploy = {
    name,
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
  // Leave unset fields out, so the engine applies its defaults (and the template's).
  return JSON.parse(JSON.stringify(body)) as ServiceDeploy;
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

function printService(service: ServiceRecord): void {
  const restart = service.restart;
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

  services
    .command("deploy <name> [command...]")
    .description("deploy a service, or a new version of one; give its command after --")
    .usage("<name> [options] [-- command args...]")
    .option("--kind <kind>", "batch | service | model | database (default: service, or the template's)")
    .option("--template <id>", "start from an app template")
    .option("--command <string>", "the command as one shell string (run by /bin/sh -c), instead of argv after --")
    .option("--env <KEY=VALUE>", "an environment variable (repeatable)", collect)
    .option("--secret <KEY=VALUE>", "a secret environment variable, stored encrypted (repeatable)", collect)
    .option("--gpus <n>", "whole GPUs to hold")
    .option("--gpu-memory-mb <n>", "a share of one GPU, in MiB")
    .option("--memory-mb <n>", "memory limit in MiB")
    .option("--port <n>", "the port the service listens on")
    .option("--priority <n>", "scheduling priority, -1000 to 1000")
    .option("--restart <policy>", "always | on-failure | never")
    .option("--max-restarts <n>", "restarts allowed within the window before the service is failed")
    .option("--window-seconds <n>", "the restart window")
    .option("--backoff-s <n>", "first delay before a restart; it doubles")
    .option("--health <check>", "http:/path, http:PORT/path, tcp, tcp:PORT, exec:COMMAND or none")
    .option(
      "--health-start-period <s>",
      "seconds after start in which failed probes do not count (default: the template's, 600 for models, else 10; 0: none)",
    )
    .option("--cwd <dir>", "working directory (absolute)")
    .option("--bind <services...>", "services this one needs (their connection env is injected)")
    .option("--repo <url>", "build from this git repository")
    .option("--ref <ref>", "branch, tag or commit to build (with --repo)")
    .option("--subdir <dir>", "directory inside the repository (with --repo)")
    .option("--build <command>", "build command (with --repo)")
    .option("--engine <engine>", "a database the engine manages: postgres | sqlite (mariadb, redis where available); no command needed")
    .option("--user <user>", "admin only: the OS user (name or uid) to run as instead of the service's own, root included")
    .action(async (name: string, argv: string[], options: DeployOptions) => {
      const record = await client().request<ServiceRecord>("POST", "/api/services", deployBody(name, argv, options));
      emit(output(), record, () =>
        process.stdout.write(
          `deployed ${record.name} version ${record.version} (${record.id}): ${record.status}${record.status_message ? ` — ${record.status_message}` : ""}\n`,
        ),
      );
    });

  services
    .command("show <name>")
    .description("show one service")
    .action(async (ident: string) => {
      const record = await client().request<ServiceRecord>("GET", servicePath(ident));
      emit(output(), record, () => printService(record));
    });

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
      emit(output(), record, () =>
        process.stdout.write(`${record.name}: ${record.status}${record.status_message ? ` — ${record.status_message}` : ""}\n`),
      );
    });

  for (const [action, description] of Object.entries(ACTIONS)) {
    services
      .command(`${action} <name>`)
      .description(description)
      .action(async (ident: string) => {
        const record = await client().request<ServiceRecord>("POST", servicePath(ident, `/${action}`));
        emit(output(), record, () =>
          process.stdout.write(`${record.name}: ${record.status}${record.status_message ? ` — ${record.status_message}` : ""}\n`),
        );
      });
  }

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
      try {
        for await (const event of client().events(servicePath(ident, `/logs?tail=${tail}&follow=true`), stop.signal)) {
          if (event.event === "line") print(JSON.parse(event.data) as LogLine);
          // The stream opens with `ready {lines}`: a service that never printed says so at once
          // instead of leaving an empty terminal (on stderr, so a pipe reads only lines).
          else if (event.event === "ready" && !json && (tail ?? 0) > 0 && (JSON.parse(event.data) as { lines?: number }).lines === 0)
            process.stderr.write(`${ident} has printed nothing yet; waiting for output (Ctrl-C to stop)\n`);
        }
      } catch (error) {
        if (!stop.signal.aborted) throw error;
      } finally {
        process.off("SIGINT", onSignal);
        process.off("SIGTERM", onSignal);
      }
      if (!stop.signal.aborted) throw new CliError("the engine closed the log stream (is it restarting?)", "stream_closed");
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
