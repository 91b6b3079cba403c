/**
 * bench/handover.ts: how a listening port changes hands between two processes under Bun, the
 * measurement behind docs/decisions.md 360. Each round starts a new server process beside the
 * serving one, which then stops accepting, lets what it accepted finish and exits, while
 * clients send GET / back to back (two on kept-alive connections, two opening one per
 * request). Three ways:
 *
 * - reuseport: both bind the port with SO_REUSEPORT (Bun.serve `reusePort`); the old one closes.
 * - reuseport+steer: the same, and the classic BPF program `ret #1` on the port's reuseport
 *   group sends every new connection to the newest socket; the old one closes 25 ms after the
 *   new one bound (what the engine does).
 * - inherited fd: one listening socket, made once (here by the bench, as systemd socket
 *   activation does) and inherited by every server, which serves it with `Bun.listen({fd})`
 *   and a minimal HTTP/1.1 responder: Bun.serve takes no descriptor (`Bun.serve({fd})` is
 *   ignored and binds :3000), so the engine's API could only serve an inherited socket through
 *   a hand-written HTTP server.
 *
 * Printed: failed requests and the longest time between two answers, median of the runs with
 * the spread. Usage: bun bench/handover.ts [--runs 5] [--rounds 20]
 */
import { dlopen, FFIType, ptr } from "bun:ffi";
import { listeningTcpFd, steerToNewest } from "../src/lib/sockets";
import { fmt, freePort, median, numericArg, printRows } from "./lib";

type Mode = "reuseport" | "reuseport+steer" | "inherited fd";
const MODES: Mode[] = ["reuseport", "reuseport+steer", "inherited fd"];
const STEER_GRACE_MS = 25;

// ------------------------------------------------------------------ the server processes

if (process.argv[2] === "--serve") {
  const mode = process.argv[3] as Mode;
  const port = Number(process.argv[4]);
  const body = String(process.pid);
  let stop: () => void;
  let inFlight: () => number;
  if (mode === "inherited fd") {
    const response = `HTTP/1.1 200 OK\r\ncontent-length: ${body.length}\r\ncontent-type: text/plain\r\n\r\n${body}`;
    let stopping = false;
    const listener = Bun.listen<{ buffer: string }>({
      fd: 3,
      socket: {
        open(socket: { data: { buffer: string } }) {
          socket.data = { buffer: "" };
        },
        data(socket: { data: { buffer: string }; write(text: string): void; end(): void }, chunk: Buffer) {
          socket.data.buffer += chunk.toString();
          for (let end = socket.data.buffer.indexOf("\r\n\r\n"); end >= 0; end = socket.data.buffer.indexOf("\r\n\r\n")) {
            socket.data.buffer = socket.data.buffer.slice(end + 4);
            socket.write(stopping ? response.replace("\r\n\r\n", "\r\nconnection: close\r\n\r\n") : response);
            if (stopping) socket.end();
          }
        },
      },
    } as unknown as Parameters<typeof Bun.listen<{ buffer: string }>>[0]);
    stop = () => {
      stopping = true;
      listener.stop(false);
    };
    inFlight = () => 0;
  } else {
    const server = Bun.serve({ hostname: "127.0.0.1", port, reusePort: true, fetch: () => new Response(body) });
    if (mode === "reuseport+steer") {
      const fd = listeningTcpFd(port);
      if (fd === null || !steerToNewest(fd)) console.error("could not steer");
    }
    stop = () => server.stop(false);
    inFlight = () => server.pendingRequests;
  }
  process.on("message", async (message: unknown) => {
    if (message !== "stop") return;
    if (mode === "reuseport+steer") await Bun.sleep(STEER_GRACE_MS);
    stop();
    while (inFlight() > 0) await Bun.sleep(2);
    await Bun.sleep(20);
    process.exit(0);
  });
  process.send?.("ready");
} else {
  await main();
}

// ------------------------------------------------------------------ the driver

