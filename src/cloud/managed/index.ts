/**
 * The managed module runs the account's one hosted machine (issue 15): purchase (derived from
 * the operator's seats, invoices and places), allocation (paid, or a one-hour trial), wake,
 * update, backups and deletion, on a provider (src/cloud/managed/providers), reconciled by the
 * provisioner, and reached through the console's `/boxes/<id>/…` proxy.
 */
import { join } from "node:path";
import { AppError } from "../../lib/errors";
import type { Logger } from "../../lib/logger";
import type { ManagedConfig } from "../config";
import { LocalProvider } from "./providers/local";
import type { BoxProvider } from "./providers/provider";
import { ScriptedProvider } from "./providers/scripted";

export { compareVersions, LocalProvider } from "./providers/local";
export type { BackupInfo, BoxEndpoint, BoxProvider, BoxSpec, BoxState, BoxStatus, DestroyResult } from "./providers/provider";
export { type Fault, type ProviderOperation, ScriptedProvider } from "./providers/scripted";
export { Provisioner, type ProvisionerOptions } from "./provisioner";
export { type BoxProxy, boxProxy } from "./proxy";
export { managedRoutes } from "./routes";
export { type Answer, type ManagedContext, ManagedService } from "./service";
export { type Allocation, type AllocationStatus, type Backup, type BoxPower, type Invoice, ManagedStore } from "./store";
export { MANAGED_RULES } from "./views";

/**
 * createProvider builds the configured provider: `local` keeps boxes under `<data-dir>/boxes`
 * and backups under `<data-dir>/backups`; `scripted` is local with the configured faults; `off`
 * is none (every hosted-machine route answers 404 `managed_not_offered`).
 */
export function createProvider(config: ManagedConfig, dataDir: string, log: Logger): BoxProvider | null {
  if (config.provider === "off") return null;
  const local = new LocalProvider({ root: join(dataDir, "boxes"), backupsRoot: join(dataDir, "backups"), releases: config.releases, log });
  if (config.provider === "local") return local;
  if (config.provider === "scripted") return new ScriptedProvider(local, config.faults ? ScriptedProvider.parseFaults(config.faults) : {});
  throw new AppError("config_invalid", `unknown box provider ${config.provider}`);
}
