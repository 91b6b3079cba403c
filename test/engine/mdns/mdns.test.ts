import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { hostname, type NetworkInterfaceInfo, tmpdir } from "node:os";
import { join } from "node:path";
import type { Subprocess } from "bun";
import pino from "pino";
import { avahiDaemonRunning, avahiPublishCommands, MdnsPublisher, parseLocalName, publishedAddresses } from "../../../src/engine/mdns";
import { isAppError } from "../../../src/lib/errors";
import { eventually } from "../../helpers";

const PEER = join(import.meta.dir, "mdns-peer.ts");
const log = pino({ level: "silent" });
const SEEN_MS = 10_000;
// TEST_MS bounds the tests that wait for the network: probing and announcing take about a second per name.
const TEST_MS = 30_000;

type PeerEvent = {
  event: string;
  name?: string;
  host?: string;
  port?: number;
  addresses?: string[];
  type?: string;
  ttl?: number;
  data?: unknown;
} & Record<string, unknown>;

/** Peer is a process started for a test (mdns-peer.ts, or a shell around it) whose JSON lines are collected. */
class Peer {
  readonly events: PeerEvent[] = [];
  readonly process: Subprocess<"ignore", "pipe", "inherit">;
  readonly read: Promise<void>;

  constructor(argv: string[], env: Record<string, string> = {}) {
    // detached: its own process group, so kill() also ends what a shell started.
    this.process = Bun.spawn(argv, { stdin: "ignore", stdout: "pipe", stderr: "inherit", detached: true, env: { ...process.env, ...env } });
    this.read = this.#collect();
    running.add(this);
  }

  static browse(...args: string[]): Peer {
    return new Peer([process.execPath, PEER, "browse", ...args]);
  }

  async #collect(): Promise<void> {
    const decoder = new TextDecoder();
    let buffered = "";
    const reader = this.process.stdout.getReader();
    for (let read = await reader.read(); !read.done; read = await reader.read()) {
      buffered += decoder.decode(read.value, { stream: true });
      const lines = buffered.split("\n");
      buffered = lines.pop() ?? "";
      for (const line of lines) {
        try {
          this.events.push(JSON.parse(line));
        } catch {
          // not a JSON line
        }
      }
    }
  }

  find(predicate: (event: PeerEvent) => boolean): PeerEvent | undefined {
    return this.events.find(predicate);
  }

  async ready(): Promise<void> {
    await eventually(() => this.find((event) => event.event === "ready"), { timeoutMs: SEEN_MS });
  }

  async kill(): Promise<void> {
    running.delete(this);
    if (this.process.exitCode === null && this.process.signalCode === null) {
      try {
        process.kill(-this.process.pid, "SIGKILL");
      } catch {
        this.process.kill("SIGKILL");
      }
    }
    await this.process.exited;
  }
}

const running = new Set<Peer>();
const publishers = new Set<MdnsPublisher>();

function publisher(options: Partial<ConstructorParameters<typeof MdnsPublisher>[0]> = {}): MdnsPublisher {
  const created = new MdnsPublisher({ backend: "bonjour", log, ...options });
  publishers.add(created);
  return created;
}

afterEach(async () => {
  await Promise.all([...publishers].map((each) => each.stop()));
  publishers.clear();
  await Promise.all([...running].map((peer) => peer.kill()));
});

function uniqueLabel(): string {
  return `mdnstest-${crypto.randomUUID().slice(0, 8)}`;
}

const upEvent = (label: string) => (event: PeerEvent) => event.event === "up" && event.name === label;
const downEvent = (label: string) => (event: PeerEvent) => event.event === "down" && event.name === label;
const liveAnswer = (name: string) => (event: PeerEvent) => event.event === "answer" && event.name === name && (event.ttl ?? 0) > 0;

