import type { ProxyStatus } from "../../contract/engine";

/** ProxyStatusSource reports the reverse proxy's state for GET /api/proxy/status. */
export interface ProxyStatusSource {
  status(): ProxyStatus;
}

/**
 * proxyNotRunning reports a proxy that is not started: no listener, no CA, no routes. It is
 * what an engine without the proxy module truthfully says; the proxy module replaces it.
 */
export function proxyNotRunning(hostname: string): ProxyStatusSource {
  const shortName = hostname.split(".")[0] || hostname;
  return {
    status: () => ({
      state: "stopped",
      mode: "off",
      hostname,
      scheme: "https",
      base_domain: `${shortName.toLowerCase()}.local`,
      enabled: false,
      available: false,
      https_port: 0,
      tls: { listening: false },
      ca: { initialized: false },
      apex: { host: `${shortName.toLowerCase()}.local`, routed: false },
      respawn: { count: 0 },
      routes: { count: 0 },
      mdns: { published: false, names: [] },
      acme: { enabled: false },
      domains: [],
    }),
  };
}
