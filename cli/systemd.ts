/**
 * systemd.ts writes the engine's systemd unit. It is pure (the command line in, the unit's
 * text out) so `engine install --systemd`, its --dry-run and the tests read the same unit.
 *
 * The unit follows the shim design: the daemon can stop, crash or restart while workloads keep
 * running under the shim launcher that holds them, so systemd must signal the daemon only
 * (KillMode=process) and let the daemon make cgroups for its runs under its own (Delegate=yes).
 */

/** UNIT_NAME is the unit `engine install --systemd` writes and `engine uninstall` removes. */
export const UNIT_NAME = "engine.service";
/** UNIT_DIR is where a system unit an administrator installs lives (systemd.unit(5)). */
export const UNIT_DIR = "/etc/systemd/system";
/** STATE_ROOT is systemd's StateDirectory= root for system units (%S). */
export const STATE_ROOT = "/var/lib";
/** UNIT_MARK starts the unit's first line: `engine uninstall` removes only a unit that has it. */
export const UNIT_MARK = "# engine.service, written by `engine install --systemd`";

export interface UnitOptions {
  /** command runs the engine: the binary, or Bun and the CLI's source entry. */
  command: string[];
  /** stateDirectory is the data dir relative to /var/lib (StateDirectory=). */
  stateDirectory: string;
  version: string;
}

/**
 * systemdWord quotes one word of an Exec line (systemd.service(5), "Command lines"): `%` is a
 * specifier and `$` a variable unless doubled; a word with a space, a quote or a backslash goes
 * in double quotes with `"` and `\` escaped.
 */
export function systemdWord(word: string): string {
  const escaped = word.replaceAll("%", "%%").replaceAll("$", "$$$$");
  if (escaped !== "" && !/[\s"'\\;]/.test(escaped)) return escaped;
  return `"${escaped.replaceAll("\\", "\\\\").replaceAll('"', '\\"')}"`;
}

/** execLine writes a command line for ExecStart= or ExecReload=. */
function execLine(command: string[]): string {
  return command.map(systemdWord).join(" ");
}

/** systemdUnit is the text of engine.service. */
export function systemdUnit({ command, stateDirectory, version }: UnitOptions): string {
  return `${UNIT_MARK} (engine ${version}).
# \`engine uninstall\` removes it; \`engine install --systemd\` writes it again. Change settings with
# \`systemctl edit engine\` (a drop-in: Environment=ENGINE_HOST=0.0.0.0, ENGINE_PORT=..., ENGINE_GPUS=...),
# which both keep.
[Unit]
Description=engine: a self-healing platform for one GPU workstation
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
# The data dir, ${STATE_ROOT}/${stateDirectory}: made by systemd, 0711 as a root engine keeps it.
StateDirectory=${stateDirectory}
StateDirectoryMode=0711
Environment=ENGINE_DATA_DIR=%S/${stateDirectory}
# Bun's allocator keeps the memory it frees (a setting read at start; set here, the daemon
# does not start itself again to set it). A drop-in may set a delay in ms instead.
Environment=MIMALLOC_PURGE_DELAY=-1
ExecStart=${execLine([...command, "serve"])}
# systemctl reload: a drain-and-restart. Requests in flight finish, then the daemon re-executes
# itself in place (the same pid, so systemd keeps watching it) and adopts the running workloads.
ExecReload=${execLine([...command, "restart"])}
# A crash, or exit 75 (a restart that could not re-execute), starts the daemon again.
Restart=on-failure
RestartSec=1
# Workloads outlive the daemon, held by its shim launcher: stopping or restarting the unit
# signals the daemon only, and the next daemon adopts them. \`engine services stop --all\`
# stops them.
KillMode=process
# The engine makes a cgroup for each run (memory limits, OOM evidence) under its own.
Delegate=yes
LimitNOFILE=65536

[Install]
WantedBy=multi-user.target
`;
}

/** isOurUnit says whether a unit file's text is one `engine install --systemd` wrote. */
export function isOurUnit(text: string): boolean {
  return text.startsWith(UNIT_MARK);
}
