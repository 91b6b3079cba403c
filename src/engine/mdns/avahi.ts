import { existsSync } from "node:fs";
import { connect } from "node:net";
import type { Subprocess } from "bun";
import type { Logger } from "../../lib/logger";
import type { LocalName } from "./names";

/** AVAHI_SOCKET is where a running avahi-daemon listens for nss-mdns and its own tools. */
export const AVAHI_SOCKET = "/run/avahi-daemon/socket";
const ESTABLISH_TIMEOUT_MS = 5000;
const EXIT_TIMEOUT_MS = 2000;

/**
 * avahiDaemonRunning is whether an avahi-daemon accepts connections on its socket. A socket
 * file alone is not enough: it stays behind when the daemon is killed.
 */
export async function avahiDaemonRunning(socketPath = AVAHI_SOCKET, timeoutMs = 500): Promise<boolean> {
  if (!existsSync(socketPath)) return false;
  return await new Promise<boolean>((resolve) => {
    const socket = connect(socketPath);
    const finish = (running: boolean) => {
      clearTimeout(timer);
      socket.destroy();
      resolve(running);
    };
    const timer = setTimeout(() => finish(false), timeoutMs);
    socket.once("connect", () => finish(true));
    socket.once("error", () => finish(false));
  });
}

/**
 * avahiPublishCommands are the avahi-publish command lines that publish one name: one per
 * address for the A and AAAA records, and one for the `_https._tcp` service instance named
 * after the label on host `name`. `--no-reverse` because avahi-daemon already publishes the
 * reverse (PTR) record of the host's addresses and a second one is a local collision;
 * `--no-fail` so that each command waits for the daemon and publishes again after it restarts
 * instead of exiting.
 */
export function avahiPublishCommands(local: LocalName, port: number, addresses: string[], command = "avahi-publish"): string[][] {
  return [
    ...addresses.map((address) => [command, "--no-fail", "--address", "--no-reverse", local.name, address]),
    [command, "--no-fail", "--service", "--host", local.name, local.label, "_https._tcp", String(port), "path=/"],
  ];
}

interface Child {
  process: Subprocess<"ignore", "ignore", "pipe">;
  established: boolean;
  stopping: boolean;
  stderr: string;
  /** stderrRead settles when the child's stderr has been read to its end. */
  stderrRead: Promise<void>;
}

interface Entry {
  local: LocalName;
  children: Child[];
  /** settle ends a publish() waiting for this entry, with the error if it failed. */
  settle?: (error?: Error) => void;
}

/** AvahiBackendOptions configures the addresses and reports a name's changes outside calls. */
export interface AvahiBackendOptions {
  log: Logger;
  addresses: string[];
  /** command is the avahi-publish program, a name looked up in PATH or a path. */
  command: string;
  /**
   * onNameChange receives a name's later changes: an error when its avahi-publish exits or
   * loses the daemon, null when all of its records are established again.
   */
  onNameChange: (name: string, error: Error | null) => void;
}

/**
 * AvahiBackend publishes names through a running avahi-daemon, so that two mDNS responders do
 * not fight over UDP 5353 (homebridge#3077). Each record is one long-lived avahi-publish child
 * process; killing it withdraws the record, and avahi-daemon sends the goodbye.
 */
export class AvahiBackend {
  readonly #options: AvahiBackendOptions;
  readonly #entries = new Map<string, Entry>();

  constructor(options: AvahiBackendOptions) {
    this.#options = options;
  }

