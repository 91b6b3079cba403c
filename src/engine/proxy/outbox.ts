import type { Socket } from "bun";

/**
 * Outbox holds the bytes a socket did not take. Bun's `socket.write` is unbuffered: it returns
 * how many bytes the kernel (or the TLS layer) accepted, and the rest is the caller's to send
 * again on `drain`. A non-empty outbox is the proxy's backpressure signal: the side that feeds
 * this socket pauses reading until `flush` empties it, so a slow reader never makes the proxy
 * buffer a whole body.
 */
export class Outbox {
  private readonly queue: Uint8Array[] = [];

  /** empty is true when every byte given to `send` has been written. */
  get empty(): boolean {
    return this.queue.length === 0;
  }

  /**
   * send writes `bytes` after anything already queued and returns true when all of it was
   * written; false means bytes wait for `flush` (or the socket is closed).
   */
  send(socket: Socket<unknown>, bytes: Uint8Array): boolean {
    if (this.queue.length > 0) {
      this.queue.push(bytes);
      return false;
    }
    const written = socket.write(bytes);
    if (written === bytes.byteLength) return true;
    if (written < 0) return false;
    this.queue.push(written === 0 ? bytes : bytes.subarray(written));
    return false;
  }

  /** flush writes queued bytes, on `drain`; it returns true once the queue is empty. */
  flush(socket: Socket<unknown>): boolean {
    while (this.queue.length > 0) {
      const bytes = this.queue[0] as Uint8Array;
      const written = socket.write(bytes);
      if (written === bytes.byteLength) {
        this.queue.shift();
        continue;
      }
      if (written > 0) this.queue[0] = bytes.subarray(written);
      return false;
    }
    return true;
  }

  /** clear drops what is queued, when the socket is gone. */
  clear(): void {
    this.queue.length = 0;
  }
}
