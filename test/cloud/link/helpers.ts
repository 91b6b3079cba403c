import { approvalRoutes } from "../../../src/cloud/approvals";
import type { Dialect } from "../../../src/cloud/db";
import { type LinkOptions, linkRoutes } from "../../../src/cloud/link";
import { MemoryBuckets, RateLimiter } from "../../../src/cloud/ratelimit";
import { startTestCloud, type TestCloud } from "../helpers";

/** ManualClock is time that moves only when a test moves it: expiries, the poll cadence and the poll's buckets read it. */
export class ManualClock {
  #now = Date.now();
  readonly read = (): number => this.#now;
  advance(ms: number): void {
    this.#now += ms;
  }
}

/** LinkTestCloud is a console serving the link and approval routes on one manual clock. */
export interface LinkTestCloud {
  cloud: TestCloud;
  clock: ManualClock;
  /** source returns a fresh client address (X-Forwarded-For from the test's loopback peer, a trusted proxy), so tests do not share rate-limit buckets. */
  source(): string;
  /** from is the header that makes a request come from `address`. */
  from(address: string): Record<string, string>;
  /** requestDevice starts a device link from a fresh address and returns its 201 body. */
  // biome-ignore lint/suspicious/noExplicitAny: tests read whichever fields they assert on.
  requestDevice(reported?: Partial<{ hostname: string; os: string; version: string }>): Promise<any>;
  /** poll polls a device code from `address` (a fresh one by default). */
  // biome-ignore lint/suspicious/noExplicitAny: as above.
  poll(deviceCode: string, address?: string): Promise<{ status: number; body: any; headers: Headers }>;
}

let counter = 0;

/** startLinkCloud starts a test console with only the link and approval modules, on a manual clock. */
export async function startLinkCloud(dialect: Dialect, options: Omit<LinkOptions, "clock" | "pollLimiter"> = {}): Promise<LinkTestCloud> {
  const clock = new ManualClock();
  // The poll's in-memory buckets refill on the manual clock, so a test decides when a token returns.
  const pollLimiter = new RateLimiter(new MemoryBuckets(), clock.read);
  const cloud = await startTestCloud(
    dialect,
    { trustedProxies: "127.0.0.1" },
    {
      modules: [
        (deps) => linkRoutes(deps, { ...options, clock: clock.read, pollLimiter }),
        (deps) => approvalRoutes(deps, { clock: clock.read }),
      ],
    },
  );
  const source = () => {
    counter += 1;
    return `10.${(counter >> 16) & 255}.${(counter >> 8) & 255}.${counter & 255}`;
  };
  const from = (address: string) => ({ "x-forwarded-for": address });
  return {
    cloud,
    clock,
    source,
    from,
    async requestDevice(reported = {}) {
      const answer = await cloud.api("POST", "/api/link/device", {
        body: { hostname: "gpu-box", os: "linux", version: "0.6.0", ...reported },
        headers: from(source()),
      });
      if (answer.status !== 201) throw new Error(`device request answered ${answer.status}: ${JSON.stringify(answer.body)}`);
      return answer.body;
    },
    poll(deviceCode, address = source()) {
      return cloud.api("POST", "/api/link/device/poll", { body: { device_code: deviceCode }, headers: from(address) });
    },
  };
}
