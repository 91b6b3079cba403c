import {
  closeSync,
  constants,
  existsSync,
  fchmodSync,
  fchownSync,
  fstatSync,
  lchownSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  realpathSync,
  statSync,
  writeSync,
} from "node:fs";
import { dirname, join } from "node:path";
import { AppError } from "../../lib/errors";
import type { MissingTool, RestoreProgress, ToolReport } from "./types";

/** ToolSpec names a program an adapter needs and the Debian package that provides it. */
export interface ToolSpec {
  tool: string;
  debianPackage: string;
}

/**
 * findTools looks for each tool on the PATH of `env`, then in `extraDirs` (in order): the
 * report names the Debian package of each tool not found.
 */
export function findTools(specs: ToolSpec[], env: Record<string, string>, extraDirs: string[] = []): ToolReport {
  const found: Record<string, string> = {};
  const missing: MissingTool[] = [];
  for (const spec of specs) {
    let path: string | null = null;
    for (const dir of extraDirs) {
      const candidate = join(dir, spec.tool);
      if (existsSync(candidate)) {
        path = candidate;
        break;
      }
    }
    path ??= Bun.which(spec.tool, { PATH: env.PATH ?? "/usr/local/bin:/usr/bin:/bin" });
    if (path) found[spec.tool] = path;
    else missing.push({ tool: spec.tool, debianPackage: spec.debianPackage });
  }
  return { found, missing };
}

/** assertTools throws database_tools_missing, naming each missing tool and its Debian package, unless the report is complete. */
export function assertTools(label: string, report: ToolReport): Record<string, string> {
  if (report.missing.length === 0) return report.found;
  const packages = [...new Set(report.missing.map((m) => m.debianPackage))];
  throw new AppError(
    "database_tools_missing",
    `${label} needs ${report.missing.map((m) => m.tool).join(", ")}, which ${report.missing.length === 1 ? "is" : "are"} not on this host: install the Debian package${packages.length === 1 ? "" : "s"} ${packages.join(" ")} (apt-get install ${packages.join(" ")})`,
    { missing: report.missing },
  );
}

/** RunAs is the unprivileged OS user a server that refuses root runs as when the engine is root. */
export interface RunAs {
  user: string;
  uid: number;
  gid: number;
}

/** lookupUser reads a user's uid and gid from /etc/passwd; null when there is no such user. */
export function lookupUser(user: string): RunAs | null {
  try {
    for (const line of readFileSync("/etc/passwd", "utf8").split("\n")) {
      const [name, , uid, gid] = line.split(":");
      if (name === user && uid !== undefined && gid !== undefined) return { user, uid: Number(uid), gid: Number(gid) };
    }
  } catch {
    // no passwd file: no such user
  }
  return null;
}

/** asUser prefixes argv with setpriv so that it runs as `runAs` (the same process: setpriv execs it). */
export function asUser(runAs: RunAs | null, argv: string[]): string[] {
  if (!runAs) return argv;
  const setpriv = Bun.which("setpriv") ?? "/usr/bin/setpriv";
  return [setpriv, `--reuid=${runAs.uid}`, `--regid=${runAs.gid}`, "--clear-groups", "--", ...argv];
}

/**
 * openOwned opens a file in a service's data dir for writing, created with `mode` (or, unless
 * `exclusive`, truncated), and gives it to `owner` when there is one. A root engine writes
 * there for a server that runs as the service's own user (instance.owner), who owns the dir:
 * the file must be the owner's for the server to use it, and a name the owner controls must
 * not lead root elsewhere, so a symbolic link at the name is refused (O_NOFOLLOW), a FIFO does
 * not block the engine (O_NONBLOCK), and anything but a regular file is refused.
 */
export function openOwned(path: string, owner: RunAs | null | undefined, mode: number, exclusive = false): number {
  const flags =
    constants.O_WRONLY |
    constants.O_CREAT |
    (exclusive ? constants.O_EXCL : constants.O_TRUNC) |
    constants.O_NOFOLLOW |
    constants.O_NONBLOCK;
  const fd = openSync(path, flags, mode);
  try {
    if (!fstatSync(fd).isFile()) throw new Error(`${path} is not a regular file`);
    if (owner) fchownSync(fd, owner.uid, owner.gid);
    return fd;
  } catch (error) {
    closeSync(fd);
    throw error;
  }
}

