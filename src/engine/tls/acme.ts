import { generateKeyPairSync } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { Agent } from "node:https";
import { join } from "node:path";
import { rootCertificates } from "node:tls";
import type * as acme from "acme-client";
import type { Clock } from "../../lib/clock";
import { AppError } from "../../lib/errors";
import { writePrivateFile } from "../../lib/files";

/**
 * acmeClient loads acme-client (and axios under it) on the first order, not at the daemon's
 * start: most engines never use ACME, and evaluating those modules was a tenth of a start's
 * CPU (decision 515).
 */
let acmeModule: Promise<typeof acme> | undefined;
function acmeClient(): Promise<typeof acme> {
  acmeModule ??= import("acme-client");
  return acmeModule;
}

/** AcmeLogger is the part of a pino logger the issuer writes to. It never receives keys. */
export interface AcmeLogger {
  info(obj: Record<string, unknown>, msg: string): void;
  warn(obj: Record<string, unknown>, msg: string): void;
  error(obj: Record<string, unknown>, msg: string): void;
}

/** AcmeCertificate is an issued certificate: the full chain, its private key and its validity. */
export interface AcmeCertificate {
  /** certPem is the leaf followed by the intermediates, as the CA sent them. */
  certPem: string;
  /** keyPem is the certificate's private key (PKCS #8, ECDSA P-256). */
  keyPem: string;
  notBefore: Date;
  notAfter: Date;
  /** issuer is the common name of the certificate's issuer (the CA's intermediate). */
  issuer: string;
}

/** AcmeOrderState is one domain's issuance state as status() reports it. */
export interface AcmeOrderState {
  domain: string;
  /**
   * state is "pending" while an order runs, "valid" once a certificate is held, "retrying"
   * after a failure with another attempt scheduled at next_retry_at, and "failed" after a
   * failure that retrying cannot fix (the CA refused the identifier or the account).
   */
  state: "pending" | "valid" | "failed" | "retrying";
  /** attempts counts the orders tried for the current certificate, the first one included. */
  attempts: number;
  last_error: string | null;
  next_retry_at: string | null;
  not_after: string | null;
}

/** AcmeStatus is the issuer's public status. It holds no key and no EAB secret. */
export interface AcmeStatus {
  enabled: true;
  directory_url: string;
  email: string | null;
  eab: boolean;
  account: "registered" | "none";
  orders: AcmeOrderState[];
}

export interface AcmeIssuerOptions {
  /** directoryUrl is the CA's ACME directory, e.g. https://acme-v02.api.letsencrypt.org/directory. */
  directoryUrl: string;
  /** email becomes the account's `mailto:` contact, where the CA sends expiry notices. */
  email?: string;
  /** eab is the external account binding some CAs (ZeroSSL, Google, step-ca) require. */
  eab?: { kid: string; hmacKey: string };
  /** dir holds the account key (`account.key`, mode 0600) and URL (`account.json`): `<dataDir>/pki/acme/`. */
  dir: string;
  /**
   * directoryCa is a PEM CA certificate trusted, in addition to the system roots, for HTTPS
   * to the directory: a private CA such as step-ca, or Pebble in tests. It must be given here
   * because NODE_EXTRA_CA_CERTS is read only when the process starts.
   */
  directoryCa?: string;
  log: AcmeLogger;
  clock: Clock;
  /** retry sets ensure()'s backoff: baseMs · 2^(failures−1), capped at maxMs, ±10 % jitter. */
  retry?: { baseMs: number; maxMs: number };
  /**
   * onChallenge is told of each http-01 answer before the CA is asked to check it (and of its
   * withdrawal, with null), and is awaited: the engine's proxy processes hold their own copy
   * of the answers, so the CA must not look before they all serve it.
   */
  onChallenge?: (token: string, keyAuthorization: string | null) => void | Promise<void>;
  /** onCertificate receives every certificate ensure() or renewDue() obtains. */
  onCertificate?: (domain: string, certificate: AcmeCertificate) => void | Promise<void>;
}

/** DEFAULT_ACME_RETRY is the backoff after a failed order: 30 s, doubling, at most one hour apart. */
export const DEFAULT_ACME_RETRY = { baseMs: 30_000, maxMs: 3_600_000 };

