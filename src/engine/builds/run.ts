import { chownSync, mkdirSync, mkdtempSync, readdirSync, realpathSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve, sep } from "node:path";
import { AppError } from "../../lib/errors";
import { inheritedEnv, NETWORK_ENV } from "../config";
import { asWorkloadUser, type WorkloadUser } from "../users";
import { BuildLog } from "./log";
import { type BuildPlan, type BuildSpec, redactUrl, validateBuildSpec } from "./spec";
import { runStep, type StepResult } from "./step";

/** BuildCredential is a code-host token for https URLs, presented to git as a username and password. */
export interface BuildCredential {
  username: string;
  password: string;
}

export interface BuildOptions {
  /** workDir is where the checkout goes: a fresh, absent or empty directory per version. */
  workDir: string;
  /** logPath is the build log; output is appended, with every known secret redacted. */
  logPath: string;
  /**
   * credential is given to git, for http and https URLs only, through GIT_ASKPASS and
   * variables set for git's processes alone: never in argv, the log or the checkout's .git/config.
   */
  credential?: BuildCredential | null;
  /** env is added to the small environment builds inherit (inheritedEnv with NETWORK_ENV: PATH, HOME, LANG, proxies, SSH_AUTH_SOCK, ...). */
  env?: Record<string, string>;
  /** inherited is the daemon's environment the build inherits from (config.workloadEnv); this process's by default. */
  inherited?: Record<string, string | undefined>;
  /** timeoutMs bounds the whole build, clone and command; it defaults to DEFAULT_BUILD_TIMEOUT_MS. */
  timeoutMs?: number;
  /** signal aborts the build; the running step's process group is killed. */
  signal?: AbortSignal;
  /**
   * user runs git and the build command as that user (the service's), through setpriv, in a
   * checkout it owns; null or absent: the engine's own user. The log stays the engine's.
   */
  user?: WorkloadUser | null;
}

/** BuildResult is how a build ended. */
export interface BuildResult {
  ok: boolean;
  /** commit is the full id checked out, once the checkout succeeded. */
  commit: string | null;
  /** dir is the absolute path of the checkout's subdir, where the service runs. */
  dir: string;
  /** reason says why a build failed, in one line; null on success. */
  reason: string | null;
  duration_ms: number;
  /** log_tail is the last lines this build wrote to its log, redacted. */
  log_tail: string[];
}

export const DEFAULT_BUILD_TIMEOUT_MS = 30 * 60_000;
const LOG_TAIL_LINES = 50;
// The askpass helper answers git's two prompts from variables only git's processes receive.
const ASKPASS_SCRIPT = `#!/bin/sh
case "$1" in
  Username*) printf '%s\\n' "$ENGINE_GIT_USERNAME" ;;
  *) printf '%s\\n' "$ENGINE_GIT_PASSWORD" ;;
esac
`;

/**
 * runBuild checks out a git repository into options.workDir and runs the spec's command in
 * the checkout's subdir. A branch or tag is cloned shallowly (`--depth 1 --branch`); a commit
 * id needs a full clone and a detached checkout, with a fetch of the id when no branch has it
 * and the id is complete. The whole build is bounded by timeoutMs and cancelled by signal;
 * either kills the running step's process group. runBuild throws AppError("build_failed") only
 * for a spec that validateBuildSpec rejects, before anything runs, and AppError("internal")
 * when the log cannot be opened; every other failure is a result with ok false and a reason.
 */
