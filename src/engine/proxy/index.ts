export {
  type CaDescription,
  type DomainRecord,
  type HeldCertificate,
  type LocalCertificates,
  type NamePublisher,
  ProxyController,
  type ProxyControllerOptions,
  type PublicIssuer,
} from "./controller";
export { type DomainRouteDeps, domainRoutes } from "./domain-routes";
export { PROXY_LATENCY_BOUNDS_S, type RouteCounts } from "./meter";
export { apexName, defaultNames, domainKind, validateDomain } from "./names";
export { proxyCommand } from "./processes";
export { type ProxyRouteDeps, proxyRoutes } from "./routes";
