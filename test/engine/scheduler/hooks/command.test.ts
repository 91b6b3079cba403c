import { afterAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { commandHook } from "../../../../src/engine/scheduler/hooks/command";
import { plainCommand, shellCommand } from "../../../../src/engine/services/spec";
import { tempDir } from "../../../helpers";
import { hostOf, launchOf } from "./launch";

const root = tempDir();
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe("plainCommand: a command string that needs nothing of the shell", () => {
  test.each([
    ["exec sleep 600", ["sleep", "600"]],
    ["sleep 600", ["sleep", "600"]],
    ["  exec\tpython3  app.py --port 8000 ", ["python3", "app.py", "--port", "8000"]],
    ["./run.sh serve", ["./run.sh", "serve"]],
    ["/usr/bin/env", ["/usr/bin/env"]],
    ["vllm serve Qwen/Qwen2.5-7B -tp 2", ["vllm", "serve", "Qwen/Qwen2.5-7B", "-tp", "2"]],
  ])("%j runs as %j", (text, argv) => {
    expect(plainCommand(shellCommand(text))).toEqual(argv);
  });

  test.each([
    // Shell syntax: variables, quotes, operators, redirections, globs, assignments, comments, escapes.
    "exec sleep $DELAY",
    "python3 -c 'print(1)'",
    'echo "hi"',
    "make && ./app",
    "a | b",
    "sleep 1; sleep 2",
    "app > out.log",
    "ls *.txt",
    "FOO=1 app",
    "app # a comment",
    "app \\\n --flag",
    "app\n",
    "app\r",
    "cd ~",
    "app `date`",
    "app {a,b}",
    // The shell's own words first: builtins (echo and test included), keywords, exec without a program.
    "cd /srv",
    "echo hello",
    "true",
    "test -f x",
    "export A",
    "ulimit -n 1024",
    "if",
    "exec",
    "exec -a name app",
    "",
    "   ",
  ])("%j stays with the shell", (text) => {
    expect(plainCommand(shellCommand(text))).toBeNull();
  });

  test("an argv deployed as a list is not a command string: it runs as given", () => {
    expect(plainCommand(["sleep", "600"])).toBeNull();
    expect(plainCommand(["/bin/sh", "-c", "sleep 1", "extra"])).toBeNull();
  });
});

describe("commandHook", () => {
  test("a plain string runs as its argv, with PWD its working directory as the shell would set it", () => {
    const launch = launchOf(root, { command: shellCommand("exec sleep 600") });
    launch.argv = launch.spec.command;
    commandHook.run(launch, hostOf(root));
    expect(launch.argv).toEqual(["sleep", "600"]);
    expect(launch.env.PWD).toBe(launch.cwd);
    expect(launch.spec.command).toEqual(["/bin/sh", "-c", "exec sleep 600"]); // the record keeps the string
  });

  test("a PWD the deploy sets is kept; a string with shell syntax keeps /bin/sh and the environment as it was", () => {
    const own = launchOf(root, { command: shellCommand("sleep 600"), env: { PWD: "/elsewhere" } });
    own.env = { PWD: "/elsewhere" };
    commandHook.run(own, hostOf(root));
    expect(own.argv).toEqual(["sleep", "600"]);
    expect(own.env.PWD).toBe("/elsewhere");

    const shell = launchOf(root, { command: shellCommand("exec sleep $DELAY") });
    shell.argv = shell.spec.command;
    commandHook.run(shell, hostOf(root));
    expect(shell.argv).toEqual(["/bin/sh", "-c", "exec sleep $DELAY"]);
    expect(shell.env).toEqual({});
  });
});
