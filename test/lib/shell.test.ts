import { describe, expect, test } from "bun:test";
import { plainCommand, shellCommand } from "../../src/lib/shell";

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
