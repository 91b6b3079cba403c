import { isIP } from "node:net";
import { type NetworkInterfaceInfo, networkInterfaces } from "node:os";
import { AppError } from "../../lib/errors";

/** LocalName is a validated single-label `.local` name and the label before `.local`. */
export interface LocalName {
  /** name is the lower-cased host name, e.g. `vllm-mybox.local`. */
  name: string;
  /** label is the part before `.local`, e.g. `vllm-mybox`; it also names the service instance. */
  label: string;
}

const LABEL = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;

/**
 * parseLocalName lower-cases a name and checks that it is one DNS label followed by `.local`.
 * Names of more labels (`a.b.local`) are refused because nss-mdns, Linux's default resolver
 * for `.local`, and Windows resolve only single-label names. It throws `invalid_domain`.
 */
export function parseLocalName(raw: string): LocalName {
  const fail = (why: string) => new AppError("invalid_domain", `invalid mDNS name ${JSON.stringify(raw)}: ${why}`);
  if (typeof raw !== "string") throw fail("a name is a string");
  const name = raw.toLowerCase();
  if (!name.endsWith(".local")) throw fail("an mDNS name ends with .local");
  const label = name.slice(0, -".local".length);
  if (label.includes(".")) {
    throw fail("an mDNS name has one label before .local (a.b.local does not resolve with nss-mdns or on Windows)");
  }
  if (!LABEL.test(label)) throw fail("the label before .local must be 1-63 letters, digits or inner hyphens");
  return { name, label };
}

/** PublishedAddresses is what a host's `.local` names point at and where multicast goes. */
export interface PublishedAddresses {
  /** addresses are the A and AAAA record data, IPv4 first. */
  addresses: string[];
  /** multicastInterface is the IPv4 address of the interface multicast is limited to, if any. */
  multicastInterface?: string;
  /** error says why no usable address was found (an unknown interface); addresses is then empty. */
  error?: string;
}

/**
 * publishedAddresses chooses the addresses `.local` names point at. Configured addresses win;
 * otherwise every non-internal IPv4 address and every non-internal, non-link-local IPv6
 * address of the host (or of `interfaceName` alone). Link-local IPv6 addresses are left out
 * because an AAAA record cannot carry the zone (`%eth0`) a client needs to use them. A host
 * with only loopback gets 127.0.0.1: multicast is then looped back on `lo`, so clients on the
 * host itself still resolve the names (bonjour-service alone would publish no address at all).
 */
export function publishedAddresses(
  options: { addresses?: string[]; interfaceName?: string },
  interfaces: NodeJS.Dict<NetworkInterfaceInfo[]> = networkInterfaces(),
): PublishedAddresses {
  let candidates: NetworkInterfaceInfo[];
  let multicastInterface: string | undefined;
  if (options.interfaceName !== undefined) {
    const own = interfaces[options.interfaceName];
    if (!own || own.length === 0) {
      return { addresses: [], error: `network interface ${JSON.stringify(options.interfaceName)} not found or without addresses` };
    }
    candidates = own;
    multicastInterface = own.find((entry) => entry.family === "IPv4")?.address;
  } else {
    candidates = Object.values(interfaces).flatMap((entries) => entries ?? []);
  }
  if (options.addresses && options.addresses.length > 0) {
    return { addresses: sortAddresses(options.addresses), multicastInterface };
  }
  const usable = candidates.filter((entry) => !entry.internal && !(entry.family === "IPv6" && isLinkLocal(entry.address)));
  const addresses = sortAddresses(usable.map((entry) => entry.address));
  if (addresses.length > 0) return { addresses, multicastInterface };
  const loopback = candidates.some((entry) => entry.family === "IPv4" && entry.internal) ? ["127.0.0.1"] : [];
  return { addresses: loopback, multicastInterface };
}

/** checkAddresses throws `config_invalid` unless every configured address is an IP literal. */
export function checkAddresses(addresses: string[]): void {
  for (const address of addresses) {
    if (isIP(address) === 0) throw new AppError("config_invalid", `mDNS address ${JSON.stringify(address)} is not an IP address`);
  }
}

function isLinkLocal(address: string): boolean {
  return /^fe[89ab][0-9a-f]:/i.test(address);
}

function sortAddresses(addresses: string[]): string[] {
  const unique = [...new Set(addresses)];
  return [...unique.filter((address) => isIP(address) === 4), ...unique.filter((address) => isIP(address) === 6)];
}
