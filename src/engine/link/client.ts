import { arch, hostname, platform, release } from "node:os";
import type { Static, TSchema } from "@sinclair/typebox";
import { Value } from "@sinclair/typebox/value";
import { DeviceLinkResponse, DevicePollPending, ErrorEnvelope, LinkClaimResponse, LinkMetadataView } from "../../contract/cloud";
import { VERSION } from "../../lib/version";

export type { DeviceLinkResponse, LinkClaimResponse } from "../../contract/cloud";

/** DEFAULT_CLOUD_URL is where `engine link` goes without --cloud, ENGINE_CLOUD_URL or a stored identity (docs/decisions.md). */
export const DEFAULT_CLOUD_URL = "http://127.0.0.1:8787";

/** DEFAULT_REQUEST_TIMEOUT_MS bounds one request to the cloud; a poll loop survives a timed-out request. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 15_000;

/** SLOW_DOWN_STEP_S is what a `slow_down` adds to the polling interval when the cloud names none (RFC 8628 §3.5: +5 s). */
const SLOW_DOWN_STEP_S = 5;
/** MAX_RETRY_DELAY_MS caps the backoff between attempts while the cloud is unreachable. */
const MAX_RETRY_DELAY_MS = 30_000;

/** ReportedMachine is what the engine tells the cloud about itself; the cloud shows it to the approver as unverified. */
export interface ReportedMachine {
  hostname: string;
  os: string;
  version: string;
}

/** reportedMachine describes this machine: its host name, `<platform> <release> <arch>`, and the engine's version. */
export function reportedMachine(): ReportedMachine {
  return { hostname: hostname(), os: `${platform()} ${release()} ${arch()}`, version: VERSION };
}

/**
 * LinkError is a failed link operation. Its code is the cloud's own error code where the
 * cloud answered one (`access_denied`, `expired_token`, `already_consumed`, `link_code_used`,
 * ...), or one of the client's: `cloud_unreachable` (no answer, or a timeout),
 * `invalid_answer` (an answer outside the contract), `cancelled` (the caller's signal),
 * `invalid_cloud_url`.
 */
export class LinkError extends Error {
  constructor(
    readonly code: string,
    message: string,
    /** status is the cloud's HTTP status, when it answered. */
    readonly status?: number,
  ) {
    super(message);
    this.name = "LinkError";
  }
}

/** PollEvent is what a device poll loop reports while it waits, for a spinner or JSON lines. */
export type PollEvent =
  | { event: "pending"; interval: number; expires_in: number }
  | { event: "slow_down"; interval: number }
  | { event: "rate_limited"; retry_after: number }
  | { event: "retrying"; delay_s: number; reason: string };

export interface PollOptions {
  /** signal stops the loop (Ctrl-C): it then throws LinkError `cancelled`. */
  signal?: AbortSignal;
  onEvent?: (event: PollEvent) => void;
}

/** MetadataAnswer is the cloud's link metadata, or `supported: false` from a cloud that predates the route. */
export type MetadataAnswer = { supported: true; hosted_base_domain: string } | { supported: false };

export interface CloudLinkClientOptions {
  /** cloudUrl is the console's base URL (the API is under `/api`). */
  cloudUrl: string;
  timeoutMs?: number;
  /** sleep and now replace the timers (tests). */
  sleep?: (ms: number, signal?: AbortSignal) => Promise<void>;
  now?: () => number;
}

interface Answer {
  status: number;
  body: unknown;
  headers: Headers;
}

/** normalizeCloudUrl checks that `raw` is an absolute http(s) URL and drops a trailing slash. */
export function normalizeCloudUrl(raw: string): string {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new LinkError("invalid_cloud_url", `the cloud URL ${JSON.stringify(raw)} is not an absolute http(s) URL`);
  }
  if ((url.protocol !== "http:" && url.protocol !== "https:") || url.search || url.hash || url.username || url.password) {
    throw new LinkError(
      "invalid_cloud_url",
      `the cloud URL ${JSON.stringify(raw)} must be http(s)://host[:port][/path], with nothing else`,
    );
  }
  return url.href.replace(/\/+$/, "");
}

/** abortableSleep waits `ms`, or rejects with LinkError `cancelled` as soon as `signal` aborts. */
export function abortableSleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(cancelled());
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(cancelled());
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

const cancelled = () => new LinkError("cancelled", "cancelled");

/** retryAfterSeconds reads a Retry-After header: delta-seconds or an HTTP date (RFC 9110 §10.2.3). */
function retryAfterSeconds(headers: Headers, now: number): number | undefined {
  const raw = headers.get("retry-after")?.trim();
  if (!raw) return undefined;
  if (/^\d+$/.test(raw)) return Number(raw);
  const date = Date.parse(raw);
  return Number.isNaN(date) ? undefined : Math.max(0, Math.ceil((date - now) / 1000));
}

