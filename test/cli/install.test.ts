import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, lstatSync, readFileSync, readlinkSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { systemdUnit, systemdWord } from "../../cli/systemd";
import { VERSION } from "../../src/lib/version";
import { ENGINE_ENTRY, REPO_ROOT, runCli, tempDir } from "../helpers";

/**
 * `engine install --systemd` and `engine uninstall`, run as a user runs them. They never touch
 * this machine's /etc/systemd: they install into a --root, or into a private mount namespace
 * with a tmpfs over /etc/systemd/system. The unit is checked by systemd's own reader,
 * `systemd-analyze verify` (Debian's systemd package).
 */

const dirs: string[] = [];
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});
const scratch = () => {
  const dir = tempDir("engine-install-");
  dirs.push(dir);
  return dir;
};

const unitIn = (root: string) => join(root, "etc", "systemd", "system", "engine.service");
const wantsIn = (root: string) => join(root, "etc", "systemd", "system", "multi-user.target.wants", "engine.service");
const SYSTEMD_ANALYZE = Bun.which("systemd-analyze");
// The source CLI: ExecStart is Bun and the CLI's entry, as the command prints.
const EXEC = ENGINE_ENTRY.join(" ");

const SYSTEMCTL = Bun.which("systemctl");
if (!SYSTEMCTL) console.warn("skipping the installs: systemctl is not installed (Debian package systemd; .ci/run installs it)");
if (!SYSTEMD_ANALYZE) {
  console.warn("skipping `systemd-analyze verify`: systemd-analyze is not installed (Debian package systemd; .ci/run installs it)");
}

describe("the unit", () => {
  test("fits the shim design: the daemon alone is signalled, cgroups are delegated, the data dir is systemd's", async () => {
    const dry = await runCli(["install", "--systemd", "--dry-run"]);
    expect(dry.code).toBe(0);
    expect(dry.stderr).toBe("");
    const [where, ...rest] = dry.stdout.split("\n");
    expect(where).toBe("# would write /etc/systemd/system/engine.service");
    const unit = rest.join("\n");
    const directives = unit.split("\n").filter((line) => line !== "" && !line.startsWith("#"));
    expect(directives).toEqual([
      "[Unit]",
      "Description=engine: a self-healing platform for one GPU workstation",
      "After=network-online.target",
      "Wants=network-online.target",
      "[Service]",
      "Type=simple",
      "StateDirectory=engine",
      "StateDirectoryMode=0711",
      "Environment=ENGINE_DATA_DIR=%S/engine",
      "Environment=MIMALLOC_PURGE_DELAY=-1",
      `ExecStart=${EXEC} serve`,
      `ExecReload=${EXEC} restart`,
      "Restart=on-failure",
      "RestartSec=1",
      "KillMode=process",
      "Delegate=yes",
      "LimitNOFILE=65536",
      "[Install]",
      "WantedBy=multi-user.target",
    ]);
    expect(unit).toStartWith("# engine.service, written by `engine install --systemd` (engine ");
  });

  test("--dry-run --json gives the path and the unit; a --data-dir under /var/lib becomes its StateDirectory", async () => {
    const dry = await runCli(["--json", "--data-dir", "/var/lib/engine-lab", "install", "--systemd", "--dry-run"]);
    expect(dry.code).toBe(0);
    const body = JSON.parse(dry.stdout) as { path: string; unit: string; dry_run: boolean };
    expect(body.path).toBe("/etc/systemd/system/engine.service");
    expect(body.dry_run).toBe(true);
    expect(body.unit).toContain("\nStateDirectory=engine-lab\n");
    expect(body.unit).toContain("\nEnvironment=ENGINE_DATA_DIR=%S/engine-lab\n");
  });

  test.each([
    { args: ["install"], message: "say what to install: `engine install --systemd` (the only kind so far) [usage]" },
    {
      args: ["--data-dir", "/srv/engine", "install", "--systemd", "--dry-run"],
      message:
        "the unit keeps the engine's data under /var/lib (StateDirectory=); --data-dir /srv/engine is not under it: give a --data-dir under /var/lib, or none for /var/lib/engine [data_dir_outside_state]",
    },
    {
      args: ["--data-dir", "/var/lib", "install", "--systemd", "--dry-run"],
      message:
        "the unit keeps the engine's data under /var/lib (StateDirectory=); --data-dir /var/lib is not under it: give a --data-dir under /var/lib, or none for /var/lib/engine [data_dir_outside_state]",
    },
  ])("refuses $args with one line", async ({ args, message }) => {
    const refused = await runCli([...args]);
    expect(refused).toEqual({ code: 1, stdout: "", stderr: `engine: ${message}\n` });
  });

  test("docs/operations.md shows the unit the command writes for /usr/local/bin/engine", () => {
    const doc = readFileSync(join(REPO_ROOT, "docs", "operations.md"), "utf8");
    const shown = /```ini\n(# engine\.service, written by[\s\S]*?)```/.exec(doc)?.[1] ?? "";
    const generated = systemdUnit({ command: ["/usr/local/bin/engine"], stateDirectory: "engine", version: VERSION });
    // The version in the first line moves with each release; the rest must not drift.
    expect(shown.replace(/\(engine [^)]+\)/, "(engine X)")).toBe(generated.replace(/\(engine [^)]+\)/, "(engine X)"));
  });

  test.each([
    ["/usr/local/bin/engine", "/usr/local/bin/engine"],
    ["/opt/my engine/bin/engine", `"/opt/my engine/bin/engine"`],
    ["/opt/100%/engine", "/opt/100%%/engine"],
    ["/opt/$HOME/engine", "/opt/$$HOME/engine"],
    ['/opt/a"b\\c', `"/opt/a\\"b\\\\c"`],
  ])("an Exec word %p is written %p", (word, written) => {
    expect(systemdWord(word)).toBe(written);
  });

  test.skipIf(!SYSTEMD_ANALYZE)("systemd-analyze verify reads it without a complaint, odd paths included", () => {
    const dir = scratch();
    // An executable under a path that needs quoting and escaping, as an ExecStart may name.
    const odd = join(dir, "my engine 100%");
    Bun.spawnSync(["mkdir", "-p", odd]);
    Bun.spawnSync(["cp", process.execPath, join(odd, "engine")]);
    for (const command of [[join(odd, "engine")], ENGINE_ENTRY]) {
      const path = join(dir, "engine.service");
      writeFileSync(path, systemdUnit({ command, stateDirectory: "engine", version: "1.2.3" }));
      const verify = Bun.spawnSync([SYSTEMD_ANALYZE as string, "verify", path], { stdout: "pipe", stderr: "pipe" });
      // verify exits 0 even for unknown keys or bad values; it says so on stderr, which must be empty.
      expect({ code: verify.exitCode, output: `${verify.stdout}${verify.stderr}` }).toEqual({ code: 0, output: "" });
    }
  });
});

