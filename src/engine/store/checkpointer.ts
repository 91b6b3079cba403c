import type { Database } from "bun:sqlite";

/** CHECKPOINT_EVERY_MS is how often the worker looks at the WAL: a busy one is checkpointed at once. */
const CHECKPOINT_EVERY_MS = 500;
/** IDLE_EVERY_MS is how long a quiet WAL (fewer than AUTOCHECKPOINT_PAGES) waits for its checkpoint. */
const IDLE_EVERY_MS = 30_000;
/**
 * RESTART_FRAMES is the WAL length (pages of 4 KiB: 16 MiB) past which the worker checkpoints with
 * RESTART: under writes that never pause, a passive checkpoint never catches up with the last
 * commit, and the WAL only starts over at its beginning once one has.
 */
const RESTART_FRAMES = 4000;
/** AUTOCHECKPOINT_PAGES is SQLite's own default: what the worker counts as a busy WAL, and what the connection gets back if the worker fails. */
const AUTOCHECKPOINT_PAGES = 1000;

/** CheckpointMessage is the worker's first message (what to checkpoint, how often), then `stop`, its last. */
type CheckpointMessage =
  | { path: string; everyMs: number; idleMs: number; checkpointFrames: number; restartFrames: number }
  | { stop: true };
/**
 * CheckpointReport is what the worker answers: ready, a failed checkpoint (it tries again), ended
 * (it could not open the database), or closed (after `stop`: its connection is closed, and what
 * is left of its end is its thread's own).
 */
type CheckpointReport = { ready: true } | { failed: string } | { ended: string } | { closed: true };

/**
 * checkpointWorker is the worker's whole program. It runs from its own source text (toString),
 * so it uses nothing from outside its body: it opens its own connection to the database and
 * checkpoints PASSIVE (it never waits for the writer, nor makes it wait), and with RESTART once
 * the WAL is `restartFrames` long (the writer then waits for one short copy). It looks every
 * `everyMs`, and checkpoints when the last checkpoint found `checkpointFrames` pages or more,
 * or the WAL file grew by as many since, else once `idleMs` passed: a checkpoint that copied
 * everything lets the next commit start the WAL over, which syncs its header on the writer's
 * thread, so checkpointing every 500 ms made a light load's commits wait for that sync twice a
 * second. It never opens the `-shm` file to count the pages from the WAL index: closing a
 * descriptor of it would drop the POSIX locks SQLite holds there for this process.
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
      scope.postMessage({ closed: true });
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
    const { statSync } = await import("node:fs");
    const pageBytes = opened.query<{ page_size: number }, []>("PRAGMA page_size").get()?.page_size ?? 4096;
    /** walBytes is the WAL file's size: stat, no descriptor (see above). */
    const walBytes = () => {
      try {
        return statSync(`${message.path}-wal`).size;
      } catch {
        return 0;
      }
    };
    // A failure is reported once until a checkpoint succeeds again (a full disk fails every turn).
    let failing = "";
    let busy = false;
    let lastBytes = walBytes();
    let lastAt = Date.now();
    timer = setInterval(() => {
      // Now when the last one found a busy WAL or the file grew by as much since, else once idleMs passed.
      const bytes = walBytes();
      if (!busy && bytes - lastBytes < message.checkpointFrames * pageBytes && Date.now() - lastAt < message.idleMs) return;
      lastAt = Date.now();
      try {
        const passive = checkpoint("PASSIVE");
        busy = (passive?.log ?? 0) >= message.checkpointFrames;
        if (passive && passive.log >= message.restartFrames) checkpoint("RESTART");
        failing = "";
      } catch (error) {
        const text = (error as Error).message;
        if (text !== failing) scope.postMessage({ failed: text });
        failing = text;
      }
      lastBytes = walBytes();
    }, message.everyMs);
    scope.postMessage({ ready: true });
  };
}

