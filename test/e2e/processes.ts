import { expect } from "bun:test";
import type { Subprocess } from "bun";
import { type Browser, chromium } from "playwright-core";
import { eventually, runCli } from "../helpers";

/** CHROMIUM_ARGS are the flags the issue asks for: headless, no sandbox, nothing phoning home. */
export const CHROMIUM_ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-background-networking",
  "--disable-component-update",
  "--no-first-run",
  "--disable-sync",
];

/** launchChromium starts Debian's headless Chromium through playwright-core. */
export function launchChromium(): Promise<Browser> {
  return chromium.launch({ executablePath: "/usr/bin/chromium", args: CHROMIUM_ARGS });
}

/** Running is a child process whose output is collected as it arrives. */
export interface Running {
  proc: Subprocess<"ignore", "pipe", "pipe">;
  stdout(): string;
  stderr(): string;
}

const BASE_ENV = { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: process.env.HOME ?? "/tmp" };

/**
 * Children starts programs for one test file and ends them all in `stopAll` (SIGTERM, then
 * SIGKILL after 5 s), so no test leaves a process behind.
 */
export class Children {
  readonly #procs: Subprocess[] = [];

  start(command: string[], env: Record<string, string> = {}): Running {
    const proc = Bun.spawn(command, { env: { ...BASE_ENV, ...env }, stdin: "ignore", stdout: "pipe", stderr: "pipe" });
    this.#procs.push(proc);
    const out = { stdout: "", stderr: "" };
    const pump = async (stream: ReadableStream<Uint8Array>, key: "stdout" | "stderr") => {
      const decoder = new TextDecoder();
      const reader = stream.getReader();
      for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read())
        out[key] += decoder.decode(chunk.value, { stream: true });
    };
    void pump(proc.stdout, "stdout");
    void pump(proc.stderr, "stderr");
    return { proc, stdout: () => out.stdout, stderr: () => out.stderr };
  }

  async stopAll(): Promise<void> {
    for (const child of this.#procs) if (child.exitCode === null) child.kill("SIGTERM");
    await Promise.all(this.#procs.map((child) => Promise.race([child.exited, Bun.sleep(5000)])));
    for (const child of this.#procs) if (child.exitCode === null) child.kill("SIGKILL");
  }
}

/** cloudListening waits for a started engine-cloud's "listening" log line and returns its public URL. */
export async function cloudListening(cloud: Running): Promise<string> {
  const listening = await eventually(
    () => {
      if (cloud.proc.exitCode !== null) throw new Error(`engine-cloud exited: ${cloud.stdout()} ${cloud.stderr()}`);
      const line = cloud
        .stdout()
        .split("\n")
        .find((l) => l.includes('"engine-cloud listening"'));
      return line ? (JSON.parse(line) as { public_url: string }) : null;
    },
    { timeoutMs: 30_000 },
  );
  return listening.public_url;
}

/** mintSession mints a console session with the operator's CLI (`engine-cloud sessions mint <args>`) and returns it. */
export async function mintSession(cloudBinary: string, dataDir: string, ...args: string[]): Promise<string> {
  const minted = await runCli(["--data-dir", dataDir, "sessions", "mint", ...args], {}, [cloudBinary]);
  expect(minted.code).toBe(0);
  return minted.stdout.trim().split("\n").at(-1) ?? "";
}

/** userCodeIn reads the user code out of the box `engine link` prints: the line after "enter the code:". */
export function userCodeIn(stdout: string): string | undefined {
  const lines = stdout.split("\n").map((line) => line.replace(/[│┌┐└┘─]/g, "").trim());
  const at = lines.indexOf("and enter the code:");
  return at >= 0 ? lines.slice(at + 1).find((line) => line.length > 0) : undefined;
}

/** LinkEvent is one JSON line of `engine link --json`. */
export interface LinkEvent {
  event: string;
  user_code?: string;
  verification_uri_complete?: string;
}

/** linkEvent waits until a running `engine link --json` has printed the named event, and returns it. */
export function linkEvent(linking: Running, name: string, timeoutMs = 20_000): Promise<LinkEvent> {
  return eventually(
    () =>
      linking
        .stdout()
        .split("\n")
        .filter((line) => line.startsWith("{"))
        .map((line) => JSON.parse(line) as LinkEvent)
        .find((event) => event.event === name),
    { timeoutMs },
  );
}