/** RENEWAL_FRACTION is how far into its lifetime a certificate is renewed (Let's Encrypt's advice: 2/3). */
export const RENEWAL_FRACTION = 2 / 3;

const JITTER = 0.1;
const DIRECTORY_TIMEOUT_MS = 15_000;
const PROBLEM_PREFIX = "urn:ietf:params:acme:error:";

/**
 * PERMANENT_PROBLEMS are the ACME problem types that the same order will meet again however
 * often it is retried; a domain that meets one is "failed" rather than "retrying".
 */
const PERMANENT_PROBLEMS = new Set(
  [
    "malformed",
    "rejectedIdentifier",
    "unsupportedIdentifier",
    "caa",
    "externalAccountRequired",
    "invalidContact",
    "unsupportedContact",
  ].map((type) => PROBLEM_PREFIX + type),
);

/**
 * POLLING is how acme-client polls an authorization or order until it leaves "pending":
 * 250 ms doubling up to 10 s, 12 times (about a minute in all). Pebble and Let's Encrypt
 * usually answer within the first second.
 */
const POLLING = { backoffAttempts: 12, backoffMin: 250, backoffMax: 10_000 };

interface AcmeProblem {
  type: string;
  detail: string;
}

interface StoredAccount {
  directory_url: string;
  url: string;
}

interface DomainEntry {
  state: AcmeOrderState;
  /** generation identifies this ensure() of the domain: a late result of a cancelled one finds no match and is dropped. */
  generation: number;
  timer?: ReturnType<typeof setTimeout>;
  /** lifetime is the validity of the certificate held now, for renewDue(). */
  lifetime?: { notBefore: Date; notAfter: Date };
}

/**
 * AcmeIssuer obtains certificates for public domains from an ACME CA (RFC 8555) with http-01
 * challenges. The engine's plain-HTTP port answers `GET /.well-known/acme-challenge/<token>`
 * with challengeResponse(token); the issuer keeps the account key on disk and everything
 * else (challenges, per-domain state, retry timers) in memory.
 */
export class AcmeIssuer {
  private readonly options: AcmeIssuerOptions;
  private readonly retry: { baseMs: number; maxMs: number };
  private readonly httpsAgent?: Agent;
  private readonly challenges = new Map<string, string>();
  private readonly inflight = new Map<string, Promise<AcmeCertificate>>();
  private readonly domains = new Map<string, DomainEntry>();
  private accountKey?: string;
  private accountUrl?: string;
  private registering?: Promise<string>;
  private nextGeneration = 1;
  private stopped = false;

  constructor(options: AcmeIssuerOptions) {
    this.options = options;
    this.retry = options.retry ?? DEFAULT_ACME_RETRY;
    // acme-client sends every request through one process-wide axios instance; a per-request
    // agent trusts the extra CA for this issuer only, not for every user of the library.
    if (options.directoryCa) this.httpsAgent = new Agent({ ca: [...rootCertificates, options.directoryCa], keepAlive: true });
    const stored = this.readStoredAccount();
    if (stored) this.accountUrl = stored.url;
  }

  /**
   * challengeResponse returns the key authorization for an http-01 token while its order
   * runs, and undefined otherwise. The HTTP port answers it as `text/plain`.
   */
  challengeResponse(token: string): string | undefined {
    return this.challenges.get(token);
  }

  /**
   * issue obtains a certificate for `domain`: it registers the account on first use (accepting
   * the CA's terms of service), orders, satisfies each http-01 challenge, finalizes with a CSR
   * for a fresh ECDSA P-256 key and downloads the chain. Concurrent calls for one domain share
   * one order. It fails with AppError "acme_failed" whose message carries the CA's problem type
   * and detail. It does not touch ensure()'s state or call onCertificate.
   */
  issue(domain: string): Promise<AcmeCertificate> {
    const name = normalizeDomain(domain);
    const running = this.inflight.get(name);
    if (running) return running;
    const order = this.runOrder(name).finally(() => this.inflight.delete(name));
    this.inflight.set(name, order);
    return order;
  }

