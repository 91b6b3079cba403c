import type { Account } from "../accounts";
import type { CloudDeps } from "../context";
import { type Session, sessionTokenOf } from "./sessions";

/** SignedIn is what a session route knows about its caller. */
export interface SignedInCaller {
  session: Session;
  account: Account;
  /** token is the presented session token, kept only for logout of this session. */
  token: string;
}

/** requireSession authenticates a session route's caller from the cookie or bearer token, or throws 401. */
export async function requireSession(deps: Pick<CloudDeps, "sessions">, request: Request): Promise<SignedInCaller> {
  const token = sessionTokenOf(request);
  const { session, account } = await deps.sessions.authenticate(token);
  return { session, account, token: token as string };
}
