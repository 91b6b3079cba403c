import type { BuildLog } from "./log";

/** How long a step waits for its pipes to close once its process group is gone. */
const PIPE_GRACE_MS = 500;
/** How many output lines a step keeps for its caller (the log has them all). */
const KEPT_LINES = 200;

/** StepResult is how one child process of a build ended. */
export interface StepResult {
  exitCode: number | null;
  signalCode: string | null;
  /** spawnError is set when the process could not start at all. */
  spawnError: string | null;
  /** output holds the step's last lines of stdout and stderr, interleaved as they came, redacted. */
  output: string[];
}

export interface StepOptions {
  cwd: string;
  env: Record<string, string>;
  log: BuildLog;
  /** stop kills the step's whole process group when it aborts. */
  stop: AbortSignal;
  /** echo writes the step's output to the log; it defaults to true. */
  echo?: boolean;
}

/**
 * runStep runs one command of a build in its own process group (setsid), streams its output
 * into the build log line by line, and kills the group when `stop` aborts. Once the command has
 * exited the group is killed as well, so nothing it started in the background outlives it.
 */
export async function runStep(argv: string[], options: StepOptions): Promise<StepResult> {
  const output: string[] = [];
  const keep = (line: string) => {
    const clean = options.log.redact(line);
    if (options.echo !== false) options.log.line(line);
    output.push(clean);
    if (output.length > KEPT_LINES) output.shift();
  };
  let proc: ReturnType<typeof Bun.spawn<"ignore", "pipe", "pipe">>;
  try {
    proc = Bun.spawn(argv, { cwd: options.cwd, env: options.env, stdin: "ignore", stdout: "pipe", stderr: "pipe", detached: true });
  } catch (error) {
    return { exitCode: null, signalCode: null, spawnError: error instanceof Error ? error.message : String(error), output };
  }
  const kill = () => killProcessGroup(proc.pid);
  options.stop.addEventListener("abort", kill, { once: true });
  if (options.stop.aborted) kill();
  const readers = [pumpLines(proc.stdout, keep), pumpLines(proc.stderr, keep)];
  try {
    await proc.exited;
    kill();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const drained = Promise.all(readers.map((reader) => reader.done));
    const late = new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(false), PIPE_GRACE_MS);
    });
    // A process that left the group (setsid of its own) may hold the pipes open forever.
    if (!(await Promise.race([drained.then(() => true), late]))) for (const reader of readers) reader.cancel();
    clearTimeout(timer);
    await drained;
  } finally {
    options.stop.removeEventListener("abort", kill);
  }
  return { exitCode: proc.exitCode, signalCode: proc.signalCode === null ? null : String(proc.signalCode), spawnError: null, output };
}

/** killProcessGroup sends SIGKILL to the process group led by pid; a group already gone is fine. */
function killProcessGroup(pid: number): void {
  try {
    process.kill(-pid, "SIGKILL");
  } catch {
    // ESRCH: every member has exited.
  }
}

function pumpLines(stream: ReadableStream<Uint8Array>, onLine: (line: string) => void): { done: Promise<void>; cancel(): void } {
  const reader = stream.getReader();
  const decoder = new TextDecoder();
  const done = (async () => {
    let pending = "";
    try {
      for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) {
        pending += decoder.decode(chunk.value, { stream: true });
        // git and many build tools redraw progress with a bare carriage return; each redraw is a line.
        // A trailing "\r" stays pending: it may be the first half of "\r\n".
        const parts = pending.split(/\r\n|\r(?!$)|\n/);
        pending = parts.pop() ?? "";
        for (const part of parts) onLine(part);
      }
    } catch {
      // A cancelled read ends the output.
    }
    pending = (pending + decoder.decode()).replace(/\r$/, "");
    if (pending !== "") onLine(pending);
  })();
  return { done, cancel: () => void reader.cancel().catch(() => undefined) };
}
