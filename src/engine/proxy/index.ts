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
export { apexName, defaultNames, domainKind, validateDomain } from "./names";
export { proxyCommand } from "./processes";
