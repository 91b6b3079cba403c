import { expect, test } from "bun:test";
import { canonicalAddress, clientAddress, clientNetwork, ProxyList } from "../../src/lib/forwarded";

test.each([
  ["203.0.113.7", "203.0.113.7"],
  [" 203.0.113.7 ", "203.0.113.7"],
  ["203.0.113.7:5123", "203.0.113.7"],
  ["2001:DB8:0:0::1", "2001:db8::1"],
  ["[2001:db8::1]", "2001:db8::1"],
  ["[2001:db8::1]:443", "2001:db8::1"],
  ["::ffff:203.0.113.7", "203.0.113.7"],
  ["::FFFF:cb00:7107", "203.0.113.7"],
  ["0:0:0:0:0:ffff:203.0.113.7", "203.0.113.7"],
  ["::1", "::1"],
  ["fe80::1%eth0", null],
  ["unknown", null],
  ["_hidden", null],
  ["", null],
  ["203.0.113.07", null],
  ["203.0.113.7.1", null],
  ["[203.0.113.7]", null],
  ["[2001:db8::1", null],
  ["[2001:db8::1]x", null],
  ["example.com", null],
  ["1".repeat(100), null],
])("canonicalAddress(%p) is %p", (raw, canonical) => {
  expect(canonicalAddress(raw)).toBe(canonical);
});

test.each([
  ["203.0.113.7", "203.0.113.7"],
  ["2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"],
  ["2001:db8:1:2::9", "2001:db8:1:2::/64"],
  ["::1", "0:0:0:0::/64"],
])("clientNetwork(%p) is %p: one IPv6 subscriber's /64 shares one bucket", (address, network) => {
  expect(clientNetwork(address)).toBe(network);
});

const PROXIES = ProxyList.parse(["127.0.0.1", "::1", "10.0.0.0/8", "fd00::/8"]);

// peer, X-Forwarded-For, the client address the console uses.
test.each([
  // An untrusted peer's header is ignored, however it is written.
  ["198.51.100.9", "203.0.113.7", "198.51.100.9"],
  ["198.51.100.9", "127.0.0.1", "198.51.100.9"],
  ["198.51.100.9", "10.0.0.5, 203.0.113.7", "198.51.100.9"],
  ["2001:db8::99", "203.0.113.7", "2001:db8::99"],
  ["::ffff:198.51.100.9", "203.0.113.7", "198.51.100.9"],
  // A trusted peer without the header is itself the client.
  ["127.0.0.1", null, "127.0.0.1"],
  ["127.0.0.1", "", "127.0.0.1"],
  // A trusted peer: the rightmost address that is not a trusted proxy.
  ["127.0.0.1", "203.0.113.7", "203.0.113.7"],
  ["::ffff:127.0.0.1", "203.0.113.7", "203.0.113.7"],
  ["::1", "2001:db8::7", "2001:db8::7"],
  ["127.0.0.1", "203.0.113.7, 10.1.2.3, 10.9.9.9", "203.0.113.7"],
  ["10.0.0.2", "203.0.113.7,fd00::3", "203.0.113.7"],
  ["127.0.0.1", "[2001:db8::7]:5000, 10.1.2.3", "2001:db8::7"],
  // What a client writes left of the address its first proxy appended proves nothing.
  ["127.0.0.1", "1.1.1.1, 8.8.8.8, 203.0.113.7", "203.0.113.7"],
  ["127.0.0.1", "10.0.0.1, 203.0.113.7", "203.0.113.7"],
  // A client that spoofs a proxy's address only moves the walk past its own entry.
  ["127.0.0.1", "10.66.66.66, 203.0.113.7, 10.1.2.3", "203.0.113.7"],
  // Malformed entries end the walk at the last trusted hop reached.
  ["127.0.0.1", "unknown", "127.0.0.1"],
  ["127.0.0.1", "203.0.113.7, garbage", "127.0.0.1"],
  ["127.0.0.1", "garbage, 10.1.2.3", "10.1.2.3"],
  ["127.0.0.1", "203.0.113.7,,10.1.2.3", "10.1.2.3"],
  ["127.0.0.1", "203.0.113.7, fe80::1%eth0", "127.0.0.1"],
  ["127.0.0.1", "<script>", "127.0.0.1"],
  // Only trusted proxies all the way: the leftmost is the best there is.
  ["127.0.0.1", "10.1.2.3, 10.4.5.6", "10.1.2.3"],
])("peer %p with X-Forwarded-For %p is client %p", (peer, forwarded, client) => {
  expect(clientAddress(peer, forwarded, PROXIES)).toBe(client);
});

test("with no trusted proxies the header is never read, loopback included", () => {
  expect(clientAddress("127.0.0.1", "203.0.113.7", ProxyList.none)).toBe("127.0.0.1");
  expect(clientAddress("::ffff:127.0.0.1", "203.0.113.7", ProxyList.none)).toBe("127.0.0.1");
  expect(clientAddress("unknown", "203.0.113.7", PROXIES)).toBe("unknown");
});

test("a header of thousands of hops costs a walk to the first untrusted one", () => {
  const long = `${"198.51.100.1, ".repeat(5000)}203.0.113.7`;
  expect(clientAddress("127.0.0.1", long, PROXIES)).toBe("203.0.113.7");
});

test.each([
  [
    ["10.0.0.0/8", "192.0.2.10", "::1", "FD00::/8", " 127.0.0.1 "],
    ["10.0.0.0/8", "192.0.2.10", "::1", "fd00::/8", "127.0.0.1"],
  ],
  [
    ["0.0.0.0/0", "::/0"],
    ["0.0.0.0/0", "::/0"],
  ],
  [["::ffff:10.0.0.1"], ["10.0.0.1"]],
  [[], []],
])("ProxyList.parse(%p) keeps %p", (entries, kept) => {
  expect(ProxyList.parse(entries).entries).toEqual(kept);
});

test.each([
  ["proxy.example.com", "is not an IP address"],
  ["10.0.0.0/33", "prefix length outside 0–32"],
  ["::/129", "prefix length outside 0–128"],
  ["10.0.0.0/", "prefix length"],
  ["10.0.0.0/-1", "prefix length"],
  ["10.0.0.0/8/8", "prefix length"],
  ["10.0.0.1/8", "host bits set"],
  ["fd00::1/8", "host bits set"],
  ["fe80::1%eth0", "is not an IP address"],
  ["10.0.0.1:80", "is not an IP address"],
  ["*", "is not an IP address"],
])("ProxyList.parse refuses %p (%s)", (entry, message) => {
  expect(() => ProxyList.parse([entry])).toThrow(message);
});