/** MESSAGES are the client's own words for the outcomes a user must act on; others keep the cloud's message. */
const MESSAGES: Record<string, string> = {
  access_denied: "the link request was denied in the console",
  expired_token: "the link request expired before it was approved; run `engine link` again for a new code",
  already_consumed: "this link request was already used to link a machine; run `engine link` again for a new code",
};

/**
 * CloudLinkClient speaks the cloud console's linking routes (RFC 8628 names) with Bun's
 * `fetch` and a timeout on every request: the device flow (`startDevice`, `pollDevice`), a
 * link code (`claimCode`), a pre-authorized key (`enrollWithKey`) and the link metadata
 * (`fetchMetadata`). Every answer is checked against the shared contract schemas, so a cloud
 * that drifts is reported as `invalid_answer`, never half-read.
 */
export class CloudLinkClient {
  readonly cloudUrl: string;
  readonly #timeoutMs: number;
  readonly #sleep: (ms: number, signal?: AbortSignal) => Promise<void>;
  readonly #now: () => number;

  constructor(options: CloudLinkClientOptions) {
    this.cloudUrl = normalizeCloudUrl(options.cloudUrl);
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
    this.#sleep = options.sleep ?? abortableSleep;
    this.#now = options.now ?? Date.now;
  }

  /** startDevice asks the cloud for a device link request: a user code to show and a device code to poll with. */
  async startDevice(machine: ReportedMachine, signal?: AbortSignal): Promise<DeviceLinkResponse> {
    const answer = await this.#send("POST", "/api/link/device", machine, signal);
    if (answer.status !== 201 && answer.status !== 200) throw this.#failure(answer);
    return this.#expect(DeviceLinkResponse, answer, "a device link response");
  }

