/**
 * The approvals module is the console's side of the device link (RFC 8628): a signed-in
 * person looks a user code up, then approves or denies it.
 */
export { type ApprovalGrant, type ApprovalView, DeviceApprovals } from "./approvals";
export { type ApprovalOptions, approvalRoutes } from "./routes";
