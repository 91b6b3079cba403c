import type { Socket } from "bun";

/**
 * Bytes is what the proxy writes: a Uint8Array, or a string of ASCII characters only (a head
 * with nothing above 0x7f), which Bun writes without a buffer allocated for it. Heads with
 * obs-text go through `wire` and become latin1 bytes.
 */
export type Bytes = string | Uint8Array;

const NON_ASCII = /[\x80-\xff]/;

/**
 * wire turns a head's latin1 text (one character per byte) into something to write: the
 * string itself when it is ASCII, as almost every head is, else its latin1 bytes (Bun would
 * write a string as UTF-8, which would change obs-text).
 */
export function wire(text: string): Bytes {
  return NON_ASCII.test(text) ? Buffer.from(text, "latin1") : text;
}

/** join puts a head and the first body bytes into one buffer, so they go out in one write (one segment). */
export function join(head: Bytes, body: Uint8Array): Uint8Array {
  if (typeof head !== "string") return Buffer.concat([head, body]);
  const joined = Buffer.allocUnsafe(head.length + body.length);
  joined.write(head, 0, "latin1");
  joined.set(body, head.length);
  return joined;
}

function byteLength(bytes: Bytes): number {
  return typeof bytes === "string" ? bytes.length : bytes.byteLength;
}

/** after is what is left of `bytes` past `offset`: a slice of an ASCII string (one byte per character), a view of a buffer. */
function after(bytes: Bytes, offset: number): Bytes {
  return typeof bytes === "string" ? bytes.slice(offset) : bytes.subarray(offset);
}

/** copyOf is bytes `from` to `to` of a buffer, copied. */
function copyOf(buffer: Uint8Array, from: number, to: number): Buffer {
  return Buffer.from(buffer.subarray(from, to));
}

/**
 * Outbox holds the bytes a socket did not take. Bun's `socket.write` is unbuffered: it returns
 * how many bytes the kernel (or the TLS layer) accepted, and the rest is the caller's to send
 * again on `drain`. A non-empty outbox is the proxy's backpressure signal: the side that feeds
 * this socket pauses reading until `flush` empties it, so a slow reader never makes the proxy
 * buffer a whole body.
 */
export class Outbox {
  private readonly queue: Bytes[] = [];

  /** empty is true when every byte given to `send` has been written. */
  get empty(): boolean {
    return this.queue.length === 0;
  }

  /**
   * send writes `bytes` after anything already queued and returns true when all of it was
   * written; false means bytes wait for `flush` (or the socket is closed).
   */
  send(socket: Socket<unknown>, bytes: Bytes): boolean {
    return this.write(socket, bytes, byteLength(bytes), false);
  }

  /**
   * sendCopy is `send` for the first `length` bytes of a buffer the caller writes again after
   * this call (a head written in place): what the socket does not take now is copied to wait.
   */
  sendCopy(socket: Socket<unknown>, buffer: Uint8Array, length: number): boolean {
    return this.write(socket, buffer, length, true);
  }

  /** write sends the first `length` bytes of `bytes`; what waits is a copy when the caller reuses `bytes`. */
  private write(socket: Socket<unknown>, bytes: Bytes, length: number, reused: boolean): boolean {
    if (this.queue.length > 0) {
      this.queue.push(reused ? copyOf(bytes as Uint8Array, 0, length) : bytes);
      return false;
    }
    const written = typeof bytes === "string" ? socket.write(bytes) : socket.write(bytes, 0, length);
    if (written === length) return true;
    if (written < 0) return false;
    this.queue.push(reused ? copyOf(bytes as Uint8Array, written, length) : written === 0 ? bytes : after(bytes, written));
    return false;
  }

  /** flush writes queued bytes, on `drain`; it returns true once the queue is empty. */
  flush(socket: Socket<unknown>): boolean {
    while (this.queue.length > 0) {
      const bytes = this.queue[0] as Bytes;
      const written = socket.write(bytes);
      if (written === byteLength(bytes)) {
        this.queue.shift();
        continue;
      }
      if (written > 0) this.queue[0] = after(bytes, written);
      return false;
    }
    return true;
  }

  /** clear drops what is queued, when the socket is gone. */
  clear(): void {
    this.queue.length = 0;
  }
}
