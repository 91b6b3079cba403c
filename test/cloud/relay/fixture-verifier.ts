import { randomBytes } from "node:crypto";
import type { AccessTokenVerifier, AssistantGrant, AssistantScope } from "../../../src/cloud/oauth/grant";

/**
 * FixtureVerifier is a TEST-ONLY stand-in for the console's authorization server
 * (src/cloud/oauth), which will implement `AccessTokenVerifier` for real. A test issues a token
 * for a grant it states outright (no consent, no PKCE) and revokes it; `verify` answers as the
 * real verifier must: unknown, revoked, expired or issued for another audience → invalid_token.
 * Production never uses it: `startCloud` takes a verifier only from its options, and refuses every
 * token without one.
 */
export class FixtureVerifier {
  readonly #tokens = new Map<string, { grant: AssistantGrant; resource: string; revoked: boolean }>();
  /** seen records every token `verify` was asked about, so a test can tell what reached the console. */
  readonly seen: string[] = [];

  /** issue mints a token for a grant and an audience (the console's `<public>/mcp`). */
  issue(
    grant: { accountId: string; scopes: AssistantScope[]; nodeIds?: string[] | null; clientId?: string; expiresInMs?: number },
    resource: string,
  ): { token: string; grant: AssistantGrant } {
    const token = `fixture_at_${randomBytes(24).toString("base64url")}`;
    const full: AssistantGrant = {
      accountId: grant.accountId,
      clientId: grant.clientId ?? "https://claude.ai/oauth/mcp-oauth-client-metadata",
      grantId: `grant_${randomBytes(6).toString("hex")}`,
      scopes: grant.scopes,
      nodeIds: grant.nodeIds ?? null,
      expiresAt: new Date(Date.now() + (grant.expiresInMs ?? 3600_000)),
    };
    this.#tokens.set(token, { grant: full, resource, revoked: false });
    return { token, grant: full };
  }

  revoke(token: string): void {
    const entry = this.#tokens.get(token);
    if (entry) entry.revoked = true;
  }

  readonly verify: AccessTokenVerifier = async (token, resource) => {
    this.seen.push(token);
    const entry = this.#tokens.get(token);
    if (!entry) return { ok: false, error: "invalid_token", description: "the access token is not known" };
    if (entry.revoked) return { ok: false, error: "invalid_token", description: "the access token has been revoked" };
    if (entry.grant.expiresAt.getTime() <= Date.now())
      return { ok: false, error: "invalid_token", description: "the access token has expired" };
    if (entry.resource !== resource)
      return { ok: false, error: "invalid_token", description: `the access token was issued for ${entry.resource}` };
    return { ok: true, grant: entry.grant };
  };
}
