import type { Command } from "commander";
import type { LinkStatus, LinkTunnel } from "../../src/contract/engine";
import { resolveConfig } from "../../src/engine/config";
import {
  CloudLinkClient,
  DEFAULT_CLOUD_URL,
  type DeviceLinkResponse,
  IdentityStore,
  type LinkClaimResponse,
  LinkError,
  type NodeIdentity,
  normalizeCloudUrl,
  type PollEvent,
  type ReportedMachine,
  reportedMachine,
} from "../../src/engine/link";
import { CliError, type EngineClient } from "../client";
import { formatPairs, type Output, printJson, printPairs } from "../output";

/** LinkCommandOptions lets tests replace the environment the cloud URL is read from. */
export interface LinkCommandOptions {
  env?: Record<string, string | undefined>;
  /** client reaches the running daemon, for the tunnel's state in `engine link status`. */
  client?: () => EngineClient;
}

/** TUNNEL_READ_TIMEOUT_MS bounds how long `engine link status` waits for the daemon to tell its tunnel's state. */
const TUNNEL_READ_TIMEOUT_MS = 3000;

/** TunnelView is the tunnel as `engine link status` shows it: the daemon's state, or why it could not be read. */
type TunnelView = LinkTunnel | { state: "unknown"; reason: string };

/**
 * readTunnel asks the running daemon for its tunnel's state: the identity is a file, but the
 * tunnel lives in the daemon. A daemon that does not answer is `unknown`, with why.
 */
async function readTunnel(client: (() => EngineClient) | undefined): Promise<TunnelView> {
  if (!client) return { state: "unknown", reason: "no engine to ask" };
  try {
    const status = await Promise.race([
      client().request<LinkStatus>("GET", "/api/link/status"),
      Bun.sleep(TUNNEL_READ_TIMEOUT_MS).then(() => {
        throw new Error(`the engine did not answer within ${TUNNEL_READ_TIMEOUT_MS / 1000} s`);
      }),
    ]);
    return status.tunnel ?? { state: "unknown", reason: "this engine predates the tunnel" };
  } catch (error) {
    const reason =
      error instanceof CliError && error.code === "daemon_not_running" ? "the engine is not running" : (error as Error).message;
    return { state: "unknown", reason };
  }
}

/** describeTunnel is the tunnel's line in `engine link status`. */
export function describeTunnel(tunnel: TunnelView): string {
  if (tunnel.state === "unknown") return `unknown: ${tunnel.reason} (the tunnel is kept by \`engine serve\`)`;
  if (tunnel.state === "connected") return `connected since ${tunnel.connected_at ?? tunnel.since}`;
  if (tunnel.state === "connecting") return `connecting${tunnel.last_error ? ` (last error: ${tunnel.last_error})` : ""}`;
  if (tunnel.state === "disconnected") {
    return `disconnected since ${tunnel.since}${tunnel.last_error ? `: ${tunnel.last_error}` : ""}${tunnel.next_attempt_at ? `; next attempt at ${tunnel.next_attempt_at}` : ""}`;
  }
  return tunnel.state === "not_linked" ? "not open: the engine has not read the identity yet" : tunnel.state;
}

interface LinkFlags {
  cloud?: string;
  key?: string;
  code?: string;
  force?: boolean;
}

/**
 * resolveCloudUrl picks the cloud: --cloud, else ENGINE_CLOUD_URL, else the stored identity's
 * cloud, else DEFAULT_CLOUD_URL (docs/decisions.md).
 */
export function resolveCloudUrl(flag: string | undefined, env: string | undefined, stored: string | undefined): string {
  return normalizeCloudUrl(flag || env || stored || DEFAULT_CLOUD_URL);
}

/**
 * registerLink adds `engine link` (device flow, --key, --code), `engine link status` and
 * `engine unlink`. They work on the data dir directly and need no daemon: a running daemon
 * reads the identity at its next metadata refresh.
 */
