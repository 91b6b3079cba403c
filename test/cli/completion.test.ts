import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { buildProgram } from "../../cli/program";
import { ENGINE_ENTRY, runCli, startTestEngine, type TestEngine, tempDir } from "../helpers";

/**
 * Shell completion for `engine`, generated from the commander program: bash's driven through
 * its own function in a real bash (as bash calls it on Tab: COMP_WORDS, COMP_CWORD, then
 * COMPREPLY), fish's through fish's own `complete -C`, zsh's checked by zsh's parser and its
 * registration with compinit. Service names come from a running engine.
 */

let engine: TestEngine;
let dir: string;
let bin: string;
const scripts: Record<string, string> = {};

beforeAll(async () => {
  engine = await startTestEngine();
  for (const name of ["web", "worker"]) {
    const deployed = await engine.json("POST", "/api/services", { body: { name, command: ["sleep", "600"] } });
    if (deployed.status !== 201) throw new Error(`deploy ${name}: ${deployed.status}`);
  }
  dir = tempDir("engine-completion-");
  // `engine` on the PATH, as a user has it: the scripts call it back for service names.
  bin = join(dir, "bin");
  mkdirSync(bin);
  writeFileSync(join(bin, "engine"), `#!/bin/sh\nexec ${ENGINE_ENTRY.map((word) => `'${word}'`).join(" ")} "$@"\n`);
  chmodSync(join(bin, "engine"), 0o755);
  // Two entries to complete paths against.
  mkdirSync(join(dir, "files", "models"), { recursive: true });
  writeFileSync(join(dir, "files", "dump.sql"), "");
  for (const shell of ["bash", "zsh", "fish"]) {
    const generated = await runCli(["completion", shell]);
    if (generated.code !== 0) throw new Error(`engine completion ${shell}: ${generated.stderr}`);
    scripts[shell] = join(dir, `engine.${shell}`);
    writeFileSync(scripts[shell] as string, generated.stdout);
  }
}, 60_000);
afterAll(async () => {
  await engine.close();
  rmSync(dir, { recursive: true, force: true });
});

const shellEnv = () => ({ PATH: `${bin}:/usr/bin:/bin`, HOME: dir, ENGINE_DATA_DIR: engine.dataDir });

/**
 * spawn runs a shell without blocking this process: the engine answering the scripts' service
 * lookups runs in it.
 */
async function spawn(argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const proc = Bun.spawn(argv, { cwd: join(dir, "files"), env: shellEnv(), stdout: "pipe", stderr: "pipe" });
  const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  return { code, stdout, stderr };
}

/**
 * bashComplete sources the script in a real bash and calls its function as bash does on Tab,
 * with the words typed so far and the one under the cursor (last), and returns COMPREPLY.
 */
async function bashComplete(words: string[]): Promise<string[]> {
  const script = [
    `source ${scripts.bash}`,
    `COMP_WORDS=(${words.map((word) => `'${word}'`).join(" ")})`,
    `COMP_CWORD=$(( \${#COMP_WORDS[@]} - 1 ))`,
    `COMP_LINE="\${COMP_WORDS[*]}"`,
    `COMP_POINT=\${#COMP_LINE}`,
    "_engine",
    `printf '%s\\n' "\${COMPREPLY[@]}"`,
  ].join("\n");
  const { code, stdout, stderr } = await spawn(["bash", "--noprofile", "--norc", "-c", script]);
  if (code !== 0) throw new Error(`bash: ${stderr}`);
  return stdout.split("\n").filter(Boolean).sort();
}