export async function runBuild(spec: BuildSpec, options: BuildOptions): Promise<BuildResult> {
  const plan = validateBuildSpec(spec);
  const started = performance.now();
  const workDir = resolve(options.workDir);
  const dir = plan.subdir === "" ? workDir : join(workDir, plan.subdir);
  const credential = options.credential && /^https?:\/\//i.test(plan.repoUrl) ? options.credential : null;
  let log: BuildLog;
  try {
    log = new BuildLog(options.logPath, secretsOf(plan, credential), LOG_TAIL_LINES);
  } catch (error) {
    throw new AppError("internal", `cannot open the build log ${options.logPath}: ${messageOf(error)}`);
  }
  const stop = new BuildStop(options.timeoutMs ?? DEFAULT_BUILD_TIMEOUT_MS, options.signal);
  let askpassDir: string | null = null;
  let commit: string | null = null;

  const finish = (reason: string | null): BuildResult => {
    const duration = Math.round(performance.now() - started);
    const cleanReason = reason === null ? null : log.redact(reason);
    log.note(cleanReason === null ? `build succeeded in ${duration} ms at ${commit}` : `build failed in ${duration} ms: ${cleanReason}`);
    return { ok: reason === null, commit, dir, reason: cleanReason, duration_ms: duration, log_tail: log.tail() };
  };

  try {
    log.note(`build started at ${new Date().toISOString()}: ${redactUrl(plan.repoUrl)} at ${plan.ref ?? "the remote's HEAD"}`);
    if (options.credential && !credential) log.note("the credential is not used: only http and https URLs take one");
    if (stop.signal.aborted) return finish(stop.describe());
    const user = options.user ?? null;
    mkdirSync(workDir, { recursive: true });
    if (user) chownSync(workDir, user.uid, user.gid);
    const baseEnv = { ...inheritedEnv(options.inherited, NETWORK_ENV), ...options.env };
    if (credential || user) {
      askpassDir = mkdtempSync(join(tmpdir(), "engine-askpass-"));
      if (credential) writeFileSync(join(askpassDir, "askpass"), ASKPASS_SCRIPT, { mode: 0o700 });
      if (user) {
        // As the service's user, a local repository (file://, a path) is someone else's, and git
        // refuses it for "dubious ownership"; only global config can allow it, as a local clone's
        // upload-pack drops GIT_CONFIG_COUNT. That check keeps a repository's config from running
        // code as the user who runs git: here that user runs the repository's code anyway. The
        // user's own ~/.gitconfig is still read, through the include.
        writeFileSync(join(askpassDir, "gitconfig"), `[safe]\n\tdirectory = *\n[include]\n\tpath = ${user.home}/.gitconfig\n`, {
          mode: 0o600,
        });
        // git runs as the build's user and must read these; the token itself travels in git's env only.
        for (const file of readdirSync(askpassDir)) chownSync(join(askpassDir, file), user.uid, user.gid);
        chownSync(askpassDir, user.uid, user.gid);
      }
    }
    const gitEnv = gitEnvironment(
      baseEnv,
      credential,
      credential && askpassDir ? join(askpassDir, "askpass") : null,
      user && askpassDir ? join(askpassDir, "gitconfig") : null,
    );
    const git = (args: string[], echo = true) => {
      if (echo) log.note(`git ${args.map((arg) => redactUrl(arg)).join(" ")}`);
      return runStep(asWorkloadUser(user, ["git", ...args]), { cwd: workDir, env: gitEnv, log, stop: stop.signal, echo });
    };

    const cloneArgs = plan.refIsCommit
      ? ["clone", "--no-tags", "--no-checkout", "--", plan.repoUrl, workDir]
      : ["clone", "--no-tags", "--depth", "1", ...(plan.ref ? ["--branch", plan.ref] : []), "--", plan.repoUrl, workDir];
    const clone = await git(cloneArgs);
    if (stop.signal.aborted) return finish(stop.describe());
    if (!succeeded(clone)) return finish(`git clone failed: ${gitError(clone)}`);

    if (plan.refIsCommit && plan.ref) {
      const wanted = `${plan.ref}^{commit}`;
      let found = await git(["rev-parse", "--verify", "--quiet", wanted], false);
      // No branch has the commit (a tag's, say); a complete id can still be fetched by itself.
      if (!succeeded(found) && plan.ref.length === 40 && !stop.signal.aborted) {
        await git(["fetch", "--no-tags", "origin", plan.ref]);
        found = await git(["rev-parse", "--verify", "--quiet", wanted], false);
      }
      if (stop.signal.aborted) return finish(stop.describe());
      if (!succeeded(found)) return finish(`commit ${plan.ref} was not found in the repository`);
      const checkout = await git(["checkout", "--detach", "--quiet", found.output[0]!]);
      if (stop.signal.aborted) return finish(stop.describe());
      if (!succeeded(checkout)) return finish(`git checkout failed: ${gitError(checkout)}`);
    }

    const head = await git(["rev-parse", "HEAD"], false);
    if (stop.signal.aborted) return finish(stop.describe());
    if (!succeeded(head)) return finish(`git rev-parse failed: ${gitError(head)}`);
    commit = head.output[0]?.trim() ?? null;
    log.note(`checked out ${commit}`);

    const subdirProblem = checkSubdir(workDir, dir, plan.subdir);
    if (subdirProblem) return finish(subdirProblem);

    if (plan.command !== null) {
      log.note(`/bin/sh -c ${plan.command}`);
      const build = await runStep(asWorkloadUser(user, ["/bin/sh", "-c", plan.command]), {
        cwd: dir,
        env: baseEnv,
        log,
        stop: stop.signal,
      });
      if (stop.signal.aborted) return finish(stop.describe());
      if (build.spawnError !== null) return finish(`build command could not start: ${build.spawnError}`);
      if (build.exitCode !== 0) {
        return finish(build.exitCode === null ? `build command killed by ${build.signalCode}` : `build command exited ${build.exitCode}`);
      }
    }
    return finish(null);
  } catch (error) {
    return finish(`build could not run: ${messageOf(error)}`);
  } finally {
    stop.dispose();
    if (askpassDir) rmSync(askpassDir, { recursive: true, force: true });
    log.close();
  }
}

