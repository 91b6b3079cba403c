import { FFIType, ptr } from "bun:ffi";
import { readdirSync, readFileSync, readlinkSync, renameSync, rmSync, statSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { openLibc } from "./libc";

/**
 * The listening sockets of a drain restart change hands without a moment where nothing
 * listens (docs/decisions.md 360). Bun.serve cannot serve on a descriptor it did not open
 * (`Bun.serve({fd})` is ignored; only the raw `Bun.listen` takes one), so the API's TCP port
 * is shared with SO_REUSEPORT and the unix sockets are swapped by rename(2):
 *
 * - TCP: every engine binds its port with SO_REUSEPORT and attaches a classic BPF program to
 *   the port's reuseport group that picks socket 1, the newest of two. While one engine holds
 *   the port the index is out of range and the kernel falls back to its hash (that one
 *   socket); the moment a successor binds, every new connection goes to the successor. The
 *   predecessor accepts what is already in its queue and only then closes, so no connection
 *   meets a closed queue (the kernel resets those; measured in bench/handover.ts).
 * - unix: a socket is bound at a name of its own (`.<letter><pid>` beside it) and renamed over the real
 *   path, which thus always names a listening socket. Bun unlinks the name a socket was bound
 *   at when it stops, which is the private one, already gone; the real path is removed at a
 *   stop only while it still names this process's socket.
 */

interface Libc {
  getsockname(fd: number, addr: unknown, len: unknown): number;
  getsockopt(fd: number, level: number, name: number, value: unknown, len: unknown): number;
  setsockopt(fd: number, level: number, name: number, value: unknown, len: number): number;
  socket(domain: number, type: number, protocol: number): number;
  sendto(fd: number, buffer: unknown, length: number, flags: number, address: unknown, addressLength: number): number;
  recv(fd: number, buffer: unknown, length: number, flags: number): number;
  close(fd: number): number;
  syscall(number: number, command: number, attr: unknown, size: number): number;
}

let libc: Libc | null | undefined;

function loadLibc(): Libc | null {
  if (libc !== undefined) return libc;
  libc = openLibc({
    getsockname: { args: [FFIType.i32, FFIType.ptr, FFIType.ptr], returns: FFIType.i32 },
    getsockopt: { args: [FFIType.i32, FFIType.i32, FFIType.i32, FFIType.ptr, FFIType.ptr], returns: FFIType.i32 },
    setsockopt: { args: [FFIType.i32, FFIType.i32, FFIType.i32, FFIType.ptr, FFIType.u32], returns: FFIType.i32 },
    socket: { args: [FFIType.i32, FFIType.i32, FFIType.i32], returns: FFIType.i32 },
    // ssize_t results read as i32: the lengths here are far below 2^31, and -1 stays -1.
    sendto: { args: [FFIType.i32, FFIType.ptr, FFIType.u64, FFIType.i32, FFIType.ptr, FFIType.u32], returns: FFIType.i32 },
    recv: { args: [FFIType.i32, FFIType.ptr, FFIType.u64, FFIType.i32], returns: FFIType.i32 },
    close: { args: [FFIType.i32], returns: FFIType.i32 },
    // long syscall(long number, ...): the bpf(2) call, which the C library does not wrap. Its
    // result, a descriptor or -1, reads as i32.
    syscall: { args: [FFIType.i64, FFIType.i32, FFIType.ptr, FFIType.u32], returns: FFIType.i32 },
  }) as unknown as Libc | null;
  return libc;
}

const SOL_SOCKET = 1;
const SO_ACCEPTCONN = 30;
const SO_RCVTIMEO = 20;
const SO_ATTACH_REUSEPORT_CBPF = 51;
const AF_INET = 2;
const AF_INET6 = 10;
const IPPROTO_TCP = 6;
const TCP_INFO = 11;
/** TCPI_UNACKED is the offset of `tcpi_unacked` in struct tcp_info: 8 bytes of u8 fields, then rto, ato, snd_mss, rcv_mss. */
const TCPI_UNACKED = 24;

/**
 * warmSocketCalls loads the C library calls of this file and runs the descriptor scan once
 * (port 0 names no listener), for a process about to bind a port beside another's: bun:ffi
 * compiles its calls on first use (2 ms on an idle machine, 4-27 ms under load, measured
 * between a successor's bind of the API port and its steering, while new connections waited:
 * decision 483).
 */
export function warmSocketCalls(): void {
  listeningTcpFd(0);
}

/**
 * listeningTcpFd finds this process's listening TCP socket on `port` among its descriptors
 * (Bun does not expose the descriptor of a server it opened). Null when none is found.
 */
export function listeningTcpFd(port: number): number | null {
  return listeningTcpFds(port)[0] ?? null;
}

/**
 * listeningTcpFds lists this process's listening TCP sockets on `port`, in descriptor order
 * (Bun does not expose the descriptor of a server it opened). Empty when none is found.
 */
export function listeningTcpFds(port: number): number[] {
  const c = loadLibc();
  if (!c) return [];
  let entries: string[];
  try {
    entries = readdirSync("/proc/self/fd");
  } catch {
    return [];
  }
  const address = Buffer.alloc(128);
  const length = new Uint32Array(1);
  const value = new Int32Array(1);
  const valueLength = new Uint32Array(1);
  const found: number[] = [];
  for (const entry of entries) {
    let target: string;
    try {
      target = readlinkSync(`/proc/self/fd/${entry}`);
    } catch {
      continue;
    }
    if (!target.startsWith("socket:")) continue;
    const fd = Number(entry);
    length[0] = address.length;
    if (c.getsockname(fd, ptr(address), ptr(length)) !== 0) continue;
    const family = address.readUInt16LE(0);
    if ((family !== AF_INET && family !== AF_INET6) || address.readUInt16BE(2) !== port) continue;
    valueLength[0] = 4;
    if (c.getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, ptr(value), ptr(valueLength)) !== 0 || value[0] !== 1) continue;
    found.push(fd);
  }
  return found.sort((a, b) => a - b);
}

