import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import type { Command } from "commander";
import { VERSION } from "../../src/lib/version";
import { CliError } from "../client";
import { emit, type Output } from "../output";
import { isOurUnit, STATE_ROOT, systemdUnit, UNIT_DIR, UNIT_NAME } from "../systemd";

// build.ts defines this in the compiled binary.
declare const __ENGINE_COMPILED__: boolean | undefined;

/** SYSTEMD_RUNNING is the directory that exists only while systemd is the init system (sd_booted(3)). */
const SYSTEMD_RUNNING = "/run/systemd/system";

/** engineCommand is how the unit runs this engine: the binary itself, or Bun on the source entry. */
function engineCommand(): { command: string[]; fromSource: boolean } {
  if (typeof __ENGINE_COMPILED__ !== "undefined" && __ENGINE_COMPILED__) return { command: [process.execPath], fromSource: false };
  return { command: [process.execPath, resolve(import.meta.dir, "..", "engine.ts")], fromSource: true };
}

/**
 * stateDirectoryOf turns the data dir the command line names into StateDirectory=, which is
 * relative to /var/lib: the unit's data dir is /var/lib/engine unless --data-dir names another
 * one under /var/lib. A data dir elsewhere is refused rather than half-supported.
 */
function stateDirectoryOf(dataDir: string | undefined): string {
  if (dataDir === undefined) return "engine";
  const inside = relative(STATE_ROOT, resolve(dataDir));
  if (inside === "" || inside.startsWith("..") || inside.startsWith("/")) {
    throw new CliError(
      `the unit keeps the engine's data under ${STATE_ROOT} (StateDirectory=); --data-dir ${dataDir} is not under it: give a --data-dir under ${STATE_ROOT}, or none for ${STATE_ROOT}/engine`,
      "data_dir_outside_state",
    );
  }
  return inside;
}

interface Systemctl {
  run(args: string[]): { ok: boolean; output: string };
}

function systemctl(root: string | undefined): Systemctl | null {
  const path = Bun.which("systemctl");
  if (!path) return null;
  return {
    run(args) {
      const command = [path, ...(root ? [`--root=${root}`] : []), ...args];
      const run = Bun.spawnSync(command, { stdout: "pipe", stderr: "pipe" });
      return { ok: run.exitCode === 0, output: `${run.stdout.toString()}${run.stderr.toString()}`.trim() };
    },
  };
}

/** initName is the name of PID 1, for saying what runs this machine instead of systemd. */
function initName(): string {
  try {
    return readFileSync("/proc/1/comm", "utf8").trim() || "unknown";
  } catch {
    return "unknown";
  }
}

interface Outcome {
  unit: string;
  path: string;
  written: boolean;
  enabled: boolean;
  started: boolean;
  note: string;
}

/**
 * registerInstall adds `engine install --systemd` and `engine uninstall`. Where systemd runs,
 * install writes the unit, enables it and starts the engine; where systemctl exists but systemd
 * is not the init system (a container, a chroot, an image being built) it writes and enables
 * the unit for the next boot and says it started nothing; where there is no systemctl it
 * refuses and writes nothing. --root installs into another root (an image), as systemctl's does.
 */
export function registerInstall(program: Command, output: () => Output): void {
  program
    .command("install")
    .description("install the engine as a system service: --systemd writes, enables and starts engine.service (root)")
    .option("--systemd", "a systemd unit (the only kind so far)")
    .option("--dry-run", "print the unit and where it would go; change nothing")
    .option("--root <dir>", "install into this root directory instead of / (an image being built): enabled, not started")
    .option("--force", "replace an engine.service that `engine install` did not write")
    .action((options: { systemd?: boolean; dryRun?: boolean; root?: string; force?: boolean }) => {
      if (!options.systemd) throw new CliError("say what to install: `engine install --systemd` (the only kind so far)", "usage");
      const { command, fromSource } = engineCommand();
      const unit = systemdUnit({
        command,
        stateDirectory: stateDirectoryOf(program.opts<{ dataDir?: string }>().dataDir),
        version: VERSION,
      });
      const root = options.root === undefined ? undefined : resolve(options.root);
      const path = join(root ?? "/", UNIT_DIR, UNIT_NAME);
      if (options.dryRun) {
        emit(output(), { path, unit, dry_run: true }, () => process.stdout.write(`# would write ${path}\n${unit}`));
        return;
      }
      const outcome = install(unit, path, root, options.force === true);
      const source = fromSource
        ? `\nnote: the unit runs this engine from source (${command.join(" ")}); for a lasting unit, build the binary (\`npm run build && sudo install dist/engine /usr/local/bin/engine\`) and install with it`
        : "";
      emit(output(), outcome, () => process.stdout.write(`${outcome.note}${source}\n`));
    });

  program
    .command("uninstall")
    .description("stop, disable and remove the engine.service that `engine install --systemd` wrote (services keep running)")
    .option("--systemd", "the systemd unit (the default, and the only kind so far)")
    .option("--dry-run", "say what would be done; change nothing")
    .option("--root <dir>", "uninstall from this root directory instead of /")
    .action((options: { dryRun?: boolean; root?: string }) => {
      const root = options.root === undefined ? undefined : resolve(options.root);
      const path = join(root ?? "/", UNIT_DIR, UNIT_NAME);
      const outcome = uninstall(path, root, options.dryRun === true);
      emit(output(), outcome, () => process.stdout.write(`${outcome.note}\n`));
    });
}

