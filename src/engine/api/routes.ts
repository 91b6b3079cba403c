import { Elysia } from "elysia";
import {
  AUTHED,
  DaemonRestartRequest,
  DaemonUpgradeAccepted,
  DaemonUpgradeRequest,
  Empty,
  errorResponses,
  Health,
  Ready,
} from "../../contract/engine";
import type { ApiDeps } from "./deps";

/** DEFAULT_UPGRADE_DRAIN_S and DEFAULT_UPGRADE_HEALTH_S are an upgrade's timeouts when the body leaves them out. */
const DEFAULT_UPGRADE_DRAIN_S = 30;
const DEFAULT_UPGRADE_HEALTH_S = 60;

/**
 * daemonRoutes serves the daemon itself: liveness, readiness, restart and upgrade. They live
 * with the API's assembly rather than beside src/engine/daemon because the daemon is the
 * composition root, which imports the API: routes there would tie the two in a cycle.
 */
export function daemonRoutes(deps: Pick<ApiDeps, "version" | "startedAt" | "daemon" | "ready">) {
  return new Elysia({ name: "daemon" })
    .get(
      "/api/health",
      () => ({ status: "ok" as const, version: deps.version, pid: process.pid, uptime_s: (Date.now() - deps.startedAt) / 1000 }),
      {
        response: { 200: Health },
        detail: { tags: ["daemon"], summary: "Liveness: answers while the daemon serves requests (no credential)", security: [] },
      },
    )
    .get(
      "/api/ready",
      (): Ready => deps.ready?.() ?? { ready: true, database: true, data_dir_writable: true, data_dir_free_bytes: 0, log_writable: true },
      {
        response: { 200: Ready },
        detail: {
          tags: ["daemon"],
          summary: "Readiness: whether the database answers and the data dir takes writes (no credential; 200 either way)",
          security: [],
        },
      },
    )
    .post(
      "/api/daemon/restart",
      ({ body, set }) => {
        deps.daemon.requestRestart(body.drain_timeout_s);
        set.status = 202;
        return {};
      },
      {
        body: DaemonRestartRequest,
        response: { 202: Empty, ...errorResponses(...AUTHED, 422, 503) },
        detail: { tags: ["daemon"], summary: "Drain for at most drain_timeout_s, then restart the daemon; answers 202 at once" },
      },
    )
    .post(
      "/api/daemon/upgrade",
      async ({ body, set }) => {
        const accepted = await deps.daemon.requestUpgrade({
          binary: body.binary,
          drain_timeout_s: body.drain_timeout_s ?? DEFAULT_UPGRADE_DRAIN_S,
          health_timeout_s: body.health_timeout_s ?? DEFAULT_UPGRADE_HEALTH_S,
        });
        set.status = 202;
        return accepted;
      },
      {
        body: DaemonUpgradeRequest,
        response: { 202: DaemonUpgradeAccepted, ...errorResponses(...AUTHED, 409, 422, 501, 503) },
        detail: {
          tags: ["daemon"],
          summary:
            "Check a new engine binary (it runs, and knows this data dir's store schema: 409 schema_downgrade if not), put it in place of the running one (keeping <path>.previous), then drain and restart into it; answers 202 once the binary is in place, and puts the previous one back if the new one does not answer /api/health within health_timeout_s. Compiled binary only (501 from source).",
        },
      },
    );
}
