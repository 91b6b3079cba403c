import { readdirSync, readFileSync, readlinkSync } from "node:fs";
import { type LogCause, type PortHolder, portsInArgs } from "./causes";

/**
 * Ports finds who listens on a TCP port from /proc: the listening sockets of /proc/net/tcp and
 * tcp6 (the engine's network namespace), then the process whose descriptors hold one of them.
 * A root engine sees every process; an unprivileged one sees its own and its workloads', and
 * for others names only the socket's owner. Nothing here throws: an unreadable /proc is no holder.
 */

/** TcpState is a socket's `st` in /proc/net/tcp: 0A is LISTEN, 01 ESTABLISHED. */
export type TcpState = "0A" | "01";
const LISTEN: TcpState = "0A";

interface Listener {
  inode: string;
  uid: number;
}

/** parseProcNetTcp returns the sockets in `state` (listening ones by default) of a /proc/net/tcp{,6} text, by local port. */
export function parseProcNetTcp(text: string, state: TcpState = LISTEN): Map<number, Listener[]> {
  const byPort = new Map<number, Listener[]>();
  for (const row of text.split("\n").slice(1)) {
    const fields = row.trim().split(/\s+/);
    // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
    if (fields.length < 10 || fields[3] !== state) continue;
    const port = Number.parseInt(fields[1]?.split(":")[1] ?? "", 16);
    if (!Number.isInteger(port)) continue;
    const list = byPort.get(port) ?? [];
    list.push({ inode: fields[9] ?? "", uid: Number(fields[7]) });
    byPort.set(port, list);
  }
  return byPort;
}

/** readTcpSockets reads the sockets in `state` (listening ones by default) of /proc/net/tcp and tcp6, by local port. */
export function readTcpSockets(procRoot = "/proc", state: TcpState = LISTEN): Map<number, Listener[]> {
  const all = new Map<number, Listener[]>();
  for (const file of ["net/tcp", "net/tcp6"]) {
    let text = "";
    try {
      text = readFileSync(`${procRoot}/${file}`, "utf8");
    } catch {
      continue;
    }
    for (const [port, list] of parseProcNetTcp(text, state)) all.set(port, [...(all.get(port) ?? []), ...list]);
  }
  return all;
}

/** listeningPorts returns the TCP ports something listens on now. */
export function listeningPorts(procRoot = "/proc"): Set<number> {
  return new Set(readTcpSockets(procRoot).keys());
}

/** freePortNear returns the first port above `port` nothing listens on, or null. */
export function freePortNear(port: number, procRoot = "/proc"): number | null {
  const taken = listeningPorts(procRoot);
  for (let candidate = port + 1; candidate <= Math.min(65535, port + 100); candidate++) if (!taken.has(candidate)) return candidate;
  return null;
}

/**
 * commandOf returns a process's command line for a remediation, with the values of
 * secret-looking options and the passwords of URLs hidden, cut to 120 characters.
 */
function commandOf(pid: number, procRoot: string): string | null {
  try {
    const argv = readFileSync(`${procRoot}/${pid}/cmdline`, "utf8").split("\0").filter(Boolean);
    const text = argv
      .join(" ")
      .replace(/(--?[\w-]*(?:pass|secret|token|key|auth|credential)[\w-]*)(=|\s+)\S+/gi, "$1$2***")
      .replace(/(\b[a-z][\w+.-]*:\/\/[^\s:/@]*:)[^\s@/]+@/gi, "$1***@");
    return text.length > 120 ? `${text.slice(0, 119)}…` : text || null;
  } catch {
    return null;
  }
}

function userName(uid: number): string {
  try {
    for (const line of readFileSync("/etc/passwd", "utf8").split("\n")) {
      const [name, , id] = line.split(":");
      if (Number(id) === uid && name) return name;
    }
  } catch {
    // no passwd: the uid it is
  }
  return `uid ${uid}`;
}

/** socketInodes are the inodes of the sockets a process holds descriptors on; none when it is gone or not ours to read. */
export function socketInodes(pid: number, procRoot = "/proc"): string[] {
  let fds: string[];
  try {
    fds = readdirSync(`${procRoot}/${pid}/fd`);
  } catch {
    return [];
  }
  const inodes: string[] = [];
  for (const fd of fds) {
    try {
      const inode = /^socket:\[(\d+)\]$/.exec(readlinkSync(`${procRoot}/${pid}/fd/${fd}`))?.[1];
      if (inode) inodes.push(inode);
    } catch {
      // closed meanwhile
    }
  }
  return inodes;
}

/** pidHoldingSocket returns the process with a descriptor on one of the sockets, or null. */
function pidHoldingSocket(inodes: Set<string>, procRoot: string): number | null {
  let pids: string[];
  try {
    pids = readdirSync(procRoot).filter((name) => /^\d+$/.test(name));
  } catch {
    return null;
  }
  return pids.map(Number).find((pid) => socketInodes(pid, procRoot).some((inode) => inodes.has(inode))) ?? null;
}

/**
 * findPortHolder returns who listens on `port`: the process, its command line, and the engine
 * service it belongs to as `serviceOf` tells (null for a process outside the engine), or
 * null when nothing listens on it.
 */
export function findPortHolder(
  port: number,
  serviceOf: (pid: number) => string | null,
  options: { procRoot?: string; enginePid?: number } = {},
): PortHolder | null {
  const procRoot = options.procRoot ?? "/proc";
  const listeners = readTcpSockets(procRoot).get(port);
  if (!listeners || listeners.length === 0) return null;
  const pid = pidHoldingSocket(new Set(listeners.map((listener) => listener.inode)), procRoot);
  const user = userName(listeners[0]?.uid ?? -1);
  if (pid === null) return { pid: null, command: null, service: null, engine: false, user };
  // Only an outside process is named by its command line: a service by its name, whose
  // command a token scoped to another service may not read.
  const engine = pid === (options.enginePid ?? process.pid);
  const service = engine ? null : serviceOf(pid);
  return { pid, command: engine || service ? null : commandOf(pid, procRoot), service, engine, user };
}

/**
 * explainPortClash completes a port_in_use cause with the port and who holds it. The port the
 * output named comes first, then those its command line, its PORT-like settings and its own
 * `port` name; the first that something listens on is the one, so a number in the command
 * line that is no port is never blamed. When none is held any more, the output's port (or the
 * declared one) stays, without a holder. free_port offers a port nothing listens on.
 */
export function explainPortClash(
  cause: LogCause,
  settings: { command: readonly string[]; env: Record<string, string>; port: number | null },
  serviceOf: (pid: number) => string | null,
  options: { procRoot?: string; enginePid?: number } = {},
): LogCause {
  if (cause.class !== "port_in_use") return cause;
  const fromEnv = Object.entries(settings.env)
    .filter(([key, value]) => /PORT/i.test(key) && /^\d{1,5}$/.test(value))
    .map(([, value]) => Number(value));
  const candidates = [
    ...new Set([
      ...(cause.port === null ? [] : [cause.port]),
      ...portsInArgs(settings.command),
      ...fromEnv,
      ...(settings.port ? [settings.port] : []),
    ]),
  ];
  let port = cause.port ?? settings.port;
  let holder: PortHolder | null = null;
  for (const candidate of candidates) {
    holder = findPortHolder(candidate, serviceOf, options);
    if (holder) {
      port = candidate;
      break;
    }
  }
  return {
    ...cause,
    port,
    subject: port === null ? cause.subject : String(port),
    holder,
    free_port: port === null ? null : freePortNear(port, options.procRoot),
  };
}
