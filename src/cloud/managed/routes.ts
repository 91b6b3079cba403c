import { Elysia } from "elysia";
import {
  ManagedAllocationView,
  ManagedBackupsView,
  ManagedPurchaseView,
  ManagedUpdateRequest,
  ManagedUpdateView,
  ManagedWakeView,
} from "../../contract/cloud";
import { requireSession } from "../auth/guard";
import { type CloudDeps, errorResponses } from "../context";
import type { ManagedService } from "./service";

const session = [{ session: [] }];

/**
 * managedRoutes serves the nine hosted-machine routes of the contract. Each takes the
 * caller's session and acts only on the caller's own account and box (no id in the path);
 * the rules live in ManagedService.
 */
export function managedRoutes(deps: CloudDeps, managed: ManagedService) {
  return new Elysia({ tags: ["hosted machines"] })
    .get(
      "/api/managed/purchase",
      async ({ request }) => {
        const { account } = await requireSession(deps, request);
        return managed.purchaseState(account);
      },
      {
        response: { 200: ManagedPurchaseView, ...errorResponses(401, 404) },
        detail: {
          summary: "The account's purchase of a hosted machine (derived; `none` until asked)",
          description: "404 `managed_not_offered` when this console offers no hosted machines.",
          security: session,
        },
      },
    )
    .post(
      "/api/managed/purchase",
      async ({ request, set }) => {
        const { account } = await requireSession(deps, request);
        const answer = await managed.requestPurchase(account, deps.sourceOf(request));
        set.status = answer.status;
        return answer.body;
      },
      {
        response: { 200: ManagedPurchaseView, 201: ManagedPurchaseView, ...errorResponses(401, 403, 404, 409) },
        detail: {
          summary: "Ask to buy a hosted machine (the owner then invoices by hand)",
          description:
            "201 when asked now; 200 with the current state when asked already (nothing is written). " +
            "403 for an inactive account; 409 `no_launch_place` when seats held plus open invoices fill the launch places.",
          security: session,
        },
      },
    )
    .get(
      "/api/managed/allocation",
      async ({ request }) => {
        const { account } = await requireSession(deps, request);
        return managed.allocation(account);
      },
      {
        response: { 200: ManagedAllocationView, ...errorResponses(401, 403, 404) },
        detail: {
          summary: "The account's hosted machine (its newest allocation, a deleted one included)",
          description: "404 `allocation_not_found` when the account never had one; 403 for a closed account.",
          security: session,
        },
      },
    )
    .post(
      "/api/managed/allocation",
      async ({ request, set }) => {
        const { account } = await requireSession(deps, request);
        const answer = await managed.allocate(account, deps.sourceOf(request));
        set.status = answer.status;
        return answer.body;
      },
      {
        response: { 200: ManagedAllocationView, 201: ManagedAllocationView, ...errorResponses(401, 403, 404, 409) },
        detail: {
          summary: "Allocate the account's hosted machine (a one-hour trial for an account that does not pay)",
          description:
            "201 with a new allocation; 200 with the existing one. A `failed` allocation with no sandbox is replaced (201, new id). " +
            "403 `trial_quota_used` when an unpaid account has no trial left, 403 for an inactive account; " +
            "409 `trial_boxes_busy` when no trial place is free (worth retrying).",
          security: session,
        },
      },
    )
    .delete(
      "/api/managed/allocation",
      async ({ request, set }) => {
        const { account } = await requireSession(deps, request);
        const answer = await managed.delete(account, deps.sourceOf(request));
        set.status = answer.status;
        return answer.body;
      },
      {
        response: { 200: ManagedAllocationView, 202: ManagedAllocationView, ...errorResponses(401, 403, 404) },
        detail: {
          summary: "Delete the account's hosted machine (no payment or standing check; no undo)",
          description:
            "202 `deleting` while the provider still owes the delete (the node is unlinked at once; the console retries until " +
            "the provider says done); 200 `deleted` when nothing is left. A repeat changes nothing and writes no audit row.",
          security: session,
        },
      },
    )
    .post(
      "/api/managed/allocation/wake",
      async ({ request, set }) => {
        const { account } = await requireSession(deps, request);
        const answer = await managed.wake(account, deps.sourceOf(request));
        set.status = answer.status;
        return answer.body;
      },
      {
        response: { 200: ManagedWakeView, 202: ManagedWakeView, ...errorResponses(401, 403, 404, 429) },
        detail: {
          summary: "Wake the account's sleeping box",
          description:
            "202 `starting` (a repeat answers the same); 200 when the box is not asleep. 403 for an inactive account; " +
            "404 `no_ready_box`; 429 `start_budget_spent` or `start_stuck` (a start running over two minutes), with Retry-After.",
          security: session,
        },
      },
    )
    .get(
      "/api/managed/allocation/update",
      async ({ request }) => {
        const { account } = await requireSession(deps, request);
        return managed.updateState(account);
      },
      {
        response: { 200: ManagedUpdateView, ...errorResponses(401, 404) },
        detail: { summary: "The box's version, the version offered and the update in progress", security: session },
      },
    )
    .post(
      "/api/managed/allocation/update",
      async ({ request, body, set }) => {
        const { account } = await requireSession(deps, request);
        const answer = await managed.requestUpdate(account, body.version, deps.sourceOf(request));
        set.status = answer.status;
        return answer.body;
      },
      {
        body: ManagedUpdateRequest,
        response: { 202: ManagedUpdateView, ...errorResponses(401, 403, 404, 409, 429, 422) },
        detail: {
          summary: "Update the box to the offered version (the console runs stop → update → start)",
          description:
            "202 when accepted, and for a repeat while that update runs (nothing written). 409: `downgrade_refused`, " +
            "`up_to_date`, `version_not_offered`, `box_offline`, `box_busy`, `backup_running`; 429 `update_too_soon` " +
            "within 3 minutes of the previous accepted update.",
          security: session,
        },
      },
    )
    .get(
      "/api/managed/allocation/backups",
      async ({ request }) => {
        const { account } = await requireSession(deps, request);
        return managed.backups(account);
      },
      {
        response: { 200: ManagedBackupsView, ...errorResponses(401, 403, 404) },
        detail: {
          summary: "Backup health of the account's newest hosted machine, tombstones included",
          security: session,
        },
      },
    );
}
