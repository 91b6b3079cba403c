import { Type as t } from "@sinclair/typebox";
import { Elysia } from "elysia";
import {
  DeviceLinkRequest,
  DeviceLinkResponse,
  DevicePollPending,
  DevicePollRequest,
  LinkClaimRequest,
  LinkClaimResponse,
  LinkCodeMintRequest,
  LinkCodeMintResponse,
} from "../../contract/cloud";
import { requireSession } from "../auth/guard";
import { type CloudDeps, errorResponses } from "../context";
import { LIMITS, MemoryBuckets, RateLimiter } from "../ratelimit";
import { DEFAULT_CADENCE, type PollCadenceOptions } from "./cadence";
import { DEFAULT_LINK_CODE_LIFETIME_S, LinkCodes, linkCodeDigest } from "./codes";
import { DEFAULT_DEVICE_OPTIONS, DeviceLinks } from "./device";
import { UserCodeDigester } from "./user-code";

/** USER_CODE_KEY_PURPOSE names the derived key user codes are keyed under (approvals derive the same one). */
export const USER_CODE_KEY_PURPOSE = "device-user-code-v1";

/** LinkOptions let tests and benches move time and shorten lifetimes; production uses the defaults. */
export interface LinkOptions {
  /** clock is the time in ms that expiries and the poll cadence are judged by. */
  clock?: () => number;
  /** deviceLifetimeMs overrides a device request's 15-minute life. */
  deviceLifetimeMs?: number;
  /** cadence overrides parts of the poll cadence (interval, step, tolerance, map bound). */
  cadence?: Partial<PollCadenceOptions>;
  /** pollLimiter replaces the in-memory limiter the poll charges. */
  pollLimiter?: RateLimiter;
}

/** userCodeDigester keys user codes under the console's derived key: one function, so link and approvals agree. */
export function userCodeDigester(deps: Pick<CloudDeps, "deriveKey">): UserCodeDigester {
  return new UserCodeDigester(deps.deriveKey(USER_CODE_KEY_PURPOSE));
}

/**
 * linkRoutes serves the machine's side of linking: claim a link code, ask for a device link
 * and poll it (RFC 8628), and, for a signed-in user, mint a link code.
 */
export function linkRoutes(deps: CloudDeps, options: LinkOptions = {}) {
  const clock = options.clock ?? Date.now;
  const codes = new LinkCodes({ ...deps, clock });
  // The poll's buckets are always in memory, whatever `rateLimits` says: see DeviceLinks.poll.
  const pollLimiter = options.pollLimiter ?? new RateLimiter(new MemoryBuckets());
  const devices = new DeviceLinks(
    { ...deps, userCodes: userCodeDigester(deps), pollLimiter, clock },
    {
      ...DEFAULT_DEVICE_OPTIONS,
      lifetimeMs: options.deviceLifetimeMs ?? DEFAULT_DEVICE_OPTIONS.lifetimeMs,
      cadence: { ...DEFAULT_CADENCE, ...options.cadence },
    },
  );

  return new Elysia({ tags: ["link"] })
    .post(
      "/api/link/claim",
      async ({ request, body }) => {
        const source = deps.sourceOf(request);
        await deps.limiter.charge([LIMITS.claimBySource, source], [LIMITS.claimByCode, linkCodeDigest(body.code)]);
        return codes.claim(body.code, { hostname: body.hostname, os: body.os ?? "", version: body.version ?? "" }, source);
      },
      {
        body: LinkClaimRequest,
        response: { 200: LinkClaimResponse, ...errorResponses(403, 404, 409, 410, 422, 429) },
        detail: { summary: "Exchange a link code (NL-…) for the node's identity, once" },
      },
    )
    .post(
      "/api/link/device",
      async ({ request, body, set }) => {
        const source = deps.sourceOf(request);
        await deps.limiter.charge([LIMITS.deviceBySource, source]);
        const answer = await devices.request({ hostname: body.hostname, os: body.os ?? "", version: body.version ?? "" }, source);
        set.status = 201;
        return answer;
      },
      {
        body: DeviceLinkRequest,
        response: { 201: DeviceLinkResponse, ...errorResponses(400, 422, 429) },
        detail: { summary: "Start a device link (RFC 8628): one pending request, both codes returned once" },
      },
    )
    .post(
      "/api/link/device/poll",
      async ({ request, body, set }) => {
        const answer = await devices.poll(body.device_code, deps.sourceOf(request));
        set.status = answer.status;
        return answer.body;
      },
      {
        body: DevicePollRequest,
        response: { 200: LinkClaimResponse, 202: DevicePollPending, ...errorResponses(400, 403, 404, 409, 410, 422, 429) },
        detail: {
          summary: "Poll a device link: 202 while pending, 200 with the node identity once approved",
          description:
            "Order: rate limits, then the cadence (slow_down, no database statement), then the row by id and the " +
            "constant-time comparison of the device credential, and only then the state.",
        },
      },
    )
    .post(
      "/api/link/codes",
      async ({ request, body, set }) => {
        const { account } = await requireSession(deps, request);
        const minted = await codes.mint(account, body?.expires_in_s ?? DEFAULT_LINK_CODE_LIFETIME_S, deps.sourceOf(request));
        set.status = 201;
        return { code: minted.code, expires_at: new Date(minted.expiresAt).toISOString() };
      },
      {
        // The body may be left out altogether: every field has a default.
        body: t.Optional(LinkCodeMintRequest),
        response: { 201: LinkCodeMintResponse, ...errorResponses(401, 403, 422) },
        detail: { summary: "Mint a single-use link code (NL-…) for the signed-in account; shown once" },
      },
    );
}
