import { isIP } from "node:net";
import { Bonjour } from "bonjour-service";
import type { Logger } from "../../lib/logger";
import type { LocalName } from "./names";

/** SERVICE_TYPE is the DNS-SD type every name is announced under (RFC 6763 §7). */
export const SERVICE_TYPE = "_https._tcp.local";
const SERVICE_ENUMERATION = "_services._dns-sd._udp.local";

// RFC 6762 §10: records that carry a host name (SRV, A, AAAA) live 120 s, the others 75 minutes.
const HOST_TTL = 120;
const OTHER_TTL = 4500;
// RFC 6762 §8.1: wait 0-250 ms, send three probes 250 ms apart, then wait 250 ms for an answer.
const PROBE_COUNT = 3;
const PROBE_INTERVAL_MS = 250;
// RFC 6762 §8.3: at least two announcements one second apart, each interval at least double the last.
const ANNOUNCE_DELAYS_MS = [1000, 2000];
const SEND_TIMEOUT_MS = 2000;
const READY_TIMEOUT_MS = 3000;

/** DnsRecord is a resource record in the shape dns-packet encodes. */
export interface DnsRecord {
  name: string;
  type: "A" | "AAAA" | "PTR" | "SRV" | "TXT";
  ttl: number;
  flush?: boolean;
  data: unknown;
}

interface DnsPacket {
  type: "query" | "response";
  answers: DnsRecord[];
  additionals: DnsRecord[];
}

/** MulticastDns is the part of a multicast-dns socket this backend uses. */
interface MulticastDns {
  on(event: "ready", listener: () => void): void;
  on(event: "error" | "warning", listener: (error: Error) => void): void;
  on(event: "response", listener: (packet: DnsPacket) => void): void;
  once(event: "ready", listener: () => void): void;
  once(event: "error", listener: (error: Error) => void): void;
  removeListener(event: "response", listener: (packet: DnsPacket) => void): void;
  query(query: { questions: { name: string; type: string }[]; authorities?: DnsRecord[] }, callback: (error?: Error | null) => void): void;
  respond(response: { answers: DnsRecord[] }, callback: (error?: Error | null) => void): void;
  destroy(callback?: () => void): void;
}

/**
 * BonjourResponder is bonjour-service's responder, which answers queries for the records it
 * holds. It is not in the package's typings; the version is pinned. The backend uses it
 * instead of bonjour's `publish` because that derives A records from the host's interfaces
 * (so neither configured addresses nor a loopback-only host work) and because its
 * `unregister` drops every record of the same owner name and type: unpublishing one service
 * also withdraws the `_https._tcp.local` PTR records of all the others.
 */
interface BonjourResponder {
  mdns: MulticastDns;
  register(records: DnsRecord[]): void;
  unregister(records: DnsRecord[]): void;
}

interface Entry {
  local: LocalName;
  port: number;
  records: DnsRecord[];
  /** registered is whether the responder holds the records (probing passed). */
  registered: boolean;
  /** announced is whether an announcement reached the socket. */
  announced: boolean;
  timers: ReturnType<typeof setTimeout>[];
}

/** BonjourBackendOptions configures the multicast socket and reports errors outside calls. */
export interface BonjourBackendOptions {
  log: Logger;
  addresses: string[];
  /** multicastInterface limits multicast to the interface with this IPv4 address. */
  multicastInterface?: string;
  /** onError receives failures that happen outside a call, such as a failed answer to a query. */
  onError: (error: Error) => void;
}

/**
 * BonjourBackend publishes names with its own mDNS responder on UDP 5353 (bonjour-service's
 * socket and responder). It probes each new name before claiming it (RFC 6762 §8.1),
 * announces it three times, answers queries for it, and sends goodbyes (TTL 0, §10.1) when a
 * name is unpublished or the backend stops.
 */
export class BonjourBackend {
  readonly #options: BonjourBackendOptions;
  readonly #entries = new Map<string, Entry>();
  #bonjour: Bonjour | undefined;
  #responder: BonjourResponder | undefined;

  constructor(options: BonjourBackendOptions) {
    this.#options = options;
  }