  /** start checks that avahi-publish is installed. */
  async start(): Promise<void> {
    if (!Bun.which(this.#options.command)) throw new Error(`${this.#options.command} is not installed (Debian package avahi-utils)`);
  }

  /** isPublished is whether every record of `name` is established with avahi-daemon. */
  isPublished(name: string): boolean {
    const entry = this.#entries.get(name);
    return entry?.children.every((child) => child.established) === true;
  }

  /**
   * publish starts the avahi-publish children for `local` (after ending those of an earlier
   * publication of the same name) and resolves when avahi-daemon has established every record.
   * It throws when a child exits or the records are not established within five seconds; the
   * children of the latter keep waiting for the daemon, and onNameChange reports when they succeed.
   */
  async publish(local: LocalName, port: number): Promise<void> {
    await this.unpublish(local.name);
    const entry: Entry = { local, children: [] };
    this.#entries.set(local.name, entry);
    const settled = new Promise<void>((resolve, reject) => {
      entry.settle = (error) => {
        entry.settle = undefined;
        if (error) reject(error);
        else resolve();
      };
    });
    for (const argv of avahiPublishCommands(local, port, this.#options.addresses, this.#options.command)) {
      try {
        entry.children.push(this.#spawn(entry, argv));
      } catch (error) {
        await this.unpublish(local.name);
        throw new Error(`cannot start ${argv.join(" ")}: ${(error as Error).message}`);
      }
    }
    const timer = setTimeout(
      () => entry.settle?.(new Error(`avahi-daemon did not establish ${local.name} within ${ESTABLISH_TIMEOUT_MS} ms; still waiting`)),
      ESTABLISH_TIMEOUT_MS,
    );
    try {
      await settled;
    } finally {
      clearTimeout(timer);
    }
  }

  /** unpublish ends the children of `name`, which withdraws its records; unknown names are ignored. */
  async unpublish(name: string): Promise<void> {
    const entry = this.#entries.get(name);
    if (!entry) return;
    this.#entries.delete(name);
    entry.settle?.(new Error(`${name} was unpublished`));
    await Promise.all(entry.children.map((child) => stopChild(child)));
  }

  /** stop ends every child; it is safe to call twice. */
  async stop(): Promise<void> {
    await Promise.all([...this.#entries.keys()].map((name) => this.unpublish(name)));
  }

  #spawn(entry: Entry, argv: string[]): Child {
    const subprocess = Bun.spawn(argv, { stdin: "ignore", stdout: "ignore", stderr: "pipe" });
    const child: Child = { process: subprocess, established: false, stopping: false, stderr: "", stderrRead: Promise.resolve() };
    const name = entry.local.name;
    // avahi-publish reports everything on stderr, its successes included.
    child.stderrRead = readLines(subprocess.stderr, (line) => {
      child.stderr = `${child.stderr}${line}\n`.slice(-2000);
      if (child.stopping) return;
      if (line.startsWith("Established under name")) {
        child.established = true;
        if (this.#entries.get(name) === entry && this.isPublished(name)) {
          if (entry.settle) entry.settle();
          else this.#options.onNameChange(name, null);
        }
      } else if (line.startsWith("Disconnected")) {
        child.established = false;
        this.#options.onNameChange(name, new Error(`avahi-daemon went away; avahi-publish is waiting to publish ${name} again`));
      }
    });
    void subprocess.exited.then(async (code) => {
      if (child.stopping) return;
      child.established = false;
      await child.stderrRead; // so that the error carries avahi-publish's own reason
      if (child.stopping) return;
      const reason = child.stderr.trim().split("\n").at(-1) || "no message";
      const error = new Error(`${argv.join(" ")} exited with code ${code}: ${reason}`);
      if (this.#entries.get(name) !== entry) return;
      if (entry.settle) entry.settle(error);
      else this.#options.onNameChange(name, error);
    });
    return child;
  }
}

async function stopChild(child: Child): Promise<void> {
  child.stopping = true;
  child.established = false;
  if (child.process.exitCode !== null || child.process.signalCode !== null) return;
  // SIGTERM lets avahi-publish free its entry group, so avahi-daemon sends the goodbye.
  child.process.kill("SIGTERM");
  let timer: ReturnType<typeof setTimeout> | undefined;
  const deadline = new Promise<boolean>((resolve) => {
    timer = setTimeout(() => resolve(false), EXIT_TIMEOUT_MS);
  });
  const exited = await Promise.race([child.process.exited.then(() => true), deadline]);
  clearTimeout(timer);
  if (!exited) {
    child.process.kill("SIGKILL");
    await child.process.exited;
  }
}

async function readLines(stream: ReadableStream<Uint8Array>, onLine: (line: string) => void): Promise<void> {
  const decoder = new TextDecoder();
  let buffered = "";
  const reader = stream.getReader();
  try {
    for (let read = await reader.read(); !read.done; read = await reader.read()) {
      buffered += decoder.decode(read.value, { stream: true });
      let newline = buffered.indexOf("\n");
      while (newline >= 0) {
        onLine(buffered.slice(0, newline));
        buffered = buffered.slice(newline + 1);
        newline = buffered.indexOf("\n");
      }
    }
  } catch {
    // The pipe closes when the child is killed.
  }
  if (buffered) onLine(buffered);
}
