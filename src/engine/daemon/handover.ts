import { chmodSync, rmSync } from "node:fs";
import { join } from "node:path";
import type { Socket, TCPSocketListener, UnixSocketListener } from "bun";
import type { Logger } from "../../lib/logger";
import { givePriorityBack, HANDOVER_BOOST, raiseWhileHandingOver } from "../../lib/priority";

/**
 * A hand-over moves the daemon's work from one process (the predecessor) to the next (the
 * successor) without a moment where nothing listens (docs/decisions.md 360-363). The two
 * talk over a private unix socket in the data dir, one JSON message a line:
 *
 *   successor -> predecessor   hello {pid, version}   started, ready to take the listeners
 *   predecessor -> successor   switch {port, deadline, drain_ms, standin, pid, store_writes}
 *   successor                  binds the API port beside the predecessor's (new connections
 *                              are its own from now on, held until it serves) and renames
 *                              its unix sockets over engine.sock and shim.sock
 *   successor -> predecessor   switched
 *   predecessor                stops accepting, lets requests in flight finish (until the
 *                              deadline), ends event streams, and stops its modules, leaving
 *                              workloads and proxy processes running
 *   predecessor -> successor   released {store_writes}
 *   successor                  opens the store, adopts the workloads, and serves the requests
 *                              that waited (keeping the service rows it read while it prepared
 *                              where both store_writes are the same: decision 533)
 *   successor -> predecessor   active {control}
 *
 * Either side may say `failed {message}` instead; the predecessor then keeps (or takes back)
 * the work, as runRestart in index.ts decides by how far the hand-over got.
 */

/** HANDOVER_ENV names the environment that makes `engine serve` a successor. */
export const HANDOVER_ENV = {
  /** control is the predecessor's control socket. */
  control: "ENGINE_HANDOVER",
  /** standin marks a successor that serves only while its parent re-executes itself. */
  standin: "ENGINE_HANDOVER_STANDIN",
  /**
   * peers are the pids of the children of the daemon's pid from before its execve (the stand-in,
   * the proxy processes it retires): the re-executed daemon reaps them, as Bun knows nothing of them.
   */
  peers: "ENGINE_HANDOVER_PEERS",
  /** priority is the CPU priority a successor started lower gives itself back at the switch (decision 368). */
  priority: "ENGINE_HANDOVER_PRIORITY",
} as const;

/** SuccessorRole is what a successor learned from its environment. */
export interface SuccessorRole {
  control: string;
  standin: boolean;
  /** peerPids are the children this process must reap after an execve in place (HANDOVER_ENV.peers). */
  peerPids: number[];
  /** priority is the CPU priority to take back at the switch; null to leave it as it is. */
  priority: number | null;
}

/**
 * takeSuccessorRole reads and removes the hand-over variables from `env` (process.env), so
 * that neither workloads nor a later restart inherit them. Null for an ordinary start.
 */
export function takeSuccessorRole(env: Record<string, string | undefined> = process.env): SuccessorRole | null {
  const control = env[HANDOVER_ENV.control];
  const standin = env[HANDOVER_ENV.standin] === "1";
  const peers = (env[HANDOVER_ENV.peers] ?? "")
    .split(",")
    .map(Number)
    .filter((pid) => Number.isInteger(pid) && pid > 0);
  const priority = env[HANDOVER_ENV.priority] === undefined ? Number.NaN : Number(env[HANDOVER_ENV.priority]);
  for (const key of Object.values(HANDOVER_ENV)) delete env[key];
  if (!control) return null;
  return { control, standin, peerPids: peers, priority: Number.isInteger(priority) && priority >= -20 && priority <= 19 ? priority : null };
}

export type ToSuccessor =
  | {
      type: "switch";
      /** port is the API's TCP port the successor binds beside the predecessor's. */
      port: number;
      /** deadline (ms since the epoch) is when the predecessor stops waiting for requests in flight. */
      deadline: number;
      /** drain_ms is the restart's drain_timeout_s, which a stand-in grants in its own hand-over too. */
      drain_ms: number;
      standin: boolean;
      pid: number;
      /** store_writes is the predecessor's count of writes to services, versions and runs (decision 533); absent from an older engine. */
      store_writes?: number | null;
    }
  | { type: "released"; store_writes?: number | null }
  | { type: "failed"; message: string };

export type ToPredecessor =
  | { type: "hello"; pid: number; version: string }
  | { type: "switched" }
  | { type: "active"; control: string | null }
  | { type: "failed"; message: string };

type Message = ToSuccessor | ToPredecessor;

/** HandoverError is a hand-over that did not go through; `stage` says how far it got. */
export class HandoverError extends Error {
  constructor(
    message: string,
    readonly stage: "hello" | "switched" | "released" | "active",
  ) {
    super(message);
    this.name = "HandoverError";
  }
}

/**
 * Channel is one end of a control connection: JSON lines out, and `next(type)` to wait for
 * the other side's next message of that type (a `failed` one, or the connection closing,
 * rejects instead).
 */