/**
 * Checkpointer is the running worker; stop() ends it, gives the connection its automatic
 * checkpoint back, and resolves once the worker has closed its own connection (at most
 * STOP_WAIT_MS): the caller's close is then the database's last, which removes the WAL itself,
 * and nothing of the worker touches the data dir after the store's stop.
 */
export interface Checkpointer {
  stop(): Promise<void>;
}

/** STOP_WAIT_MS bounds the wait for the worker's own close (a checkpoint under way finishes first). */
const STOP_WAIT_MS = 1000;

/**
 * startCheckpointer moves the WAL checkpoints of `db` (the file at `path`) off the calling
 * thread. SQLite's automatic checkpoint runs inside the commit that takes the WAL past 1000
 * pages and fsyncs the WAL and the database there, on the daemon's event loop: measured on this
 * machine's disk, 36 µs a commit on average, in stalls of milliseconds (decision 502). The
 * connection turns it off once a worker thread, with a connection of its own, is ready to
 * checkpoint instead. Should the worker fail, the connection gets its automatic checkpoint
 * back. `onFailed` hears of a checkpoint that failed (a full disk, say; the worker tries again
 * at its next turn), or, with `ended`, of the worker's end (the commits checkpoint again).
 */
export function startCheckpointer(
  db: Database,
  path: string,
  onFailed: (message: string, ended: boolean) => void,
  options: { everyMs?: number; idleMs?: number; checkpointFrames?: number; restartFrames?: number } = {},
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
    onFailed(`the checkpoint worker ended (${why}); the database checkpoints in its commits again`, true);
  };
  worker.onmessage = (event: MessageEvent<CheckpointReport>) => {
    const report = event.data;
    // The connection stops checkpointing only once the worker does. The worker loads its source
    // from the URL after the constructor returns: the URL is let go once it has.
    if ("ready" in report) {
      URL.revokeObjectURL(url);
      if (running) db.exec("PRAGMA wal_autocheckpoint = 0");
    } else if ("closed" in report) markClosed();
    else if ("failed" in report) onFailed(report.failed, false);
    else if ("ended" in report) {
      fallBack(report.ended);
      worker.terminate();
    }
  };
  worker.onerror = (event) => {
    fallBack(String(event.message).split("\n").at(-1) ?? "");
    worker.terminate();
  };
  // closed settles once the worker's connection is closed: its `closed` report, or its thread's end.
  let markClosed!: () => void;
  const closed = new Promise<void>((resolve) => {
    markClosed = resolve;
  });
  worker.addEventListener("close", () => {
    markClosed();
    fallBack("it exited");
  });
  worker.postMessage({
    path,
    everyMs: options.everyMs ?? CHECKPOINT_EVERY_MS,
    idleMs: options.idleMs ?? IDLE_EVERY_MS,
    checkpointFrames: options.checkpointFrames ?? AUTOCHECKPOINT_PAGES,
    restartFrames: options.restartFrames ?? RESTART_FRAMES,
  } satisfies CheckpointMessage);
  (worker as Worker & { unref?: () => void }).unref?.();
  return {
    async stop() {
      if (!running) return;
      running = false;
      // The connection checkpoints in its commits again from this moment; the worker closes its
      // connection and says so, which is waited for (bounded): when it closed after the store
      // did, it was the last connection and removed the WAL while the data dir was being
      // removed, and a removal that met it left part of the dir behind. The end of its thread
      // (its runtime's teardown, touching no file) is not waited for: it took a drain restart's
      // release 5-25 ms (decision 512).
      worker.postMessage({ stop: true } satisfies CheckpointMessage);
      URL.revokeObjectURL(url);
      db.exec(`PRAGMA wal_autocheckpoint = ${AUTOCHECKPOINT_PAGES}`);
      let bound: ReturnType<typeof setTimeout> | undefined;
      await Promise.race([closed, new Promise<void>((resolve) => (bound = setTimeout(resolve, STOP_WAIT_MS)))]);
      clearTimeout(bound);
    },
  };
}
