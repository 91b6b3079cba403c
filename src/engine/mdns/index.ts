/**
 * The mdns module publishes single-label `.local` names (`vllm-mybox.local`) on the local
 * network: an A/AAAA record pointing at this host and an `_https._tcp` DNS-SD service on the
 * proxy's HTTPS port. It publishes through a running avahi-daemon when there is one, since
 * two responders on UDP 5353 interfere, and through its own responder (bonjour-service)
 * otherwise.
 */
import type { Logger } from "../../lib/logger";
import { AvahiBackend, avahiDaemonRunning } from "./avahi";
import { BonjourBackend } from "./bonjour";
import { checkAddresses, type LocalName, parseLocalName, publishedAddresses } from "./names";

export { AVAHI_SOCKET, avahiDaemonRunning, avahiPublishCommands } from "./avahi";
export { type LocalName, type PublishedAddresses, parseLocalName, publishedAddresses } from "./names";

/** MdnsBackend is what publishes names: avahi-daemon, the built-in responder, or nothing. */
export type MdnsBackend = "bonjour" | "avahi" | "off";

export interface MdnsPublisherOptions {
  /** backend defaults to "auto": avahi when avahi-daemon runs, else bonjour. */
  backend?: "auto" | MdnsBackend;
  log: Logger;
  /** addresses replace the host's own addresses in the A and AAAA records. */
  addresses?: string[];
  /**
   * interface names the network interface (e.g. "eth0") whose addresses are published and,
   * with the bonjour backend, the only one multicast is sent and received on. avahi-daemon
   * chooses its interfaces from its own configuration (allow-interfaces).
   */
  interface?: string;
  /** avahiPublish is the avahi-publish program the avahi backend runs; it defaults to the one in PATH. */
  avahiPublish?: string;
}

/** MdnsStatus is the publisher's state, as shown in the proxy status. */
export interface MdnsStatus {
  /** backend is the one chosen by start(); "off" before start() and after stop(). */
  backend: MdnsBackend;
  /** published is whether at least one name is requested and every requested name is announced. */
  published: boolean;
  /** names are the requested names, sorted, whether or not their publication succeeded. */
  names: string[];
  /** interface_addresses are the addresses the names point at. */
  interface_addresses: string[];
  /** error describes the current failures, if any: the backend's and each name's. */
  error?: string;
}

interface Backend {
  start(): Promise<void>;
  publish(local: LocalName, port: number): Promise<void>;
  unpublish(name: string): Promise<void>;
  stop(): Promise<void>;
  isPublished(name: string): boolean;
}

interface Request {
  local: LocalName;
  port: number;
}

// BACKEND_ERROR keys the backend's own failure among the per-name ones.
const BACKEND_ERROR = "";

/**
 * MdnsPublisher publishes `.local` names for the proxy. Names may be requested before
 * start(); they are published when it runs. Failures of the network or of avahi never throw
 * out of start() or publish(): they are logged once and reported in status().error, so that
 * a host without multicast still runs the daemon. Only invalid input throws.
 */
export class MdnsPublisher {
  readonly #options: MdnsPublisherOptions;
  readonly #log: Logger;
  readonly #requests = new Map<string, Request>();
  readonly #errors = new Map<string, string>();
  readonly #logged = new Set<string>();
  #backendName: MdnsBackend = "off";
  #backend: Backend | undefined;
  #ready = false;
  #starting: Promise<void> | undefined;
  #addresses: string[] = [];

  constructor(options: MdnsPublisherOptions) {
    if (options.addresses) checkAddresses(options.addresses);
    this.#options = options;
    this.#log = options.log;
  }