describe("engine install --systemd --root / engine uninstall --root", () => {
  test.skipIf(!SYSTEMCTL)(
    "installs into a root: written, enabled for its next boot, accepted by systemd-analyze; uninstall takes it away",
    async () => {
      const root = scratch();
      const installed = await runCli(["install", "--systemd", "--root", root]);
      expect(installed.code).toBe(0);
      expect(installed.stdout).toStartWith(
        `wrote ${unitIn(root)} and enabled it in ${root}: the engine starts at that system's next boot; nothing was started here\n`,
      );
      expect(installed.stdout).toContain("note: the unit runs this engine from source");
      expect(lstatSync(wantsIn(root)).isSymbolicLink()).toBe(true);
      expect(readlinkSync(wantsIn(root))).toBe("/etc/systemd/system/engine.service");
      const unit = readFileSync(unitIn(root), "utf8");
      expect(unit).toContain(`\nExecStart=${EXEC} serve\n`);
      expect(lstatSync(unitIn(root)).mode & 0o777).toBe(0o644);
      if (SYSTEMD_ANALYZE) {
        const verify = Bun.spawnSync([SYSTEMD_ANALYZE, "verify", unitIn(root)], { stdout: "pipe", stderr: "pipe" });
        expect({ code: verify.exitCode, output: `${verify.stdout}${verify.stderr}` }).toEqual({ code: 0, output: "" });
      }

      const again = await runCli(["install", "--systemd", "--root", root]);
      expect(again.code).toBe(0);
      expect(again.stdout).toStartWith(`rewrote ${unitIn(root)} and enabled it in ${root}`);

      const plan = await runCli(["uninstall", "--root", root, "--dry-run"]);
      expect(plan.code).toBe(0);
      expect(plan.stdout).toStartWith(`would run: systemctl disable engine.service; rm ${unitIn(root)}\n`);
      expect(existsSync(unitIn(root))).toBe(true);

      const removed = await runCli(["uninstall", "--root", root]);
      expect(removed.code).toBe(0);
      expect(removed.stdout).toBe(
        `disabled and removed ${unitIn(root)}; services keep running (the next \`engine serve\` adopts them; stop them first with \`engine services stop --all\` to end them); the data dir is kept\n`,
      );
      expect(existsSync(unitIn(root))).toBe(false);
      expect(existsSync(wantsIn(root))).toBe(false);

      const nothing = await runCli(["uninstall", "--systemd", "--root", root]);
      expect(nothing).toEqual({
        code: 0,
        stdout: `engine.service is not installed (there is no ${unitIn(root)}); nothing to do\n`,
        stderr: "",
      });
    },
  );

  test.skipIf(!SYSTEMCTL)("a unit it did not write is neither replaced (without --force) nor removed", async () => {
    const root = scratch();
    Bun.spawnSync(["mkdir", "-p", join(root, "etc", "systemd", "system")]);
    const mine = "[Service]\nExecStart=/usr/bin/my-engine\n";
    writeFileSync(unitIn(root), mine);
    const refused = await runCli(["install", "--systemd", "--root", root]);
    expect(refused).toEqual({
      code: 1,
      stdout: "",
      stderr: `engine: ${unitIn(root)} exists and \`engine install\` did not write it; nothing was changed (--force replaces it) [unit_exists]\n`,
    });
    const kept = await runCli(["uninstall", "--root", root]);
    expect(kept.code).toBe(1);
    expect(kept.stderr).toBe(
      `engine: ${unitIn(root)} was not written by \`engine install\`; it is left as it is (remove it yourself) [unit_not_ours]\n`,
    );
    expect(readFileSync(unitIn(root), "utf8")).toBe(mine);
    expect(existsSync(wantsIn(root))).toBe(false);

    const forced = await runCli(["install", "--systemd", "--root", root, "--force"]);
    expect(forced.code).toBe(0);
    expect(forced.stdout).toStartWith(`rewrote ${unitIn(root)}`);
    expect(readFileSync(unitIn(root), "utf8")).toStartWith("# engine.service, written by `engine install --systemd`");
  });

  test("without systemctl it refuses and writes nothing", async () => {
    const root = scratch();
    const refused = await runCli(["install", "--systemd", "--root", root], { PATH: join(root, "no-bin") });
    expect(refused).toEqual({
      code: 1,
      stdout: "",
      stderr:
        "engine: there is no systemctl on this machine, so no systemd to install into; nothing was written (`engine install --systemd --dry-run` prints the unit) [systemd_missing]\n",
    });
    expect(existsSync(join(root, "etc"))).toBe(false);
  });
});