describe("bash", () => {
  test("the script registers its function for engine", () => {
    const run = Bun.spawnSync(["bash", "--noprofile", "--norc", "-c", `source ${scripts.bash} && complete -p engine`], {
      stdout: "pipe",
      stderr: "pipe",
    });
    expect(run.stdout.toString()).toBe("complete -F _engine engine\n");
    expect(run.stderr.toString()).toBe("");
  });

  test("every command of the program completes at the top, the hidden one does not", async () => {
    const program = buildProgram();
    const visible = program
      .createHelp()
      .visibleCommands(program)
      .map((command) => command.name());
    expect(visible).toContain("top");
    expect(visible).toContain("completion");
    expect(await bashComplete(["engine", ""])).toEqual([...visible].sort());
    expect(await bashComplete(["engine", "__"])).toEqual([]);
  });

  test.each([
    { words: ["engine", "serv"], expected: ["serve", "services"] },
    { words: ["engine", "services", "de"], expected: ["deploy"] },
    { words: ["engine", "--json", "services", "st"], expected: ["start", "stop"] },
    { words: ["engine", "services", "deploy", "api", "--ki"], expected: ["--kind"] },
    {
      words: ["engine", "top", "--"],
      expected: ["--data-dir", "--help", "--interval", "--json", "--once", "--token", "--url", "--version-flag"],
    },
    { words: ["engine", "install", "--s"], expected: ["--systemd"] },
    { words: ["engine", "completion", ""], expected: ["bash", "fish", "zsh"] },
    { words: ["engine", "tokens", "create", "--role", ""], expected: [] },
    // Options that take a directory or a file complete paths; so does a command after --.
    { words: ["engine", "--data-dir", "mo"], expected: ["models"] },
    { words: ["engine", "--data-dir", "=", "mo"], expected: ["models"] },
    { words: ["engine", "restore", "db", "du"], expected: ["dump.sql"] },
    { words: ["engine", "services", "deploy", "api", "--", "du"], expected: ["dump.sql"] },
    // Service names, from the running engine.
    { words: ["engine", "logs", ""], expected: ["web", "worker"] },
    { words: ["engine", "services", "stop", "w"], expected: ["web", "worker"] },
    { words: ["engine", "services", "delete", "wo"], expected: ["worker"] },
    { words: ["engine", "diagnose", "--json", ""], expected: ["web", "worker"] },
    { words: ["engine", "services", "deploy", "api", "--bind", "we"], expected: ["web"] },
    // One positional argument taken: logs wants no second service.
    { words: ["engine", "logs", "web", ""], expected: [] },
  ])("$words completes to $expected", async ({ words, expected }) => {
    expect(await bashComplete([...words])).toEqual([...expected]);
  });

  test("service names follow a typed --data-dir, and an engine that is not there completes none, quietly", async () => {
    const elsewhere = join(dir, "no-engine-here");
    expect(await bashComplete(["engine", "--data-dir", elsewhere, "logs", ""])).toEqual([]);
    expect(await bashComplete(["engine", "--data-dir", engine.dataDir, "logs", ""])).toEqual(["web", "worker"]);
  });
});

describe("engine __complete services", () => {
  test("prints one name a line, and nothing with status 0 when no engine answers", async () => {
    expect(await runCli(["--data-dir", engine.dataDir, "__complete", "services"])).toEqual({
      code: 0,
      stdout: "web\nworker\n",
      stderr: "",
    });
    expect(await runCli(["--data-dir", join(dir, "none"), "__complete", "services"], { ENGINE_PORT: "1" })).toEqual({
      code: 0,
      stdout: "",
      stderr: "",
    });
  });

  test("engine completion refuses a shell it does not know", async () => {
    const refused = await runCli(["completion", "tcsh"]);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toStartWith(
      "error: command-argument value 'tcsh' is invalid for argument 'shell'. Allowed choices are bash, zsh, fish.\n",
    );
  });
});

const ZSH = Bun.which("zsh");
const FISH = Bun.which("fish");
if (!ZSH) console.warn("skipping the zsh completion checks: zsh is not installed (Debian package zsh)");
if (!FISH) console.warn("skipping the fish completion checks: fish is not installed (Debian package fish)");

describe("zsh", () => {
  test.skipIf(!ZSH)("the script parses, and compinit registers _engine for engine", () => {
    const parse = Bun.spawnSync([ZSH as string, "-n", scripts.zsh as string], { stdout: "pipe", stderr: "pipe" });
    expect({ code: parse.exitCode, stderr: parse.stderr.toString() }).toEqual({ code: 0, stderr: "" });
    const load = Bun.spawnSync(
      [ZSH as string, "-f", "-c", `autoload -U compinit && compinit -u -D && source ${scripts.zsh} && print -r -- $_comps[engine]`],
      { stdout: "pipe", stderr: "pipe", env: shellEnv() },
    );
    expect({ out: load.stdout.toString(), err: load.stderr.toString() }).toEqual({ out: "_engine\n", err: "" });
  });
});

describe("fish", () => {
  /** fishComplete asks fish what it would offer for a command line (complete -C), names only. */
  async function fishComplete(line: string): Promise<string[]> {
    const run = await spawn([FISH as string, "--no-config", "-c", `source ${scripts.fish}; complete -C ${JSON.stringify(line)}`]);
    if (run.code !== 0 || run.stderr.length > 0) throw new Error(`fish: ${run.stderr}`);
    return run.stdout
      .split("\n")
      .filter(Boolean)
      .map((entry) => entry.split("\t")[0] ?? "")
      .sort();
  }

  test.skipIf(!FISH)("the script parses", () => {
    const parse = Bun.spawnSync([FISH as string, "--no-execute", scripts.fish as string], { stdout: "pipe", stderr: "pipe" });
    expect({ code: parse.exitCode, stderr: parse.stderr.toString() }).toEqual({ code: 0, stderr: "" });
  });

  test.skipIf(!FISH).each([
    { line: "engine serv", expected: ["serve", "services"] },
    { line: "engine services de", expected: ["deploy"] },
    { line: "engine services deploy api --ki", expected: ["--kind"] },
    { line: "engine completion ", expected: ["bash", "fish", "zsh"] },
    { line: "engine logs ", expected: ["web", "worker"] },
    { line: "engine services delete wo", expected: ["worker"] },
    { line: "engine restore db du", expected: ["dump.sql"] },
  ])("$line completes to $expected", async ({ line, expected }) => {
    expect(await fishComplete(line)).toEqual([...expected]);
  });
});