/** listeningSocket makes the one socket of the "inherited fd" way: bound and listening, inheritable. */
function listeningSocket(port: number): number {
  const libc = dlopen("libc.so.6", {
    socket: { args: [FFIType.i32, FFIType.i32, FFIType.i32], returns: FFIType.i32 },
    bind: { args: [FFIType.i32, FFIType.ptr, FFIType.u32], returns: FFIType.i32 },
    listen: { args: [FFIType.i32, FFIType.i32], returns: FFIType.i32 },
  }).symbols;
  const fd = libc.socket(2, 1, 0); // AF_INET, SOCK_STREAM, no CLOEXEC: inherited
  const address = Buffer.alloc(16);
  address.writeUInt16LE(2, 0);
  address.writeUInt16BE(port, 2);
  address.set([127, 0, 0, 1], 4);
  if (libc.bind(fd, ptr(address), 16) !== 0 || libc.listen(fd, 511) !== 0) throw new Error(`cannot listen on ${port}`);
  return fd;
}

interface RunResult {
  answered: number;
  failed: number;
  longestGapMs: number;
}

async function run(mode: Mode, rounds: number): Promise<RunResult> {
  const port = await freePort();
  const fd = mode === "inherited fd" ? listeningSocket(port) : null;
  const start = async () => {
    let ready!: () => void;
    const started = new Promise<void>((resolve) => {
      ready = resolve;
    });
    const proc = Bun.spawn([process.execPath, import.meta.path, "--serve", mode, String(port)], {
      stdio: ["ignore", "inherit", "inherit", ...(fd === null ? [] : [fd])] as never,
      ipc(message) {
        if (message === "ready") ready();
      },
    });
    await started;
    return proc;
  };
  let serving = await start();
  let go = true;
  let answered = 0;
  let failed = 0;
  let last = performance.now();
  let longest = 0;
  const client = (keepalive: boolean) =>
    (async () => {
      while (go) {
        try {
          const response = await fetch(`http://127.0.0.1:${port}/`, { keepalive, signal: AbortSignal.timeout(5000) });
          await response.text();
          const now = performance.now();
          longest = Math.max(longest, now - last);
          last = now;
          answered += 1;
        } catch {
          failed += 1;
        }
        await Bun.sleep(1);
      }
    })();
  const clients = [client(true), client(true), client(false), client(false)];
  try {
    await Bun.sleep(200);
    last = performance.now();
    longest = 0;
    for (let round = 0; round < rounds; round++) {
      const next = await start();
      serving.send("stop");
      await serving.exited;
      serving = next;
      await Bun.sleep(100);
    }
  } finally {
    go = false;
    await Promise.all(clients);
    serving.kill();
    await serving.exited;
  }
  return { answered, failed, longestGapMs: longest };
}

async function main(): Promise<void> {
  const runs = numericArg("--runs", 5);
  const rounds = numericArg("--rounds", 20);
  const rows: string[][] = [];
  for (const mode of MODES) {
    const results: RunResult[] = [];
    for (let index = 0; index < runs; index++) results.push(await run(mode, rounds));
    const failed = results.map((result) => result.failed);
    const gaps = results.map((result) => result.longestGapMs);
    rows.push([
      mode,
      String(median(failed)),
      `${Math.min(...failed)}–${Math.max(...failed)}`,
      String(failed.reduce((sum, value) => sum + value, 0)),
      String(Math.round(median(results.map((result) => result.answered)))),
      fmt(median(gaps), 1),
      `${fmt(Math.min(...gaps), 1)}–${fmt(Math.max(...gaps), 1)}`,
    ]);
  }
  printRows(
    `Port hand-over between two Bun processes (${rounds} hand-overs a run, 4 clients sending back to back; median of ${runs} runs)`,
    ["way", "failed (median)", "failed (spread)", "failed (all runs)", "answered", "longest gap ms", "gap spread ms"],
    rows,
  );
}