  /**
   * start chooses the backend, opens it and publishes the names requested so far. It resolves
   * once they are announced or have failed; it does nothing if the publisher is started.
   */
  async start(): Promise<void> {
    if (!this.#starting) this.#starting = this.#start();
    await this.#starting;
  }

  async #start(): Promise<void> {
    const choice = this.#options.backend ?? "auto";
    if (choice === "off") return;
    const backendName = choice === "auto" ? ((await avahiDaemonRunning()) ? "avahi" : "bonjour") : choice;
    this.#backendName = backendName;
    const chosen = publishedAddresses({ addresses: this.#options.addresses, interfaceName: this.#options.interface });
    this.#addresses = chosen.addresses;
    if (chosen.error || chosen.addresses.length === 0) {
      this.#fail(BACKEND_ERROR, new Error(chosen.error ?? "no address to publish: no network interface has an IP address"));
      return;
    }
    if (backendName === "avahi" && this.#options.interface) {
      this.#log.info({ interface: this.#options.interface }, "avahi-daemon publishes on the interfaces of its own configuration");
    }
    const backend: Backend =
      backendName === "avahi"
        ? new AvahiBackend({
            log: this.#log,
            addresses: chosen.addresses,
            command: this.#options.avahiPublish ?? "avahi-publish",
            onNameChange: (name, error) => this.#nameChanged(name, error),
          })
        : new BonjourBackend({
            log: this.#log,
            addresses: chosen.addresses,
            multicastInterface: chosen.multicastInterface,
            onError: (error) => this.#fail(BACKEND_ERROR, error),
          });
    // Kept before it starts, so that stop() closes a backend whose start failed halfway.
    this.#backend = backend;
    try {
      await backend.start();
    } catch (error) {
      this.#fail(BACKEND_ERROR, error as Error);
      return;
    }
    this.#ready = true;
    this.#log.info({ backend: backendName, addresses: chosen.addresses }, "mdns publisher started");
    await Promise.all([...this.#requests.values()].map((request) => this.#publish(request)));
  }

  /**
   * publish requests `name` (one label before `.local`) with the HTTPS `port`: an A record per
   * IPv4 and an AAAA record per IPv6 address of this host, and an `_https._tcp` service
   * instance named after the label with host `name`. Once started, it resolves when the name
   * is announced or its publication has failed (see status()). It throws `invalid_domain` for
   * an invalid name.
   */
  async publish(name: string, port: number): Promise<void> {
    const local = parseLocalName(name);
    if (!Number.isInteger(port) || port < 1 || port > 65535) throw new RangeError(`mDNS service port ${port} is not a TCP port`);
    const previous = this.#requests.get(local.name);
    if (previous?.port === port && this.#backend?.isPublished(local.name)) return;
    const request = { local, port };
    this.#requests.set(local.name, request);
    if (this.#ready) await this.#publish(request);
  }

  /** unpublish withdraws `name` and tells the network it is gone; an unknown name is ignored. */
  async unpublish(name: string): Promise<void> {
    const { name: normalized } = parseLocalName(name);
    if (!this.#requests.delete(normalized)) return;
    this.#errors.delete(normalized);
    try {
      await this.#backend?.unpublish(normalized);
      this.#log.info({ name: normalized }, "mdns name unpublished");
    } catch (error) {
      this.#log.warn({ name: normalized, err: (error as Error).message }, "mdns name not withdrawn cleanly");
    }
  }

  /** names are the requested names, sorted. */
  names(): string[] {
    return [...this.#requests.keys()].sort();
  }

  status(): MdnsStatus {
    const names = this.names();
    const backend = this.#backend;
    const error = [...new Set(this.#errors.values())].join("; ");
    return {
      backend: this.#backendName,
      published: this.#ready && backend !== undefined && names.length > 0 && names.every((name) => backend.isPublished(name)),
      names,
      interface_addresses: [...this.#addresses],
      ...(error ? { error } : {}),
    };
  }

  /**
   * stop withdraws every name (goodbye packets, or the avahi-publish children killed) and
   * closes the backend. It waits for a start in progress, is safe after a failed or partial
   * start and twice, and leaves a publisher that can be started again.
   */
  async stop(): Promise<void> {
    await this.#starting?.catch(() => undefined);
    const backend = this.#backend;
    this.#backend = undefined;
    this.#ready = false;
    this.#starting = undefined;
    this.#requests.clear();
    this.#errors.clear();
    this.#logged.clear();
    this.#addresses = [];
    this.#backendName = "off";
    if (!backend) return;
    try {
      await backend.stop();
    } catch (error) {
      this.#log.warn({ err: (error as Error).message }, "mdns backend did not stop cleanly");
    }
  }

  async #publish(request: Request): Promise<void> {
    const backend = this.#backend;
    if (!backend) return;
    try {
      await backend.publish(request.local, request.port);
      if (this.#requests.get(request.local.name) !== request) return;
      this.#errors.delete(request.local.name);
      this.#log.info({ name: request.local.name, port: request.port, backend: this.#backendName }, "mdns name published");
    } catch (error) {
      // A publication cancelled by unpublish or replaced by a newer request is not a failure.
      if (this.#requests.get(request.local.name) === request) this.#fail(request.local.name, error as Error);
    }
  }

  #nameChanged(name: string, error: Error | null): void {
    if (!this.#requests.has(name)) return;
    if (error) {
      this.#fail(name, error);
      return;
    }
    this.#errors.delete(name);
    this.#log.info({ name }, "mdns name published");
  }

  // fail records a failure for status() and logs each distinct message once.
  #fail(key: string, error: Error): void {
    const message = error.message || String(error);
    this.#errors.set(key, message);
    if (this.#logged.has(message)) return;
    this.#logged.add(message);
    this.#log.warn({ name: key || undefined, backend: this.#backendName, err: message }, "mdns publication failed");
  }
}
