/**
 * Package shell: what the engine knows of /bin/sh's command strings, for the services' commands
 * and the exec probes alike: how a string is run through the shell, and when it need not be.
 */

/** shellCommand runs a command string through /bin/sh, as Procfiles and systemd's ExecStart= with sh -c do. */
export function shellCommand(command: string): string[] {
  return ["/bin/sh", "-c", command];
}

/** SHELL_SYNTAX are the characters that make a command string the shell's: quotes, variables, globs, operators, redirections, assignments. */
export const SHELL_SYNTAX = /[|&;<>()$`\\"'*?[\]#~=%{}\n]/;

/**
 * SHELL_WORDS are the words that mean something to /bin/sh as a command's first word: its
 * builtins (dash's, echo and test included, which differ from their programs in details) and
 * its keywords. A command string that starts with one needs the shell.
 */
export const SHELL_WORDS = new Set([
  ...[".", ":", "[", "alias", "bg", "break", "cd", "chdir", "command", "continue", "echo", "eval", "exec", "exit", "export"],
  ...["false", "fc", "fg", "getopts", "hash", "jobs", "kill", "local", "printf", "pwd", "read", "readonly", "return", "set"],
  ...["shift", "source", "builtin", "test", "times", "trap", "true", "type", "ulimit", "umask", "unalias", "unset", "wait"],
  ...["if", "then", "else", "elif", "fi", "case", "esac", "for", "select", "while", "until", "do", "done", "in", "function"],
  ...["!", "[[", "time"],
]);

/**
 * plainCommand is the argv a command string stands for when running it needs nothing of the
 * shell: plain words separated by spaces or tabs (no quote, variable, glob, redirection,
 * operator or assignment: SHELL_SYNTAX), the first of them, after an optional `exec`, a
 * program and not one of the shell's words. Anything else is null, and runs under /bin/sh -c.
 * GNU make runs such a recipe line the same way, and bash -c execs a lone simple command: the
 * workload gets the argv the shell would have given it, one exec sooner and with no shell
 * process left waiting for it when the string did not say `exec`.
 */
export function plainCommand(argv: readonly string[]): string[] | null {
  if (argv.length !== 3 || argv[0] !== "/bin/sh" || argv[1] !== "-c") return null;
  const text = argv[2] ?? "";
  // Any whitespace but spaces and tabs (a newline, a carriage return) is the shell's too.
  if (SHELL_SYNTAX.test(text) || /[^\S \t]/.test(text)) return null;
  const words = text.split(/[ \t]+/).filter((word) => word !== "");
  if (words[0] === "exec") words.shift();
  const first = words[0];
  if (first === undefined || first.startsWith("-") || SHELL_WORDS.has(first)) return null;
  return words;
}
