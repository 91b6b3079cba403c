/**
 * bench/mcp.ts: one assistant's tool calls (`list_services`, `diagnose`) against the compiled
 * binary, over /mcp in both protocol revisions, over stdio (`engine mcp`, through the unix
 * socket), and relayed through a console (the console's /mcp, then the engine's tunnel; the
 * console runs from source in its own process, bench/relay-console.ts), each next to the same
 * operation over the plain HTTP API in the same run (GET /api/services,
 * GET /api/services/:name/diagnose). Calls are sequential, as one assistant makes them; the p50
 * ratio MCP/HTTP is the figure.
 *
 * Usage: bun bench/mcp.ts [--duration-ms 3000] [--services 10] [--rebuild]
 */
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { reapWorkloads } from "../test/helpers";
import { fmt, freePort, numericArg, printRows, waitForHttp } from "./lib";

const root = join(import.meta.dir, "..");
const durationMs = numericArg("--duration-ms", 3000);
const serviceCount = numericArg("--services", 10);

const binary = join(root, "dist", "engine");
if (!existsSync(binary) || process.argv.includes("--rebuild")) {
  const build = Bun.spawnSync([process.execPath, join(root, "build.ts")], { stdout: "inherit", stderr: "inherit" });
  if (build.exitCode !== 0) process.exit(1);
}

interface Timing {
  calls: number;
  errors: number;
  perSecond: number;
  p50: number;
  p99: number;
}

/** measure calls `once` back to back for durationMs (after a warm-up) and reports latency percentiles in ms. */
async function measure(once: () => Promise<boolean>): Promise<Timing> {
  const warmup = performance.now() + 300;
  while (performance.now() < warmup) await once();
  const latencies: number[] = [];
  let errors = 0;
  const started = performance.now();
  const deadline = started + durationMs;
  while (performance.now() < deadline && latencies.length < 100_000) {
    const start = performance.now();
    if (!(await once())) errors++;
    latencies.push(performance.now() - start);
  }
  const elapsed = performance.now() - started;
  latencies.sort((a, b) => a - b);
  const at = (p: number) => latencies[Math.min(latencies.length - 1, Math.floor((p / 100) * latencies.length))] ?? Number.NaN;
  return { calls: latencies.length, errors, perSecond: (latencies.length / elapsed) * 1000, p50: at(50), p99: at(99) };
}