/**
 * steerToNewest attaches to the reuseport group of the listening socket `fd` the classic BPF
 * program `ret #1`: a new connection goes to the group's second socket, the successor's,
 * when there is one, and by hash to the only socket otherwise (an index out of range falls
 * back to the hash). The program belongs to the group, so it survives the socket that
 * attached it. Answers whether the kernel took it.
 */
export function steerToNewest(fd: number): boolean {
  return steerTo(fd, 1);
}

/**
 * steerTo attaches to the reuseport group of the listening socket `fd` the classic BPF program
 * `ret #index`: every new connection goes to the group's socket at `index`, or by hash when
 * there is none there (an index out of range falls back to the kernel's hash, so
 * `UNSTEERED` gives the group its plain hash back). Answers whether the kernel took it.
 */
export function steerTo(fd: number, index: number): boolean {
  const c = loadLibc();
  if (!c) return false;
  // struct sock_filter { u16 code; u8 jt; u8 jf; u32 k } — BPF_RET|BPF_K (0x06), k = index.
  const program = Buffer.alloc(8);
  program.writeUInt16LE(0x06, 0);
  program.writeUInt32LE(index >>> 0, 4);
  // struct sock_fprog { u16 len; struct sock_filter *filter } (padded to 16 bytes on 64-bit).
  const fprog = Buffer.alloc(16);
  fprog.writeUInt16LE(1, 0);
  fprog.writeBigUInt64LE(BigInt(ptr(program)), 8);
  return c.setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, ptr(fprog), fprog.length) === 0;
}

/** SYS_BPF is bpf(2)'s number, per architecture; bpf(2) has no C library wrapper. */
const SYS_BPF: Partial<Record<NodeJS.Architecture, number>> = { x64: 321, arm64: 280 };
const BPF_MAP_CREATE = 0;
const BPF_MAP_UPDATE_ELEM = 2;
const BPF_PROG_LOAD = 5;
const BPF_MAP_TYPE_REUSEPORT_SOCKARRAY = 20;
const BPF_PROG_TYPE_SK_REUSEPORT = 21;
const BPF_FUNC_SK_SELECT_REUSEPORT = 82;
const BPF_PSEUDO_MAP_FD = 1;
const SO_ATTACH_REUSEPORT_EBPF = 52;
/** BPF_ATTR_BYTES is the size of the `union bpf_attr` passed: zeros past the fields set, which every kernel accepts. */
const BPF_ATTR_BYTES = 128;
const LICENSE = Buffer.from("GPL\0", "latin1");

