import { basename } from "node:path";
import type { ManagedDatabase } from "./hooks";

/** stopCommandOf is a managed database's own clean stop (`pg_ctl stop -m fast`, ...); null: none, or it cannot be built. */
export function stopCommandOf({ adapter, instance }: ManagedDatabase): string[] | null {
  try {
    return adapter.stopCommand(instance);
  } catch {
    return null;
  }
}

/**
 * runStopCommand runs a database's own clean stop and says whether it succeeded; when it
 * fails (or cannot run) it says why in the service's log, and the caller sends SIGTERM
 * instead. SIGKILL still waits for stop_timeout_s either way.
 */
export async function runStopCommand(argv: string[], env: Record<string, string>, note: (line: string) => void): Promise<boolean> {
  try {
    const proc = Bun.spawn(argv, { env, stdin: "ignore", stdout: "pipe", stderr: "pipe" });
    const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
    if (code === 0) return true;
    const why = `${out}\n${err}`.trim().split("\n").slice(-2).join(" | ");
    note(`stop: ${describeStopCommand(argv)} failed (exit ${code}: ${why}); sending SIGTERM`);
  } catch (error) {
    note(`stop: could not run the stop command (${(error as Error).message}); sending SIGTERM`);
  }
  return false;
}

/** describeStopCommand names a stop command for logs and Diagnosis: "pg_ctl stop -m fast", without paths or the setpriv prefix. */
export function describeStopCommand(argv: string[]): string {
  const start = argv.indexOf("--") >= 0 && basename(argv[0] ?? "") === "setpriv" ? argv.indexOf("--") + 1 : 0;
  let words = argv.slice(start);
  // `sh -c <script> <file> <tool> ...` hands the tool a secret from a file (Redis's REDISCLI_AUTH): describe the tool.
  if (basename(words[0] ?? "") === "sh" && words[1] === "-c") words = words.slice(4);
  const program = basename(words[0] ?? "");
  // Keep the verbs and flags, not the paths nor the long options that say how to connect: "pg_ctl stop -m fast", "mariadb-admin shutdown".
  const rest: string[] = [];
  for (let index = 1; index < words.length; index++) {
    const word = words[index] as string;
    if (word === "-D") {
      index++;
      continue;
    }
    if (word === "-W" || word.startsWith("/") || word.startsWith("--")) continue;
    rest.push(word);
  }
  return [program, ...rest].join(" ");
}
