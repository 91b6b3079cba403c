import { Elysia } from "elysia";
import { DeviceApprovalGrant, DeviceApprovalRequest, DeviceApprovalView, DeviceDenial } from "../../contract/cloud";
import { requireSession, type SignedInCaller } from "../auth/guard";
import { type CloudDeps, errorResponses } from "../context";
import { userCodeDigester } from "../link";
import { LIMITS } from "../ratelimit";
import { DeviceApprovals } from "./approvals";

/** ApprovalOptions let tests move the clock the expiries are judged by (the link module's, in tests). */
export interface ApprovalOptions {
  clock?: () => number;
}

/**
 * approvalRoutes serve the console's side of the device link to a signed-in person: look a
 * user code up (spends nothing), approve it, or deny it (each spends one attempt). The
 * session is checked before the body, so a caller without one learns only 401.
 */
export function approvalRoutes(deps: CloudDeps, options: ApprovalOptions = {}) {
  const approvals = new DeviceApprovals({ ...deps, userCodes: userCodeDigester(deps), clock: options.clock ?? Date.now });
  /**
   * chargeDecision charges an approve or deny, first (the contract's order), narrowest bucket
   * first: the session, the account (many sessions of one account share it), then the source
   * address (many accounts behind one address share it). An account that spends its own budget
   * is refused before it drains the budget its neighbours behind the same address share.
   */
  const chargeDecision = (caller: SignedInCaller, source: string) =>
    deps.limiter.charge(
      [LIMITS.decideBySession, caller.session.id],
      [LIMITS.decideByAccount, caller.account.id],
      [LIMITS.decideBySource, source],
    );
  return new Elysia({ tags: ["device approvals"] })
    .derive(async ({ request }) => ({ caller: await requireSession(deps, request), source: deps.sourceOf(request) }))
    .post(
      "/api/nodes/device-approvals/lookup",
      async ({ caller, source, body }) => {
        await deps.limiter.charge([LIMITS.lookupBySession, caller.session.id], [LIMITS.lookupBySource, source]);
        return approvals.lookup(body.user_code);
      },
      {
        body: DeviceApprovalRequest,
        response: { 200: DeviceApprovalView, ...errorResponses(401, 403, 404, 422, 429) },
        detail: { summary: "Show a pending device request by its user code; spends no attempt" },
      },
    )
    .post(
      "/api/nodes/device-approvals/approve",
      async ({ caller, source, body }) => {
        await chargeDecision(caller, source);
        return approvals.approve(caller.account, body.user_code, source);
      },
      {
        body: DeviceApprovalRequest,
        response: { 200: DeviceApprovalGrant, ...errorResponses(401, 403, 404, 409, 422, 429) },
        detail: { summary: "Approve a device request: enroll the machine under the account; spends one attempt" },
      },
    )
    .post(
      "/api/nodes/device-approvals/deny",
      async ({ caller, source, body }) => {
        await chargeDecision(caller, source);
        return approvals.deny(caller.account, body.user_code, source);
      },
      {
        body: DeviceApprovalRequest,
        response: { 200: DeviceDenial, ...errorResponses(401, 404, 409, 422, 429) },
        detail: { summary: "Deny a device request; its next poll answers access_denied; spends one attempt" },
      },
    );
}