export class Channel<In extends Message, Out extends Message> {
  private buffer = "";
  private readonly inbox: In[] = [];
  private waiter: { resolve: () => void } | null = null;
  private closedBecause: string | null = null;

  constructor(private socket: Socket<unknown> | null) {}

  attach(socket: Socket<unknown>): void {
    this.socket = socket;
  }

  /** receive takes bytes from the socket's data handler. */
  receive(chunk: Buffer | string): void {
    this.buffer += chunk.toString();
    for (let newline = this.buffer.indexOf("\n"); newline >= 0; newline = this.buffer.indexOf("\n")) {
      const line = this.buffer.slice(0, newline);
      this.buffer = this.buffer.slice(newline + 1);
      try {
        this.inbox.push(JSON.parse(line) as In);
      } catch {
        this.closedBecause = "the other side sent a line that is not JSON";
        this.socket?.end();
      }
    }
    this.wake();
  }

  /** closed is told by the socket's close handler. */
  closed(reason = "the other side closed the control connection"): void {
    this.closedBecause ??= reason;
    this.wake();
  }

  private wake(): void {
    const waiter = this.waiter;
    this.waiter = null;
    waiter?.resolve();
  }

  send(message: Out): void {
    this.socket?.write(`${JSON.stringify(message)}\n`);
    this.socket?.flush();
  }

