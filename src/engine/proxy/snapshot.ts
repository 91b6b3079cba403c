import type { RouteCounts } from "./meter";

/**
 * The proxy processes hold no state of their own: the daemon sends each of them a
 * ProxySnapshot (routes, certificates, ACME challenges) whenever something changes, so a
 * respawned or restarted process serves exactly what the daemon decided.
 */

/** RouteState is what the proxy does with a request for the route. */
export type RouteState = "up" | "starting" | "down";

export interface RouteEntry {
  host: string;
  /** pathPrefix is "/" or a prefix like "/api"; the longest matching prefix wins. */
  pathPrefix: string;
  service: string;
  /** upstream is `http://127.0.0.1:<port>`. */
  upstream: string;
  state: RouteState;
  /** status is the service's status, shown on the 502/503 page. */
  status: string;
  retryAfterS: number;
}

export interface SnapshotCertificate {
  serverName: string;
  cert: string;
  key: string;
}

export interface ProxySnapshot {
  /** generation increases with every snapshot; a process ignores older ones. */
  generation: number;
  routes: RouteEntry[];
  certificates: SnapshotCertificate[];
  /** challenges maps ACME http-01 tokens to key authorizations. */
  challenges: Record<string, string>;
}

/** ListenerConfig is what a proxy process needs to bind. */
export interface ListenerConfig {
  host: string;
  httpsPort: number;
  httpPort: number;
  maxBodyBytes: number;
  /** stateDir holds the process's pid file, so a restarted daemon finds and retires it. */
  stateDir: string;
  /**
   * steer makes the process, the first of a generation that retires another, take every new
   * connection on its ports until told `unsteer` (listener.ts, decision 443).
   */
  steer?: boolean;
}

/** Messages from the daemon to a proxy process. */
export type ToProxy =
  /** start binds and serves; `cpu` is the CPU to pin the process's event loop to (null or absent: none). */
  | { type: "start"; config: ListenerConfig; snapshot: ProxySnapshot; cpu?: number | null }
  | { type: "snapshot"; snapshot: ProxySnapshot }
  /** unsteer spreads the ports' new connections by hash again, once the retired generation is gone. */
  | { type: "unsteer" }
  | { type: "stop" };

/** Messages from a proxy process to the daemon. */
export type FromProxy =
  /** ready: bound and serving; `cpu` is the CPU its event loop is pinned to, null where the pin was not asked or was refused. */
  | {
      type: "ready";
      httpsPort: number;
      httpPort: number;
      generation: number;
      cpu?: number | null;
      /** steered says how a process started with `steer` picks itself for new connections: by its socket (eBPF), by index, or not at all (decision 529). */
      steered?: "socket" | "index" | null;
    }
  | { type: "applied"; generation: number; rebinds: number }
  | { type: "error"; code: string; message: string }
  /** counts are the process's cumulative request counts, sent every few seconds (docs/decisions.md 335). */
  | { type: "counts"; counts: RouteCounts[] };

/** ProxyPidRecord is a proxy process's pid file: enough for the next daemon to find, check and retire it. */
export interface ProxyPidRecord {
  pid: number;
  start_time: number;
  https_port: number;
  http_port: number;
}
