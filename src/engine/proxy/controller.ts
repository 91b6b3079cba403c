import type { Database } from "bun:sqlite";
import { existsSync, mkdirSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { ProxyStatus, ServiceRecord } from "../../contract/engine";
import { allowedCpus } from "../../lib/affinity";
import { type Clock, iso } from "../../lib/clock";
import { AppError, isAppError } from "../../lib/errors";
import { writePrivateFile } from "../../lib/files";
import type { Logger } from "../../lib/logger";
import type { ProxyConfig } from "../config";
import type { ServiceDirectory } from "../services";
import { type DomainRow, DomainStore } from "./domains";
import type { RouteCounts } from "./meter";
import { apexName, type DomainKind, defaultNames, domainKind, validateDomain } from "./names";
import { type ProcessesStatus, ProxyProcesses } from "./processes";
import type { ProxySnapshot, RouteEntry, RouteState, SnapshotCertificate } from "./snapshot";

/** HeldCertificate is a certificate the proxy serves for one name. */
export interface HeldCertificate {
  certPem: string;
  keyPem: string;
  notAfter: Date;
  issuer: string;
}

/** LocalCertificates issues and renews the local CA's leaf certificates (src/engine/tls). */
export interface LocalCertificates {
  get(name: string): HeldCertificate;
  renewDue(now: Date): string[];
}

/** CaDescription is what the status reports of the local CA. */
export interface CaDescription {
  initialized: boolean;
  subject: string;
  fingerprint_sha256: string;
  not_after: string;
  intermediate_not_after: string;
  root_path: string;
  trusted_in_system: boolean;
  trusted_in_nss: boolean | null;
}

/** PublicIssuer is the ACME issuer's part the proxy uses (src/engine/tls/acme.ts). */
export interface PublicIssuer {
  issue(domain: string): Promise<HeldCertificate & { notBefore: Date }>;
  ensure(domain: string, current?: { notBefore: Date; notAfter: Date }): void;
  cancel(domain: string): boolean;
  renewDue(now?: Date): string[];
  status(): { directory_url: string; orders: AcmeOrderSummary[] };
  stop(): void;
}

/** AcmeOrderSummary is one domain's ACME state as the status reports it. */
export interface AcmeOrderSummary {
  domain: string;
  state: string;
  attempts: number;
  last_error: string | null;
  next_retry_at: string | null;
  not_after: string | null;
}

/** NamePublisher publishes `.local` names over mDNS (src/engine/mdns). */
export interface NamePublisher {
  publish(name: string, port: number): void | Promise<void>;
  unpublish(name: string): void | Promise<void>;
  status(): { backend: string; published: boolean; names: string[] };
  stop(): void | Promise<void>;
}

export interface ProxyControllerOptions {
  config: ProxyConfig;
  dataDir: string;
  /** apiPort is the engine's own API port: `<hostname>.local` (the apex) routes to it. */
  apiPort: number;
  db: Database;
  services: ServiceDirectory;
  log: Logger;
  clock: Clock;
  certificates: LocalCertificates;
  describeCa: () => CaDescription;
  acme: PublicIssuer | null;
  mdns: NamePublisher | null;
  /** command starts a proxy process; tests may pass their own. */
  command?: string[];
}

/** DomainRecord is the answer to adding a domain. */
export interface DomainRecord {
  service_name: string;
  domain: string;
  path_prefix: string;
  kind: DomainKind;
  url: string;
  certificate: { issuer: string; not_after: string } | null;
}

/** STARTING_STATUSES answer 503 with Retry-After: the service is on its way up. */
const STARTING_STATUSES = new Set(["pending", "scheduled", "building", "restarting", "retrying", "paused"]);
const UP_STATUSES = new Set(["running", "degraded"]);

/** RENEW_CHECK_MS is how often certificates are checked for renewal. */
const RENEW_CHECK_MS = 60 * 60 * 1000;

function routeState(status: string): RouteState {
  if (UP_STATUSES.has(status)) return "up";
  if (STARTING_STATUSES.has(status)) return "starting";
  return "down";
}

/**
 * ProxyController is the daemon's side of the reverse proxy: it turns services, their ports
 * and their domains into routes, holds a certificate for every routed name (local CA, or ACME
 * for public domains), publishes `.local` names, and keeps the proxy processes fed with
 * snapshots. Routes follow the services: a change of status reaches the proxy within a tick.
 */
export class ProxyController {
  private readonly store: DomainStore;
  private readonly processes: ProxyProcesses | null;
  private readonly hostname: string;
  private routesByService = new Map<string, RouteEntry[]>();
  private readonly certificates = new Map<string, HeldCertificate & { source: "local-ca" | "acme" }>();
  private readonly acmeDir: string;
  private generation = 0;
  private dirty = new Set<string>();
  private flushQueued = false;
  private unsubscribe: (() => void) | null = null;
  private renewTimer: ReturnType<typeof setInterval> | null = null;
  private state: "starting" | "running" | "failed" | "stopped" | "disabled" = "starting";
  private failure: string | null = null;
  private published = new Set<string>();
  private challenges: Record<string, string> = {};
  private lastRenewal: { at: string; names: string[] } | null = null;

  constructor(private readonly o: ProxyControllerOptions) {
    this.store = new DomainStore(o.db);
    this.hostname = o.config.hostname;
    this.acmeDir = join(o.dataDir, "pki", "acme", "certificates");
    this.processes = o.config.enabled
      ? new ProxyProcesses({
          config: {
            host: o.config.host,
            httpsPort: o.config.httpsPort ?? 0,
            httpPort: o.config.httpPort ?? 0,
            maxBodyBytes: o.config.maxBodyBytes,
            stateDir: join(o.dataDir, "proxy"),
          },
          count: o.config.processes,
          log: o.log,
          binDir: join(o.dataDir, "bin"),
          command: o.command,
          cpus: o.config.cpuAffinity === "auto" ? allowedCpus() : null,
        })
      : null;
    if (!o.config.enabled) this.state = "disabled";
  }

  // ---------------------------------------------------------------- lifecycle

  /**
   * start builds the routes, makes sure every name has a certificate, and starts the proxy
   * processes. When the ports were left to the engine it takes 443 and 80 where it may, else
   * 8443 and 8080. A port taken by another program fails the start with `port_in_use` when
   * the user chose it, and leaves the proxy `failed` (the API still starts) when it was a default.
   */
  async start(): Promise<void> {
    this.loadAcmeCertificates();
    for (const service of this.o.services.list()) this.routesByService.set(service.id, this.routesFor(service));
    this.unsubscribe = this.o.services.subscribe((serviceId, change) => {
      // A service with no port has no route, and had none if none is recorded: nothing to recompute.
      if (change && change.port === null && !this.routesByService.has(serviceId)) return;
      this.markDirty(serviceId);
    });
    this.ensureCertificates();
    if (!this.processes) return;
    const previous = this.processes.previous();
    const config = this.o.config;
    const inherit = previous[0];
    const candidates = (chosen: number | null, privileged: number, fallback: number, inherited: number | undefined): number[] => {
      if (inherited !== undefined && (chosen === null || chosen === 0 || chosen === inherited)) return [inherited];
      if (chosen !== null) return [chosen];
      return [privileged, fallback];
    };
    const httpsCandidates = candidates(config.httpsPort, 443, 8443, inherit?.https_port);
    const httpCandidates = candidates(config.httpPort, 80, 8080, inherit?.http_port);
    let lastError: unknown;
    for (let i = 0; i < Math.max(httpsCandidates.length, httpCandidates.length); i++) {
      const httpsPort = httpsCandidates[Math.min(i, httpsCandidates.length - 1)] ?? 0;
      const httpPort = httpCandidates[Math.min(i, httpCandidates.length - 1)] ?? 0;
      if (!inherit) {
        const problem = probePorts(config.host, [httpsPort, httpPort]);
        if (problem) {
          lastError = problem;
          continue;
        }
      }
      try {
        this.processes.setPorts(httpsPort, httpPort);
        const bound = await this.processes.start(this.snapshot(), previous);
        this.state = "running";
        this.o.log.info({ https_port: bound.httpsPort, http_port: bound.httpPort, processes: config.processes }, "proxy listening");
        this.publishNames();
        this.renewTimer = setInterval(() => void this.renewDue(), RENEW_CHECK_MS);
        this.renewTimer.unref?.();
        return;
      } catch (error) {
        lastError = error;
      }
    }
    const err = lastError as NodeJS.ErrnoException;
    this.state = "failed";
    this.failure =
      `cannot listen on ${httpsCandidates.join(" or ")} / ${httpCandidates.join(" or ")}: ${err?.code ?? ""} ${err?.message ?? ""}`.trim();
    if (config.httpsPort !== null || config.httpPort !== null) {
      throw new AppError(
        "port_in_use",
        `the proxy ${this.failure}: choose other ports with --https-port/--http-port (ENGINE_HTTPS_PORT/ENGINE_HTTP_PORT) or ENGINE_PROXY=off`,
      );
    }
    this.o.log.error({ reason: this.failure }, "proxy not started: the API runs without it");
  }

  /** stop ends the proxy processes and unpublishes every name. */
  async stop(): Promise<void> {
    this.halt();
    await this.processes?.stop();
    await this.o.mdns?.stop();
    this.o.acme?.stop();
    this.state = "stopped";
  }

  /** handOver leaves the proxy processes serving for the next daemon, which retires them once it has bound. */
  async handOver(): Promise<void> {
    this.halt();
    this.processes?.handOver();
    await this.o.mdns?.stop();
    this.o.acme?.stop();
    this.state = "stopped";
  }

  private halt(): void {
    this.unsubscribe?.();
    this.unsubscribe = null;
    if (this.renewTimer) clearInterval(this.renewTimer);
    this.renewTimer = null;
  }

  // ---------------------------------------------------------------- routes

  private markDirty(serviceId: string): void {
    this.dirty.add(serviceId);
    if (this.flushQueued) return;
    this.flushQueued = true;
    queueMicrotask(() => {
      this.flushQueued = false;
      this.flush();
    });
  }

  /** flush recomputes the routes of the services that changed and pushes a snapshot if any route did. */
  private flush(): void {
    const ids = [...this.dirty];
    this.dirty.clear();
    let changed = false;
    for (const id of ids) {
      let record: ServiceRecord | null = null;
      try {
        record = this.o.services.get(id);
      } catch (error) {
        if (!isAppError(error) || error.code !== "service_not_found") throw error;
      }
      const before = this.routesByService.get(id) ?? [];
      if (!record) {
        this.store.removeService(id);
        for (const route of before) this.o.acme?.cancel(route.host);
        this.routesByService.delete(id);
        changed ||= before.length > 0;
        continue;
      }
      const after = this.routesFor(record);
      if (JSON.stringify(after) !== JSON.stringify(before)) {
        changed = true;
        if (after.length > 0) this.routesByService.set(id, after);
        else this.routesByService.delete(id);
      }
    }
    if (changed) this.pushRoutes();
  }

  private pushRoutes(): void {
    this.ensureCertificates();
    this.publishNames();
    this.broadcast();
  }

  private broadcast(): number {
    this.generation += 1;
    this.processes?.broadcast(this.snapshot());
    return this.generation;
  }

  private routesFor(service: ServiceRecord): RouteEntry[] {
    if (service.port === null) return [];
    const base = {
      service: service.name,
      upstream: `http://127.0.0.1:${service.port}`,
      state: routeState(service.status),
      status: service.status,
      retryAfterS: service.status === "building" ? 30 : 5,
    };
    // A database speaks its own protocol, not HTTP: it gets no name of its own (clients reach its
    // port, bound services get its URL); a domain added to it by hand is still routed.
    const names = service.kind === "database" ? [] : defaultNames(service.name, this.hostname);
    const routes: RouteEntry[] = names.map((host) => ({ ...base, host, pathPrefix: "/" }));
    for (const row of this.store.forService(service.id)) routes.push({ ...base, host: row.domain, pathPrefix: row.path_prefix });
    return routes;
  }

  private apexRoute(): RouteEntry {
    return {
      host: apexName(this.hostname),
      pathPrefix: "/",
      service: "engine",
      upstream: `http://127.0.0.1:${this.o.apiPort}`,
      state: "up",
      status: "running",
      retryAfterS: 1,
    };
  }

  private allRoutes(): RouteEntry[] {
    const routes = [this.apexRoute(), { ...this.apexRoute(), host: "localhost" }];
    for (const list of this.routesByService.values()) routes.push(...list);
    return routes;
  }

  private snapshot(): ProxySnapshot {
    const routes = this.allRoutes();
    const certificates: SnapshotCertificate[] = [];
    // The apex goes first: Bun serves the first certificate to clients that send no SNI.
    for (const host of new Set(routes.map((route) => route.host))) {
      const held = this.certificates.get(host);
      if (held) certificates.push({ serverName: host, cert: held.certPem, key: held.keyPem });
    }
    return { generation: this.generation, routes, certificates, challenges: { ...this.challenges } };
  }

  // ---------------------------------------------------------------- certificates

  /** ensureCertificates gives every routed name a certificate: ACME's for public names once issued, the local CA's otherwise. */
  private ensureCertificates(): void {
    const hosts = new Set(this.allRoutes().map((route) => route.host));
    for (const host of hosts) {
      if (this.certificates.has(host)) continue;
      try {
        this.certificates.set(host, { ...this.o.certificates.get(host), source: "local-ca" });
      } catch (error) {
        this.o.log.error({ err: error, host }, "cannot issue a certificate");
      }
    }
    for (const host of [...this.certificates.keys()]) if (!hosts.has(host)) this.certificates.delete(host);
  }

  private async renewDue(): Promise<void> {
    const now = this.o.clock.now();
    const renewed = this.o.certificates.renewDue(now);
    let changed = false;
    for (const name of renewed) {
      const current = this.certificates.get(name);
      if (current?.source === "local-ca") {
        this.certificates.set(name, { ...this.o.certificates.get(name), source: "local-ca" });
        changed = true;
      }
    }
    this.o.acme?.renewDue(now);
    if (renewed.length > 0) this.lastRenewal = { at: iso(now), names: renewed };
    if (changed) this.broadcast();
  }

  /** renewNow runs the renewal check at once (the hourly timer's work), for the CLI and tests. */
  renewNow(): Promise<void> {
    return this.renewDue();
  }

  private loadAcmeCertificates(): void {
    if (!this.o.acme || !existsSync(this.acmeDir)) return;
    const routed = new Set(this.store.list().map((row) => row.domain));
    for (const file of readdirSync(this.acmeDir).filter((name) => name.endsWith(".json"))) {
      try {
        const stored = JSON.parse(readFileSync(join(this.acmeDir, file), "utf8")) as {
          domain: string;
          cert: string;
          key: string;
          not_before: string;
          not_after: string;
          issuer: string;
        };
        if (!routed.has(stored.domain)) continue;
        const held = { certPem: stored.cert, keyPem: stored.key, notAfter: new Date(stored.not_after), issuer: stored.issuer };
        this.certificates.set(stored.domain, { ...held, source: "acme" });
        this.o.acme.ensure(stored.domain, { notBefore: new Date(stored.not_before), notAfter: held.notAfter });
      } catch (error) {
        this.o.log.warn({ err: error, file }, "unreadable stored ACME certificate: ignored");
      }
    }
  }

  /** acceptAcmeCertificate keeps a certificate the ACME issuer obtained (first issuance or renewal) and serves it. */
  acceptAcmeCertificate(domain: string, certificate: HeldCertificate & { notBefore: Date }): void {
    mkdirSync(this.acmeDir, { recursive: true, mode: 0o700 });
    writePrivateFile(
      join(this.acmeDir, `${domain}.json`),
      JSON.stringify({
        domain,
        cert: certificate.certPem,
        key: certificate.keyPem,
        not_before: iso(certificate.notBefore),
        not_after: iso(certificate.notAfter),
        issuer: certificate.issuer,
      }),
    );
    if (!this.store.forDomain(domain).length) return;
    this.certificates.set(domain, { ...certificate, source: "acme" });
    this.broadcast();
  }

  /**
   * setChallenge publishes (or, with null, withdraws) an ACME http-01 answer on every proxy
   * process, and resolves once they all serve it, so the CA is told to look only then.
   */
  async setChallenge(token: string, keyAuthorization: string | null): Promise<void> {
    if (keyAuthorization === null) delete this.challenges[token];
    else this.challenges[token] = keyAuthorization;
    const generation = this.broadcast();
    if (keyAuthorization !== null) await this.processes?.whenApplied(generation, 5000);
  }

  // ---------------------------------------------------------------- mDNS

  private publishNames(): void {
    const mdns = this.o.mdns;
    if (!mdns || !this.processes || this.state !== "running") return;
    const wanted = new Set(
      this.allRoutes()
        .map((route) => route.host)
        .filter((host) => host.endsWith(".local")),
    );
    for (const name of wanted) {
      if (this.published.has(name)) continue;
      this.published.add(name);
      void Promise.resolve()
        .then(() => mdns.publish(name, this.processes?.httpsPort ?? 0))
        .catch((error) => this.o.log.warn({ err: error, name }, "mDNS publication failed"));
    }
    for (const name of [...this.published]) {
      if (wanted.has(name)) continue;
      this.published.delete(name);
      void Promise.resolve()
        .then(() => mdns.unpublish(name))
        .catch((error) => this.o.log.warn({ err: error, name }, "mDNS withdrawal failed"));
    }
  }

  // ---------------------------------------------------------------- domains

  private owner(domain: string): string | null {
    if (domain === apexName(this.hostname) || domain === "localhost") return "engine";
    for (const [id, routes] of this.routesByService) if (routes.some((route) => route.host === domain)) return id;
    const row = this.store.forDomain(domain)[0];
    return row ? row.service_id : null;
  }

  /**
   * addDomain routes a domain (and optional path prefix) to a service. The name is checked
   * first, then its owner (one service per name), then, for a public name with ACME set up,
   * a certificate is obtained before anything is stored: a refusal from the CA leaves
   * nothing behind.
   */
  async addDomain(serviceIdent: string, rawDomain: string, rawPrefix = "/"): Promise<DomainRecord> {
    const domain = validateDomain(rawDomain);
    const pathPrefix = normalizePrefix(rawPrefix);
    const service = this.o.services.get(serviceIdent);
    if (service.port === null) {
      throw new AppError("no_port", `${service.name} has no port to route to: redeploy it with a port, then add the domain`);
    }
    const owner = this.owner(domain);
    if (owner !== null && owner !== service.id) {
      const who = owner === "engine" ? "the engine itself" : this.nameOf(owner);
      throw new AppError("domain_in_use", `${domain} is already routed to ${who}`);
    }
    if (this.store.forDomain(domain).some((row) => row.path_prefix === pathPrefix) || (owner === service.id && pathPrefix === "/")) {
      throw new AppError("domain_in_use", `${domain}${pathPrefix === "/" ? "" : pathPrefix} is already routed to ${service.name}`);
    }
    const kind = domainKind(domain);
    if (kind === "public" && this.o.acme && !this.certificates.has(domain)) {
      const certificate = await this.o.acme.issue(domain);
      this.acceptAcmeCertificate(domain, certificate);
      this.certificates.set(domain, { ...certificate, source: "acme" });
      this.o.acme.ensure(domain, { notBefore: certificate.notBefore, notAfter: certificate.notAfter });
    }
    // Read the service again: it may have moved (or gone) while the CA was working.
    const current = this.o.services.get(service.id);
    this.store.insert({ domain, path_prefix: pathPrefix, service_id: service.id, created_at: iso(this.o.clock.now()) });
    this.routesByService.set(service.id, this.routesFor(current));
    this.pushRoutes();
    this.o.log.info({ service: service.name, domain, path_prefix: pathPrefix, kind }, "domain added");
    const held = this.certificates.get(domain);
    return {
      service_name: service.name,
      domain,
      path_prefix: pathPrefix,
      kind,
      url: this.urlOf(domain, pathPrefix),
      certificate: held ? { issuer: held.issuer, not_after: iso(held.notAfter) } : null,
    };
  }

  /** removeDomain takes a domain off a service; an unknown domain is `removed: false`, not an error. */
  removeDomain(serviceIdent: string, rawDomain: string): { service_name: string; domain: string; removed: boolean } {
    const service = this.o.services.get(serviceIdent);
    const domain = rawDomain.trim().toLowerCase().replace(/\.$/, "");
    const removed = this.store.remove(domain, service.id);
    if (removed) {
      this.o.acme?.cancel(domain);
      this.routesByService.set(service.id, this.routesFor(service));
      this.pushRoutes();
      this.o.log.info({ service: service.name, domain }, "domain removed");
    }
    return { service_name: service.name, domain, removed };
  }

  private nameOf(serviceId: string): string {
    try {
      return this.o.services.get(serviceId).name;
    } catch {
      return serviceId;
    }
  }

  private urlOf(host: string, pathPrefix = "/"): string {
    const port = this.processes?.httpsPort ?? 0;
    return `https://${host}${port === 443 || port === 0 ? "" : `:${port}`}${pathPrefix === "/" ? "/" : pathPrefix}`;
  }

  // ---------------------------------------------------------------- status

  /** status reports the proxy for GET /api/proxy/status; every value is read from the running parts. */
  /** requestCounts are what the proxy processes answered, per route and status class, since the proxy started (/metrics). */
  requestCounts(): RouteCounts[] {
    return this.processes?.requestCounts() ?? [];
  }

  status(): ProxyStatus {
    const processes: ProcessesStatus | null = this.processes?.status() ?? null;
    const routes = this.allRoutes();
    const running = this.state === "running";
    const userRoutes = new Set(this.store.list().map((row) => `${row.domain}${row.path_prefix}`));
    const acmeStatus = this.o.acme?.status() ?? null;
    const acmeStates = new Map(acmeStatus?.orders.map((order) => [order.domain, order.state]));
    const describe = (host: string, service: string, source: "default" | "user", pathPrefix = "/") => {
      const held = this.certificates.get(host);
      const kind = domainKind(host);
      return {
        domain: host,
        path_prefix: pathPrefix,
        service,
        source,
        kind,
        url: this.urlOf(host, pathPrefix),
        certificate: held
          ? { issuer: held.issuer, source: held.source, not_after: iso(held.notAfter) }
          : { issuer: null, source: null, not_after: null },
        acme_state: acmeStates.get(host) ?? null,
      };
    };
    const domains = [];
    for (const list of this.routesByService.values()) {
      for (const route of list) {
        const source = userRoutes.has(`${route.host}${route.pathPrefix}`) ? "user" : "default";
        domains.push(describe(route.host, route.service, source, route.pathPrefix));
      }
    }
    const ca = this.o.describeCa();
    const apex = apexName(this.hostname);
    return {
      state: this.state,
      mode: !this.processes ? "off" : this.o.acme ? "local-ca+acme" : "local-ca",
      hostname: this.hostname,
      scheme: "https",
      base_domain: apex,
      enabled: this.o.config.enabled,
      available: running,
      https_port: running ? (this.processes?.httpsPort ?? 0) : 0,
      tls: {
        listening: running,
        https_port: running ? (this.processes?.httpsPort ?? 0) : 0,
        http_port: running ? (this.processes?.httpPort ?? 0) : 0,
        http_redirect: true,
        protocols: ["http/1.1"],
        certificates: this.certificates.size,
        leaf_lifetime_hours: Math.round(this.o.config.leafLifetimeMs / 3600_000),
        last_renewal: this.lastRenewal,
        max_body_bytes: this.o.config.maxBodyBytes,
        error: this.failure,
      },
      ca: { ...ca },
      apex: { host: apex, routed: running, upstream: `http://127.0.0.1:${this.o.apiPort}`, url: this.urlOf(apex) },
      respawn: processes ?? { processes: 0, pids: [], count: 0, last_at: null, last_reason: null, retired_on_start: 0, cpus: [] },
      routes: {
        count: routes.length,
        items: routes.map((route) => ({
          host: route.host,
          path_prefix: route.pathPrefix,
          service: route.service,
          upstream: route.upstream,
          state: route.state,
        })),
      },
      mdns: this.o.mdns ? { enabled: true, ...this.o.mdns.status() } : { enabled: false, backend: "off", published: false, names: [] },
      acme: acmeStatus ? { ...acmeStatus, enabled: true } : { enabled: false, directory_url: null, orders: [] },
      domains: domains.sort((a, b) => a.domain.localeCompare(b.domain)),
    };
  }
}

function normalizePrefix(raw: string): string {
  const prefix = raw.trim() || "/";
  if (!/^\/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*$/.test(prefix) || prefix.includes("//") || prefix.includes("/../")) {
    throw new AppError("invalid_domain", `invalid path prefix ${JSON.stringify(raw)}: it starts with / and holds URL path characters only`);
  }
  return prefix.length > 1 && prefix.endsWith("/") ? prefix.slice(0, -1) : prefix;
}

/** probePorts binds each port briefly without SO_REUSEPORT: a port another program holds (or may not be bound) shows here. */
function probePorts(host: string, ports: number[]): NodeJS.ErrnoException | null {
  for (const port of ports) {
    if (port === 0) continue;
    try {
      const server = Bun.listen({ hostname: host, port, socket: { data() {} } });
      server.stop(true);
    } catch (error) {
      return error as NodeJS.ErrnoException;
    }
  }
  return null;
}

export type { DomainRow };
