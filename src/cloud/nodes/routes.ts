import { Elysia } from "elysia";
import { NodesView } from "../../contract/cloud";
import { requireSession } from "../auth/guard";
import type { CloudDeps } from "../server/deps";
import { errorResponses } from "../server/responses";

const iso = (ms: number) => new Date(ms).toISOString();

/**
 * nodeRoutes serves `GET /api/nodes`: the signed-in account's linked machines, oldest first,
 * for the console's nodes page. It is not in the contract (recorded in docs/decisions.md);
 * it reads only the caller's own rows and never a credential.
 */
export function nodeRoutes(deps: CloudDeps) {
  return new Elysia({ tags: ["nodes"] }).get(
    "/api/nodes",
    async ({ request }) => {
      const { account } = await requireSession(deps, request);
      const nodes = await deps.nodes.list(account.id);
      return {
        nodes: nodes.map((node) => ({
          id: node.id,
          slug: node.slug,
          hostname: node.hostname,
          os: node.os,
          version: node.version,
          enrolled_via: node.enrolledVia,
          created_at: iso(node.createdAt),
          last_seen_at: node.lastSeenAt === null ? null : iso(node.lastSeenAt),
        })),
      };
    },
    {
      response: { 200: NodesView, ...errorResponses(401) },
      detail: { summary: "The signed-in account's linked machines (reported fields are unverified)", security: [{ session: [] }] },
    },
  );
}