  /** start opens the multicast socket and resolves once it is bound; it throws if binding fails. */
  async start(): Promise<void> {
    const socketOptions = this.#options.multicastInterface
      ? // multicast-dns binds to `interface` unless `bind` is set, and a socket bound to a unicast address receives no multicast.
        { interface: this.#options.multicastInterface, bind: "0.0.0.0" }
      : {};
    const bonjour = new Bonjour(socketOptions as ConstructorParameters<typeof Bonjour>[0], (error: Error) => this.#options.onError(error));
    this.#bonjour = bonjour;
    const responder = (bonjour as unknown as { server: BonjourResponder }).server;
    this.#responder = responder;
    // Without an "error" listener, an EADDRINUSE or EACCES from the socket would be thrown and end the daemon.
    responder.mdns.on("error", (error) => this.#options.onError(error));
    // multicast-dns retries joining the group on every interface each 5 s and warns each time one fails.
    const warned = new Set<string>();
    responder.mdns.on("warning", (error) => {
      if (warned.has(error.message)) return;
      warned.add(error.message);
      this.#options.log.debug({ err: error.message }, "mdns socket warning");
    });
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`mDNS socket not bound within ${READY_TIMEOUT_MS} ms`)), READY_TIMEOUT_MS);
      responder.mdns.once("ready", () => {
        clearTimeout(timer);
        resolve();
      });
      responder.mdns.once("error", (error) => {
        clearTimeout(timer);
        reject(error);
      });
    });
  }

  /** isPublished is whether `name` has been announced. */
  isPublished(name: string): boolean {
    return this.#entries.get(name)?.announced === true;
  }

  /**
   * publish claims `local.name` and announces its records. It resolves after the first
   * announcement was sent and throws if another responder already answers for the name or the
   * socket cannot send. Publishing a name again with another port replaces its SRV record
   * without probing, since the name is already ours.
   */
  async publish(local: LocalName, port: number): Promise<void> {
    const responder = this.#requireResponder();
    const previous = this.#entries.get(local.name);
    const entry: Entry = {
      local,
      port,
      records: serviceRecords(local, port, this.#options.addresses),
      registered: false,
      announced: false,
      timers: [],
    };
    if (previous) this.#withdraw(previous);
    this.#entries.set(local.name, entry);
    if (!previous?.registered) {
      const conflict = await this.#probe(responder, entry);
      if (this.#entries.get(local.name) !== entry) return; // unpublished or replaced while probing
      if (conflict) {
        this.#entries.delete(local.name);
        throw new Error(`mDNS name ${local.name} is already answered by another host on the network`);
      }
    }
    responder.register(entry.records);
    entry.registered = true;
    await this.#send(responder, entry.records);
    if (this.#entries.get(local.name) !== entry) return;
    entry.announced = true;
    let delay = 0;
    for (const step of ANNOUNCE_DELAYS_MS) {
      delay += step;
      const timer = setTimeout(() => {
        this.#send(responder, entry.records).catch((error: Error) => this.#options.onError(error));
      }, delay);
      timer.unref();
      entry.timers.push(timer);
    }
  }

  /** unpublish withdraws `name` and sends its goodbye; it does nothing for a name not published. */
  async unpublish(name: string): Promise<void> {
    const entry = this.#entries.get(name);
    if (!entry || !this.#responder) return;
    this.#entries.delete(name);
    this.#withdraw(entry);
    if (entry.registered) await this.#send(this.#responder, goodbyes(entry.records, this.#entries.size > 0));
  }

  /** stop sends goodbyes for every name and closes the socket; it is safe after a failed start and twice. */
  async stop(): Promise<void> {
    const entries = [...this.#entries.values()];
    this.#entries.clear();
    for (const entry of entries) this.#withdraw(entry);
    const responder = this.#responder;
    const bonjour = this.#bonjour;
    this.#responder = undefined;
    this.#bonjour = undefined;
    const registered = entries.filter((entry) => entry.registered);
    if (responder && registered.length > 0) {
      await this.#send(
        responder,
        goodbyes(
          registered.flatMap((entry) => entry.records),
          false,
        ),
      ).catch((error: Error) => this.#options.log.debug({ err: error.message }, "mdns goodbye not sent"));
    }
    if (bonjour) {
      await new Promise<void>((resolve) => {
        try {
          bonjour.destroy(() => resolve());
        } catch {
          resolve(); // the socket never bound
        }
      });
    }
  }

  #requireResponder(): BonjourResponder {
    if (!this.#responder) throw new Error("the mDNS socket is not open");
    return this.#responder;
  }

  // withdraw stops an entry's announcements and takes its records out of the responder.
  #withdraw(entry: Entry): void {
    for (const timer of entry.timers) clearTimeout(timer);
    entry.timers = [];
    if (!entry.registered || !this.#responder) return;
    this.#responder.unregister(entry.records);
    // bonjour's unregister matches on owner name and type only, so it also removed the other
    // names' records that share an owner (the _https._tcp.local PTRs): put those back.
    for (const other of this.#entries.values()) {
      if (other !== entry && other.registered) this.#responder.register(other.records);
    }
  }

  // probe asks the network for the name and the service instance three times and reports
  // whether any other responder answered with a live record for either (RFC 6762 §8.1).
  async #probe(responder: BonjourResponder, entry: Entry): Promise<boolean> {
    const owners = new Set([entry.local.name, instanceName(entry.local.label)]);
    let conflict = false;
    const onResponse = (packet: DnsPacket) => {
      // A goodbye (TTL 0) is not a claim: it may be this host's own, looped back after an unpublish.
      const records = [...(packet.answers ?? []), ...(packet.additionals ?? [])];
      if (records.some((record) => record.ttl > 0 && owners.has(record.name.toLowerCase()))) conflict = true;
    };
    responder.mdns.on("response", onResponse);
    try {
      await Bun.sleep(Math.random() * PROBE_INTERVAL_MS);
      for (let attempt = 0; attempt < PROBE_COUNT && !conflict; attempt++) {
        if (this.#entries.get(entry.local.name) !== entry) return false;
        await new Promise<void>((resolve, reject) =>
          responder.mdns.query(
            {
              questions: [...owners].map((name) => ({ name, type: "ANY" })),
              // §8.2: the proposed records go in the authority section, for simultaneous-probe tie-breaking.
              authorities: entry.records.filter((record) => owners.has(record.name)),
            },
            (error) => (error ? reject(error) : resolve()),
          ),
        );
        await Bun.sleep(PROBE_INTERVAL_MS);
      }
      return conflict;
    } finally {
      responder.mdns.removeListener("response", onResponse);
    }
  }

  async #send(responder: BonjourResponder, records: DnsRecord[]): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`mDNS send did not complete within ${SEND_TIMEOUT_MS} ms`)), SEND_TIMEOUT_MS);
      responder.mdns.respond({ answers: records }, (error) => {
        clearTimeout(timer);
        if (error) reject(error);
        else resolve();
      });
    });
  }
}

/** instanceName is the DNS-SD service instance a label is announced as, `<label>._https._tcp.local`. */
export function instanceName(label: string): string {
  return `${label}.${SERVICE_TYPE}`;
}

/**
 * serviceRecords are the records that publish one name: the DNS-SD PTR, SRV and TXT records
 * of an `_https._tcp` instance named after the label (RFC 6763 §4-§6), the A and AAAA records
 * of the host name, and the service-type enumeration PTR (§9). Records unique to this host
 * carry the cache-flush bit (RFC 6762 §10.2).
 */
export function serviceRecords(local: LocalName, port: number, addresses: string[]): DnsRecord[] {
  const instance = instanceName(local.label);
  return [
    { name: SERVICE_TYPE, type: "PTR", ttl: OTHER_TTL, data: instance },
    { name: instance, type: "SRV", ttl: HOST_TTL, flush: true, data: { priority: 0, weight: 0, port, target: local.name } },
    { name: instance, type: "TXT", ttl: OTHER_TTL, flush: true, data: [Buffer.from("path=/")] },
    ...addresses.map(
      (address): DnsRecord => ({ name: local.name, type: isIP(address) === 6 ? "AAAA" : "A", ttl: HOST_TTL, flush: true, data: address }),
    ),
    { name: SERVICE_ENUMERATION, type: "PTR", ttl: OTHER_TTL, data: SERVICE_TYPE },
  ];
}

// goodbyes turns records into their goodbyes (TTL 0). The service-type enumeration PTR is
// shared by every name, so it is only withdrawn with the last one.
function goodbyes(records: DnsRecord[], othersRemain: boolean): DnsRecord[] {
  return records
    .filter((record) => !(othersRemain && record.name === SERVICE_ENUMERATION))
    .filter((record, index, all) => record.name !== SERVICE_ENUMERATION || all.findIndex((r) => r.name === SERVICE_ENUMERATION) === index)
    .map((record) => ({ ...record, ttl: 0, flush: false }));
}
