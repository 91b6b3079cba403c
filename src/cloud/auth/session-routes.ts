import { Elysia } from "elysia";
import { ErrorEnvelope, LogoutAllView, SessionView } from "../../contract/cloud";
import type { Account } from "../accounts";
import type { CloudDeps } from "../context";
import { requireSession } from "./guard";
import { clearedSessionCookie, sessionTokenOf } from "./sessions";

const iso = (ms: number) => new Date(ms).toISOString();

/** accountView is an account as the API shows it. */
export function accountView(account: Account) {
  return {
    id: account.id,
    email: account.email,
    name: account.name,
    standing: account.standing,
    remote_link: account.remoteLink,
    paid: account.paid,
    node_limit: account.nodeLimit,
  };
}

/**
 * sessionRoutes: the signed-in session, logout (this session; 204 whether or not there was
 * one) and logout-all (every session of the account, answering how many ended).
 */
export function sessionRoutes(deps: CloudDeps) {
  return new Elysia({ tags: ["auth"] })
    .get(
      "/api/auth/session",
      async ({ request }) => {
        const { session, account } = await requireSession(deps, request);
        return {
          session_id: session.id,
          kind: session.kind,
          created_at: iso(session.createdAt),
          expires_at: iso(session.expiresAt),
          absolute_expires_at: iso(session.absoluteExpiresAt),
          account: accountView(account),
        };
      },
      { response: { 200: SessionView, 401: ErrorEnvelope }, detail: { summary: "The signed-in session and its account" } },
    )
    .post(
      "/api/auth/logout",
      async ({ request }) => {
        await deps.sessions.end(sessionTokenOf(request));
        return new Response(null, { status: 204, headers: { "set-cookie": clearedSessionCookie() } });
      },
      { detail: { summary: "End this session (204 always)", responses: { 204: { description: "Signed out" } } } },
    )
    .post(
      "/api/auth/logout-all",
      async ({ request, set }) => {
        const { account } = await requireSession(deps, request);
        // One transaction: the sessions end and the audit row says so, or (a full disk) neither.
        const ended = await deps.db.transaction(async (tx) => {
          const count = await deps.sessions.endAll(account.id, tx);
          await deps.audit.write(
            { accountId: account.id, action: "session.logout_all", source: deps.sourceOf(request), details: { ended: count } },
            tx,
          );
          return count;
        });
        set.headers["set-cookie"] = clearedSessionCookie();
        return { ended };
      },
      { response: { 200: LogoutAllView, 401: ErrorEnvelope }, detail: { summary: "End every session of the account" } },
    );
}
