import type { Clock } from "../../lib/clock";
import type { Logger } from "../../lib/logger";
import type { Api } from "../api";
import type { TokenStore } from "../auth";
import type { EngineConfig } from "../config";
import type { GpuInventory } from "../gpu";
import type { TunnelClient, VcsTokenStore } from "../link";
import type { McpEndpoint } from "../mcp";
import type { EngineMetrics } from "../metrics";
import type { ProxyController } from "../proxy";
import type { ServiceDirectory, ServiceManager } from "../services";
import type { Database } from "../store";
import type { Supervisor } from "../supervisor";
import type { TemplateCatalog } from "../templates";
import type { LocalCa, TrustStatus } from "../tls";
import type { ApiListeners } from "./listeners";

/**
 * EngineContext is what every module of the daemon is started with: the validated
 * configuration, the logger, the clock, the engine's store and the bus where modules meet. It
 * replaces the options bags each module was handed and the holders filled in later.
 */
export interface EngineContext {
  readonly config: EngineConfig;
  readonly log: Logger;
  readonly clock: Clock;
  /** store is the engine's database. It opens in the list's order: reading it before the store module started throws. */
  readonly store: Database;
  readonly bus: EngineBus;
}

/**
 * Module is one long-lived part of the daemon, with one lifecycle (Caddy's provision, start,
 * cleanup). provision(ctx), where a module has one, builds what needs nothing exclusive (no
 * port, no write to what a running predecessor owns) and publishes on ctx.bus what later
 * modules reach of it; start(ctx) does the module's work in the composition root's order; stop()
 * undoes both. A plain start provisions and starts each module in turn; a restart's successor
 * provisions every module before it starts the first (ModuleRunner, decision 441). The root
 * stops the modules in reverse, also when a later one failed, so stop() must be safe after a
 * provision alone, after a partial start (the failing module's own included) and twice.
 */
export interface Module {
  readonly name: string;
  provision?(ctx: EngineContext): void | Promise<void>;
  start(ctx: EngineContext): void | Promise<void>;
  stop(): void | Promise<void>;
}

/** LocalAuthority is the local CA as the modules share it: the CA, its root, and the first reading of whether the system trusts it. */
export interface LocalAuthority {
  ca: LocalCa;
  rootPem: string;
  trust: Promise<Pick<TrustStatus, "system" | "nss">>;
}

/**
 * HandoverOutcome is what a successor learned at its predecessor's release: `storeUnchanged`
 * when the predecessor said it wrote no service, version or run between the switch and the
 * release, so the rows the successor read while it prepared are the store's (decision 533).
 */
export interface HandoverOutcome {
  storeUnchanged: boolean;
}

/** EnginePeers are what modules publish on the bus, by name: each is published once, by the module that starts it. */
export interface EnginePeers {
  supervisor: Supervisor;
  ca: LocalAuthority;
  listeners: ApiListeners;
  tokens: TokenStore;
  templates: TemplateCatalog;
  vcs: VcsTokenStore;
  secretKey: Buffer;
  metrics: EngineMetrics;
  gpus: GpuInventory;
  /** manager is the service manager itself; services is what the API and the proxy use of it (tests may wrap it). */
  manager: ServiceManager;
  services: ServiceDirectory;
  api: Api;
  mcp: McpEndpoint;
  tunnel: TunnelClient;
  /** handover is how a successor's take-over went, once its predecessor released its work. */
  handover: HandoverOutcome;
  /** proxy is the running reverse proxy: absent while it starts, and in a stand-in, which runs none of its own. */
  proxy: ProxyController;
}

/**
 * EngineBus is where the daemon's modules meet. A module publishes what it serves once it has
 * started; a later module takes it with get (a peer that must be there by the list's order), a
 * callback that may run earlier asks with find. It is the one place for what used to be a
 * holder per pair of modules (the proxy for the metrics and ACME, the API for the tunnel).
 */
export class EngineBus {
  readonly #peers: Partial<EnginePeers> = {};

  /** provide publishes a peer; a second one under the same name is a defect of the list. */
  provide<K extends keyof EnginePeers>(name: K, peer: EnginePeers[K]): EnginePeers[K] {
    if (this.#peers[name] !== undefined) throw new Error(`engine bus: ${name} is provided twice`);
    this.#peers[name] = peer;
    return peer;
  }

  /** get returns a peer the list's order guarantees; asking before it started is a defect and throws. */
  get<K extends keyof EnginePeers>(name: K): EnginePeers[K] {
    const peer = this.#peers[name];
    if (peer === undefined) throw new Error(`engine bus: ${name} is asked for before its module started`);
    return peer as EnginePeers[K];
  }

  /** find returns a peer when its module has started (and, for the proxy, runs), else undefined. */
  find<K extends keyof EnginePeers>(name: K): EnginePeers[K] | undefined {
    return this.#peers[name];
  }
}

/**
 * ModuleRunner provisions and starts modules in order and stops them in reverse. A module counts
 * as started from the moment its provision (or start) is called, so a failed one is stopped too,
 * then every one before it. stop() may come at any time, also while a later module still starts
 * (a restart requested as soon as the API answers): it stops what has started by then.
 */
export class ModuleRunner {
  readonly #started: Module[] = [];

  constructor(private readonly ctx: EngineContext) {}

  /**
   * start provisions and starts each module in order; on a failure it stops every started one
   * in reverse and throws the error. With `provisionFirst` every module is provisioned before the
   * first one starts (Caddy's Provision, then Start): a successor builds all it can before a
   * module of the list (the take-over) waits for its predecessor's release.
   */
  async start(modules: readonly Module[], options: { provisionFirst?: boolean } = {}): Promise<void> {
    try {
      if (options.provisionFirst) {
        for (const module of modules) {
          this.#started.push(module);
          await module.provision?.(this.ctx);
        }
        for (const module of modules) await module.start(this.ctx);
        return;
      }
      for (const module of modules) {
        this.#started.push(module);
        await module.provision?.(this.ctx);
        await module.start(this.ctx);
      }
    } catch (error) {
      await this.stop();
      throw error;
    }
  }

  /**
   * stop stops every started module in reverse, each once, logging (not throwing) a failure. It
   * answers how long each module's stop took, in ms (a hand-over's release logs them).
   */
  async stop(): Promise<Record<string, number>> {
    const took: Record<string, number> = {};
    while (this.#started.length > 0) {
      const module = this.#started.pop() as Module;
      const start = performance.now();
      try {
        await module.stop();
      } catch (error) {
        this.ctx.log.error({ err: error, module: module.name }, "stopping a module failed");
      }
      took[module.name] = Math.round((performance.now() - start) * 10) / 10;
    }
    return took;
  }
}
