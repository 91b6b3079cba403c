import type { Diagnosis } from "../../contract/engine";
import { AppError } from "../../lib/errors";

/**
 * ServiceDirectory is what the API needs from the scheduler to find and diagnose services.
 * Until the scheduler module exists, the engine runs with `noServices`, under which no service
 * exists: lookups answer `service_not_found`, the truth, rather than invented records.
 */
export interface ServiceDirectory {
  diagnose(ident: string): Diagnosis;
  /** serviceName resolves a name or id to the service's name, for scope checks. */
  serviceName(ident: string): string;
  removeDomain(name: string, domain: string): { service_name: string; domain: string; removed: boolean };
  restoreDatabase(
    name: string,
    dump: string,
    timeoutS: number,
  ): Promise<{ service_name: string; dump: string; engine: string; duration_s: number }>;
  /** drain waits, at most until the deadline, for work that must finish before a restart. */
  drain(deadline: number): Promise<void>;
}

function notFound(ident: string): never {
  throw new AppError("service_not_found", `no service named or with id ${JSON.stringify(ident)}`);
}

export const noServices: ServiceDirectory = {
  diagnose: notFound,
  serviceName: notFound,
  removeDomain: notFound,
  restoreDatabase: async (name) => {
    throw new AppError("database_not_found", `no database service named ${JSON.stringify(name)}`);
  },
  drain: async () => {},
};
