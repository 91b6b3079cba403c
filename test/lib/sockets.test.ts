import { expect, test } from "bun:test";
import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TCPSocketListenOptions } from "bun";
import {
  acceptQueueLength,
  bindUnixAt,
  bindUnixPrivately,
  listenersFromDiag,
  listenersFromProc,
  listenersOnPort,
  listeningTcpFd,
  listeningTcpFds,
  ownsPath,
  steerTo,
  steerToSocket,
  UNSTEERED,
  warmSocketCalls,
} from "../../src/lib/sockets";

/** countingListener listens on `port` (SO_REUSEPORT) and adds one to `counts[slot]` for each connection it accepts, which it ends. */
function countingListener(port: number, counts: number[], slot: number) {
  const options: TCPSocketListenOptions<unknown> = {
    hostname: "127.0.0.1",
    port,
    socket: {
      open(socket) {
        counts[slot] = (counts[slot] ?? 0) + 1;
        socket.end();
      },
      data() {},
    },
  };
  return Bun.listen({ ...options, reusePort: true } as TCPSocketListenOptions<unknown>);
}

test("acceptQueueLength counts the connections a listener has not accepted yet, and 0 once it has", async () => {
  const counts = [0];
  const listener = countingListener(0, counts, 0);
  const accepted = () => counts[0] ?? 0;
  try {
    const fd = listeningTcpFd(listener.port);
    expect(fd).not.toBeNull();
    expect(acceptQueueLength(fd as number)).toBe(0);
    // The child connects three times while this process's event loop is blocked in spawnSync:
    // the kernel completes the handshakes and queues them, and nothing accepts them yet.
    const child = Bun.spawnSync([
      "python3",
      "-c",
      `import socket\nfor _ in range(3): socket.create_connection(("127.0.0.1", ${listener.port})).close()`,
    ]);
    expect(child.exitCode).toBe(0);
    expect(acceptQueueLength(fd as number)).toBe(3);
    const deadline = Date.now() + 10_000;
    while (accepted() < 3 && Date.now() < deadline) await Bun.sleep(5);
    expect(accepted()).toBe(3);
    expect(acceptQueueLength(fd as number)).toBe(0);
  } finally {
    listener.stop(true);
  }
});

/** connectAll opens `count` connections to `port` one after another, each waited for until the listener has ended it. */
async function connectAll(port: number, count: number): Promise<void> {
  for (let index = 0; index < count; index++) {
    const { promise, resolve } = Promise.withResolvers<void>();
    await Bun.connect({ hostname: "127.0.0.1", port, socket: { data() {}, close: () => resolve(), error: () => resolve() } });
    await promise;
  }
}

test("steerTo sends every new connection to the group's socket at an index, and UNSTEERED spreads them by hash again", async () => {
  const accepted = [0, 0];
  const first = countingListener(0, accepted, 0);
  const second = countingListener(first.port, accepted, 1);
  try {
    expect(listenersOnPort(first.port)).toBe(2);
    const fd = listeningTcpFd(first.port);
    expect(fd).not.toBeNull();
    // The second listener bound last: it is the group's socket 1.
    expect(steerTo(fd as number, 1)).toBe(true);
    await connectAll(first.port, 20);
    expect(accepted).toEqual([0, 20]);
    expect(steerTo(fd as number, 0)).toBe(true);
    await connectAll(first.port, 20);
    expect(accepted).toEqual([20, 20]);
    expect(steerTo(fd as number, UNSTEERED)).toBe(true);
    await connectAll(first.port, 60);
    // By hash of the client's port: both get some.
    expect(accepted[0]).toBeGreaterThan(20);
    expect(accepted[1]).toBeGreaterThan(20);
  } finally {
    first.stop(true);
    second.stop(true);
  }
});

test("an index steers a group only until older sockets close: the newest moves into a closed one's slot (why steerToSocket exists)", async () => {
  const accepted = [0, 0, 0];
  const oldest = countingListener(0, accepted, 0);
  const older = countingListener(oldest.port, accepted, 1);
  const newest = countingListener(oldest.port, accepted, 2);
  try {
    const fd = listeningTcpFd(oldest.port) as number;
    expect(steerTo(fd, 2)).toBe(true);
    await connectAll(oldest.port, 10);
    expect(accepted).toEqual([0, 0, 10]);
    // The oldest closes: the group's last socket, the newest, takes its slot 0, so index 2 is out
    // of range and the kernel's hash spreads over the newest and `older`, which is retiring too.
    oldest.stop(true);
    await connectAll(oldest.port, 40);
    expect(accepted[1]).toBeGreaterThan(0);
  } finally {
    for (const listener of [oldest, older, newest]) listener.stop(true);
  }
});