describe("names", () => {
  test.each([
    ["a.b.local", /one label before \.local/],
    ["vllm.example.com", /ends with \.local/],
    ["vllm", /ends with \.local/],
    [".local", /letters, digits or inner hyphens/],
    ["-vllm.local", /letters, digits or inner hyphens/],
    ["vllm-.local", /letters, digits or inner hyphens/],
    ["vllm_box.local", /letters, digits or inner hyphens/],
    ["vllm box.local", /letters, digits or inner hyphens/],
    [`${"a".repeat(64)}.local`, /letters, digits or inner hyphens/],
    ["vllm.local.", /ends with \.local/],
  ])("%p is refused with invalid_domain", async (name, reason) => {
    expect(() => parseLocalName(name)).toThrow(reason);
    const error = await publisher()
      .publish(name, 8443)
      .catch((caught: unknown) => caught);
    expect(isAppError(error) && error.code).toBe("invalid_domain");
  });

  test("names are lower-cased and the label is the part before .local", () => {
    expect(parseLocalName("VLLM-MyBox.local")).toEqual({ name: "vllm-mybox.local", label: "vllm-mybox" });
    expect(parseLocalName(`${"a".repeat(63)}.local`).label).toHaveLength(63);
  });

  test("a port that is not a TCP port is refused", async () => {
    await expect(publisher().publish("vllm-mybox.local", 0)).rejects.toThrow(RangeError);
    await expect(publisher().publish("vllm-mybox.local", 70000)).rejects.toThrow(RangeError);
  });

  test("configured addresses must be IP addresses", () => {
    expect(() => new MdnsPublisher({ log, addresses: ["mybox.lan"] })).toThrow(/not an IP address/);
  });
});

describe("publishedAddresses", () => {
  const v4 = (address: string, internal = false): NetworkInterfaceInfo => ({
    address,
    family: "IPv4",
    internal,
    netmask: "255.255.255.0",
    mac: "02:00:00:00:00:01",
    cidr: null,
  });
  const v6 = (address: string, internal = false): NetworkInterfaceInfo => ({
    address,
    family: "IPv6",
    internal,
    netmask: "ffff:ffff:ffff:ffff::",
    mac: "02:00:00:00:00:01",
    cidr: null,
    scopeid: 0,
  });
  const loopback = [v4("127.0.0.1", true), v6("::1", true)];

  test.each([
    [
      "a LAN host: its IPv4 and global IPv6, not link-local",
      { lo: loopback, eth0: [v4("192.0.2.2"), v6("fd00::2"), v6("fe80::1")] },
      {},
      ["192.0.2.2", "fd00::2"],
    ],
    ["a host with only loopback: 127.0.0.1", { lo: loopback }, {}, ["127.0.0.1"]],
    [
      "two interfaces: both, IPv4 first",
      { lo: loopback, eth0: [v6("2001:db8::2"), v4("192.0.2.2")], wlan0: [v4("198.51.100.7")] },
      {},
      ["192.0.2.2", "198.51.100.7", "2001:db8::2"],
    ],
    [
      "one chosen interface",
      { lo: loopback, eth0: [v4("192.0.2.2")], wlan0: [v4("198.51.100.7")] },
      { interfaceName: "wlan0" },
      ["198.51.100.7"],
    ],
    ["configured addresses win", { lo: loopback, eth0: [v4("192.0.2.2")] }, { addresses: ["203.0.113.9", "203.0.113.9"] }, ["203.0.113.9"]],
  ])("%s", (_title, interfaces, options, expected) => {
    expect(publishedAddresses(options, interfaces).addresses).toEqual(expected);
  });

  test("a chosen interface limits multicast to its IPv4 address; an unknown one is an error", () => {
    const interfaces = { lo: loopback, eth0: [v4("192.0.2.2")] };
    expect(publishedAddresses({ interfaceName: "eth0" }, interfaces)).toEqual({
      addresses: ["192.0.2.2"],
      multicastInterface: "192.0.2.2",
    });
    expect(publishedAddresses({ interfaceName: "eth9" }, interfaces)).toEqual({
      addresses: [],
      error: 'network interface "eth9" not found or without addresses',
    });
  });
});

