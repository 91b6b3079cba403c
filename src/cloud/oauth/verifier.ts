import type { CloudDeps } from "../context";
import { num, optionalNum } from "../db";
import type { AccessTokenVerifier, VerifyResult } from "./grant";
import { AssistantStore, SECRET_PREFIXES, scopesFrom } from "./store";

/** VerifierOptions let tests move the clock tokens expire by. */
export interface VerifierOptions {
  clock?: () => number;
}

const refuse = (description: string): VerifyResult => ({ ok: false, error: "invalid_token", description });

/**
 * createAccessTokenVerifier returns the console's `AccessTokenVerifier` (src/cloud/oauth/grant.ts):
 * it reads the token's row, its grant and the grant's account in one statement on every call,
 * with no cache, so a revoked grant, a revoked token or an account that lost its remote-link
 * entitlement stops working at the next call. A token is good when it is an access token
 * (never a refresh token), unexpired, unrevoked, its grant unrevoked, issued for `resource`
 * (RFC 8707: the audience the assistant asked for at the token endpoint), and its account is
 * active and still entitled. The answer names the grant's account, client, scopes and nodes.
 */
export function createAccessTokenVerifier(deps: Pick<CloudDeps, "db">, options: VerifierOptions = {}): AccessTokenVerifier {
  const store = new AssistantStore(deps.db);
  const clock = options.clock ?? Date.now;
  return async (token, resource) => {
    if (typeof token !== "string" || !token.startsWith(SECRET_PREFIXES.access) || token.length > 128) {
      return refuse("the access token is not one this console issued");
    }
    const row = await store.accessGrant(token);
    if (row?.kind !== "access") return refuse("the access token is not known");
    if (optionalNum(row.revoked_at) !== null || optionalNum(row.grant_revoked_at) !== null) {
      return refuse("the access token has been revoked");
    }
    const expiresAt = num(row.expires_at);
    if (expiresAt <= clock()) return refuse("the access token has expired");
    if (row.resource !== resource) return refuse("the access token was issued for another resource (audience)");
    if (row.standing !== "active") return refuse("the account is not active");
    if (num(row.remote_link) !== 1) return refuse("the account no longer has the remote-link entitlement");
    return {
      ok: true,
      grant: {
        accountId: row.account_id as string,
        clientId: row.client_id as string,
        grantId: row.grant_id as string,
        scopes: scopesFrom(row.scopes as string),
        nodeIds: row.node_ids === null ? null : (JSON.parse(row.node_ids as string) as string[]),
        expiresAt: new Date(expiresAt),
      },
    };
  };
}