  /**
   * ensure keeps a certificate for `domain`: it starts an order now unless the domain is
   * already tracked (a "failed" domain is tried afresh), and after a failure schedules the
   * next one with exponential backoff. `current` is a certificate the caller already holds
   * (loaded from disk at start-up); while it is not due for renewal no order is made.
   */
  ensure(domain: string, current?: { notBefore: Date; notAfter: Date }): void {
    const name = normalizeDomain(domain);
    const existing = this.domains.get(name);
    if (existing && existing.state.state !== "failed") return;
    if (existing) this.clearTimer(existing);
    const entry: DomainEntry = {
      generation: this.nextGeneration++,
      state: { domain: name, state: "pending", attempts: 0, last_error: null, next_retry_at: null, not_after: null },
    };
    this.domains.set(name, entry);
    if (current) {
      entry.lifetime = { notBefore: current.notBefore, notAfter: current.notAfter };
      entry.state.state = "valid";
      entry.state.not_after = current.notAfter.toISOString();
      if (!isDue(entry.lifetime, this.options.clock.now())) return;
    }
    void this.attempt(name, entry.generation);
  }

  /**
   * renewDue starts a new order for every domain whose certificate is past 2/3 of its
   * lifetime at `now`, and returns those domains. The certificate held stays in use (and in
   * not_after) until the new one arrives.
   */
  renewDue(now: Date = this.options.clock.now()): string[] {
    const due: string[] = [];
    for (const [name, entry] of this.domains) {
      if (entry.state.state !== "valid" || !entry.lifetime || !isDue(entry.lifetime, now)) continue;
      entry.state.attempts = 0;
      due.push(name);
      void this.attempt(name, entry.generation);
    }
    return due;
  }

  /**
   * cancel forgets `domain`: its retry timer stops and the result of an order still running
   * is dropped. It returns whether the domain was tracked.
   */
  cancel(domain: string): boolean {
    const name = normalizeDomain(domain);
    const entry = this.domains.get(name);
    if (!entry) return false;
    this.clearTimer(entry);
    this.domains.delete(name);
    return true;
  }

  /** state returns one domain's issuance state, or undefined when ensure() never saw it. */
  state(domain: string): AcmeOrderState | undefined {
    const entry = this.domains.get(normalizeDomain(domain));
    return entry ? { ...entry.state } : undefined;
  }

  /** status returns the issuer's configuration and every tracked domain; never a key or the EAB secret. */
  status(): AcmeStatus {
    return {
      enabled: true,
      directory_url: this.options.directoryUrl,
      email: this.options.email ?? null,
      eab: this.options.eab !== undefined,
      account: this.accountUrl ? "registered" : "none",
      orders: [...this.domains.values()].map((entry) => ({ ...entry.state })).sort((a, b) => a.domain.localeCompare(b.domain)),
    };
  }

  /**
   * stop cancels every retry timer and drops the results of orders still running. Orders in
   * flight are not aborted (acme-client cannot), they end on their own.
   */
  stop(): void {
    this.stopped = true;
    for (const entry of this.domains.values()) this.clearTimer(entry);
    this.httpsAgent?.destroy();
  }

  private async attempt(name: string, generation: number): Promise<void> {
    const current = (): DomainEntry | undefined => {
      const entry = this.domains.get(name);
      return !this.stopped && entry?.generation === generation ? entry : undefined;
    };
    const entry = current();
    if (!entry) return;
    entry.timer = undefined;
    entry.state.state = "pending";
    entry.state.attempts += 1;
    entry.state.next_retry_at = null;
    let certificate: AcmeCertificate;
    try {
      certificate = await this.issue(name);
    } catch (error) {
      const after = current();
      if (!after) return;
      const message = error instanceof Error ? error.message : String(error);
      after.state.last_error = message;
      const problemType = error instanceof AppError ? error.details?.problem_type : undefined;
      if (typeof problemType === "string" && PERMANENT_PROBLEMS.has(problemType)) {
        after.state.state = "failed";
        this.options.log.error({ domain: name, attempts: after.state.attempts, error: message }, "acme: certificate order failed");
        return;
      }
      const delayMs = this.backoffMs(after.state.attempts);
      after.state.state = "retrying";
      after.state.next_retry_at = new Date(this.options.clock.now().getTime() + delayMs).toISOString();
      after.timer = setTimeout(() => void this.attempt(name, generation), delayMs);
      after.timer.unref?.();
      this.options.log.warn(
        { domain: name, attempts: after.state.attempts, error: message, next_retry_at: after.state.next_retry_at },
        "acme: certificate order failed, will retry",
      );
      return;
    }
    const after = current();
    if (!after) return;
    after.lifetime = { notBefore: certificate.notBefore, notAfter: certificate.notAfter };
    after.state.state = "valid";
    after.state.last_error = null;
    after.state.not_after = certificate.notAfter.toISOString();
    this.options.log.info(
      { domain: name, attempts: after.state.attempts, issuer: certificate.issuer, not_after: after.state.not_after },
      "acme: certificate issued",
    );
    try {
      await this.options.onCertificate?.(name, certificate);
    } catch (error) {
      this.options.log.error({ domain: name, error: (error as Error).message }, "acme: storing the certificate failed");
    }
  }