  /**
   * pollDevice polls until the request is approved and returns the node identity. It waits
   * `interval` seconds between polls (the cloud's latest value), adds 5 s on `slow_down` or
   * takes the interval the cloud names (RFC 8628 §3.5), waits out Retry-After on
   * `rate_limited`, and retries an unreachable cloud or a 5xx with backoff until the
   * request's lifetime has passed. It throws LinkError on `access_denied`, `expired_token`,
   * `already_consumed` (and any other refusal), and `cancelled` when `signal` aborts.
   */
  async pollDevice(device: DeviceLinkResponse, options: PollOptions = {}): Promise<LinkClaimResponse> {
    const { signal, onEvent } = options;
    const deadline = this.#now() + device.expires_in * 1000;
    let intervalS = Math.max(0, device.interval);
    let waitMs = intervalS * 1000;
    let failures = 0;
    let lastFailure = "";
    let pastDeadline = false;
    for (;;) {
      // One poll is still sent at the deadline, so an approval in the last seconds is not lost.
      await this.#sleep(Math.max(0, Math.min(waitMs, deadline - this.#now())), signal);
      if (this.#now() >= deadline) {
        if (pastDeadline) break;
        pastDeadline = true;
      }
      let answer: Answer;
      try {
        answer = await this.#send("POST", "/api/link/device/poll", { device_code: device.device_code }, signal);
      } catch (error) {
        if (!(error instanceof LinkError) || error.code !== "cloud_unreachable") throw error;
        answer = { status: 0, body: null, headers: new Headers() };
        lastFailure = error.message;
      }
      if (answer.status === 0 || answer.status >= 500) {
        // A cloud that is restarting or unreachable is waited for, with backoff, until the request expires.
        if (answer.status >= 500) lastFailure = `the cloud answered ${answer.status}`;
        if (pastDeadline) {
          throw new LinkError("cloud_unreachable", `${lastFailure}; the link request expired while retrying`, answer.status || undefined);
        }
        failures += 1;
        waitMs = Math.max(intervalS * 1000, Math.min(1000 * 2 ** (failures - 1), MAX_RETRY_DELAY_MS));
        onEvent?.({ event: "retrying", delay_s: Math.ceil(waitMs / 1000), reason: lastFailure });
        continue;
      }
      failures = 0;
      if (answer.status === 200) return this.#expect(LinkClaimResponse, answer, "a node identity (LinkClaimResponse)");
      if (answer.status === 202) {
        const pending = this.#expect(DevicePollPending, answer, "a pending poll answer");
        intervalS = Math.max(0, pending.interval);
        waitMs = intervalS * 1000;
        onEvent?.({ event: "pending", interval: pending.interval, expires_in: pending.expires_in });
        continue;
      }
      const code = errorCode(answer.body);
      if (answer.status === 429 && code === "slow_down") {
        const named = Value.Check(ErrorEnvelope, answer.body) ? answer.body.error.interval : undefined;
        intervalS = named !== undefined && named > intervalS ? named : intervalS + SLOW_DOWN_STEP_S;
        waitMs = intervalS * 1000;
        onEvent?.({ event: "slow_down", interval: intervalS });
        continue;
      }
      if (answer.status === 429) {
        const retryAfter = retryAfterSeconds(answer.headers, this.#now()) ?? intervalS + SLOW_DOWN_STEP_S;
        waitMs = Math.max(intervalS, retryAfter) * 1000;
        onEvent?.({ event: "rate_limited", retry_after: retryAfter });
        continue;
      }
      throw this.#failure(answer);
    }
    throw new LinkError("expired_token", MESSAGES.expired_token ?? "expired");
  }

  /** claimCode exchanges a link code (`NL-...`) for the node identity; a code releases it once. */
  async claimCode(code: string, machine: ReportedMachine, signal?: AbortSignal): Promise<LinkClaimResponse> {
    const answer = await this.#send("POST", "/api/link/claim", { code, ...machine }, signal);
    if (answer.status !== 200) throw this.#failure(answer);
    return this.#expect(LinkClaimResponse, answer, "a node identity (LinkClaimResponse)");
  }

  /** enrollWithKey enrolls this machine with a pre-authorized link key and returns the node identity. */
  async enrollWithKey(key: string, machine: ReportedMachine, signal?: AbortSignal): Promise<LinkClaimResponse> {
    const answer = await this.#send("POST", "/api/link/preauth", { key, ...machine }, signal);
    if (answer.status !== 200) throw this.#failure(answer);
    return this.#expect(LinkClaimResponse, answer, "a node identity (LinkClaimResponse)");
  }

  /**
   * fetchMetadata reads the link metadata (the hosted base domain). A cloud that predates the
   * route answers 404, which is `supported: false`, never an error (contract, Versioning 2).
   */
  async fetchMetadata(signal?: AbortSignal): Promise<MetadataAnswer> {
    const answer = await this.#send("GET", "/api/link/metadata", undefined, signal);
    if (answer.status === 404) return { supported: false };
    if (answer.status !== 200) throw this.#failure(answer);
    const view = this.#expect(LinkMetadataView, answer, "link metadata");
    return { supported: true, hosted_base_domain: view.hosted_base_domain };
  }

  async #send(method: string, path: string, body: unknown, signal?: AbortSignal): Promise<Answer> {
    if (signal?.aborted) throw cancelled();
    const timeout = AbortSignal.timeout(this.#timeoutMs);
    const url = `${this.cloudUrl}${path}`;
    let response: Response;
    let text: string;
    try {
      response = await fetch(url, {
        method,
        headers: {
          accept: "application/json",
          "user-agent": `engine/${VERSION}`,
          ...(body === undefined ? {} : { "content-type": "application/json" }),
        },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: signal ? AbortSignal.any([signal, timeout]) : timeout,
        redirect: "error",
      });
      text = await response.text();
    } catch (error) {
      if (signal?.aborted) throw cancelled();
      const reason = timeout.aborted ? `no answer within ${Math.round(this.#timeoutMs / 1000)} s` : (error as Error).message;
      throw new LinkError("cloud_unreachable", `cannot reach the cloud at ${this.cloudUrl} (${reason})`);
    }
    let parsed: unknown = null;
    if (text.length > 0) {
      try {
        parsed = JSON.parse(text);
      } catch {
        parsed = text;
      }
    }
    return { status: response.status, body: parsed, headers: response.headers };
  }

  #expect<T extends TSchema>(schema: T, answer: Answer, what: string): Static<T> {
    if (Value.Check(schema, answer.body)) return answer.body;
    throw new LinkError("invalid_answer", `the cloud at ${this.cloudUrl} answered ${answer.status} without ${what}`, answer.status);
  }

  #failure(answer: Answer): LinkError {
    if (Value.Check(ErrorEnvelope, answer.body)) {
      const { code, message } = answer.body.error;
      const retryAfter = answer.status === 429 ? retryAfterSeconds(answer.headers, this.#now()) : undefined;
      const text = MESSAGES[code] ?? (retryAfter !== undefined ? `${message} (retry in ${retryAfter} s)` : message);
      return new LinkError(code, text, answer.status);
    }
    if (answer.status === 422) return new LinkError("invalid_request", "the cloud refused the request as invalid (422)", 422);
    return new LinkError(
      "invalid_answer",
      `the cloud at ${this.cloudUrl} answered ${answer.status} without an error envelope`,
      answer.status,
    );
  }
}

function errorCode(body: unknown): string | undefined {
  return Value.Check(ErrorEnvelope, body) ? body.error.code : undefined;
}
