import { Elysia } from "elysia";
import { AUTHED, errorResponses, LinkStatus, VcsTokenPush, VcsTokenPushResult } from "../../contract/engine";
import type { Logger } from "../../lib/logger";
import type { NodeIdentity } from "./identity";
import type { TunnelStatus } from "./tunnel";
import type { VcsTokenStore } from "./vcs-token";

/** LinkRouteDeps are what the link's routes need: its identity, its tunnel's state and the code-host token store. */
export interface LinkRouteDeps {
  log: Logger;
  /** startedAt is when the daemon started: an unlinked engine's tunnel has been `not_linked` since then. */
  startedAt: number;
  vcs: VcsTokenStore;
  /** linkIdentity reads the cloud link's identity (null when unlinked); unset: always unlinked. */
  linkIdentity?: () => NodeIdentity | null;
  /** linkTunnel reads the state of the tunnel to the console; unset: reported as not linked. */
  linkTunnel?: () => TunnelStatus;
}

/** linkRoutes serves the link to a cloud console: its status and the code-host token the console pushes. */
export function linkRoutes(deps: LinkRouteDeps) {
  return new Elysia({ name: "link" })
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
