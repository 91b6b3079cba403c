import { approvalRoutes } from "../approvals";
import { signinRoutes } from "../auth";
import type { CloudRoutes } from "../context";
import { preauthKeyRoutes } from "../keys/routes";
import { linkRoutes } from "../link";
import { managedRoutes } from "../managed";
import { nodeRoutes } from "../nodes/routes";
import { assistantRoutes } from "../oauth";
import { consolePages } from "../ui";

/**
 * API_MODULES lists the route plugins the `api` role serves, one per resource. The
 * composition root mounts them in this order after the routes every role has. `consolePages`
 * serves the browser pages outside /api (issue 7).
 */
export const API_MODULES: CloudRoutes[] = [
  signinRoutes,
  preauthKeyRoutes,
  linkRoutes,
  approvalRoutes,
  nodeRoutes,
  (deps) => assistantRoutes(deps),
  (deps) => managedRoutes(deps, deps.managed),
  consolePages,
];
