import type { Role } from "../../contract/engine";
import { AppError } from "../../lib/errors";

/**
 * Principal is who is calling: a bearer token, or the local unix socket, whose file mode
 * (0600) is the trust boundary and which therefore counts as admin (as in Headscale). Two more
 * arrive over the cloud link's tunnel, never over a listener: an `assistant` (a relayed MCP
 * call, its rights from the user's consent: readonly or submitter, never admin) and the
 * `link` itself (the console pushing a code-host token).
 */
export interface Principal {
  kind: "token" | "local" | "assistant" | "link";
  tokenId: string | null;
  name: string;
  role: Role;
  maxGpus: number | null;
  maxConcurrentJobs: number | null;
  /** scopeServices limits the services the principal may touch; empty means all. */
  scopeServices: string[];
}

export const LOCAL_PRINCIPAL: Principal = Object.freeze({
  kind: "local",
  tokenId: null,
  name: "local socket",
  role: "admin",
  maxGpus: null,
  maxConcurrentJobs: null,
  scopeServices: [],
}) as Principal;

/**
 * LINK_PRINCIPAL is the console speaking over the tunnel this engine opened with its node
 * credential. The daemon hands it only `PUT /api/link/vcs-token` (the push the HTTP route takes
 * from an admin token), so it reaches nothing else.
 */
export const LINK_PRINCIPAL: Principal = Object.freeze({
  kind: "link",
  tokenId: null,
  name: "cloud link",
  role: "admin",
  maxGpus: null,
  maxConcurrentJobs: null,
  scopeServices: [],
}) as Principal;

/** inScope says whether a principal's scope takes in the service `serviceName` (an unscoped one takes in every service). */
export function inScope(principal: Principal, serviceName: string): boolean {
  return principal.scopeServices.length === 0 || principal.scopeServices.includes(serviceName);
}

/** assertServiceInScope throws 403 `out_of_scope` when a scoped principal names a service outside its scope. */
export function assertServiceInScope(principal: Principal, serviceName: string): void {
  if (!inScope(principal, serviceName)) {
    throw new AppError(
      "out_of_scope",
      `this token is scoped to ${principal.scopeServices.join(", ")}: ${serviceName} is outside its scope`,
    );
  }
}

/**
 * RequestContext resolves, inside a route's handler, the principal the API's access check
 * established when the request arrived (src/engine/api/index.ts).
 */
export interface RequestContext {
  principalOf(request: Request): Principal;
}
