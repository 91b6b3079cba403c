import { Elysia } from "elysia";
import {
  DaemonRestartRequest,
  DaemonUpgradeAccepted,
  DaemonUpgradeRequest,
  Empty,
  Health,
  LinkStatus,
  Ready,
  VcsTokenPush,
  VcsTokenPushResult,
} from "../../contract/engine";
import type { ApiDeps } from "./deps";
import { AUTHED, errorResponses } from "./responses";

/** DEFAULT_UPGRADE_DRAIN_S and DEFAULT_UPGRADE_HEALTH_S are an upgrade's timeouts when the body leaves them out. */
const DEFAULT_UPGRADE_DRAIN_S = 30;
const DEFAULT_UPGRADE_HEALTH_S = 60;

/** daemonRoutes serves the daemon's own routes: health, restart, upgrade, the link's status and its vcs-token push. */
export function daemonRoutes(deps: ApiDeps) {
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
    )
    .get(
      "/api/link/status",
      (): LinkStatus => {
        const identity = deps.linkIdentity?.() ?? null;
        return {
          linked: identity !== null,
          cloud_url: identity?.cloud_url ?? null,
          node_id: identity?.node_id ?? null,
          slug: identity?.slug ?? null,
          account_id: identity?.account_id ?? null,
          hosted_base_domain: identity?.hosted_base_domain ?? null,
          linked_at: identity?.linked_at ?? null,
          metadata_refreshed_at: identity?.metadata_refreshed_at ?? null,
          tunnel: deps.linkTunnel?.() ?? {
            state: "not_linked",
            since: new Date(deps.startedAt).toISOString(),
            url: null,
            connected_at: null,
            last_error: null,
            last_error_at: null,
            next_attempt_at: null,
            failures: 0,
          },
        };
      },
      {
        response: { 200: LinkStatus, ...errorResponses(...AUTHED) },
        detail: {
          tags: ["link"],
          summary: "Whether this engine is linked to a cloud console, as which node (never the credential), and its tunnel's state",
        },
      },
    )
    .put(
      "/api/link/vcs-token",
      ({ body }) => {
        const outcome = deps.vcs.push(body);
        deps.log.info(
          { installation_id: outcome.installation_id, applied: outcome.applied, repos_count: outcome.repos_count },
          "vcs token pushed",
        );
        return outcome;
      },
      {
        body: VcsTokenPush,
        response: { 200: VcsTokenPushResult, ...errorResponses(...AUTHED, 422) },
        detail: { tags: ["link"], summary: "Accept a code-host installation token pushed by the cloud link" },
      },
    );
}
