import { expect, test } from "bun:test";
import { acceptQueueLength, listeningTcpFd } from "../../src/lib/sockets";

test("acceptQueueLength counts the connections a listener has not accepted yet, and 0 once it has", async () => {
  let accepted = 0;
  const listener = Bun.listen({
    hostname: "127.0.0.1",
    port: 0,
    socket: {
      open() {
        accepted += 1;
      },
      data() {},
    },
  });
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
    while (accepted < 3 && Date.now() < deadline) await Bun.sleep(5);
    expect(accepted).toBe(3);
    expect(acceptQueueLength(fd as number)).toBe(0);
  } finally {
    listener.stop(true);
  }
});
