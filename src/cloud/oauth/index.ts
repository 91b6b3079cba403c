/**
 * The console's authorization server for assistants (MCP clients): OAuth 2.1 with PKCE, client
 * ID metadata documents, dynamic registration and three pre-registered assistants, consent in
 * the console's pages, audience-bound access tokens, rotating refresh tokens. Its public
 * surface: the routes, and the `AccessTokenVerifier` the console's MCP resource server
 * (src/cloud/relay) checks assistants' tokens with.
 */
import type { Database } from "../db";
import { ClientDirectory } from "./directory";
import { AssistantStore } from "./store";

export { AuthorizationServer, OAuthError, offeredScopes, s256 } from "./authorization";
export { ASSISTANT_NAMES, type AssistantName, type Client, PREREGISTERED } from "./clients";
export type { AccessTokenVerifier, AssistantGrant, AssistantScope, VerifyResult } from "./grant";
export { ASSISTANT_SCOPES } from "./grant";
export { consoleMcpUrl } from "./resource";
export { type AssistantRoutesOptions, assistantRoutes } from "./routes";
export { createAccessTokenVerifier, type VerifierOptions } from "./verifier";

/** sweepAssistantRows deletes the authorization server's dead rows (run by the worker role's sweep). */
export async function sweepAssistantRows(db: Database, now: number): Promise<Record<string, number>> {
  const rows = await new AssistantStore(db).sweep(now);
  const clients = await new ClientDirectory(db, { allowLoopback: false, clock: () => now }).sweep();
  return { ...rows, clients };
}
