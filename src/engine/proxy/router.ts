import type { RouteEntry } from "./snapshot";

/** Router finds a request's route by host, then by the longest matching path prefix. */
export class Router {
  private readonly byHost = new Map<string, RouteEntry[]>();

  constructor(routes: RouteEntry[]) {
    for (const route of routes) {
      const list = this.byHost.get(route.host) ?? [];
      list.push(route);
      this.byHost.set(route.host, list);
    }
    for (const list of this.byHost.values()) list.sort((a, b) => b.pathPrefix.length - a.pathPrefix.length);
  }

  /** match returns the route for a host and path, or undefined when no service holds them. */
  match(host: string, path: string): RouteEntry | undefined {
    const list = this.byHost.get(host);
    if (!list) return undefined;
    if (list.length === 1 && list[0]?.pathPrefix === "/") return list[0];
    return list.find((route) => prefixMatches(route.pathPrefix, path));
  }

  hasHost(host: string): boolean {
    return this.byHost.has(host);
  }
}

/** prefixMatches is true for "/api" against "/api", "/api/x" and "/api?q", never "/apix". */
function prefixMatches(prefix: string, path: string): boolean {
  if (prefix === "/") return true;
  if (!path.startsWith(prefix)) return false;
  const next = path.charAt(prefix.length);
  return next === "" || next === "/" || next === "?";
}
