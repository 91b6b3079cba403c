import { BlockList, isIPv4, isIPv6 } from "node:net";

/**
 * canonicalAddress reads one address as a client or a proxy may write it — `203.0.113.7`,
 * `203.0.113.7:5123`, `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:443` — and returns it
 * without port or brackets, IPv6 in lower case, and an IPv4-mapped IPv6 address
 * (`::ffff:203.0.113.7`, what a dual-stack socket reports for an IPv4 peer) as plain IPv4,
 * so one client has one spelling. Anything else (a name, `unknown`, an obfuscated RFC 7239
 * identifier, an empty string) is null.
 */
export function canonicalAddress(raw: string): string | null {
  let text = raw.trim();
  if (text.length === 0 || text.length > 64) return null;
  if (text.startsWith("[")) {
    const close = text.indexOf("]");
    if (close === -1) return null;
    const rest = text.slice(close + 1);
    if (rest !== "" && !/^:\d{1,5}$/.test(rest)) return null;
    text = text.slice(1, close);
    if (!isIPv6(text)) return null;
  } else if (/^[0-9.]+:\d{1,5}$/.test(text)) {
    text = text.slice(0, text.lastIndexOf(":"));
  }
  if (isIPv4(text)) return text;
  // A zone (`fe80::1%eth0`) names an interface of the sender's host: meaningless here.
  if (!isIPv6(text) || text.includes("%")) return null;
  const bytes = bytesOf(text, "ipv6");
  // ::ffff:a.b.c.d (RFC 4291 §2.5.5.2) is an IPv4 peer seen through a dual-stack socket.
  if (bytes.slice(0, 10).every((b) => b === 0) && bytes[10] === 255 && bytes[11] === 255) return bytes.slice(12).join(".");
  // The URL parser writes IPv6 in its one canonical form (RFC 5952: lower case, zeros compressed).
  return new URL(`http://[${text}]/`).hostname.slice(1, -1);
}

/**
 * clientNetwork is the unit one client controls: an IPv4 address itself, an IPv6 address's
 * /64 — the smallest block a subscriber is given (RFC 6177), so one host can take 2^64
 * addresses and per-address limits must count the block, not the address.
 */
export function clientNetwork(address: string): string {
  if (!isIPv6(address)) return address;
  const bytes = bytesOf(address, "ipv6");
  const groups = [0, 2, 4, 6].map((i) => (((bytes[i] as number) << 8) | (bytes[i + 1] as number)).toString(16));
  return `${groups.join(":")}::/64`;
}

/**
 * ProxyList is a set of trusted proxies: single addresses and CIDR ranges, IPv4 and IPv6.
 * An IPv4-mapped IPv6 peer matches the IPv4 entries, because addresses are canonical first.
 */
export class ProxyList {
  private constructor(
    private readonly ranges: BlockList,
    /** entries are the parsed entries, for logs and tests. */
    readonly entries: readonly string[],
  ) {}

  /** none is the empty list: no peer is a proxy, so X-Forwarded-For is never read. */
  static readonly none = ProxyList.parse([]);

  /**
   * parse reads entries like `10.0.0.0/8`, `192.0.2.10`, `::1`, `fd00::/8`. It throws an Error
   * naming the first entry that is not an address, or an address with a prefix length in
   * range (0–32, 0–128) and no host bit set below it (`10.0.0.1/8` is usually a typo).
   */
  static parse(entries: readonly string[]): ProxyList {
    const ranges = new BlockList();
    const parsed: string[] = [];
    for (const raw of entries) {
      const entry = raw.trim();
      const slash = entry.indexOf("/");
      if (slash === -1) {
        const address = isIPv4(entry) || (isIPv6(entry) && !entry.includes("%")) ? canonicalAddress(entry) : null;
        if (!address) throw new Error(`${JSON.stringify(raw)} is not an IP address or CIDR range`);
        ranges.addAddress(address, isIPv4(address) ? "ipv4" : "ipv6");
        parsed.push(address);
        continue;
      }
      const address = entry.slice(0, slash);
      const family = isIPv4(address) ? "ipv4" : isIPv6(address) && !address.includes("%") ? "ipv6" : null;
      if (!family) throw new Error(`${JSON.stringify(raw)} is not an IP address or CIDR range`);
      const max = family === "ipv4" ? 32 : 128;
      const digits = entry.slice(slash + 1);
      const prefix = /^\d{1,3}$/.test(digits) ? Number(digits) : Number.NaN;
      if (!(prefix >= 0 && prefix <= max)) throw new Error(`${JSON.stringify(raw)} has a prefix length outside 0–${max}`);
      const bytes = bytesOf(address, family);
      for (let bit = prefix; bit < max; bit++) {
        if (((bytes[bit >> 3] as number) >> (7 - (bit & 7))) & 1) {
          throw new Error(`${JSON.stringify(raw)} has host bits set below /${prefix} (did you mean its network address?)`);
        }
      }
      ranges.addSubnet(address, prefix, family);
      parsed.push(`${address.toLowerCase()}/${prefix}`);
    }
    return new ProxyList(ranges, parsed);
  }

  /** has says whether a canonical address is one of the trusted proxies. */
  has(address: string): boolean {
    return this.ranges.check(address, isIPv4(address) ? "ipv4" : "ipv6");
  }

  get size(): number {
    return this.entries.length;
  }
}

/** bytesOf returns a valid address's bytes (4 or 16), the dotted IPv4 tail of an IPv6 address included. */
function bytesOf(address: string, family: "ipv4" | "ipv6"): number[] {
  if (family === "ipv4") return address.split(".").map(Number);
  const groups = (part: string): number[] =>
    part === ""
      ? []
      : part.split(":").flatMap((group) => {
          if (!group.includes(".")) return [Number.parseInt(group, 16)];
          const [a = 0, b = 0, c = 0, d = 0] = group.split(".").map(Number);
          return [a * 256 + b, c * 256 + d];
        });
  const [head = "", tail] = address.split("::");
  const left = groups(head);
  const right = tail === undefined ? [] : groups(tail);
  const all = [...left, ...Array(8 - left.length - right.length).fill(0), ...right];
  return all.flatMap((group) => [group >> 8, group & 255]);
}

/**
 * clientAddress returns the address a request came from. The socket's peer is the truth
 * unless the peer is a trusted proxy; then X-Forwarded-For is read from the right — each
 * proxy appends the address it received the request from — skipping addresses that are
 * themselves trusted proxies, and the first one that is not is the client (what nginx's
 * `real_ip_recursive on` and Caddy's `trusted_proxies` do). Everything left of it was written
 * by the client and proves nothing. A malformed entry ends the walk at the last address
 * reached, a trusted hop: a proxy that forwarded garbage vouches for no client, so the
 * request counts as that proxy's (failing toward a shared, stricter rate-limit bucket).
 * When every entry is a trusted proxy, the leftmost is the best there is.
 */
export function clientAddress(peer: string, forwardedFor: string | null, proxies: ProxyList): string {
  const direct = canonicalAddress(peer);
  if (!direct) return peer;
  if (!forwardedFor || proxies.size === 0 || !proxies.has(direct)) return direct;
  let reached = direct;
  let end = forwardedFor.length;
  // Walk commas from the right without splitting the whole header: the walk stops early.
  while (end > 0) {
    const comma = forwardedFor.lastIndexOf(",", end - 1);
    const hop = canonicalAddress(forwardedFor.slice(comma + 1, end));
    if (!hop) return reached;
    if (!proxies.has(hop)) return hop;
    reached = hop;
    end = comma === -1 ? 0 : comma;
  }
  return reached;
}