export function registerLink(program: Command, output: () => Output, options: LinkCommandOptions = {}): void {
  const env = () => options.env ?? process.env;
  const store = () => new IdentityStore(resolveConfig({ dataDir: program.opts<{ dataDir?: string }>().dataDir }).dataDir);

  const link = program
    .command("link")
    .description("link this machine to a cloud console: shows a code to approve there (or use --key / --code)")
    .option("--cloud <url>", `the console's URL (ENGINE_CLOUD_URL; default: the linked cloud, else ${DEFAULT_CLOUD_URL})`)
    .option("--key <key>", "enroll with a pre-authorized link key, without a browser")
    .option("--code <code>", "claim a link code (NL-...) made in the console")
    .option("--force", "link again even though this machine is already linked (replaces the identity)")
    .action(async (flags: LinkFlags) => {
      if (flags.key && flags.code) throw new CliError("pass either --key or --code, not both", "invalid_request");
      const identities = store();
      let current: NodeIdentity | null = null;
      try {
        current = identities.read();
      } catch (error) {
        // A damaged identity is replaced by --force; otherwise its message says how to get out.
        if (!flags.force) throw error;
      }
      if (current && !flags.force) {
        throw new CliError(
          `this machine is already linked as ${current.slug} (node ${current.node_id}) to ${current.cloud_url}; run \`engine unlink\` first, or pass --force to link again`,
          "already_linked",
        );
      }
      const cloudUrl = asCli(() => resolveCloudUrl(flags.cloud, env().ENGINE_CLOUD_URL, current?.cloud_url));
      warnIfCleartext(cloudUrl);
      const client = new CloudLinkClient({ cloudUrl });
      const machine = reportedMachine();
      const out = output();
      const claim = await asCliAsync(async () => {
        if (flags.key) return client.enrollWithKey(flags.key.trim(), machine);
        if (flags.code) return client.claimCode(flags.code.trim(), machine);
        return deviceFlow(client, machine, out);
      });
      const identity = identities.save(claim);
      if (out.json) writeJsonLine({ event: "linked", ...identity });
      else {
        process.stdout.write(
          `linked: this machine is ${identity.slug} (node ${identity.node_id}) in account ${identity.account_id}\n${formatPairs([
            ["cloud", identity.cloud_url],
            ["hosted base domain", identity.hosted_base_domain],
            ["identity", identities.path],
          ]).join("\n")}\n`,
        );
      }
    });

  link
    .command("status")
    .description("show whether this machine is linked, to which node, account and cloud (never the credential), and its tunnel's state")
    .action(async () => {
      const identities = store();
      const identity = identities.read();
      const tunnel = identity ? await readTunnel(options.client) : null;
      const value = identity
        ? { linked: true, ...identity, identity_path: identities.path, tunnel }
        : { linked: false, identity_path: identities.path };
      if (output().json) return printJson(value);
      if (!identity) {
        process.stdout.write("not linked: run `engine link` to link this machine to a cloud console\n");
        return;
      }
      printPairs([
        ["linked", "yes"],
        ["node", identity.node_id],
        ["slug", identity.slug],
        ["account", identity.account_id],
        ["cloud", identity.cloud_url],
        ["hosted base domain", identity.hosted_base_domain],
        ["linked at", identity.linked_at],
        ["metadata refreshed", identity.metadata_refreshed_at ?? "not yet"],
        ["tunnel", describeTunnel(tunnel ?? { state: "unknown", reason: "not read" })],
        ["identity", identities.path],
      ]);
    });

  program
    .command("unlink")
    .description("forget this machine's cloud identity (the console keeps listing the node until it is removed there)")
    .action(() => {
      const removed = store().remove();
      const value = removed
        ? { removed: true, identity_path: removed.path, ...(removed.identity ?? {}) }
        : { removed: false, identity_path: store().path };
      if (output().json) return printJson(value);
      if (!removed) {
        process.stdout.write("not linked: there was no identity to remove\n");
        return;
      }
      const who = removed.identity
        ? `node ${removed.identity.slug} (${removed.identity.node_id}) of account ${removed.identity.account_id} at ${removed.identity.cloud_url}`
        : "a damaged node identity";
      process.stdout.write(
        `unlinked: removed ${who} (${removed.path}); the node credential is gone from this machine, and the console still lists the node until it is removed there\n`,
      );
    });
}

/**
 * deviceFlow runs RFC 8628 from the machine's side: ask for a code, show it with the page to
 * enter it on, and poll until a signed-in human approves or denies it, the code expires, or
 * the user presses Ctrl-C.
 */