/** bpfInstruction encodes one `struct bpf_insn`: opcode, dst and src registers, offset, immediate. */
function bpfInstruction(code: number, dst: number, src: number, offset: number, immediate: number): Buffer {
  const insn = Buffer.alloc(8);
  insn.writeUInt8(code, 0);
  insn.writeUInt8(dst | (src << 4), 1);
  insn.writeInt16LE(offset, 2);
  insn.writeInt32LE(immediate, 4);
  return insn;
}

/**
 * steerToSocket sends every new connection of the reuseport group of the listening socket
 * `fd` to that very socket, wherever it sits in the group, with an eBPF program
 * (SK_REUSEPORT) that picks it from a one-slot REUSEPORT_SOCKARRAY map: unlike `steerTo`'s
 * index, no close of another socket of the group moves it out of the program's reach (a
 * generation smaller than the one it retires, or an old process rebinding its certificate:
 * decision 529). Once the socket has closed, the map is empty and the kernel's hash picks. The
 * program and the map belong to the group, which keeps them after their descriptors here are
 * closed; `steerTo(fd, UNSTEERED)` replaces the program. Loading one needs CAP_BPF (root, as
 * kernel.unprivileged_bpf_disabled is set by default): false where the kernel refuses, and the
 * caller steers by index instead.
 */
export function steerToSocket(fd: number): boolean {
  const c = loadLibc();
  const number = SYS_BPF[process.arch];
  if (!c || number === undefined) return false;
  const bpf = (command: number, attr: Buffer) => c.syscall(number, command, ptr(attr), attr.length);
  const map = Buffer.alloc(BPF_ATTR_BYTES);
  map.writeUInt32LE(BPF_MAP_TYPE_REUSEPORT_SOCKARRAY, 0);
  map.writeUInt32LE(4, 4); // key_size
  map.writeUInt32LE(4, 8); // value_size: a socket's descriptor, as u32
  map.writeUInt32LE(1, 12); // max_entries
  const mapFd = bpf(BPF_MAP_CREATE, map);
  if (mapFd < 0) return false;
  let programFd = -1;
  try {
    const key = new Uint32Array([0]);
    const value = new Uint32Array([fd]);
    const update = Buffer.alloc(BPF_ATTR_BYTES);
    update.writeUInt32LE(mapFd, 0);
    update.writeBigUInt64LE(BigInt(ptr(key)), 8);
    update.writeBigUInt64LE(BigInt(ptr(value)), 16);
    if (bpf(BPF_MAP_UPDATE_ELEM, update) !== 0) return false;
    // *(u32 *)(r10 - 4) = 0; r2 = map; r3 = r10 - 4; r4 = 0;
    // bpf_sk_select_reuseport(ctx, map, &key, 0); return SK_PASS. A failed pick (the socket
    // closed, so not in the map) passes too: the kernel then picks by its hash.
    const instructions = Buffer.concat([
      bpfInstruction(0x62, 10, 0, -4, 0), // BPF_ST | BPF_MEM | BPF_W
      bpfInstruction(0x18, 2, BPF_PSEUDO_MAP_FD, 0, mapFd), // BPF_LD | BPF_IMM | BPF_DW, two slots
      bpfInstruction(0, 0, 0, 0, 0),
      bpfInstruction(0xbf, 3, 10, 0, 0), // BPF_ALU64 | BPF_MOV | BPF_X
      bpfInstruction(0x07, 3, 0, 0, -4), // BPF_ALU64 | BPF_ADD | BPF_K
      bpfInstruction(0xb7, 4, 0, 0, 0), // BPF_ALU64 | BPF_MOV | BPF_K
      bpfInstruction(0x85, 0, 0, 0, BPF_FUNC_SK_SELECT_REUSEPORT), // BPF_JMP | BPF_CALL
      bpfInstruction(0xb7, 0, 0, 0, 1), // r0 = SK_PASS
      bpfInstruction(0x95, 0, 0, 0, 0), // BPF_JMP | BPF_EXIT
    ]);
    const load = Buffer.alloc(BPF_ATTR_BYTES);
    load.writeUInt32LE(BPF_PROG_TYPE_SK_REUSEPORT, 0);
    load.writeUInt32LE(instructions.length / 8, 4);
    load.writeBigUInt64LE(BigInt(ptr(instructions)), 8);
    load.writeBigUInt64LE(BigInt(ptr(LICENSE)), 16);
    programFd = bpf(BPF_PROG_LOAD, load);
    if (programFd < 0) return false;
    const option = new Int32Array([programFd]);
    return c.setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_EBPF, ptr(option), 4) === 0;
  } finally {
    if (programFd >= 0) c.close(programFd);
    c.close(mapFd);
  }
}

