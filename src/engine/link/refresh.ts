import type { Logger } from "../../lib/logger";
import { CloudLinkClient, LinkError } from "./client";
import type { IdentityStore } from "./identity";

/** METADATA_REFRESH_MS is how often a linked daemon re-reads the link metadata (docs/decisions.md). */
export const METADATA_REFRESH_MS = 6 * 3600_000;
/** METADATA_RETRY_MS is how soon a refresh that could not reach the cloud is tried again. */
export const METADATA_RETRY_MS = 5 * 60_000;

export interface MetadataRefresherOptions {
  identity: IdentityStore;
  log: Logger;
  periodMs?: number;
  retryMs?: number;
  /** client builds the link client for a cloud URL (tests replace it). */
  client?: (cloudUrl: string) => Pick<CloudLinkClient, "fetchMetadata">;
}

/** RefreshOutcome says what one refresh did, for logs and tests. */
export type RefreshOutcome = "not_linked" | "unchanged" | "updated" | "unsupported" | "failed";

/**
 * MetadataRefresher keeps a linked engine's hosted base domain current: it reads the link
 * metadata at start and every `periodMs` (6 h). It re-reads the identity file each time, so
 * an `engine link` or `engine unlink` run while the daemon is up takes effect at the next
 * refresh. A cloud that predates the route (404) is logged once as "refresh unsupported" and
 * the stored value kept; an unreachable cloud is a warning and a retry in `retryMs`. Nothing
 * it meets stops the daemon.
 */
export class MetadataRefresher {
  readonly #options: MetadataRefresherOptions;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #running: Promise<RefreshOutcome> | undefined;
  #abort = new AbortController();
  #stopped = false;
  #unsupportedLogged = false;

  constructor(options: MetadataRefresherOptions) {
    this.#options = options;
  }

  /** start runs the first refresh in the background and schedules the next ones. */
  start(): void {
    this.#stopped = false;
    this.#abort = new AbortController();
    this.#schedule(0);
  }

  /** stop cancels the timer and any refresh in flight; it is safe to call more than once. */
  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#abort.abort();
    await this.#running?.catch(() => undefined);
  }

  /** refreshNow refreshes at once (a SIGHUP, a test) and returns what happened; the schedule continues after it. */
  async refreshNow(): Promise<RefreshOutcome> {
    if (this.#running) return this.#running;
    this.#running = this.#refresh().finally(() => {
      this.#running = undefined;
    });
    return this.#running;
  }

  #schedule(delayMs: number): void {
    if (this.#stopped) return;
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = setTimeout(async () => {
      const outcome = await this.refreshNow();
      this.#schedule(outcome === "failed" ? (this.#options.retryMs ?? METADATA_RETRY_MS) : (this.#options.periodMs ?? METADATA_REFRESH_MS));
    }, delayMs);
    // The refresh timer alone never keeps a process alive.
    this.#timer.unref?.();
  }

  async #refresh(): Promise<RefreshOutcome> {
    const { identity: store, log } = this.#options;
    let identity: ReturnType<IdentityStore["read"]>;
    try {
      identity = store.read();
    } catch (error) {
      log.warn({ err: (error as Error).message }, "link: cannot read the node identity; metadata not refreshed");
      return "failed";
    }
    if (!identity) return "not_linked";
    const client = this.#options.client?.(identity.cloud_url) ?? new CloudLinkClient({ cloudUrl: identity.cloud_url });
    try {
      const metadata = await client.fetchMetadata(this.#abort.signal);
      if (!metadata.supported) {
        if (!this.#unsupportedLogged) {
          this.#unsupportedLogged = true;
          log.info({ cloud_url: identity.cloud_url }, "link: refresh unsupported by this cloud; keeping the stored hosted base domain");
        }
        return "unsupported";
      }
      if (metadata.hosted_base_domain === identity.hosted_base_domain && identity.metadata_refreshed_at !== null) return "unchanged";
      const updated = store.updateMetadata(identity.node_id, metadata.hosted_base_domain);
      if (updated && metadata.hosted_base_domain !== identity.hosted_base_domain) {
        log.info({ from: identity.hosted_base_domain, to: metadata.hosted_base_domain }, "link: hosted base domain changed");
        return "updated";
      }
      return "unchanged";
    } catch (error) {
      if (error instanceof LinkError && error.code === "cancelled") return "failed";
      log.warn({ cloud_url: identity.cloud_url, err: (error as Error).message }, "link: cannot refresh the link metadata; retrying later");
      return "failed";
    }
  }
}