async function deviceFlow(client: CloudLinkClient, machine: ReportedMachine, out: Output): Promise<LinkClaimResponse> {
  const abort = new AbortController();
  const onInterrupt = () => abort.abort();
  process.on("SIGINT", onInterrupt);
  let spinner: Spinner | undefined;
  try {
    const device = await client.startDevice(machine, abort.signal);
    if (out.json) {
      writeJsonLine({
        event: "device",
        user_code: device.user_code,
        verification_uri: device.verification_uri,
        verification_uri_complete: device.verification_uri_complete,
        expires_in: device.expires_in,
        interval: device.interval,
        cloud_url: client.cloudUrl,
      });
    } else {
      process.stdout.write(deviceBox(device));
      if (process.stdout.isTTY) spinner = new Spinner(Date.now() + device.expires_in * 1000);
      else process.stdout.write("waiting for approval (Ctrl-C to stop)...\n");
    }
    const onEvent = (event: PollEvent) => {
      if (out.json) return writeJsonLine(event);
      const note = eventNote(event);
      if (!note) return;
      if (spinner) spinner.note(note);
      else process.stderr.write(`${note}\n`);
    };
    return await client.pollDevice(device, { signal: abort.signal, onEvent });
  } catch (error) {
    if (out.json && error instanceof LinkError) writeJsonLine({ event: "failed", code: error.code, message: error.message });
    throw error;
  } finally {
    spinner?.stop();
    process.off("SIGINT", onInterrupt);
  }
}

function eventNote(event: PollEvent): string | undefined {
  switch (event.event) {
    case "slow_down":
      return `the cloud asked to poll more slowly: every ${event.interval} s now`;
    case "rate_limited":
      return `the cloud is rate limiting; retrying in ${event.retry_after} s`;
    case "retrying":
      return `${event.reason}; retrying in ${event.delay_s} s`;
    default:
      return undefined;
  }
}

/** deviceBox frames the user code and the verification URLs so they stand out in a terminal. */
export function deviceBox(device: DeviceLinkResponse): string {
  const minutes = Math.max(1, Math.round(device.expires_in / 60));
  const lines = [
    "To link this machine, open this page in a browser signed in to the console:",
    "",
    `    ${device.verification_uri}`,
    "",
    "and enter the code:",
    "",
    `    ${device.user_code}`,
    "",
    "Or open this link, which carries the code:",
    "",
    `    ${device.verification_uri_complete}`,
    "",
    `The code expires in ${minutes} minute${minutes === 1 ? "" : "s"}.`,
  ];
  const width = Math.max(...lines.map((line) => line.length));
  const rule = "─".repeat(width + 4);
  return `┌${rule}┐\n${lines.map((line) => `│  ${line.padEnd(width)}  │`).join("\n")}\n└${rule}┘\n`;
}

/** Spinner shows that `engine link` is waiting; it is used only when stdout is a terminal. */
class Spinner {
  static readonly FRAMES = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];
  readonly #timer: ReturnType<typeof setInterval>;
  readonly #deadline: number;
  #frame = 0;
  #note = "";

  constructor(deadline: number) {
    this.#deadline = deadline;
    this.#timer = setInterval(() => this.#draw(), 100);
    this.#draw();
  }

  note(text: string): void {
    this.#note = text;
  }

  stop(): void {
    clearInterval(this.#timer);
    process.stdout.write("\r\x1b[K");
  }

  #draw(): void {
    const left = Math.max(0, Math.round((this.#deadline - Date.now()) / 1000));
    const clock = `${Math.floor(left / 60)}:${String(left % 60).padStart(2, "0")}`;
    const frame = Spinner.FRAMES[this.#frame++ % Spinner.FRAMES.length];
    process.stdout.write(`\r\x1b[K${frame} waiting for approval (${clock} left, Ctrl-C to stop)${this.#note ? ` · ${this.#note}` : ""}`);
  }
}

function writeJsonLine(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value)}\n`);
}

/** warnIfCleartext warns when the node credential would cross a network unencrypted. */
function warnIfCleartext(cloudUrl: string): void {
  const url = new URL(cloudUrl);
  const loopback = ["localhost", "127.0.0.1", "[::1]"].includes(url.hostname) || url.hostname.startsWith("127.");
  if (url.protocol === "http:" && !loopback) {
    process.stderr.write(`warning: ${cloudUrl} is plain http: the node credential crosses the network unencrypted; prefer https\n`);
  }
}

/** toCliError turns a link failure into the CLI's one-line error, keeping the code. */
function toCliError(error: LinkError): CliError {
  if (error.code === "cancelled") return new CliError("cancelled: this machine was not linked", "cancelled");
  return new CliError(error.message, error.code);
}

function asCli<T>(fn: () => T): T {
  try {
    return fn();
  } catch (error) {
    throw error instanceof LinkError ? toCliError(error) : error;
  }
}

async function asCliAsync<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (error) {
    throw error instanceof LinkError ? toCliError(error) : error;
  }
}