  /** backoffMs is the delay before attempt `failures + 1`: base · 2^(failures−1), capped, ±10 %. */
  private backoffMs(failures: number): number {
    const exponential = Math.min(this.retry.maxMs, this.retry.baseMs * 2 ** Math.max(0, failures - 1));
    return Math.round(exponential * (1 + JITTER * (2 * Math.random() - 1)));
  }

  private clearTimer(entry: DomainEntry): void {
    if (entry.timer) clearTimeout(entry.timer);
    entry.timer = undefined;
  }

  private async runOrder(domain: string): Promise<AcmeCertificate> {
    await this.checkDirectory();
    const { client, problem } = await this.accountClient();
    let order: acme.Order;
    try {
      order = await client.createOrder({ identifiers: [{ type: "dns", value: domain }] });
    } catch (error) {
      // The CA forgot the account (a reset staging CA, a deactivated account): register the
      // same key again once and repeat the order.
      if (problem.last?.type !== `${PROBLEM_PREFIX}accountDoesNotExist`) throw acmeFailed(domain, "order", error, problem.last);
      this.options.log.warn({ domain }, "acme: the CA does not know the stored account, registering again");
      this.accountUrl = undefined;
      const again = await this.accountClient();
      try {
        order = await again.client.createOrder({ identifiers: [{ type: "dns", value: domain }] });
      } catch (retryError) {
        throw acmeFailed(domain, "order", retryError, again.problem.last);
      }
      return this.completeOrder(domain, again.client, again.problem, order);
    }
    return this.completeOrder(domain, client, problem, order);
  }

  private async completeOrder(
    domain: string,
    client: acme.Client,
    problem: { last?: AcmeProblem },
    order: acme.Order,
  ): Promise<AcmeCertificate> {
    const tokens: string[] = [];
    try {
      const authorizations = await client.getAuthorizations(order);
      for (const authorization of authorizations) {
        if (authorization.status === "valid") continue;
        const challenge = authorization.challenges.find((candidate) => candidate.type === "http-01");
        if (!challenge) {
          const offered = authorization.challenges.map((candidate) => candidate.type).join(", ");
          throw new AppError("acme_failed", `the CA offered no http-01 challenge for ${domain} (offered: ${offered || "none"})`, {
            domain,
            stage: "challenge",
          });
        }
        const keyAuthorization = await client.getChallengeKeyAuthorization(challenge);
        this.challenges.set(challenge.token, keyAuthorization);
        tokens.push(challenge.token);
        await this.options.onChallenge?.(challenge.token, keyAuthorization);
        await client.completeChallenge(challenge);
        try {
          await client.waitForValidStatus(authorization);
        } catch (error) {
          throw await this.challengeFailure(domain, client, authorization, error, problem.last);
        }
      }
      const keyPem = generateKeyPairSync("ec", { namedCurve: "prime256v1" }).privateKey.export({ type: "pkcs8", format: "pem" }).toString();
      const { crypto } = await acmeClient();
      const [, csr] = await crypto.createCsr({ commonName: domain, altNames: [domain] }, keyPem);
      const finalized = await client.finalizeOrder(order, csr);
      const certPem = await client.getCertificate(finalized);
      const info = crypto.readCertificateInfo(certPem);
      return { certPem, keyPem, notBefore: info.notBefore, notAfter: info.notAfter, issuer: info.issuer.commonName ?? "" };
    } catch (error) {
      if (error instanceof AppError) throw error;
      throw acmeFailed(domain, "order", error, problem.last);
    } finally {
      for (const token of tokens) {
        this.challenges.delete(token);
        await Promise.resolve(this.options.onChallenge?.(token, null)).catch(() => undefined);
      }
    }
  }

