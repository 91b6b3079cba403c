import { expect, test } from "bun:test";
import type { TCPSocketListenOptions } from "bun";
import { acceptQueueLength, listenersOnPort, listeningTcpFd, steerTo, UNSTEERED } from "../../src/lib/sockets";

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

test("steerTo sends every new connection to the group's socket at an index, and UNSTEERED spreads them by hash again", async () => {
  const accepted = [0, 0];
  const first = countingListener(0, accepted, 0);
  const second = countingListener(first.port, accepted, 1);
  const connectAll = async (count: number) => {
    for (let index = 0; index < count; index++) {
      const { promise, resolve } = Promise.withResolvers<void>();
      await Bun.connect({ hostname: "127.0.0.1", port: first.port, socket: { data() {}, close: () => resolve(), error: () => resolve() } });
      await promise;
    }
  };
  try {
    expect(listenersOnPort(first.port)).toBe(2);
    const fd = listeningTcpFd(first.port);
    expect(fd).not.toBeNull();
    // The second listener bound last: it is the group's socket 1.
    expect(steerTo(fd as number, 1)).toBe(true);
    await connectAll(20);
    expect(accepted).toEqual([0, 20]);
    expect(steerTo(fd as number, 0)).toBe(true);
    await connectAll(20);
    expect(accepted).toEqual([20, 20]);
    expect(steerTo(fd as number, UNSTEERED)).toBe(true);
    await connectAll(60);
    // By hash of the client's port: both get some.
    expect(accepted[0]).toBeGreaterThan(20);
    expect(accepted[1]).toBeGreaterThan(20);
  } finally {
    first.stop(true);
    second.stop(true);
  }
});
