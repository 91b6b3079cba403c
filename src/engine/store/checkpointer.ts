import type { Database } from "bun:sqlite";

/** CHECKPOINT_EVERY_MS is how often the worker looks whether the WAL has pages to copy into the database. */
export const CHECKPOINT_EVERY_MS = 500;
/**
 * RESTART_FRAMES is the WAL length (pages of 4 KiB: 16 MiB) past which the worker checkpoints with
 * RESTART: under writes that never pause, a passive checkpoint never catches up with the last
 * commit, and the WAL only starts over at its beginning once one has.
 */
export const RESTART_FRAMES = 4000;
/** AUTOCHECKPOINT_PAGES is SQLite's own default: the worker checkpoints at it too, and the connection gets it back if the worker fails. */
const AUTOCHECKPOINT_PAGES = 1000;

/** CheckpointMessage is the worker's first message (what to checkpoint, how often), then `stop`, its last. */
type CheckpointMessage = { path: string; everyMs: number; checkpointFrames: number; restartFrames: number } | { stop: true };
/** CheckpointReport is what the worker answers: ready, a failed checkpoint (it tries again), or ended (it could not open the database). */
export type CheckpointReport = { ready: true } | { failed: string } | { ended: string };

/**
 * checkpointWorker is the worker's whole program. It runs from its own source text (toString),
 * so it uses nothing from outside its body: it opens its own connection to the database and,
 * every `everyMs`, checkpoints PASSIVE once `checkpointFrames` pages wait in the WAL (it never
 * waits for the writer, nor makes it wait), and with RESTART once the WAL is `restartFrames`
 * long (the writer then waits for one short copy). How many pages wait it reads from the WAL
 * index's header in the `-shm` file (mxFrame, and the checkpoint's nBackfill: SQLite's file
 * format, in the machine's byte order): a checkpoint that copied everything lets the next commit
 * start the WAL over, which syncs its header on the writer's thread, so checkpointing at every
 * turn made a light load's commits wait for that sync twice a second. Where the header cannot
 * be read, it checkpoints at every turn.
 */
function checkpointWorker(scope: {
  onmessage: ((event: MessageEvent<CheckpointMessage>) => void) | null;
  postMessage(report: CheckpointReport): void;
  close(): void;
}): void {
  let db: import("bun:sqlite").Database | null = null;
  let timer: ReturnType<typeof setInterval> | null = null;
  scope.onmessage = async (event) => {
    const message = event.data;
    if ("stop" in message) {
      // No last checkpoint: the connection checkpoints again from now on (and when it closes),
      // and a stop during a restart's hand-over should cost nothing.
      if (timer) clearInterval(timer);
      db?.close();
      db = null;
      scope.close();
      return;
    }
    const { Database } = await import("bun:sqlite");
    let opened: import("bun:sqlite").Database;
    try {
      opened = new Database(message.path, { readwrite: true, create: false });
      opened.exec("PRAGMA busy_timeout = 5000");
    } catch (error) {
      scope.postMessage({ ended: `cannot open ${message.path}: ${(error as Error).message}` });
      return;
    }
    db = opened;
    const checkpoint = (mode: "PASSIVE" | "RESTART") =>
      opened.query<{ busy: number; log: number; checkpointed: number }, []>(`PRAGMA wal_checkpoint(${mode})`).get();
    const { closeSync, openSync, readSync } = await import("node:fs");
    const header = new Uint8Array(100);
    const view = new DataView(header.buffer);
    const little = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
    /** waiting answers [pages in the WAL, pages not yet copied], or null where the index cannot be read. */
    const waiting = (): [number, number] | null => {
      let fd = -1;
      try {
        fd = openSync(`${message.path}-shm`, "r");
        if (readSync(fd, header, 0, 100, 0) < 100) return null;
      } catch {
        return null;
      } finally {
        if (fd >= 0) closeSync(fd);
      }
      const frames = view.getUint32(16, little);
      const copied = view.getUint32(96, little);
      return [frames, copied <= frames ? frames - copied : frames];
    };
    // A failure is reported once until a checkpoint succeeds again (a full disk fails every turn).
    let failing = "";
    timer = setInterval(() => {
      try {
        const wal = waiting();
        if (wal && wal[1] < message.checkpointFrames && wal[0] < message.restartFrames) return;
        const passive = checkpoint("PASSIVE");
        if (passive && passive.log >= message.restartFrames) checkpoint("RESTART");
        failing = "";
      } catch (error) {
        const text = (error as Error).message;
        if (text !== failing) scope.postMessage({ failed: text });
        failing = text;
      }
    }, message.everyMs);
    scope.postMessage({ ready: true });
  };
}

/** Checkpointer is the running worker; stop() ends it and gives the connection its automatic checkpoint back. */
export interface Checkpointer {
  stop(): void;
}

/**
 * startCheckpointer moves the WAL checkpoints of `db` (the file at `path`) off the calling
 * thread. SQLite's automatic checkpoint runs inside the commit that takes the WAL past 1000
 * pages and fsyncs the WAL and the database there, on the daemon's event loop: measured on this
 * machine's disk, 36 µs a commit on average, in stalls of milliseconds (decision 502). The
 * connection turns it off once a worker thread, with a connection of its own, is ready to
 * checkpoint instead. Should the worker fail, the connection gets its automatic checkpoint
 * back. `onFailed` hears of a checkpoint that failed (a full disk, say); the worker tries again
 * at its next turn.
 */
export function startCheckpointer(
  db: Database,
  path: string,
  onFailed: (message: string) => void,
  options: { everyMs?: number; checkpointFrames?: number; restartFrames?: number } = {},
): Checkpointer {
  const source = `(${checkpointWorker.toString()})(self);`;
  const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
  const worker = new Worker(url);
  let running = true;
  const fallBack = (why: string) => {
    if (!running) return;
    running = false;
    URL.revokeObjectURL(url);
    db.exec(`PRAGMA wal_autocheckpoint = ${AUTOCHECKPOINT_PAGES}`);
    onFailed(`the checkpoint worker ended (${why}); the database checkpoints in its commits again`);
  };
  worker.onmessage = (event: MessageEvent<CheckpointReport>) => {
    const report = event.data;
    // The connection stops checkpointing only once the worker does. The worker loads its source
    // from the URL after the constructor returns: the URL is let go once it has.
    if ("ready" in report) {
      URL.revokeObjectURL(url);
      if (running) db.exec("PRAGMA wal_autocheckpoint = 0");
    } else if ("failed" in report) onFailed(report.failed);
    else if ("ended" in report) {
      fallBack(report.ended);
      worker.terminate();
    }
  };
  worker.onerror = (event) => {
    fallBack(String(event.message).split("\n").at(-1) ?? "");
    worker.terminate();
  };
  worker.addEventListener("close", () => fallBack("it exited"));
  worker.postMessage({
    path,
    everyMs: options.everyMs ?? CHECKPOINT_EVERY_MS,
    checkpointFrames: options.checkpointFrames ?? AUTOCHECKPOINT_PAGES,
    restartFrames: options.restartFrames ?? RESTART_FRAMES,
  } satisfies CheckpointMessage);
  (worker as Worker & { unref?: () => void }).unref?.();
  return {
    stop() {
      if (!running) return;
      running = false;
      // Not waited for: the worker closes its connection and ends on its own thread, while the
      // connection checkpoints in its commits again from this moment.
      worker.postMessage({ stop: true } satisfies CheckpointMessage);
      URL.revokeObjectURL(url);
      db.exec(`PRAGMA wal_autocheckpoint = ${AUTOCHECKPOINT_PAGES}`);
    },
  };
}