  /**
   * checkDirectory fetches the directory before an order, so an unreachable or untrusted CA
   * fails at once with the network's reason. acme-client would retry such a request five
   * times over 75 s and then lose the cause (its retry interceptor throws a TypeError about
   * `response.config`).
   */
  private async checkDirectory(): Promise<void> {
    const url = this.options.directoryUrl;
    let response: Response;
    try {
      response = await fetch(url, {
        signal: AbortSignal.timeout(DIRECTORY_TIMEOUT_MS),
        ...(this.options.directoryCa ? { tls: { ca: [...rootCertificates, this.options.directoryCa] } } : {}),
      });
    } catch (error) {
      throw new AppError("acme_failed", `cannot reach the ACME directory ${url}: ${(error as Error).message}`, { stage: "directory" });
    }
    await response.body?.cancel();
    if (!response.ok)
      throw new AppError("acme_failed", `the ACME directory ${url} answered HTTP ${response.status}`, { stage: "directory" });
  }

  /** challengeFailure reads the failed authorization back to report what the CA's validation saw. */
  private async challengeFailure(
    domain: string,
    client: acme.Client,
    authorization: acme.Authorization,
    error: unknown,
    last: AcmeProblem | undefined,
  ): Promise<AppError> {
    try {
      const [current] = await client.getAuthorizations({ authorizations: [authorization.url] } as acme.Order);
      const failed = current?.challenges.find((candidate) => candidate.type === "http-01" && candidate.error);
      const reason = failed?.error as { type?: string; detail?: string } | undefined;
      if (reason?.type) return acmeFailed(domain, "challenge", error, { type: reason.type, detail: reason.detail ?? "" });
    } catch {
      // Fall back to what the poll itself said.
    }
    return acmeFailed(domain, "challenge", error, last);
  }

  /**
   * accountClient returns a client signed in as the account, registering it first when this
   * directory has no account URL on disk. Each order gets its own client, so the problem it
   * records belongs to that order alone.
   */
  private async accountClient(): Promise<{ client: acme.Client; problem: { last?: AcmeProblem } }> {
    const accountUrl = this.accountUrl ?? (await this.register());
    return this.client(accountUrl);
  }

  private register(): Promise<string> {
    this.registering ??= this.createAccount().finally(() => {
      this.registering = undefined;
    });
    return this.registering;
  }

  private async createAccount(): Promise<string> {
    const { client, problem } = await this.client();
    try {
      await client.createAccount({
        termsOfServiceAgreed: true,
        ...(this.options.email ? { contact: [`mailto:${this.options.email}`] } : {}),
      });
    } catch (error) {
      throw acmeFailed(undefined, "account", error, problem.last);
    }
    const url = client.getAccountUrl();
    writePrivateFile(join(this.options.dir, "account.json"), `${JSON.stringify({ directory_url: this.options.directoryUrl, url })}\n`);
    this.accountUrl = url;
    this.options.log.info({ directory_url: this.options.directoryUrl, account_url: url }, "acme: account registered");
    return url;
  }