test("steerToSocket sends every new connection to one socket while the others of its group close in any order; UNSTEERED spreads them again", async () => {
  const accepted = [0, 0, 0, 0];
  const first = countingListener(0, accepted, 0);
  const port = first.port;
  const second = countingListener(port, accepted, 1);
  const third = countingListener(port, accepted, 2);
  const steered = countingListener(port, accepted, 3);
  const listeners = [first, second, third, steered];
  try {
    const fds = listeningTcpFds(port);
    expect(fds).toHaveLength(4);
    expect(listeningTcpFd(port)).toBe(fds[0] as number);
    // The descriptors are in the order the listeners were opened: the last is `steered`'s.
    // Root may load the program; a user may not (the kernel lets users load socket filters only), and steers by index.
    const taken = steerToSocket(fds[3] as number);
    expect(taken).toBe(process.getuid?.() === 0);
    if (!taken) return;
    await connectAll(port, 10);
    expect(accepted).toEqual([0, 0, 0, 10]);
    // Close the others from the middle out, the order an index cannot follow.
    second.stop(true);
    await connectAll(port, 10);
    first.stop(true);
    await connectAll(port, 10);
    expect(accepted).toEqual([0, 0, 0, 30]);
    // A socket that joins later gets nothing while the program picks `steered`.
    const late = countingListener(port, accepted, 1);
    listeners.push(late);
    await connectAll(port, 10);
    expect(accepted).toEqual([0, 0, 0, 40]);
    expect(steerTo(fds[3] as number, UNSTEERED)).toBe(true);
    await connectAll(port, 60);
    // By hash of the client's port over `third`, `steered` and `late`: each gets some.
    expect(accepted[1]).toBeGreaterThan(0);
    expect(accepted[2]).toBeGreaterThan(0);
    expect(accepted[3]).toBeGreaterThan(40);
  } finally {
    for (const listener of listeners) listener.stop(true);
  }
});

test("listenersOnPort asks the kernel for the listening sockets only: IPv4 and IPv6, as they join and leave, not the connections", async () => {
  const first = countingListener(0, [], 0);
  const port = first.port;
  const listeners = [first, countingListener(port, [], 1)];
  const v6 = Bun.listen({ hostname: "::1", port, reusePort: true, socket: { data() {} } } as TCPSocketListenOptions<unknown>);
  // A connection to the port and one that closed (TIME_WAIT on one side) are not listeners.
  const { promise: closed, resolve } = Promise.withResolvers<void>();
  await Bun.connect({ hostname: "127.0.0.1", port, socket: { data() {}, close: () => resolve(), error: () => resolve() } });
  await closed;
  const held = await Bun.connect({ hostname: "::1", port, socket: { data() {} } });
  try {
    expect(listenersFromDiag(port)).toBe(3);
    expect(listenersOnPort(port)).toBe(3);
    expect(listenersFromProc(port)).toBe(3);
    listeners.pop()?.stop(true);
    expect(listenersOnPort(port)).toBe(2);
    v6.stop(true);
    expect(listenersOnPort(port)).toBe(1);
    expect(listenersFromProc(port)).toBe(1);
  } finally {
    held.end();
    for (const listener of listeners) listener.stop(true);
    v6.stop(true);
  }
  expect(listenersOnPort(port)).toBe(0);
});

test("bindUnixPrivately binds where no client finds it; publish renames it over the path, which names the old socket until then", async () => {
  const dir = mkdtempSync(join(tmpdir(), "engine-sockets-"));
  const path = join(dir, "engine.sock");
  const serve = (unix: string, text: string) => Bun.serve({ unix, fetch: () => new Response(text) });
  // A new connection each time: a kept-alive one would stay with the socket it was opened to.
  const ask = async () =>
    (await fetch("http://localhost/", { unix: path, keepalive: false, headers: { connection: "close" } } as RequestInit)).text();
  const old = bindUnixAt(path, (privatePath) => serve(privatePath, "old"));
  try {
    const next = bindUnixPrivately(path, (privatePath) => serve(privatePath, "new"));
    expect(await ask()).toBe("old");
    const name = next.publish();
    expect(await ask()).toBe("new");
    expect(ownsPath(name)).toBe(true);
    expect(ownsPath(old.name)).toBe(false);
    expect(readdirSync(dir)).toEqual(["engine.sock"]);
    next.server.stop(true);

    const discarded = bindUnixPrivately(path, (privatePath) => serve(privatePath, "never"));
    expect(readdirSync(dir).length).toBe(2);
    discarded.server.stop(true);
    discarded.discard();
    expect(readdirSync(dir)).toEqual(["engine.sock"]);
  } finally {
    old.server.stop(true);
    rmSync(dir, { recursive: true, force: true });
  }
});

test("warmSocketCalls finds no listener for port 0 and leaves the scan ready", () => {
  warmSocketCalls();
  expect(listeningTcpFd(0)).toBeNull();
  const server = Bun.serve({ port: 0, fetch: () => new Response("x") });
  try {
    expect(listeningTcpFd(server.port as number)).not.toBeNull();
  } finally {
    server.stop(true);
  }
});