describe("avahi command lines", () => {
  test("one avahi-publish per address and one for the service", () => {
    expect(avahiPublishCommands(parseLocalName("vllm-mybox.local"), 8443, ["192.0.2.2", "fd00::2"])).toEqual([
      ["avahi-publish", "--no-fail", "--address", "--no-reverse", "vllm-mybox.local", "192.0.2.2"],
      ["avahi-publish", "--no-fail", "--address", "--no-reverse", "vllm-mybox.local", "fd00::2"],
      ["avahi-publish", "--no-fail", "--service", "--host", "vllm-mybox.local", "vllm-mybox", "_https._tcp", "8443", "path=/"],
    ]);
  });

  test("avahiDaemonRunning needs a listener, not just the socket file a killed daemon leaves", async () => {
    expect(await avahiDaemonRunning("/nonexistent/avahi-socket")).toBe(false);
    const dir = mkdtempSync(join(tmpdir(), "mdns-test-"));
    const path = join(dir, "socket");
    try {
      const listen = `Bun.listen({ unix: ${JSON.stringify(path)}, socket: { data() {} } }); console.log('{"event":"ready"}')`;
      const holder = new Peer([process.execPath, "-e", listen]);
      await holder.ready();
      expect(await avahiDaemonRunning(path)).toBe(true);
      await holder.kill();
      expect(existsSync(path)).toBe(true);
      expect(await avahiDaemonRunning(path)).toBe(false);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

// A stand-in avahi-publish checks how the avahi backend drives its children where no avahi
// runs (CI): it logs its arguments, reports like the real one on stderr, and either stays up
// until SIGTERM or, for the name collision.local, fails at once.
const FAKE_AVAHI_PUBLISH = `#!/bin/sh
log="$(dirname "$0")/log"
echo "start $*" >> "$log"
if [ "$4" = "collision.local" ]; then echo "Failed to add address: Local name collision" >&2; exit 1; fi
sleep 600 & pause=$!
trap 'echo "stop $*" >> "$log"; kill $pause; exit 0' TERM
echo "Established under name '$4'" >&2
wait $pause
`;

describe("avahi backend with a stand-in avahi-publish", () => {
  const dir = mkdtempSync(join(tmpdir(), "mdns-fake-avahi-"));
  const avahiPublish = join(dir, "avahi-publish");
  const calls = () => (existsSync(join(dir, "log")) ? readFileSync(join(dir, "log"), "utf8").trim().split("\n") : []);

  beforeAll(() => writeFileSync(avahiPublish, FAKE_AVAHI_PUBLISH, { mode: 0o755 }));
  afterEach(() => rmSync(join(dir, "log"), { force: true }));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  test("each record is one child, started on publish and ended by unpublish and stop", async () => {
    const mdns = publisher({ backend: "avahi", addresses: ["192.0.2.2", "fd00::2"], avahiPublish });
    await mdns.start();
    await mdns.publish("vllm-mybox.local", 8443);
    await mdns.publish("comfy-mybox.local", 8444);
    expect(mdns.status()).toEqual({
      backend: "avahi",
      published: true,
      names: ["comfy-mybox.local", "vllm-mybox.local"],
      interface_addresses: ["192.0.2.2", "fd00::2"],
    });
    expect(calls().sort()).toEqual(
      [
        ...avahiPublishCommands(parseLocalName("vllm-mybox.local"), 8443, ["192.0.2.2", "fd00::2"], avahiPublish),
        ...avahiPublishCommands(parseLocalName("comfy-mybox.local"), 8444, ["192.0.2.2", "fd00::2"], avahiPublish),
      ]
        .map((argv) => `start ${argv.slice(1).join(" ")}`)
        .sort(),
    );

    await mdns.unpublish("vllm-mybox.local");
    expect(calls().filter((line) => line.startsWith("stop") && line.includes("vllm-mybox.local"))).toHaveLength(3);
    expect(mdns.status()).toMatchObject({ published: true, names: ["comfy-mybox.local"] });
    await mdns.stop();
    expect(calls().filter((line) => line.startsWith("stop"))).toHaveLength(6);
    await mdns.stop();
  });

  test("a child that fails is reported in status, not thrown", async () => {
    const mdns = publisher({ backend: "avahi", addresses: ["192.0.2.2"], avahiPublish });
    await mdns.start();
    await mdns.publish("collision.local", 8443);
    await mdns.publish("vllm-mybox.local", 8443);
    expect(mdns.status()).toEqual({
      backend: "avahi",
      published: false,
      names: ["collision.local", "vllm-mybox.local"],
      interface_addresses: ["192.0.2.2"],
      error: expect.stringContaining("exited with code 1: Failed to add address: Local name collision"),
    });
    await mdns.unpublish("collision.local");
    expect(mdns.status()).toMatchObject({ published: true, names: ["vllm-mybox.local"] });
    expect(mdns.status().error).toBeUndefined();
  });
});

describe("lifecycle without a network", () => {
  test("a publisher that is off publishes nothing and says so", async () => {
    const off = publisher({ backend: "off" });
    await off.start();
    await off.publish("vllm-mybox.local", 8443);
    expect(off.status()).toEqual({ backend: "off", published: false, names: ["vllm-mybox.local"], interface_addresses: [] });
  });

  test("a failed start is reported, not thrown, and stop() is safe before, after and twice", async () => {
    const unstarted = publisher();
    await unstarted.stop();
    const broken = publisher({ interface: "nonexistent0" });
    await broken.start();
    await broken.publish("vllm-mybox.local", 8443);
    expect(broken.status()).toEqual({
      backend: "bonjour",
      published: false,
      names: ["vllm-mybox.local"],
      interface_addresses: [],
      error: 'network interface "nonexistent0" not found or without addresses',
    });
    await broken.stop();
    await broken.stop();
    expect(broken.status()).toEqual({ backend: "off", published: false, names: [], interface_addresses: [] });
  });
});

describe("bonjour backend, seen from a second process", () => {
  test(
    "a published name is browsed with its host and port and its A record resolves",
    async () => {
      const label = uniqueLabel();
      const name = `${label}.local`;
      const peer = Peer.browse("--resolve", name);
      await peer.ready();
      const mdns = publisher();
      await mdns.start();
      await mdns.publish(name, 8443);

      const status = mdns.status();
      expect(status).toMatchObject({ backend: "bonjour", published: true, names: [name] });
      expect(status.error).toBeUndefined();
      const ipv4 = status.interface_addresses.filter((address) => address.includes("."));
      expect(ipv4.length).toBeGreaterThan(0);

      const up = await eventually(() => peer.find(upEvent(label)), { timeoutMs: SEEN_MS });
      expect(up).toMatchObject({ host: name, port: 8443 });
      expect(up.addresses).toEqual(expect.arrayContaining(ipv4));
      const answer = await eventually(() => peer.find(liveAnswer(name)), { timeoutMs: SEEN_MS });
      expect(answer).toMatchObject({ type: "A", ttl: 120 });
      expect(ipv4).toContain(answer.data as string);
    },
    TEST_MS,
  );

  test(
    "publishing a name again with another port updates the service",
    async () => {
      const label = uniqueLabel();
      const peer = Peer.browse();
      await peer.ready();
      const mdns = publisher();
      await mdns.start();
      await mdns.publish(`${label}.local`, 8443);
      await eventually(() => peer.find(upEvent(label)), { timeoutMs: SEEN_MS });
      await mdns.publish(`${label}.local`, 9443);
      const update = await eventually(() => peer.find((event) => event.event === "update" && event.name === label), { timeoutMs: SEEN_MS });
      expect(update).toMatchObject({ port: 9443, host: `${label}.local` });
      expect(mdns.status()).toMatchObject({ published: true, names: [`${label}.local`] });
    },
    TEST_MS,
  );

  test(
    "unpublish says goodbye: the browser sees the name go down, and a fresh browse finds only what remains",
    async () => {
      const keep = uniqueLabel();
      const gone = uniqueLabel();
      const peer = Peer.browse();
      await peer.ready();
      const mdns = publisher();
      await mdns.start();
      await Promise.all([mdns.publish(`${keep}.local`, 8443), mdns.publish(`${gone}.local`, 8443)]);
      expect(mdns.names()).toEqual([`${keep}.local`, `${gone}.local`].sort());
      await eventually(() => peer.find(upEvent(keep)) && peer.find(upEvent(gone)), { timeoutMs: SEEN_MS });

      await mdns.unpublish(`${gone}.local`);
      expect(mdns.status()).toMatchObject({ published: true, names: [`${keep}.local`] });
      await eventually(() => peer.find(downEvent(gone)), { timeoutMs: SEEN_MS });
      expect(peer.find(downEvent(keep))).toBeUndefined();

      // A browser started now asks afresh: the remaining name is answered (its PTR record
      // survived the other's withdrawal), the removed one is not, nor is its A record.
      const fresh = Peer.browse("--resolve", `${keep}.local`, "--resolve", `${gone}.local`);
      await eventually(() => fresh.find(upEvent(keep)), { timeoutMs: SEEN_MS });
      await eventually(() => fresh.events.filter(liveAnswer(`${keep}.local`)).length >= 2, { timeoutMs: SEEN_MS });
      expect(fresh.find(upEvent(gone))).toBeUndefined();
      expect(fresh.find(liveAnswer(`${gone}.local`))).toBeUndefined();
    },
    TEST_MS,
  );

  test(
    "stop() says goodbye for every name, and the publisher can start again",
    async () => {
      const first = uniqueLabel();
      const second = uniqueLabel();
      const peer = Peer.browse();
      await peer.ready();
      const mdns = publisher();
      await mdns.start();
      await mdns.publish(`${first}.local`, 8443);
      await mdns.publish(`${second}.local`, 8444);
      await eventually(() => peer.find(upEvent(first)) && peer.find(upEvent(second)), { timeoutMs: SEEN_MS });

      await mdns.stop();
      expect(mdns.status()).toEqual({ backend: "off", published: false, names: [], interface_addresses: [] });
      await eventually(() => peer.find(downEvent(first)) && peer.find(downEvent(second)), { timeoutMs: SEEN_MS });
      await mdns.stop();

      const again = uniqueLabel();
      await mdns.start();
      await mdns.publish(`${again}.local`, 8443);
      await eventually(() => peer.find(upEvent(again)), { timeoutMs: SEEN_MS });
    },
    TEST_MS,
  );

  test(
    "names requested before start() are published by it",
    async () => {
      const label = uniqueLabel();
      const peer = Peer.browse();
      await peer.ready();
      const mdns = publisher();
      await mdns.publish(`${label}.local`, 8443);
      expect(mdns.status()).toMatchObject({ published: false, names: [`${label}.local`] });
      await mdns.start();
      expect(mdns.status().published).toBe(true);
      await eventually(() => peer.find(upEvent(label)), { timeoutMs: SEEN_MS });
    },
    TEST_MS,
  );

  test(
    "a name another responder already answers for is reported and not taken",
    async () => {
      const label = uniqueLabel();
      const name = `${label}.local`;
      const browser = Peer.browse();
      await browser.ready();
      const owner = new Peer([process.execPath, PEER, "publish", name, "8443"]);
      await eventually(() => owner.find((event) => event.event === "status" && event.published === true), { timeoutMs: SEEN_MS });
      await eventually(() => browser.find(upEvent(label)), { timeoutMs: SEEN_MS });

      const mdns = publisher();
      await mdns.start();
      await mdns.publish(name, 9443);
      expect(mdns.status()).toMatchObject({
        published: false,
        names: [name],
        error: `mDNS name ${name} is already answered by another host on the network`,
      });
      expect(browser.find((event) => event.event === "update" && event.name === label)).toBeUndefined();
    },
    TEST_MS,
  );
});

// Network namespaces stand for machines without a LAN, or with a LAN but no route for multicast.
const canUnshare =
  Bun.which("unshare") !== null &&
  Bun.which("ip") !== null &&
  Bun.spawnSync(["unshare", "--net", "true"], { stderr: "ignore" }).exitCode === 0;

describe.skipIf(!canUnshare)("bonjour backend in a private network namespace", () => {
  test(
    "names point at 127.0.0.1 and resolve for clients on the host",
    async () => {
      const label = uniqueLabel();
      const name = `${label}.local`;
      const script = [
        "ip link set lo up",
        '"$BUN" "$PEER" publish "$NAME" 8443 & publisher=$!',
        '"$BUN" "$PEER" browse --resolve "$NAME" --until-seen "$LABEL"; seen=$?',
        "kill $publisher; wait $publisher; exit $seen",
      ].join("\n");
      const shell = new Peer(["unshare", "--net", "sh", "-c", script], { BUN: process.execPath, PEER, NAME: name, LABEL: label });
      expect(await shell.process.exited).toBe(0);
      await shell.read;
      expect(shell.find((event) => event.event === "status")).toMatchObject({ published: true, interface_addresses: ["127.0.0.1"] });
      expect(shell.find(upEvent(label))).toMatchObject({ host: name, port: 8443, addresses: ["127.0.0.1"] });
      expect(shell.find(liveAnswer(name))).toMatchObject({ type: "A", data: "127.0.0.1" });
    },
    TEST_MS,
  );

  // A LAN interface without a route for 224.0.0.251 (no default route): sends fail with ENETUNREACH.
  const canVeth =
    Bun.spawnSync(["unshare", "--net", "ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"], { stderr: "ignore" }).exitCode ===
    0;

  test.skipIf(!canVeth)(
    "a network that refuses multicast is reported in status, and the interface option gets around it",
    async () => {
      const script = [
        "ip link set lo up",
        "ip link add v0 type veth peer name v1 && ip addr add 10.9.0.1/24 dev v0 && ip link set v0 up && ip link set v1 up",
        '"$BUN" "$PEER" publish "$NAME" 8443 & publisher=$!',
        '"$BUN" "$PEER" publish "$NAME" 8443 v0 & chosen=$!',
        'while ! grep -c status "$OUT" | grep -q 2; do sleep 0.1; done; kill $publisher $chosen; wait',
      ].join("\n");
      const dir = mkdtempSync(join(tmpdir(), "mdns-test-"));
      const out = join(dir, "out");
      try {
        const shell = new Peer(["unshare", "--net", "sh", "-c", `(${script}) > "$OUT"`], {
          BUN: process.execPath,
          PEER,
          NAME: "refused.local",
          OUT: out,
        });
        expect(await shell.process.exited).toBe(0);
        const statuses = readFileSync(out, "utf8")
          .trim()
          .split("\n")
          .map((line) => JSON.parse(line));
        expect(statuses).toContainEqual({
          event: "status",
          backend: "bonjour",
          published: false,
          names: ["refused.local"],
          interface_addresses: ["10.9.0.1"],
          error: "send ENETUNREACH 224.0.0.251:5353",
        });
        expect(statuses).toContainEqual({
          event: "status",
          backend: "bonjour",
          published: true,
          names: ["refused.local"],
          interface_addresses: ["10.9.0.1"],
        });
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
    TEST_MS,
  );
});

// The avahi backend is tested against a real avahi-daemon: the one running, or one started
// here (with a system D-Bus if none runs) when the tools are installed and we are root.
const DBUS_SOCKET = "/run/dbus/system_bus_socket";
const avahiTools = ["avahi-daemon", "avahi-publish", "avahi-browse", "avahi-resolve"].every((tool) => Bun.which(tool) !== null);
const avahiRunning = avahiTools && Bun.spawnSync(["avahi-daemon", "--check"], { stderr: "ignore" }).exitCode === 0;
const avahiStartable = avahiTools && process.getuid?.() === 0 && (existsSync(DBUS_SOCKET) || Bun.which("dbus-daemon") !== null);

describe.skipIf(!(avahiRunning || avahiStartable))("avahi backend, against avahi-daemon", () => {
  const started: Subprocess[] = [];

  beforeAll(async () => {
    if (await avahiDaemonRunning()) return;
    if (!(await avahiDaemonRunning(DBUS_SOCKET))) {
      mkdirSync("/run/dbus", { recursive: true });
      started.push(Bun.spawn(["dbus-daemon", "--system", "--nofork", "--nopidfile"], { stdout: "ignore", stderr: "ignore" }));
      await eventually(() => avahiDaemonRunning(DBUS_SOCKET), { timeoutMs: SEEN_MS });
    }
    started.push(
      Bun.spawn(["avahi-daemon", "--no-drop-root", "--no-chroot", "--no-rlimits", "--no-proc-title"], {
        stdout: "ignore",
        stderr: "ignore",
      }),
    );
    await eventually(() => avahiDaemonRunning(), { timeoutMs: SEEN_MS });
    // The daemon takes names only once it has claimed its own host name ("Server startup complete").
    await eventually(() => Bun.spawnSync(["avahi-resolve", "-n", `${hostname()}.local`], { stderr: "ignore" }).stdout.length > 0, {
      timeoutMs: SEEN_MS,
    });
  }, TEST_MS);

  afterAll(async () => {
    // avahi-daemon first: it needs the bus to shut down cleanly.
    for (const daemon of started.reverse()) {
      daemon.kill("SIGTERM");
      await daemon.exited;
    }
    // dbus-daemon leaves its socket behind; no bus ran before, so nothing else can be using it.
    if (started.length === 2) rmSync(DBUS_SOCKET, { force: true });
  }, TEST_MS);

  const avahiResolve = (name: string) =>
    new TextDecoder()
      .decode(Bun.spawnSync(["avahi-resolve", "-4", "-n", name], { stderr: "ignore" }).stdout)
      .trim()
      .split(/\s+/)[1];
  const avahiBrowse = () =>
    new TextDecoder()
      .decode(Bun.spawnSync(["avahi-browse", "--resolve", "--terminate", "--parsable", "_https._tcp"], { stderr: "ignore" }).stdout)
      .split("\n")
      .filter((line) => line.startsWith("="))
      .map((line) => line.split(";"));
  const avahiPublishProcesses = (name: string) =>
    new TextDecoder()
      .decode(Bun.spawnSync(["pgrep", "-f", `avahi-publish .*${name}`]).stdout)
      .trim()
      .split("\n")
      .filter(Boolean);

  test(
    "auto chooses avahi while avahi-daemon runs",
    async () => {
      const mdns = publisher({ backend: "auto" });
      await mdns.start();
      expect(mdns.status().backend).toBe("avahi");
    },
    TEST_MS,
  );

  test(
    "a published name is browsed and resolved through avahi, and by a second mDNS stack",
    async () => {
      const label = uniqueLabel();
      const name = `${label}.local`;
      const peer = Peer.browse("--resolve", name);
      await peer.ready();
      const mdns = publisher({ backend: "avahi" });
      await mdns.start();
      await mdns.publish(name, 8443);
      const status = mdns.status();
      expect(status).toMatchObject({ backend: "avahi", published: true, names: [name] });
      expect(status.error).toBeUndefined();
      const ipv4 = status.interface_addresses.filter((address) => address.includes("."));

      const row = await eventually(() => avahiBrowse().find((fields) => fields[3] === label && fields[2] === "IPv4"), {
        timeoutMs: SEEN_MS,
      });
      expect(row[6]).toBe(name); // host
      expect(ipv4).toContain(row[7] as string); // address
      expect(row[8]).toBe("8443"); // port
      expect(ipv4).toContain(avahiResolve(name) as string);
      expect(await eventually(() => peer.find(upEvent(label)), { timeoutMs: SEEN_MS })).toMatchObject({ host: name, port: 8443 });
      expect(avahiPublishProcesses(name)).toHaveLength(status.interface_addresses.length + 1);
    },
    TEST_MS,
  );

  test(
    "unpublish and stop end the avahi-publish children and the names go away",
    async () => {
      const gone = uniqueLabel();
      const last = uniqueLabel();
      const peer = Peer.browse();
      await peer.ready();
      const mdns = publisher({ backend: "avahi" });
      await mdns.start();
      await mdns.publish(`${gone}.local`, 8443);
      await mdns.publish(`${last}.local`, 8443);
      await eventually(() => peer.find(upEvent(gone)) && peer.find(upEvent(last)), { timeoutMs: SEEN_MS });

      await mdns.unpublish(`${gone}.local`);
      expect(avahiPublishProcesses(`${gone}.local`)).toEqual([]);
      expect(mdns.status()).toMatchObject({ published: true, names: [`${last}.local`] });
      await eventually(() => peer.find(downEvent(gone)), { timeoutMs: SEEN_MS });
      // avahi-daemon keeps a record for a second after its goodbye (RFC 6762 §10.1).
      await eventually(() => avahiResolve(`${gone}.local`) === undefined, { timeoutMs: SEEN_MS });

      await mdns.stop();
      expect(avahiPublishProcesses(`${last}.local`)).toEqual([]);
      await eventually(() => peer.find(downEvent(last)), { timeoutMs: SEEN_MS });
      await mdns.stop();
    },
    TEST_MS,
  );
});