// Without --root, on this machine, in a mount namespace of its own: /etc/systemd/system is a
// fresh tmpfs there, so the install and the uninstall change nothing outside. Where systemd is
// the init system the command would start the engine for real, so the test does not run there.
const systemdRuns = existsSync("/run/systemd/system");
const canUnshare =
  !systemdRuns &&
  Bun.which("systemctl") !== null &&
  Bun.spawnSync(["unshare", "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs tmpfs /etc/systemd/system"], {
    stdout: "ignore",
    stderr: "ignore",
  }).exitCode === 0;
if (!canUnshare) {
  console.warn(
    systemdRuns
      ? "skipping the install without --root: systemd runs this machine, and the test would start an engine under it"
      : "skipping the install without --root: it needs systemctl and a private mount namespace (unshare --mount, as root)",
  );
}

describe("engine install --systemd where systemctl exists but systemd is not PID 1", () => {
  test.skipIf(!canUnshare)("writes and enables the unit for the next boot, says it started nothing, and uninstall undoes it", () => {
    const script = [
      "mount -t tmpfs tmpfs /etc/systemd/system",
      `"$@" install --systemd; echo "install=$?"`,
      "readlink /etc/systemd/system/multi-user.target.wants/engine.service",
      `"$@" uninstall; echo "uninstall=$?"`,
      `echo "left=[$(ls -A /etc/systemd/system)]"`,
    ].join("\n");
    const run = Bun.spawnSync(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", ...ENGINE_ENTRY], {
      stdout: "pipe",
      stderr: "pipe",
      env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: process.env.HOME ?? "/tmp" },
    });
    const pid1 = readFileSync("/proc/1/comm", "utf8").trim();
    const lines = run.stdout.toString().split("\n");
    expect(lines[0]).toBe(
      `wrote /etc/systemd/system/engine.service and enabled it for the next boot, but started nothing: systemd is not running on this machine (PID 1 is ${pid1}, and there is no /run/systemd/system). Run \`engine serve\` to start the engine now`,
    );
    expect(lines).toContain("install=0");
    expect(lines).toContain("/etc/systemd/system/engine.service");
    expect(lines).toContain("uninstall=0");
    expect(lines.find((line) => line.startsWith("disabled and removed /etc/systemd/system/engine.service;"))).toBeDefined();
    // Nothing is left in the namespace's /etc/systemd/system: the unit and its link are gone.
    expect(lines).toContain("left=[]");
    expect(run.exitCode).toBe(0);
  });
});
