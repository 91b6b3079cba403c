import type { Role } from "../../contract/engine";
import { AppError } from "../../lib/errors";

/**
 * Principal is who is calling: a bearer token, or the local unix socket, whose file mode
 * (0600) is the trust boundary and which therefore counts as admin (as in Headscale).
 */
export interface Principal {
  kind: "token" | "local";
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

/** assertServiceInScope throws 403 `out_of_scope` when a scoped principal names a service outside its scope. */
export function assertServiceInScope(principal: Principal, serviceName: string): void {
  if (principal.scopeServices.length > 0 && !principal.scopeServices.includes(serviceName)) {
    throw new AppError(
      "out_of_scope",
      `this token is scoped to ${principal.scopeServices.join(", ")}: ${serviceName} is outside its scope`,
    );
  }
}