const dataDir = mkdtempSync(join(tmpdir(), "engine-bench-mcp-"));
const consoleDir = mkdtempSync(join(tmpdir(), "engine-bench-relay-console-"));
// The console first: the engine links to it before it starts, so its tunnel opens at start.
const consoleProcess = Bun.spawn([process.execPath, join(root, "bench", "relay-console.ts"), consoleDir], {
  stdout: "pipe",
  stderr: "inherit",
});
// However the run ends, the console process goes with it.
process.on("exit", () => consoleProcess.kill("SIGTERM"));
const relay = await (async () => {
  const reader = consoleProcess.stdout.getReader();
  let text = "";
  while (!text.includes("\n")) {
    const { value, done } = await reader.read();
    if (done) throw new Error("bench/relay-console.ts ended before it printed its address");
    text += new TextDecoder().decode(value);
  }
  reader.releaseLock();
  return JSON.parse(text.slice(0, text.indexOf("\n"))) as { url: string; key: string; token: string };
})();
const linked = Bun.spawnSync([binary, "link", "--data-dir", dataDir, "--cloud", relay.url, "--key", relay.key], { stderr: "inherit" });
if (linked.exitCode !== 0) throw new Error("engine link failed");
const port = await freePort();
const engine = Bun.spawn([binary, "serve", "--data-dir", dataDir, "--port", String(port), "--log-level", "warn"], {
  env: { ...process.env, ENGINE_PROXY: "off" },
  stdout: "ignore",
  stderr: "inherit",
});
const clients: Client[] = [];
try {
  const base = `http://127.0.0.1:${port}`;
  await waitForHttp(`${base}/api/health`);
  const token = readFileSync(join(dataDir, "admin.token"), "utf8").trim();
  const headers = { authorization: `Bearer ${token}` };
  for (let i = 0; i < serviceCount; i++) {
    const response = await fetch(`${base}/api/services`, {
      method: "POST",
      headers: { ...headers, "content-type": "application/json" },
      body: JSON.stringify({ name: `svc-${i}`, command: "exec sleep 600" }),
    });
    if (response.status !== 201) throw new Error(`deploy failed: ${response.status} ${await response.text()}`);
  }

  const http = (path: string) => async () => {
    const response = await fetch(`${base}${path}`, { headers });
    await response.arrayBuffer();
    return response.ok;
  };
  const connect = async (transport: StreamableHTTPClientTransport | StdioClientTransport, modern: boolean) => {
    const client = new Client({ name: "bench", version: "1.0.0" }, modern ? { versionNegotiation: { mode: { pin: "2026-07-28" } } } : {});
    await client.connect(transport);
    clients.push(client);
    return client;
  };
  // The relayed rows need the tunnel up.
  const deadline = Date.now() + 20_000;
  for (;;) {
    const status = (await (await fetch(`${base}/api/link/status`, { headers })).json()) as { tunnel: { state: string } };
    if (status.tunnel.state === "connected") break;
    if (Date.now() > deadline) throw new Error(`the engine's tunnel did not connect: ${JSON.stringify(status.tunnel)}`);
    await Bun.sleep(50);
  }
  const url = new URL(`${base}/mcp`);
  const relayed = new URL(`${relay.url}/mcp`);
  const relayHeaders = { authorization: `Bearer ${relay.token}` };
  const targets: [string, Client][] = [
    ["/mcp 2026-07-28", await connect(new StreamableHTTPClientTransport(url, { requestInit: { headers } }), true)],
    ["/mcp 2025-11-25", await connect(new StreamableHTTPClientTransport(url, { requestInit: { headers } }), false)],
    [
      "stdio (engine mcp)",
      await connect(new StdioClientTransport({ command: binary, args: ["mcp", "--data-dir", dataDir], stderr: "inherit" }), false),
    ],
    [
      "relayed: console /mcp 2026-07-28",
      await connect(new StreamableHTTPClientTransport(relayed, { requestInit: { headers: relayHeaders } }), true),
    ],
    [
      "relayed: console /mcp 2025-11-25",
      await connect(new StreamableHTTPClientTransport(relayed, { requestInit: { headers: relayHeaders } }), false),
    ],
  ];
  const tool = (client: Client, name: string, args: Record<string, unknown>) => async () => {
    const result = await client.callTool({ name, arguments: args });
    return result.isError !== true;
  };

  const rows: (string | number)[][] = [];
  const operations: [string, string, string, Record<string, unknown>][] = [
    ["list services", "/api/services", "list_services", {}],
    ["diagnose", "/api/services/svc-0/diagnose", "diagnose", { service: "svc-0" }],
  ];
  for (const [label, path, name, args] of operations) {
    const direct = await measure(http(path));
    rows.push([`${label}: HTTP GET ${path}`, fmt(direct.perSecond, 0), fmt(direct.p50), fmt(direct.p99), "1.00", direct.errors]);
    for (const [transport, client] of targets) {
      const timing = await measure(tool(client, name, args));
      rows.push([
        `${label}: ${transport}`,
        fmt(timing.perSecond, 0),
        fmt(timing.p50),
        fmt(timing.p99),
        fmt(timing.p50 / direct.p50),
        timing.errors,
      ]);
    }
  }
  printRows(
    `MCP tool calls (compiled binary, ${serviceCount} services, one client, sequential calls, ${durationMs} ms each; client in this process, console in its own)`,
    ["target", "calls/s", "p50 ms", "p99 ms", "p50 ratio", "errors"],
    rows,
  );
} finally {
  for (const client of clients) await client.close().catch(() => undefined);
  engine.kill("SIGTERM");
  await engine.exited;
  consoleProcess.kill("SIGTERM");
  await consoleProcess.exited;
  rmSync(consoleDir, { recursive: true, force: true });
  // The services were handed over, not stopped: end them and their shims by their recorded pids.
  reapWorkloads(dataDir);
  rmSync(dataDir, { recursive: true, force: true });
}
