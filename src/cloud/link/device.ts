import { randomBytes } from "node:crypto";
import { constantTimeEqual, digestSecret, randomId } from "../../lib/crypto";
import { AppError } from "../../lib/errors";
import type { AuditLog } from "../audit";
import { type Database, isUniqueViolation } from "../db";
import { type ClaimAnswer, claimAnswer, cleanReported, type NodeStore, type Reported } from "../nodes";
import { LIMITS, type RateLimiter } from "../ratelimit";
import { DEFAULT_CADENCE, PollCadence, type PollCadenceOptions } from "./cadence";
import { DeviceRequests } from "./requests";
import { formatUserCode, newUserCode, type UserCodeDigester } from "./user-code";

/** DEVICE_LIFETIME_MS is how long a device request may wait for its approval: 15 minutes (RFC 8628's example is 1800 s). */
export const DEVICE_LIFETIME_MS = 15 * 60_000;
/** USER_CODE_ATTEMPTS is each user code's budget of approve and deny decisions (RFC 8628 §5.1: a small attempt budget). */
export const USER_CODE_ATTEMPTS = 5;

/**
 * DEVICE_CODE_SHAPE is `<row id>.<secret>`: the id finds the row by primary key, and the
 * 256-bit secret (43 base64url characters) is then compared in constant time against the
 * stored digest, so no lookup ever depends on secret material.
 */
const DEVICE_CODE_SHAPE = /^(dev_[a-z0-9]{16})\.[A-Za-z0-9_-]{43}$/;

/** DevicePending is the 202 answer of a poll before the decision (RFC 8628's `authorization_pending`). */
export interface DevicePending {
  status: "authorization_pending";
  interval: number;
  expires_in: number;
}

/** PollAnswer is a poll's success: still pending (202), or the node identity once approved (200). */
export type PollAnswer = { status: 202; body: DevicePending } | { status: 200; body: ClaimAnswer };

export interface DeviceLinkDeps {
  db: Database;
  nodes: NodeStore;
  audit: AuditLog;
  site: { publicUrl: string; hostedBaseDomain: string };
  userCodes: UserCodeDigester;
  /** pollLimiter charges the poll's buckets; it must keep them in memory (see `poll`). */
  pollLimiter: RateLimiter;
  clock: () => number;
}

export interface DeviceLinkOptions {
  lifetimeMs: number;
  attempts: number;
  cadence: PollCadenceOptions;
}

export const DEFAULT_DEVICE_OPTIONS: DeviceLinkOptions = {
  lifetimeMs: DEVICE_LIFETIME_MS,
  attempts: USER_CODE_ATTEMPTS,
  cadence: DEFAULT_CADENCE,
};

/**
 * DeviceLinks is the machine's side of RFC 8628: a machine asks for a pair of codes, shows
 * the user code to a person who approves it in the console (src/cloud/approvals), and polls
 * with the device code until the answer is its node identity.
 */
export class DeviceLinks {
  readonly #cadence: PollCadence;
  readonly #requests: DeviceRequests;

  constructor(
    private readonly deps: DeviceLinkDeps,
    private readonly options: DeviceLinkOptions = DEFAULT_DEVICE_OPTIONS,
  ) {
    this.#cadence = new PollCadence(options.cadence);
    this.#requests = new DeviceRequests(deps.db);
  }

