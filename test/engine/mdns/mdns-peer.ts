/**
 * mdns-peer is a second mDNS participant for the mdns tests, run as its own process so that
 * it has its own socket, as another machine on the network would. It prints JSON lines.
 *
 *   bun mdns-peer.ts browse [--resolve NAME]... [--until-seen LABEL]
 *     browses `_https._tcp` with bonjour-service and prints {"event":"up"|"update"|"down",...}; for each
 *     NAME it sends an mDNS query for type A twice a second and prints every answer as
 *     {"event":"answer",...}. With --until-seen it exits 0 once the service LABEL is up and an
 *     A answer has arrived, or 1 after ten seconds.
 *   bun mdns-peer.ts publish NAME PORT [INTERFACE]
 *     publishes NAME with MdnsPublisher (bonjour backend) and prints its status until killed.
 */
import { Bonjour } from "bonjour-service";
import pino from "pino";
import { MdnsPublisher } from "../../../src/engine/mdns";

interface Answer {
  name: string;
  type: string;
  ttl: number;
  data: unknown;
}

interface RawMulticastDns {
  on(event: "ready", listener: () => void): void;
  on(event: "response", listener: (packet: { answers: Answer[]; additionals: Answer[] }) => void): void;
  query(name: string, type: string): void;
}

const print = (value: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(value)}\n`);
const [mode, ...args] = process.argv.slice(2);

if (mode === "publish") {
  const [name = "", port = "0", networkInterface] = args;
  const publisher = new MdnsPublisher({ backend: "bonjour", log: pino({ level: "silent" }), interface: networkInterface });
  await publisher.start();
  await publisher.publish(name, Number(port));
  print({ event: "status", ...publisher.status() });
  process.on("SIGTERM", () => void publisher.stop().then(() => process.exit(0)));
} else if (mode === "browse") {
  const resolve: string[] = [];
  let untilSeen: string | undefined;
  for (let index = 0; index < args.length; index += 2) {
    if (args[index] === "--resolve") resolve.push(args[index + 1] ?? "");
    if (args[index] === "--until-seen") untilSeen = args[index + 1];
  }
  const bonjour = new Bonjour();
  // The raw socket is bonjour-service's own multicast-dns instance: not in its typings, but it
  // is the library's socket and spares the tests a second mDNS dependency.
  const mdns = (bonjour as unknown as { server: { mdns: RawMulticastDns } }).server.mdns;
  let seenUp = false;
  let seenAnswer = false;
  const maybeExit = () => {
    if (untilSeen && seenUp && seenAnswer) process.exit(0);
  };
  if (untilSeen) setTimeout(() => process.exit(1), 10_000);
  mdns.on("response", (packet) => {
    for (const record of [...packet.answers, ...packet.additionals]) {
      if (!resolve.includes(record.name.toLowerCase()) || (record.type !== "A" && record.type !== "AAAA")) continue;
      print({ event: "answer", name: record.name, type: record.type, ttl: record.ttl, data: record.data });
      if (record.type === "A" && record.ttl > 0) seenAnswer = true;
    }
    maybeExit();
  });
  mdns.on("ready", () => {
    print({ event: "ready" });
    const ask = () => {
      for (const name of resolve) mdns.query(name, "A");
    };
    ask();
    setInterval(ask, 500);
  });
  const browser = bonjour.find({ type: "https" });
  browser.on("up", (service) => {
    print({ event: "up", name: service.name, host: service.host, port: service.port, addresses: service.addresses ?? [] });
    if (service.name === untilSeen) seenUp = true;
    maybeExit();
  });
  browser.on("srv-update", (service) => print({ event: "update", name: service.name, host: service.host, port: service.port }));
  browser.on("down", (service) => print({ event: "down", name: service.name, host: service.host }));
} else {
  process.stderr.write("usage: mdns-peer.ts browse [--resolve NAME]... [--until-seen LABEL] | publish NAME PORT [INTERFACE]\n");
  process.exit(2);
}
