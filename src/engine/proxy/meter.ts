import type { RouteEntry } from "./snapshot";

/**
 * PROXY_LATENCY_BOUNDS_S are the upper bounds of the proxy's latency histogram, in seconds:
 * Prometheus's defaults, then minutes, because a model server may think that long before it
 * has answered (docs/decisions.md 335).
 */
export const PROXY_LATENCY_BOUNDS_S: readonly number[] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];

/** UNROUTED is the route label of requests no route matched (a 404 page, a redirect, a bad request). */
export const UNROUTED = "unrouted";

/**
 * RouteCounts are one proxy process's cumulative counts for one route and status class. They
 * travel to the daemon as JSON over the IPC channel, so they are plain numbers and arrays.
 */
export interface RouteCounts {
  service: string;
  route: string;
  /** code is the status class: `1xx` … `5xx`. */
  code: string;
  requests: number;
  request_bytes: number;
  response_bytes: number;
  /** latency counts requests per bucket of PROXY_LATENCY_BOUNDS_S (the last: above the last bound), not cumulatively. */
  latency: number[];
  latency_sum_s: number;
}

/** routeLabel is a route as the metrics name it: its host, and its path prefix unless that is `/`. */
export function routeLabel(route: RouteEntry): string {
  return route.pathPrefix === "/" ? route.host : `${route.host}${route.pathPrefix}`;
}

function classIndex(status: number): number {
  const index = Math.floor(status / 100);
  return index >= 1 && index <= 5 ? index : 5;
}

function emptyCounts(service: string, route: string, code: string): RouteCounts {
  return {
    service,
    route,
    code,
    requests: 0,
    request_bytes: 0,
    response_bytes: 0,
    latency: new Array(PROXY_LATENCY_BOUNDS_S.length + 1).fill(0),
    latency_sum_s: 0,
  };
}

/**
 * ProxyMeter counts what one proxy process forwarded and answered. Recording a request is a
 * few additions: the counts of a route are found through the snapshot's route object (a
 * WeakMap, so a new snapshot's routes start new lookups but keep the same counts by label).
 */
export class ProxyMeter {
  private readonly byKey = new Map<string, RouteCounts>();
  private readonly byRoute = new WeakMap<RouteEntry, (RouteCounts | undefined)[]>();

  private countsFor(route: RouteEntry | null, status: number): RouteCounts {
    const index = classIndex(status);
    let slots: (RouteCounts | undefined)[] | undefined;
    if (route) {
      slots = this.byRoute.get(route);
      const found = slots?.[index];
      if (found) return found;
    }
    const service = route?.service ?? "";
    const label = route ? routeLabel(route) : UNROUTED;
    const code = `${index}xx`;
    const key = `${service}\n${label}\n${code}`;
    let counts = this.byKey.get(key);
    if (!counts) {
      counts = emptyCounts(service, label, code);
      this.byKey.set(key, counts);
    }
    if (route) {
      if (!slots) {
        slots = [];
        this.byRoute.set(route, slots);
      }
      slots[index] = counts;
    }
    return counts;
  }

  /** record counts one answered request: its route (null: none matched), status, bytes each way and seconds taken. */
  record(route: RouteEntry | null, status: number, requestBytes: number, responseBytes: number, seconds: number): void {
    const counts = this.countsFor(route, status);
    counts.requests += 1;
    counts.request_bytes += requestBytes;
    counts.response_bytes += responseBytes;
    let bucket = 0;
    while (bucket < PROXY_LATENCY_BOUNDS_S.length && seconds > (PROXY_LATENCY_BOUNDS_S[bucket] as number)) bucket++;
    counts.latency[bucket]! += 1;
    counts.latency_sum_s += seconds;
  }

  /** report returns a copy of every count so far, for the daemon. */
  report(): RouteCounts[] {
    return [...this.byKey.values()].map((counts) => ({ ...counts, latency: [...counts.latency] }));
  }
}

/**
 * ProxyTotals keeps, in the daemon, the proxy processes' counts: each live process's latest
 * cumulative report, plus a base holding the last report of every process that ended, so the
 * totals never go down while the daemon runs (docs/decisions.md 335).
 */
export class ProxyTotals {
  private readonly base = new Map<string, RouteCounts>();
  private readonly live = new Map<number, RouteCounts[]>();

  /** update takes a process's latest report. */
  update(pid: number, counts: RouteCounts[]): void {
    this.live.set(pid, counts);
  }

  /** retire folds an ended process's last report into the base. */
  retire(pid: number): void {
    const counts = this.live.get(pid);
    this.live.delete(pid);
    if (counts) addInto(this.base, counts);
  }

  /** totals sums the base and every live process's report, one entry per service, route and class. */
  totals(): RouteCounts[] {
    const sum = new Map<string, RouteCounts>();
    addInto(sum, this.base.values());
    for (const counts of this.live.values()) addInto(sum, counts);
    return [...sum.values()];
  }
}

function addInto(into: Map<string, RouteCounts>, counts: Iterable<RouteCounts>): void {
  for (const item of counts) {
    const key = `${item.service}\n${item.route}\n${item.code}`;
    const held = into.get(key);
    if (!held) {
      into.set(key, { ...item, latency: [...item.latency] });
      continue;
    }
    held.requests += item.requests;
    held.request_bytes += item.request_bytes;
    held.response_bytes += item.response_bytes;
    held.latency_sum_s += item.latency_sum_s;
    item.latency.forEach((count, i) => {
      held.latency[i] = (held.latency[i] ?? 0) + count;
    });
  }
}