  /**
   * request writes one pending row — the digests of both codes, the cleaned reported
   * strings, the source address, the attempt budget and an expiry (every row expires, so
   * creating many only ever makes rows that go away) — and returns both plaintexts, once.
   * The audit row names the row, the source and the reported hostname, never a code.
   */
  async request(reported: Reported, source: string) {
    const clean = cleanReported(reported);
    if (!clean.hostname) throw new AppError("invalid_request", "the reported hostname is empty once control characters are removed");
    const id = randomId("dev");
    const deviceCode = `${id}.${randomBytes(32).toString("base64url")}`;
    const now = this.deps.clock();
    const expiresAt = now + this.options.lifetimeMs;
    const intervalS = this.options.cadence.initialIntervalS;
    // 20^8 user codes: a clash with a stored one is rare but possible, so draw again (a fresh transaction each time).
    for (let attempt = 0; ; attempt++) {
      const userCode = newUserCode();
      try {
        await this.deps.db.transaction(async (tx) => {
          await this.#requests.insert(tx, {
            id,
            deviceCodeDigest: digestSecret(deviceCode),
            userCodeDigest: this.deps.userCodes.digest(userCode),
            reported: clean,
            source,
            attemptsLeft: this.options.attempts,
            intervalS,
            createdAt: now,
            expiresAt,
          });
          await this.deps.audit.write(
            { accountId: null, action: "device_link.requested", subject: id, source, details: { hostname: clean.hostname } },
            tx,
          );
        });
      } catch (error) {
        if (attempt < 3 && isUniqueViolation(error)) continue;
        throw error;
      }
      const shown = formatUserCode(userCode);
      const verificationUri = `${this.deps.site.publicUrl}/link`;
      return {
        device_code: deviceCode,
        user_code: shown,
        verification_uri: verificationUri,
        verification_uri_complete: `${verificationUri}?user_code=${shown}`,
        expires_in: Math.round(this.options.lifetimeMs / 1000),
        interval: intervalS,
      };
    }
  }

  /**
   * poll answers a machine's poll in the contract's order, which is the security argument:
   *
   *  1. The rate limits are charged (per source address, and per presented string by its
   *     hash). They live in memory: a database bucket would make every poll — even a flood
   *     of invented codes — a write.
   *  2. The cadence is checked from memory only; a poll inside the interval (less the
   *     tolerance) is `slow_down` with the new interval, with no database statement and the
   *     same answer for a real or an invented code.
   *  3. Only then is the row read, by the id in the code, and the secret compared in constant
   *     time: malformed is `invalid_request`, unknown id `device_request_not_found`, wrong
   *     secret `invalid_device_credential`. Every answer that reveals the state sits behind
   *     that comparison: consumed `already_consumed`, denied `access_denied`, expired
   *     `expired_token`, pending 202, approved 200 with the node identity.
   */
  async poll(presented: string, source: string): Promise<PollAnswer> {
    const key = digestSecret(presented);
    await this.deps.pollLimiter.charge([LIMITS.pollBySource, source], [LIMITS.pollByDevice, key]);
    const cadence = this.#cadence.check(key, this.deps.clock());
    if (!cadence.allowed) {
      // RFC 8628 §3.5: slow_down adds 5 s to the interval, for this and every later poll.
      throw new AppError("slow_down", `polling too fast: wait ${cadence.intervalS} s between polls`, {
        interval: cadence.intervalS,
        retry_after_s: cadence.intervalS,
      });
    }
    const match = DEVICE_CODE_SHAPE.exec(presented);
    if (!match) throw new AppError("invalid_request", "this is not a device code");
    const row = await this.#requests.byId(match[1] as string);
    if (!row) throw new AppError("device_request_not_found", "no such device request; start linking again");
    if (!constantTimeEqual(key, row.deviceCodeDigest)) {
      throw new AppError("invalid_device_credential", "the device code is not valid");
    }
    const { state, expiresAt } = row;
    const now = this.deps.clock();
    if (state === "consumed") throw new AppError("already_consumed", "this device request has already been collected");
    if (state === "denied") throw new AppError("access_denied", "the request was denied in the console");
    if (now >= expiresAt) throw new AppError("expired_token", "the device request expired before it was collected; start again");
    if (state === "pending") {
      return {
        status: 202,
        body: {
          status: "authorization_pending",
          interval: Math.max(row.intervalS, cadence.intervalS),
          expires_in: Math.ceil((expiresAt - now) / 1000),
        },
      };
    }
    return { status: 200, body: await this.#collect(row.id, now) };
  }

  /**
   * collect hands an approved request's node identity to the machine, once: the row moves
   * approved → consumed by compare-and-set, and the node's credential is minted in the same
   * transaction, so its plaintext exists only in this answer and nothing is kept to hand out
   * later. A concurrent poll that loses the compare-and-set gets `already_consumed`.
   */
  async #collect(id: string, now: number): Promise<ClaimAnswer> {
    return this.deps.db.transaction(async (tx) => {
      const nodeId = await this.#requests.consume(tx, id, now);
      if (nodeId === null) throw new AppError("already_consumed", "this device request has already been collected");
      const enrollment = await this.deps.nodes.rotateCredential(tx, nodeId);
      return claimAnswer(enrollment, this.deps.site);
    });
  }
}
