import { Elysia, t } from "elysia";
import {
  ErrorEnvelope,
  HTTPValidationError,
  LinkClaimResponse,
  PreauthKeyIdParams,
  PreauthKeyMintRequest,
  PreauthKeyMintResponse,
  PreauthKeysView,
  PreauthLinkRequest,
} from "../../contract/cloud";
import { digestSecret } from "../../lib/crypto";
import { requireSession } from "../auth/guard";
import type { CloudDeps } from "../context";
import { claimAnswer } from "../nodes";
import { LIMITS } from "../ratelimit";
import { assertAccountOpen, PreauthKeyStore } from "./index";

const iso = (ms: number) => new Date(ms).toISOString();

/**
 * preauthKeyRoutes serves pre-authorized link keys: mint (201, the only answer that shows the
 * key), list (newest first, revoked and expired included), revoke (204 in every case, so the
 * status cannot tell whether another account's key exists), and enrollment with a key
 * (`POST /api/link/preauth`), which answers the same `LinkClaimResponse` as claim and poll.
 */
export function preauthKeyRoutes(deps: CloudDeps) {
  const keys = new PreauthKeyStore(deps.db, deps.accounts, deps.nodes, deps.audit);
  return new Elysia({ tags: ["preauth-keys"] })
    .post(
      "/api/preauth-keys",
      async ({ request, body, set }) => {
        const { account } = await requireSession(deps, request);
        const minted = await keys.mint(account, {
          expiresInS: body?.expires_in_s,
          maxUses: body?.max_uses,
          description: body?.description,
          source: deps.sourceOf(request),
        });
        set.status = 201;
        return { id: minted.id, key: minted.key, expires_at: iso(minted.expiresAt), max_uses: minted.maxUses };
      },
      {
        body: PreauthKeyMintRequest,
        response: {
          201: PreauthKeyMintResponse,
          400: ErrorEnvelope,
          401: ErrorEnvelope,
          403: ErrorEnvelope,
          409: ErrorEnvelope,
          422: HTTPValidationError,
        },
        detail: {
          summary: "Mint a pre-authorized link key (shown once)",
          description:
            "Needs an account in good standing (403 otherwise). Lifetime 60 s to 90 days (default 24 h), 1 to 1000 uses (default 1). " +
            "409 `preauth_key_limit_reached` when the account already has 100 keys that can still enroll.",
          security: [{ session: [] }],
        },
      },
    )
    .get(
      "/api/preauth-keys",
      async ({ request }) => {
        const { account } = await requireSession(deps, request);
        assertAccountOpen(account);
        const now = Date.now();
        const listed = await keys.list(account.id);
        return {
          keys: listed.map((key) => ({
            id: key.id,
            description: key.description,
            created_at: iso(key.createdAt),
            expires_at: iso(key.expiresAt),
            max_uses: key.maxUses,
            uses: key.uses,
            revoked: key.revokedAt !== null,
            expired: key.expiresAt <= now,
          })),
        };
      },
      {
        response: { 200: PreauthKeysView, 401: ErrorEnvelope, 403: ErrorEnvelope },
        detail: {
          summary: "The account's keys, newest first, revoked and expired included (never the key)",
          description: "403 for a closed account.",
          security: [{ session: [] }],
        },
      },
    )
    .delete(
      "/api/preauth-keys/:key_id",
      async ({ request, params, set }) => {
        const { account } = await requireSession(deps, request);
        assertAccountOpen(account);
        await keys.revoke(account.id, params.key_id, deps.sourceOf(request));
        set.status = 204;
      },
      {
        params: PreauthKeyIdParams,
        response: {
          204: t.Void({ description: "Revoked, or nothing to revoke" }),
          401: ErrorEnvelope,
          403: ErrorEnvelope,
          422: HTTPValidationError,
        },
        detail: {
          summary: "Revoke a key (204 in every case)",
          description:
            "Answers 204 whether the key was revoked now, was revoked already, is unknown or is another account's; " +
            "only a change writes an audit row. Nodes the key enrolled stay enrolled. 403 for a closed account.",
          security: [{ session: [] }],
        },
      },
    )
    .post(
      "/api/link/preauth",
      async ({ request, body }) => {
        const source = deps.sourceOf(request);
        // Charged first, before any read; the key's bucket is named by its digest, never its plaintext.
        await deps.limiter.charge([LIMITS.preauthBySource, source], [LIMITS.preauthByKey, digestSecret(body.key)]);
        const { enrollment } = await keys.enroll(body.key, { hostname: body.hostname, os: body.os, version: body.version }, source);
        return claimAnswer(enrollment, deps.site);
      },
      {
        body: PreauthLinkRequest,
        response: {
          200: LinkClaimResponse,
          400: ErrorEnvelope,
          403: ErrorEnvelope,
          404: ErrorEnvelope,
          409: ErrorEnvelope,
          429: ErrorEnvelope,
          422: HTTPValidationError,
        },
        detail: {
          tags: ["link"],
          summary: "Enroll this machine with a pre-authorized link key",
          description:
            "400 `invalid_request` for a malformed key; 404 `preauth_key_invalid` for an unknown, revoked or expired key (one answer); " +
            "409 `preauth_key_exhausted` when its uses are spent; 403 when the key's account is not in good standing or at its node limit.",
        },
      },
    );
}