function install(unit: string, path: string, root: string | undefined, force: boolean): Outcome {
  const ctl = systemctl(root);
  if (!ctl) {
    throw new CliError(
      "there is no systemctl on this machine, so no systemd to install into; nothing was written (`engine install --systemd --dry-run` prints the unit)",
      "systemd_missing",
    );
  }
  const existing = existsSync(path) ? readFileSync(path, "utf8") : null;
  if (existing !== null && !isOurUnit(existing) && !force) {
    throw new CliError(`${path} exists and \`engine install\` did not write it; nothing was changed (--force replaces it)`, "unit_exists");
  }
  try {
    mkdirSync(dirname(path), { recursive: true, mode: 0o755 });
    // Written whole or not at all: a half-written unit must never be what systemd reads.
    writeFileSync(`${path}.tmp`, unit, { mode: 0o644 });
    renameSync(`${path}.tmp`, path);
  } catch (error) {
    rmSync(`${path}.tmp`, { force: true });
    const code = (error as NodeJS.ErrnoException).code;
    throw new CliError(
      `cannot write ${path}: ${(error as Error).message}${code === "EACCES" || code === "EPERM" ? " (run it as root: sudo engine install --systemd)" : ""}`,
      "unit_not_written",
    );
  }
  const undo = () => {
    if (existing === null) rmSync(path, { force: true });
    else writeFileSync(path, existing, { mode: 0o644 });
  };
  const live = root === undefined && existsSync(SYSTEMD_RUNNING);
  const steps = live ? [["daemon-reload"], ["enable", "--now", UNIT_NAME]] : [["enable", UNIT_NAME]];
  for (const step of steps) {
    const result = ctl.run(step);
    if (!result.ok) {
      undo();
      throw new CliError(
        `systemctl ${step.join(" ")} failed: ${result.output || "no message"}; ${existing === null ? `${path} was removed again` : `${path} was put back as it was`}`,
        "systemctl_failed",
      );
    }
  }
  const verb = existing === null ? "wrote" : "rewrote";
  const note = live
    ? `${verb} ${path}, enabled and started it: \`systemctl status engine\` shows it, \`journalctl -u engine\` its log`
    : root !== undefined
      ? `${verb} ${path} and enabled it in ${root}: the engine starts at that system's next boot; nothing was started here`
      : `${verb} ${path} and enabled it for the next boot, but started nothing: systemd is not running on this machine (PID 1 is ${initName()}, and there is no ${SYSTEMD_RUNNING}). Run \`engine serve\` to start the engine now`;
  return { unit, path, written: true, enabled: true, started: live, note };
}

function uninstall(path: string, root: string | undefined, dryRun: boolean): Outcome {
  if (!existsSync(path)) {
    return {
      unit: "",
      path,
      written: false,
      enabled: false,
      started: false,
      note: `${UNIT_NAME} is not installed (there is no ${path}); nothing to do`,
    };
  }
  const text = readFileSync(path, "utf8");
  if (!isOurUnit(text)) {
    throw new CliError(`${path} was not written by \`engine install\`; it is left as it is (remove it yourself)`, "unit_not_ours");
  }
  const live = root === undefined && existsSync(SYSTEMD_RUNNING);
  const steps = live ? [["disable", "--now", UNIT_NAME], ["daemon-reload"]] : [["disable", UNIT_NAME]];
  const after =
    "services keep running (the next `engine serve` adopts them; stop them first with `engine services stop --all` to end them); the data dir is kept";
  if (dryRun) {
    const plan = [
      ...steps.slice(0, 1).map((s) => `systemctl ${s.join(" ")}`),
      `rm ${path}`,
      ...steps.slice(1).map((s) => `systemctl ${s.join(" ")}`),
    ];
    return { unit: text, path, written: true, enabled: true, started: live, note: `would run: ${plan.join("; ")}\n${after}` };
  }
  const ctl = systemctl(root);
  if (ctl) {
    const [disable, ...rest] = steps;
    const result = ctl.run(disable ?? []);
    if (!result.ok)
      throw new CliError(
        `systemctl ${(disable ?? []).join(" ")} failed: ${result.output || "no message"}; ${path} is kept`,
        "systemctl_failed",
      );
    rmSync(path, { force: true });
    for (const step of rest) ctl.run(step);
  } else {
    rmSync(path, { force: true });
  }
  const stopped = live ? "stopped the engine, " : "";
  return { unit: text, path, written: false, enabled: false, started: false, note: `${stopped}disabled and removed ${path}; ${after}` };
}
