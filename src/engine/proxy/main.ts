import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { pinCallingThread } from "../../lib/affinity";
import { readProcessStat } from "../supervisor";
import { ProxyListener } from "./listener";
import type { FromProxy, ProxyPidRecord, ToProxy } from "./snapshot";

/** COUNTS_REPORT_MS is how often a proxy process sends its request counts to the daemon. */
export const COUNTS_REPORT_MS = 5000;

/** ORPHAN_GRACE_MS is how long a proxy process keeps serving once its daemon is gone, waiting to be retired by the next one. */
const ORPHAN_GRACE_MS = 60_000;

/**
 * runProxyProcess is the body of a proxy process (this module as the entry of the compiled
 * binary's proxy bundle, of Bun from source, or of `engine __proxy`): it binds when the daemon
 * sends the first snapshot, applies later ones, and outlives its daemon for a short grace so
 * that a daemon restarting in place (execve) keeps the ports served until the next daemon's
 * processes have bound and retire this one with SIGTERM.
 */
export function runProxyProcess(): void {
  let listener: ProxyListener | null = null;
  let pidFile: string | null = null;
  let stopping = false;
  const send = (message: FromProxy) => {
    try {
      process.send?.(message);
    } catch {
      // the daemon is gone; nothing to tell
    }
  };
  const reportCounts = () => {
    if (listener) send({ type: "counts", counts: listener.meter.report() });
  };
  const reporter = setInterval(reportCounts, COUNTS_REPORT_MS);
  reporter.unref?.();
  const stop = async (graceful: boolean, code = 0) => {
    if (stopping) return;
    stopping = true;
    clearInterval(reporter);
    const deadline = setTimeout(() => process.exit(code), graceful ? 30_000 : 1000);
    deadline.unref?.();
    await listener?.stop(graceful);
    // What was answered while draining reaches the daemon before the process goes.
    reportCounts();
    if (pidFile) rmSync(pidFile, { force: true });
    process.exit(code);
  };

  process.on("message", (raw: unknown) => {
    const message = raw as ToProxy;
    if (message.type === "start") {
      try {
        listener = new ProxyListener(message.config);
        listener.start(message.snapshot);
        mkdirSync(message.config.stateDir, { recursive: true, mode: 0o700 });
        pidFile = join(message.config.stateDir, `${process.pid}.pid`);
        const record: ProxyPidRecord = {
          pid: process.pid,
          start_time: readProcessStat(process.pid)?.startTime ?? 0,
          https_port: listener.httpsPort,
          http_port: listener.httpPort,
        };
        writeFileSync(pidFile, `${JSON.stringify(record)}\n`);
        // Pinned once bound: a process that could not bind ends anyway. The runtime's threads that
        // run already (its collector's helpers) keep every CPU (docs/decisions.md 521).
        const cpu = typeof message.cpu === "number" && pinCallingThread(message.cpu) ? message.cpu : null;
        send({
          type: "ready",
          httpsPort: listener.httpsPort,
          httpPort: listener.httpPort,
          generation: listener.generation,
          cpu,
          ...(message.config.steer ? { steered: listener.steeredBy } : {}),
        });
      } catch (error) {
        const err = error as NodeJS.ErrnoException;
        send({ type: "error", code: err.code ?? "proxy_failed", message: err.message });
        void stop(false, 1);
      }
    } else if (message.type === "snapshot" && listener) {
      try {
        listener.apply(message.snapshot);
        send({ type: "applied", generation: listener.generation, rebinds: listener.rebinds });
      } catch (error) {
        send({ type: "error", code: (error as NodeJS.ErrnoException).code ?? "proxy_failed", message: (error as Error).message });
      }
    } else if (message.type === "unsteer") {
      listener?.unsteer();
    } else if (message.type === "stop") {
      void stop(true);
    }
  });
  process.on("disconnect", () => {
    if (stopping) return;
    // The daemon went away: re-executing itself for a restart, or killed. Keep serving the
    // last snapshot until the next daemon retires this process, or the grace runs out.
    setTimeout(() => void stop(true), ORPHAN_GRACE_MS).unref?.();
  });
  process.on("SIGTERM", () => void stop(true));
  process.on("SIGINT", () => void stop(true));
}

if (import.meta.main) runProxyProcess();