  /** next waits for a message of `type` until `timeoutMs` have passed. */
  async next<T extends In["type"]>(type: T, timeoutMs: number): Promise<Extract<In, { type: T }>> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const message = this.inbox.shift();
      if (message) {
        if (message.type === type) return message as Extract<In, { type: T }>;
        if (message.type === "failed") throw new Error((message as { message: string }).message);
        continue; // an earlier step's message, read late
      }
      if (this.closedBecause) throw new Error(this.closedBecause);
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no ${type} within ${Math.round(timeoutMs / 1000)} s`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiter = {
          resolve: () => {
            clearTimeout(timer);
            resolve();
          },
        };
      });
    }
  }

  close(): void {
    this.closedBecause ??= "closed";
    try {
      this.socket?.end();
    } catch {
      // already closed
    }
  }
}

export type PredecessorChannel = Channel<ToPredecessor, ToSuccessor>;
export type SuccessorChannel = Channel<ToSuccessor, ToPredecessor>;

/**
 * ControlSocket is a predecessor's listening control socket, `<data-dir>/.h<pid>` (0600: only
 * the engine's user may hand its work over; short, as a unix socket's path must be). It exists
 * only while a restart is under way, and takes one successor.
 */
export class ControlSocket {
  readonly path: string;
  private readonly listener: UnixSocketListener<unknown> | TCPSocketListener<unknown>;
  private socket: Socket<unknown> | null = null;
  private channel: PredecessorChannel | null = null;
  private connected: (() => void) | null = null;

  constructor(dataDir: string) {
    this.path = join(dataDir, `.h${process.pid}`);
    rmSync(this.path, { force: true });
    const umask = process.umask(0o077);
    try {
      this.listener = Bun.listen<unknown>({
        unix: this.path,
        socket: {
          open: (socket) => {
            if (this.socket) {
              socket.end(); // one successor at a time
              return;
            }
            this.socket = socket;
            this.channel = new Channel<ToPredecessor, ToSuccessor>(socket);
            this.connected?.();
          },
          data: (socket, chunk) => {
            if (socket === this.socket) this.channel?.receive(chunk);
          },
          close: (socket) => {
            if (socket === this.socket) this.channel?.closed();
          },
          error: (socket) => {
            if (socket === this.socket) this.channel?.closed();
          },
        },
      });
    } finally {
      process.umask(umask);
    }
    chmodSync(this.path, 0o600);
  }

  /** accept waits for the successor to connect, until `timeoutMs` or until `gone` resolves (it exited). */
  async accept(timeoutMs: number, gone: Promise<unknown>): Promise<PredecessorChannel> {
    if (this.channel) return this.channel;
    const connected = new Promise<"connected">((resolve) => {
      this.connected = () => resolve("connected");
    });
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timeout = new Promise<"timeout">((resolve) => {
      timer = setTimeout(() => resolve("timeout"), timeoutMs);
    });
    const outcome = await Promise.race([connected, timeout, gone.then(() => "gone" as const)]);
    clearTimeout(timer);
    if (outcome === "connected" && this.channel) return this.channel;
    if (outcome === "gone") throw new Error("the new process exited before it connected");
    throw new Error(`the new process did not connect within ${Math.round(timeoutMs / 1000)} s`);
  }

  /** close ends the control connection and removes the socket. */
  close(): void {
    this.channel?.close();
    this.listener.stop(true);
    rmSync(this.path, { force: true });
  }
}

/** connectPredecessor opens a successor's end of the control connection. */
export async function connectPredecessor(path: string): Promise<SuccessorChannel> {
  const channel = new Channel<ToSuccessor, ToPredecessor>(null);
  const socket = await Bun.connect<unknown>({
    unix: path,
    socket: {
      data: (_socket, chunk) => channel.receive(chunk),
      close: () => channel.closed("the previous engine closed the control connection"),
      error: () => channel.closed("the control connection failed"),
    },
  });
  channel.attach(socket);
  return channel;
}

/** HandingOver is what a predecessor does at each step of a hand-over. */
export interface HandingOver {
  log: Logger;
  /** port is the API's bound TCP port (a successor of `--port 0` keeps it). */
  port: number;
  /** retire stops accepting once the successor took the ports, and lets requests in flight finish until the deadline. */
  retire(deadline: number): Promise<void>;
  /**
   * release stops every module, leaving workloads and proxy processes running for the
   * successor; it answers how long each module's stop took (ms), for the log.
   */
  release(): Promise<Record<string, number>>;
  /** storeWrites is how many writes to services, versions and runs this process has made (null where it cannot say). */
  storeWrites(): number | null;
}

/**
 * storeUnchanged says whether a predecessor wrote no service, version or run between its
 * `switch` and its `released`: both carry its count, and the two are equal. A predecessor that
 * says no count (an older engine, or one without a service store) may have written.
 */
export function storeUnchanged(order: { store_writes?: number | null }, released: { store_writes?: number | null } | null): boolean {
  const before = order.store_writes;
  const after = released?.store_writes;
  return typeof before === "number" && typeof after === "number" && before === after;
}

/** SWITCH_TIMEOUT_MS bounds how long a successor may take to bind, once told to. */
const SWITCH_TIMEOUT_MS = 30_000;
/** ACTIVE_TIMEOUT_MS bounds how long a successor may take to open the store and adopt the workloads. */
export const ACTIVE_TIMEOUT_MS = 120_000;

/**
 * handOver drives a predecessor's side of a hand-over on a connected channel, from the
 * successor's hello to its `active`, and answers that message. It throws a HandoverError whose
 * stage says what the caller must undo: before "released" this process still holds its
 * modules (and, before "switched", its listeners); from "active" on it holds nothing.
 */
export async function handOver(
  channel: PredecessorChannel,
  side: HandingOver,
  options: { deadline: number; drainMs: number; standin: boolean; helloTimeoutMs: number },
): Promise<{ hello: Extract<ToPredecessor, { type: "hello" }>; active: Extract<ToPredecessor, { type: "active" }> }> {
  let hello: Extract<ToPredecessor, { type: "hello" }>;
  try {
    hello = await channel.next("hello", options.helloTimeoutMs);
  } catch (error) {
    throw new HandoverError((error as Error).message, "hello");
  }
  side.log.info({ successor_pid: hello.pid, successor_version: hello.version }, "handing over to the new process");
  channel.send({
    type: "switch",
    port: side.port,
    deadline: options.deadline,
    drain_ms: options.drainMs,
    standin: options.standin,
    pid: process.pid,
    store_writes: side.storeWrites(),
  });
  try {
    await channel.next("switched", SWITCH_TIMEOUT_MS);
  } catch (error) {
    throw new HandoverError((error as Error).message, "switched");
  }
  const phases = new Phases();
  // New requests wait on the successor until this process has released its work: it runs
  // above its priority meanwhile (decision 527), and as before once it has.
  const raised = raiseWhileHandingOver();
  let modules: Record<string, number>;
  try {
    await side.retire(options.deadline);
    phases.mark("retire");
    modules = await side.release();
    phases.mark("release");
    channel.send({ type: "released", store_writes: side.storeWrites() });
  } finally {
    if (raised) givePriorityBack();
  }
  side.log.info(
    { successor_pid: hello.pid, phases_ms: phases.ms, modules_ms: modules, raised_priority: raised ? -HANDOVER_BOOST : undefined },
    "released the work to the new process",
  );
  try {
    const active = await channel.next("active", ACTIVE_TIMEOUT_MS);
    return { hello, active };
  } catch (error) {
    throw new HandoverError((error as Error).message, "active");
  }
}

/**
 * Phases times the steps of one side of a hand-over (decision 440): `mark(name)` records the
 * milliseconds since the previous mark under `name`, so the log line that ends a hand-over
 * says where its window went (the bench reads it).
 */
export class Phases {
  readonly ms: Record<string, number> = {};
  private readonly at = new Map<string, number>();
  private last = performance.now();

  mark(name: string): void {
    const now = performance.now();
    this.ms[name] = round(now - this.last);
    this.at.set(name, now);
    this.last = now;
  }

  /** since is the milliseconds from the end of step `name` to the last mark (NaN when it was never marked). */
  since(name: string): number {
    return round(this.last - (this.at.get(name) ?? Number.NaN));
  }
}

function round(ms: number): number {
  return Math.round(ms * 10) / 10;
}