/**
 * BuildStop is the build's one cancellation signal: it aborts when the timeout passes or the
 * caller's signal aborts, and remembers which, for the reason.
 */
class BuildStop {
  readonly #controller = new AbortController();
  readonly #timer: ReturnType<typeof setTimeout>;
  readonly #external?: AbortSignal;
  readonly #onExternalAbort = () => this.#controller.abort();
  #timedOut = false;

  constructor(
    readonly timeoutMs: number,
    external?: AbortSignal,
  ) {
    this.#timer = setTimeout(() => {
      this.#timedOut = true;
      this.#controller.abort();
    }, timeoutMs);
    this.#external = external;
    if (external?.aborted) this.#controller.abort();
    else external?.addEventListener("abort", this.#onExternalAbort, { once: true });
  }

  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  describe(): string {
    return this.#timedOut ? `timed out after ${this.timeoutMs} ms` : "aborted";
  }

  dispose(): void {
    clearTimeout(this.#timer);
    this.#external?.removeEventListener("abort", this.#onExternalAbort);
  }
}

/**
 * gitEnvironment adds what git's processes need: no terminal prompts, messages in English (the
 * reasons quote them), and configuration through GIT_CONFIG_COUNT, after any the caller set.
 * With a credential, the helper list is emptied so no helper of the host's configuration can
 * offer another credential or store this one, and GIT_ASKPASS answers git's prompts.
 */
function gitEnvironment(
  base: Record<string, string>,
  credential: BuildCredential | null,
  askpass: string | null,
  globalConfig: string | null,
): Record<string, string> {
  const env: Record<string, string> = { ...base, GIT_TERMINAL_PROMPT: "0", LC_ALL: "C" };
  if (globalConfig && env.GIT_CONFIG_GLOBAL === undefined) env.GIT_CONFIG_GLOBAL = globalConfig;
  const config: [string, string][] = [["advice.detachedHead", "false"]];
  if (credential && askpass) {
    config.push(["credential.helper", ""]);
    env.GIT_ASKPASS = askpass;
    env.ENGINE_GIT_USERNAME = credential.username;
    env.ENGINE_GIT_PASSWORD = credential.password;
  }
  // ssh must fail rather than wait for a passphrase or a host-key answer nobody will type.
  if (env.GIT_SSH_COMMAND === undefined && env.GIT_SSH === undefined) env.GIT_SSH_COMMAND = "ssh -o BatchMode=yes";
  const first = Number.parseInt(env.GIT_CONFIG_COUNT ?? "0", 10) || 0;
  config.forEach(([key, value], index) => {
    env[`GIT_CONFIG_KEY_${first + index}`] = key;
    env[`GIT_CONFIG_VALUE_${first + index}`] = value;
  });
  env.GIT_CONFIG_COUNT = String(first + config.length);
  return env;
}

function secretsOf(plan: BuildPlan, credential: BuildCredential | null): string[] {
  const secrets: string[] = [];
  if (credential) {
    secrets.push(
      credential.password,
      encodeURIComponent(credential.password),
      Buffer.from(`${credential.username}:${credential.password}`).toString("base64"),
    );
  }
  // A password written into the URL itself is a secret too.
  const inUrl = /^[a-z][a-z0-9+.-]*:\/\/[^/@:]*:([^/@]+)@/i.exec(plan.repoUrl)?.[1];
  if (inUrl) secrets.push(inUrl, safeDecode(inUrl));
  return secrets;
}

/** checkSubdir says why the subdir cannot be used, or null: it must exist and, symlinks resolved, stay inside the checkout. */
function checkSubdir(workDir: string, dir: string, subdir: string): string | null {
  if (subdir === "") return null;
  let real: string;
  try {
    real = realpathSync(dir);
  } catch {
    return `subdir ${subdir} does not exist in the checkout`;
  }
  const root = realpathSync(workDir);
  if (real !== root && !real.startsWith(root + sep)) return `subdir ${subdir} leads outside the checkout`;
  if (!statSync(real).isDirectory()) return `subdir ${subdir} is not a directory`;
  return null;
}

function succeeded(step: StepResult): boolean {
  return step.spawnError === null && step.exitCode === 0;
}

/** gitError picks the line of git's output that says what went wrong. */
function gitError(step: StepResult): string {
  if (step.spawnError !== null) return `git could not start: ${step.spawnError}`;
  const lines = step.output.map((line) => line.trim()).filter((line) => line !== "");
  const fatal = lines.findLast((line) => line.startsWith("fatal: "));
  if (fatal) return fatal.slice("fatal: ".length);
  const error = lines.findLast((line) => line.startsWith("error: "));
  if (error) return error.slice("error: ".length);
  const status = step.exitCode === null ? `killed by ${step.signalCode}` : `exited ${step.exitCode}`;
  return lines.at(-1) ? `${lines.at(-1)} (${status})` : status;
}

function safeDecode(text: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