  private async client(accountUrl?: string): Promise<{ client: acme.Client; problem: { last?: AcmeProblem } }> {
    const { Client } = await acmeClient();
    const client = new Client({
      directoryUrl: this.options.directoryUrl,
      accountKey: this.loadAccountKey(),
      ...(accountUrl ? { accountUrl } : {}),
      ...(this.options.eab ? { externalAccountBinding: this.options.eab } : {}),
      ...POLLING,
    });
    const problem: { last?: AcmeProblem } = {};
    // acme-client turns a problem document into an Error with its detail alone; the wrapper
    // keeps the last one's type (rejectedIdentifier, unauthorized, ...) so errors can name it,
    // and adds the agent that trusts directoryCa. `http.request` is acme-client 5.x's one
    // entry point for HTTP (src/http.js).
    const http = (client as unknown as { http: { request: HttpRequest } }).http;
    const request = http.request.bind(http);
    const httpsAgent = this.httpsAgent;
    http.request = async (url, method, requestOptions = {}) => {
      problem.last = undefined;
      let response: Awaited<ReturnType<HttpRequest>>;
      try {
        response = await request(url, method, httpsAgent ? { ...requestOptions, httpsAgent } : requestOptions);
      } catch {
        // acme-client answers every HTTP status; a throw here is a network failure after its
        // retries, whose own message is an unrelated TypeError (see checkDirectory).
        throw new Error(`no answer from the CA to ${method.toUpperCase()} ${url}`);
      }
      const data = response.data as { type?: unknown; detail?: unknown } | undefined;
      if (response.status >= 400 && typeof data?.type === "string") {
        problem.last = { type: data.type, detail: typeof data.detail === "string" ? data.detail : "" };
      }
      return response;
    };
    return { client, problem };
  }

  /** loadAccountKey reads the account key, creating an ECDSA P-256 key (mode 0600) on first use. */
  private loadAccountKey(): string {
    if (this.accountKey) return this.accountKey;
    const path = join(this.options.dir, "account.key");
    if (existsSync(path)) {
      this.accountKey = readFileSync(path, "utf8");
    } else {
      this.accountKey = generateKeyPairSync("ec", { namedCurve: "prime256v1" })
        .privateKey.export({ type: "pkcs8", format: "pem" })
        .toString();
      writePrivateFile(path, this.accountKey);
    }
    return this.accountKey;
  }

  /** readStoredAccount returns the account URL on disk when it belongs to this directory. */
  private readStoredAccount(): StoredAccount | undefined {
    const path = join(this.options.dir, "account.json");
    if (!existsSync(path) || !existsSync(join(this.options.dir, "account.key"))) return undefined;
    try {
      const stored = JSON.parse(readFileSync(path, "utf8")) as Partial<StoredAccount>;
      if (stored.directory_url === this.options.directoryUrl && typeof stored.url === "string") {
        return { directory_url: stored.directory_url, url: stored.url };
      }
    } catch (error) {
      this.options.log.warn({ path, error: (error as Error).message }, "acme: ignoring an unreadable account file");
    }
    return undefined;
  }
}

type HttpRequest = (
  url: string,
  method: string,
  options?: Record<string, unknown>,
) => Promise<{ status: number; data: unknown; headers: Record<string, string> }>;

/** normalizeDomain lower-cases a domain and trims spaces; the CA judges everything else. */
function normalizeDomain(domain: string): string {
  return domain.trim().toLowerCase();
}

/** isDue reports whether a certificate is past RENEWAL_FRACTION of its lifetime at `now`. */
function isDue(lifetime: { notBefore: Date; notAfter: Date }, now: Date): boolean {
  const start = lifetime.notBefore.getTime();
  return now.getTime() >= start + (lifetime.notAfter.getTime() - start) * RENEWAL_FRACTION;
}

/** STAGES names each step of an order in acme_failed messages. */
const STAGES = {
  account: "the CA refused the account",
  order: "the certificate order for",
  challenge: "the http-01 challenge for",
} as const;

/**
 * acmeFailed wraps what the CA said in AppError "acme_failed". The message names the short
 * problem type and the CA's detail ("malformed: Order included a DNS identifier with an IP
 * address value"), because that is what a user needs to fix a domain or an account.
 */
function acmeFailed(domain: string | undefined, stage: keyof typeof STAGES, error: unknown, problem?: AcmeProblem): AppError {
  const said = problem
    ? `${problem.type.startsWith(PROBLEM_PREFIX) ? problem.type.slice(PROBLEM_PREFIX.length) : problem.type}: ${problem.detail.trim()}`
    : error instanceof Error
      ? error.message.trim()
      : String(error);
  const subject = stage === "account" ? STAGES.account : `${STAGES[stage]} ${domain} failed`;
  return new AppError("acme_failed", `${subject}: ${said}`, {
    ...(domain ? { domain } : {}),
    stage,
    ...(problem ? { problem_type: problem.type } : {}),
  });
}
