import { Elysia } from "elysia";
import { DaemonRestartRequest, Empty, Health, VcsTokenPush, VcsTokenPushResult } from "../../contract/engine";
import type { ApiDeps } from "./deps";
import { AUTHED, errorResponses } from "./responses";

/** daemonRoutes serves the daemon's own routes: health, restart, and the link's vcs-token push. */
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