/**
 * acceptQueueLength is how many connections the kernel has completed on the listening socket
 * `fd` that the process has not accepted yet (for a listener, `tcpi_unacked` of TCP_INFO is its
 * accept queue). A listener that closes resets them, so a retiring one waits for 0. Null when
 * the kernel does not say.
 */
export function acceptQueueLength(fd: number): number | null {
  const c = loadLibc();
  if (!c) return null;
  const info = Buffer.alloc(256);
  const length = new Uint32Array([info.length]);
  if (c.getsockopt(fd, IPPROTO_TCP, TCP_INFO, ptr(info), ptr(length)) !== 0 || (length[0] ?? 0) < TCPI_UNACKED + 4) return null;
  return info.readUInt32LE(TCPI_UNACKED);
}

/** UNSTEERED is an index no reuseport group reaches, so `steerTo(fd, UNSTEERED)` spreads new connections by hash again. */
export const UNSTEERED = 0xffff_ffff;

/**
 * listenersOnPort counts the listening TCP sockets on `port` in this network namespace: the
 * size of the port's reuseport group, the socket this process bound last being its newest, at
 * index count - 1 (the kernel appends a socket that joins). It asks the kernel for the
 * listening sockets only (sock_diag, as `ss -l` does); /proc/net/tcp lists every connection,
 * and a proxy that closes many holds tens of thousands in TIME_WAIT, which took a new proxy
 * process up to a second to read before it could steer (decision 528). /proc where the
 * kernel refuses the netlink socket.
 */
export function listenersOnPort(port: number): number {
  return listenersFromDiag(port) ?? listenersFromProc(port);
}

const AF_NETLINK = 16;
const SOCK_DGRAM = 2;
const SOCK_CLOEXEC = 0o2000000;
const NETLINK_SOCK_DIAG = 4;
const SOCK_DIAG_BY_FAMILY = 20;
const NLM_F_REQUEST = 0x1;
const NLM_F_DUMP = 0x300;
const NLMSG_ERROR = 2;
const NLMSG_DONE = 3;
const TCP_LISTEN = 10;
/** NLMSG_HEADER is the size of struct nlmsghdr; DIAG_REQUEST that of struct inet_diag_req_v2 (8 bytes, then inet_diag_sockid's 48). */
const NLMSG_HEADER = 16;
const DIAG_REQUEST = 56;

/**
 * listenersFromDiag counts the listening TCP sockets on `port` over NETLINK_SOCK_DIAG: one dump
 * of the listening sockets (states = LISTEN) for each address family, their source ports
 * compared here. Null when the netlink socket cannot be opened or a dump fails.
 */
export function listenersFromDiag(port: number): number | null {
  const c = loadLibc();
  if (!c) return null;
  const fd = c.socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return null;
  // The kernel answers a dump at once; a receive timeout keeps a kernel that would not from holding the caller.
  const timeout = Buffer.alloc(16);
  timeout.writeBigInt64LE(1n, 0);
  c.setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, ptr(timeout), timeout.length);
  try {
    let count = 0;
    for (const family of [AF_INET, AF_INET6]) {
      const found = dumpListeners(c, fd, family, port);
      if (found === null) return null;
      count += found;
    }
    return count;
  } finally {
    c.close(fd);
  }
}

/** diagBuffer receives the dumps: a datagram holds as many messages as fit (ss reads 32 KiB at a time). */
const diagBuffer = Buffer.alloc(32 * 1024);

