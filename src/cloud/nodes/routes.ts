import { Elysia } from "elysia";
import { NodesView } from "../../contract/cloud";
import { requireSession } from "../auth/guard";
import { type CloudDeps, errorResponses } from "../context";

/**
 * nodeRoutes serves `GET /api/nodes`: the signed-in account's linked machines, oldest first,
 * for the console's nodes page, each with whether its tunnel is open now (the relay), when it
 * was last seen, and the version and GPUs it last reported. It is not in the contract
 * (recorded in docs/decisions.md); it reads only the caller's own rows and never a credential.
 */
export function nodeRoutes(deps: CloudDeps) {
  return new Elysia({ tags: ["nodes"] }).get(
    "/api/nodes",
    async ({ request }) => {
      const { account } = await requireSession(deps, request);
      const nodes = await deps.nodes.list(account.id);
      return {
        nodes: nodes.map((node) => {
          // Online is the relay's registry (this process); the row keeps what was last reported.
          const now = deps.relay.nodeNow(node);
          return {
            id: node.id,
            slug: node.slug,
            hostname: node.hostname,
            os: node.os,
            version: now.version,
            enrolled_via: node.enrolledVia,
            created_at: new Date(node.createdAt).toISOString(),
            last_seen_at: now.last_seen_at,
            online: now.online,
            online_since: now.online_since,
            gpus: now.gpus,
          };
        }),
      };
    },
    {
      response: { 200: NodesView, ...errorResponses(401) },
      detail: { summary: "The signed-in account's linked machines (reported fields are unverified)", security: [{ session: [] }] },
    },
  );
}
