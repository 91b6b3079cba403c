import type { DaemonUpgradeAccepted, Ready } from "../../contract/engine";
import type { Logger } from "../../lib/logger";
import type { TokenStore } from "../auth";
import type { NodeIdentity, TunnelStatus, VcsTokenStore } from "../link";
import type { EngineMetrics } from "../metrics";
import type { ProxyController } from "../proxy";
import type { ServiceDirectory } from "../services";
import type { TemplateCatalog } from "../templates";

/** DaemonControl is what the API may ask of the daemon itself. */
export interface DaemonControl {
  /** requestRestart starts a drain-and-restart in the background and returns at once. */
  requestRestart(drainTimeoutS: number): void;
  /**
   * requestUpgrade checks a new binary, puts it in place of the running one, and starts the
   * same drain-and-restart into it; it resolves once the binary is in place (not when it serves).
   */
  requestUpgrade(request: { binary: string; drain_timeout_s: number; health_timeout_s: number }): Promise<UpgradeAccepted>;
}

export type UpgradeAccepted = DaemonUpgradeAccepted;

/**
 * ApiDeps are the modules the HTTP API calls. Each resource's routes, beside their module,
 * declare the part they use; the API hands each its part. Handlers are thin: validate, call, answer.
 */
export interface ApiDeps {
  log: Logger;
  version: string;
  startedAt: number;
  tokens: TokenStore;
  templates: TemplateCatalog;
  vcs: VcsTokenStore;
  proxy: Pick<ProxyController, "status" | "addDomain" | "removeDomain">;
  services: ServiceDirectory;
  daemon: DaemonControl;
  /** linkIdentity reads the cloud link's identity (null when unlinked); unset: always unlinked. */
  linkIdentity?: () => NodeIdentity | null;
  /** linkTunnel reads the state of the tunnel to the console; unset: reported as not linked. */
  linkTunnel?: () => TunnelStatus;
  /** baseUrl is where browsers reach this engine (the web UI's login links); unset before it listens. */
  baseUrl?: () => string | undefined;
  /** metrics answers GET /metrics and the history; unset: both answer empty. */
  metrics?: Pick<EngineMetrics, "render" | "history">;
  /** closing aborts when the daemon hands over to a successor: event streams end, and their clients reconnect there. */
  closing?: AbortSignal;
  /** ready checks the database and the data dir for GET /api/ready; unset: ready by definition. */
  ready?: () => Ready;
}