function dumpListeners(c: Libc, fd: number, family: number, port: number): number | null {
  const request = Buffer.alloc(NLMSG_HEADER + DIAG_REQUEST);
  request.writeUInt32LE(request.length, 0);
  request.writeUInt16LE(SOCK_DIAG_BY_FAMILY, 4);
  request.writeUInt16LE(NLM_F_REQUEST | NLM_F_DUMP, 6);
  request.writeUInt8(family, NLMSG_HEADER);
  request.writeUInt8(IPPROTO_TCP, NLMSG_HEADER + 1);
  request.writeUInt32LE(1 << TCP_LISTEN, NLMSG_HEADER + 4);
  // sockaddr_nl of the kernel: family, then pid 0 and groups 0.
  const kernel = Buffer.alloc(12);
  kernel.writeUInt16LE(AF_NETLINK, 0);
  if (c.sendto(fd, ptr(request), request.length, 0, ptr(kernel), kernel.length) !== request.length) return null;
  let count = 0;
  for (;;) {
    const received = c.recv(fd, ptr(diagBuffer), diagBuffer.length, 0);
    if (received <= 0) return null;
    for (let offset = 0; offset + NLMSG_HEADER <= received; ) {
      const length = diagBuffer.readUInt32LE(offset);
      const type = diagBuffer.readUInt16LE(offset + 4);
      if (type === NLMSG_DONE) return count;
      if (type === NLMSG_ERROR || length < NLMSG_HEADER) return null;
      // struct inet_diag_msg: family, state, timer, retrans, then inet_diag_sockid (its source port first, big-endian).
      if (type === SOCK_DIAG_BY_FAMILY && diagBuffer.readUInt16BE(offset + NLMSG_HEADER + 4) === port) count += 1;
      offset += (length + 3) & ~3;
    }
  }
}

/** listenersFromProc counts the listening TCP sockets on `port` in /proc/net/tcp and tcp6, which list every socket. */
export function listenersFromProc(port: number): number {
  const hexPort = `:${port.toString(16).toUpperCase().padStart(4, "0")}`;
  let count = 0;
  for (const file of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    let text: string;
    try {
      text = readFileSync(file, "utf8");
    } catch {
      continue;
    }
    for (const line of text.split("\n")) {
      const fields = line.trim().split(/\s+/);
      // sl local_address rem_address st ...: st 0A is LISTEN.
      if (fields[3] === "0A" && fields[1]?.endsWith(hexPort)) count += 1;
    }
  }
  return count;
}

/** UnixSocketName is a unix socket bound at a private name and renamed over its real path. */
export interface UnixSocketName {
  path: string;
  /** inode of the socket this process bound: the path is this process's while it names that inode. */
  inode: number;
}

/**
 * bindUnixAt binds a unix socket through `bind(privatePath)` and renames it over `path`, so
 * that `path` names a listening socket at every moment: the previous engine's until the
 * rename, this one's after it.
 */
export function bindUnixAt<T>(path: string, bind: (privatePath: string) => T): { server: T; name: UnixSocketName } {
  const bound = bindUnixPrivately(path, bind);
  return { server: bound.server, name: bound.publish() };
}

/**
 * bindUnixPrivately is bindUnixAt in two steps: the socket is bound at its private name now,
 * where no client finds it, and `publish()` renames it over `path` later. Creating the socket
 * is the slow half (an inode: milliseconds on a busy file system); the rename is the switch.
 * `discard()` removes the private name of a socket that will not be published.
 */
export function bindUnixPrivately<T>(
  path: string,
  bind: (privatePath: string) => T,
): { server: T; publish: () => UnixSocketName; discard: () => void } {
  // Short, as a unix socket's path is (at most 107 bytes; the data dir's is checked for
  // engine.sock): the first letter of the name and the pid, hidden beside it.
  const privatePath = join(dirname(path), `.${basename(path).slice(0, 1)}${process.pid}`);
  rmSync(privatePath, { force: true });
  const server = bind(privatePath);
  const inode = statSync(privatePath).ino;
  return {
    server,
    publish() {
      renameSync(privatePath, path);
      return { path, inode };
    },
    discard() {
      rmSync(privatePath, { force: true });
    },
  };
}

/** ownsPath says whether `name.path` still names the socket this process bound. */
export function ownsPath(name: UnixSocketName): boolean {
  try {
    return statSync(name.path).ino === name.inode;
  } catch {
    return false;
  }
}

/**
 * removeStaleNames removes the private socket names (`.<letter><pid>`) in `dir` whose process
 * is gone: a process killed between a bind and its rename, or a killed restart's control socket.
 */
export function removeStaleNames(dir: string): void {
  let entries: string[];
  try {
    entries = readdirSync(dir);
  } catch {
    return;
  }
  for (const entry of entries) {
    const match = /^\.[a-z](\d+)$/.exec(entry);
    if (!match) continue;
    try {
      process.kill(Number(match[1]), 0);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ESRCH") rmSync(join(dir, entry), { force: true });
    }
  }
}

/** removeIfOwned removes the socket's path unless a successor's socket has taken it over. */
export function removeIfOwned(name: UnixSocketName): void {
  if (ownsPath(name)) rmSync(name.path, { force: true });
}
