/**
 * The seam between the console's authorization server for assistants (`src/cloud/oauth`, which
 * issues access tokens after consent) and its MCP resource server and relay (`src/cloud/relay`,
 * which checks them and forwards calls to linked engines). Both halves use these types; the
 * authorization server implements `AccessTokenVerifier`.
 */

/** ASSISTANT_SCOPES are the scopes an assistant may be granted; `operate` includes `read`. */
export const ASSISTANT_SCOPES = ["engine:read", "engine:operate"] as const;
export type AssistantScope = (typeof ASSISTANT_SCOPES)[number];

/** AssistantGrant is what a valid access token stands for: who consented, to which client, for what. */
export interface AssistantGrant {
  /** accountId is the account whose user consented. */
  accountId: string;
  /** clientId is the assistant's client id (a Client ID Metadata Document URL, or a registered id). */
  clientId: string;
  /** grantId names the consent; revoking it ends every token issued under it at once. */
  grantId: string;
  /** scopes granted: a subset of ASSISTANT_SCOPES. */
  scopes: AssistantScope[];
  /** nodeIds the grant reaches; null means every node of the account, now and later. */
  nodeIds: string[] | null;
  expiresAt: Date;
}

export type VerifyResult = { ok: true; grant: AssistantGrant } | { ok: false; error: "invalid_token"; description: string };

/**
 * AccessTokenVerifier checks an assistant's bearer token for `resource` (the console's MCP URL,
 * RFC 8707 audience): known, unexpired, unrevoked, issued for that audience.
 */
export type AccessTokenVerifier = (token: string, resource: string) => Promise<VerifyResult>;