/** writeOwned writes a whole file through openOwned. */
export function writeOwned(path: string, content: string | Uint8Array, owner: RunAs | null | undefined, mode: number): void {
  const fd = openOwned(path, owner, mode);
  try {
    const bytes = typeof content === "string" ? Buffer.from(content, "utf8") : content;
    for (let written = 0; written < bytes.length; ) written += writeSync(fd, bytes, written, bytes.length - written);
  } finally {
    closeSync(fd);
  }
}

/** mkdirOwned makes a directory in a service's data dir and gives it to `owner` (lchown: a link at the name is not followed). */
export function mkdirOwned(path: string, owner: RunAs | null | undefined, mode: number): void {
  mkdirSync(path, { mode });
  if (owner) lchownSync(path, owner.uid, owner.gid);
}

/**
 * setFileMode gives a regular file in a service's data dir `mode`, without following a link at
 * its name (a file other users may rename cannot lead root elsewhere). It answers false when
 * nothing is there, and throws when the name is not a regular file.
 */
export function setFileMode(path: string, mode: number): boolean {
  let fd: number;
  try {
    fd = openSync(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return false;
    if ((error as NodeJS.ErrnoException).code === "ELOOP") throw new Error(`${path} is a symbolic link, not the database's file`);
    throw error;
  }
  try {
    const stat = fstatSync(fd);
    if (!stat.isFile()) throw new Error(`${path} is not a regular file`);
    if ((stat.mode & 0o7777) !== mode) fchmodSync(fd, mode);
    return true;
  } finally {
    closeSync(fd);
  }
}

/**
 * giveTo gives files a program running as the engine made in a service's data dir to
 * `owner`, without following links; a path that is not there is skipped.
 */
export function giveTo(owner: RunAs | null | undefined, ...paths: string[]): void {
  if (!owner) return;
  for (const path of paths) {
    let stat: ReturnType<typeof lstatSync>;
    try {
      stat = lstatSync(path);
    } catch {
      continue;
    }
    if (stat.uid !== owner.uid || stat.gid !== owner.gid) lchownSync(path, owner.uid, owner.gid);
  }
}

/**
 * firstUnreachable returns the first directory on the way to `path` that `runAs` may not
 * search (no x bit for it as owner, group or other), or null when it can reach `path`.
 */
export function firstUnreachable(path: string, runAs: RunAs): string | null {
  const chain: string[] = [];
  for (let dir = dirname(path); ; dir = dirname(dir)) {
    chain.unshift(dir);
    if (dir === dirname(dir)) break;
  }
  for (const dir of chain) {
    let mode: number;
    let uid: number;
    let gid: number;
    try {
      ({ mode, uid, gid } = statSync(dir));
    } catch {
      return dir;
    }
    const searchable = uid === runAs.uid ? mode & 0o100 : gid === runAs.gid ? mode & 0o010 : mode & 0o001;
    if (!searchable) return dir;
  }
  return null;
}

/** ToolRun is the outcome of a program run to completion. */
export interface ToolRun {
  exitCode: number | null;
  signal: string | null;
  /** output is the last few KiB of stdout and stderr together. */
  output: string;
}

const OUTPUT_KEPT = 8 * 1024;

/**
 * runTool runs a program to completion, keeping the tail of its output and passing each
 * line to `onLine`. An abort of `signal` kills it (SIGKILL) and the promise then rejects
 * with the signal's reason. stdin may be a file descriptor or a stream the caller writes.
 */
export async function runTool(
  argv: string[],
  options: {
    env: Record<string, string>;
    cwd?: string;
    signal?: AbortSignal;
    stdin?: number | "pipe" | "ignore";
    onLine?: (line: string) => void;
    onSpawn?: (proc: Bun.Subprocess<"pipe" | "ignore", "pipe", "pipe">) => void | Promise<void>;
  },
): Promise<ToolRun> {
  if (options.signal?.aborted) throw options.signal.reason;
  const proc = Bun.spawn(argv, {
    env: options.env,
    cwd: options.cwd,
    stdin: (options.stdin ?? "ignore") as "pipe",
    stdout: "pipe",
    stderr: "pipe",
  });
  const kill = () => proc.kill("SIGKILL");
  options.signal?.addEventListener("abort", kill, { once: true });
  let output = "";
  const decoder = new TextDecoder();
  const pump = async (stream: ReadableStream<Uint8Array>) => {
    let pending = "";
    const reader = stream.getReader();
    for (let next = await reader.read(); !next.done; next = await reader.read()) {
      const chunk = next.value;
      const text = decoder.decode(chunk, { stream: true });
      output = (output + text).slice(-OUTPUT_KEPT);
      if (!options.onLine) continue;
      pending += text;
      let newline = pending.indexOf("\n");
      while (newline >= 0) {
        const line = pending.slice(0, newline).trimEnd();
        if (line) options.onLine(line);
        pending = pending.slice(newline + 1);
        newline = pending.indexOf("\n");
      }
      if (pending.length > OUTPUT_KEPT) pending = pending.slice(-OUTPUT_KEPT);
    }
    if (pending.trim() && options.onLine) options.onLine(pending.trim());
  };
  try {
    const feeding = options.onSpawn ? Promise.resolve(options.onSpawn(proc as never)) : Promise.resolve();
    const [, , , exitCode] = await Promise.all([
      feeding.catch((error) => {
        kill();
        throw error;
      }),
      pump(proc.stdout),
      pump(proc.stderr),
      proc.exited,
    ]);
    if (options.signal?.aborted) throw options.signal.reason;
    return { exitCode: proc.signalCode ? null : exitCode, signal: proc.signalCode ? String(proc.signalCode) : null, output: output.trim() };
  } finally {
    options.signal?.removeEventListener("abort", kill);
  }
}

/** lastLines returns the last `count` non-empty lines of a tool's output, for an error message. */
export function lastLines(output: string, count = 3): string {
  return output
    .split("\n")
    .map((line) => line.trim())
    .filter(Boolean)
    .slice(-count)
    .join(" | ");
}

/**
 * FileProgress follows how far a process has read the files under `root` (a dump file or a
 * dump directory) from /proc/<pid>/fdinfo, at no cost to the process: the tool reads the
 * file itself, with nothing in between. Files it has closed count whole.
 */
export class FileProgress {
  private readonly done = new Map<string, number>();
  private readonly open = new Map<string, number>();
  private best = 0;
  private readonly root: string;

  constructor(
    root: string,
    private readonly totalBytes: number,
  ) {
    this.root = realpathSync(root);
  }

  /** sample reads the positions of `pids`' descriptors that point under the root, and returns the progress. */
  sample(pids: number[]): RestoreProgress {
    const seen = new Map<string, number>();
    for (const pid of pids) {
      let fds: string[];
      try {
        fds = readdirSync(`/proc/${pid}/fd`);
      } catch {
        continue;
      }
      for (const fd of fds) {
        let target: string;
        try {
          target = readlinkSync(`/proc/${pid}/fd/${fd}`);
        } catch {
          continue;
        }
        if (target !== this.root && !target.startsWith(`${this.root}/`)) continue;
        try {
          const pos = /pos:\s*(\d+)/.exec(readFileSync(`/proc/${pid}/fdinfo/${fd}`, "utf8"));
          if (pos) seen.set(target, Math.max(seen.get(target) ?? 0, Number(pos[1])));
        } catch {
          // closed meanwhile
        }
      }
    }
    for (const [file, position] of this.open) {
      if (!seen.has(file)) this.done.set(file, fileSize(file) ?? position);
    }
    this.open.clear();
    for (const [file, position] of seen) {
      this.done.delete(file);
      this.open.set(file, position);
    }
    let bytes = 0;
    for (const size of this.done.values()) bytes += size;
    for (const position of this.open.values()) bytes += position;
    this.best = Math.min(this.totalBytes, Math.max(this.best, bytes));
    return { bytesRead: this.best, totalBytes: this.totalBytes };
  }
}

function fileSize(path: string): number | null {
  try {
    return statSync(path).size;
  } catch {
    return null;
  }
}

/** openForReading opens a file for a child's stdin; the caller closes the descriptor after the child started. */
export function openForReading(path: string): number {
  return openSync(path, "r");
}

export { closeSync };

/** freeTcpPort returns a loopback TCP port that was free a moment ago, found by listening on port 0. */
export async function freeTcpPort(): Promise<number> {
  const listener = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
  const port = listener.port;
  listener.stop(true);
  return port;
}
