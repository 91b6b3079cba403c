import { createReadStream } from "node:fs";
import { createGunzip } from "node:zlib";

/** Sink is the writable end of a child's stdin, as Bun.spawn gives it. */
export interface Sink {
  write(chunk: Uint8Array): number | Promise<number>;
  flush(): number | Promise<number>;
  end(): number | Promise<number>;
}

/**
 * feedFile streams a file (decompressed when `gzip`) into a child's stdin, calling `onRead`
 * with the bytes read from disk so far (compressed bytes for a gzip file: the file's size is
 * the total the user sees). It stops, without error, when the signal aborts.
 */
export async function feedFile(
  path: string,
  sink: Sink,
  { gzip, signal, onRead }: { gzip: boolean; signal: AbortSignal; onRead: (bytes: number) => void },
): Promise<void> {
  const file = createReadStream(path, { highWaterMark: 1024 * 1024 });
  let read = 0;
  file.on("data", (chunk) => {
    read += (chunk as Buffer).length;
    onRead(read);
  });
  const source = gzip ? file.pipe(createGunzip()) : file;
  const stop = () => file.destroy();
  signal.addEventListener("abort", stop, { once: true });
  try {
    for await (const chunk of source as AsyncIterable<Buffer>) {
      if (signal.aborted) return;
      await sink.write(chunk);
      await sink.flush();
    }
  } catch (error) {
    if (signal.aborted) return;
    // A child that exited early closes its stdin: its own exit status tells why.
    if ((error as NodeJS.ErrnoException).code === "EPIPE") return;
    throw error;
  } finally {
    signal.removeEventListener("abort", stop);
    try {
      await sink.end();
    } catch {
      // the child is gone
    }
  }
}
