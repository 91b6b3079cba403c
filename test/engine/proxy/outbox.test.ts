import { describe, expect, test } from "bun:test";
import type { Socket } from "bun";
import { Outbox } from "../../../src/engine/proxy/outbox";

/** takes is a socket that accepts at most `room` bytes a write, and keeps what it accepted. */
function takes(room: number) {
  const received: number[] = [];
  const socket = {
    room,
    write(data: string | Uint8Array, offset = 0, length?: number): number {
      const bytes =
        typeof data === "string" ? Buffer.from(data, "latin1") : data.subarray(offset, length === undefined ? undefined : offset + length);
      const accepted = Math.min(bytes.length, this.room);
      received.push(...bytes.subarray(0, accepted));
      return accepted;
    },
  };
  return { socket: socket as unknown as Socket<unknown> & { room: number }, received };
}

describe("Outbox.sendCopy: a buffer its caller writes again", () => {
  test("what the socket takes at once is not copied, and the call says so", () => {
    const { socket, received } = takes(1024);
    const outbox = new Outbox();
    const buffer = Buffer.from("GET / HTTP/1.1\r\n\r\nleft over", "latin1");
    expect(outbox.sendCopy(socket, buffer, 18)).toBe(true);
    expect(outbox.empty).toBe(true);
    expect(Buffer.from(received).toString("latin1")).toBe("GET / HTTP/1.1\r\n\r\n");
  });

  test("the bytes a full socket left wait as a copy: the caller may overwrite its buffer at once", () => {
    const { socket, received } = takes(4);
    const outbox = new Outbox();
    const buffer = Buffer.from("0123456789", "latin1");
    expect(outbox.sendCopy(socket, buffer, 8)).toBe(false);
    buffer.fill(0x78);
    // Bytes sent after it wait behind it, in order, copied too.
    buffer.write("ab", 0, "latin1");
    expect(outbox.sendCopy(socket, buffer, 2)).toBe(false);
    buffer.fill(0x79);
    socket.room = 1024;
    expect(outbox.flush(socket)).toBe(true);
    expect(Buffer.from(received).toString("latin1")).toBe("01234567ab");
  });

  test("a closed socket (-1) queues nothing", () => {
    const outbox = new Outbox();
    const closed = { write: () => -1 } as unknown as Socket<unknown>;
    expect(outbox.sendCopy(closed, Buffer.from("abc"), 3)).toBe(false);
    expect(outbox.empty).toBe(true);
  });
});
