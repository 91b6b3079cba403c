// The tls module: the engine's local certificate authority, the leaf certificates it issues
// for proxied names, and the installation of its root into the system and NSS trust stores.

export {
  type AcmeCertificate,
  AcmeIssuer,
  type AcmeIssuerOptions,
  type AcmeOrderState,
  type AcmeStatus,
  DEFAULT_ACME_RETRY,
} from "./acme";
export {
  CLOCK_SKEW_MS,
  DEFAULT_LEAF_LIFETIME_MS,
  INTERMEDIATE_LIFETIME_MS,
  type IssuedLeaf,
  LocalCa,
  type LocalCaOptions,
  pkiDirectory,
  RENEWAL_FRACTION,
  ROOT_LIFETIME_MS,
  renewalDue,
  renewalTime,
} from "./ca";
export { LeafCertificates, type LeafCertificatesOptions, leavesDirectory, validateLeafName } from "./leaves";
export {
  installTrust,
  rootFileStem,
  SYSTEM_TRUST_STORES,
  type SystemTrustStore,
  type TrustChange,
  type TrustOptions,
  type TrustStatus,
  trustStatus,
  uninstallTrust,
} from "./trust";
