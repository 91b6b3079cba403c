import { Elysia, t } from "elysia";
import { AUTHED, CreatedToken, errorResponses, Token, TokenCreate, TokenIdParams } from "../../contract/engine";
import type { Logger } from "../../lib/logger";
import type { RequestContext } from "./principal";
import type { TokenStore } from "./tokens";

/** TokenRouteDeps are what the token routes need: the store and the log that records creations and revocations. */
export interface TokenRouteDeps {
  tokens: TokenStore;
  log: Logger;
}

/**
 * tokenRoutes serves the Token resource. Admins list every token; other roles see only the
 * token they present, so a submitter can read its own caps and scope and nothing else.
 */
export function tokenRoutes(deps: TokenRouteDeps, ctx: RequestContext) {
  return new Elysia({ name: "tokens" })
    .get(
      "/api/tokens",
      ({ request }) => {
        const principal = ctx.principalOf(request);
        const all = deps.tokens.list();
        return principal.role === "admin" ? all : all.filter((token) => token.id === principal.tokenId);
      },
      {
        response: { 200: t.Array(Token), ...errorResponses(...AUTHED, 422) },
        detail: { tags: ["tokens"], summary: "List access tokens" },
      },
    )
    .post(
      "/api/tokens",
      ({ body, set }) => {
        const { record, secret } = deps.tokens.create(body);
        deps.log.info({ token_id: record.id, role: record.role }, "token created");
        set.status = 201;
        return { ...record, token: secret };
      },
      {
        body: TokenCreate,
        response: { 201: CreatedToken, ...errorResponses(...AUTHED, 409, 422) },
        detail: { tags: ["tokens"], summary: "Create a token; its secret is returned once, in `token`" },
      },
    )
    .delete(
      "/api/tokens/:id",
      ({ params }) => {
        const record = deps.tokens.revoke(params.id);
        deps.log.info({ token_id: record.id }, "token revoked");
        return record;
      },
      {
        params: TokenIdParams,
        response: { 200: Token, ...errorResponses(...AUTHED, 404, 409, 422) },
        detail: { tags: ["tokens"], summary: "Revoke a token (idempotent)" },
      },
    );
}
