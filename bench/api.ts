/**
 * bench/api.ts: requests/s and p50/p99 of GET /api/tokens (with bearer auth) and
 * GET /api/app-templates on the compiled binary, next to a bare Bun.serve returning the same
 * JSON bytes in the same run. The ratio engine/bare is the figure.
 *
 * Usage: bun bench/api.ts [--duration-ms 3000] [--concurrency 32]
 */
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fmt, freePort, loadTest, printRows, waitForHttp } from "./lib";

const root = join(import.meta.dir, "..");
const arg = (name: string, fallback: number) => {
  const index = process.argv.indexOf(name);
  return index >= 0 ? Number(process.argv[index + 1]) : fallback;
};
const durationMs = arg("--duration-ms", 3000);
const concurrency = arg("--concurrency", 32);

const binary = join(root, "dist", "engine");
if (!existsSync(binary) || process.argv.includes("--rebuild")) {
  const build = Bun.spawnSync([process.execPath, join(root, "build.ts")], { stdout: "inherit", stderr: "inherit" });
  if (build.exitCode !== 0) process.exit(1);
}

const dataDir = mkdtempSync(join(tmpdir(), "engine-bench-"));
const enginePort = await freePort();
const engine = Bun.spawn([binary, "serve", "--data-dir", dataDir, "--port", String(enginePort), "--log-level", "warn"], {
  stdout: "ignore",
  stderr: "inherit",
});
let anchor: ReturnType<typeof Bun.spawn> | undefined;
try {
  const base = `http://127.0.0.1:${enginePort}`;
  await waitForHttp(`${base}/api/health`);
  const token = readFileSync(join(dataDir, "admin.token"), "utf8").trim();
  const headers = { authorization: `Bearer ${token}` };

  // The anchor serves the very bytes the engine serves, from a separate process like the engine.
  const tokensBody = await (await fetch(`${base}/api/tokens`, { headers })).text();
  const templatesBody = await (await fetch(`${base}/api/app-templates`, { headers })).text();
  const anchorPort = await freePort();
  const anchorSource = `
    const bodies = { "/api/tokens": ${JSON.stringify(tokensBody)}, "/api/app-templates": ${JSON.stringify(templatesBody)} };
    Bun.serve({ port: ${anchorPort}, hostname: "127.0.0.1", fetch(req) {
      const body = bodies[new URL(req.url).pathname];
      return body ? new Response(body, { headers: { "content-type": "application/json" } }) : new Response("not found", { status: 404 });
    }});`;
  anchor = Bun.spawn([process.execPath, "-e", anchorSource], { stdout: "ignore", stderr: "inherit" });
  const anchorBase = `http://127.0.0.1:${anchorPort}`;
  await waitForHttp(`${anchorBase}/api/tokens`);

  const rows: (string | number)[][] = [];
  for (const path of ["/api/tokens", "/api/app-templates"]) {
    const bare = await loadTest(`${anchorBase}${path}`, { concurrency, durationMs });
    const ours = await loadTest(`${base}${path}`, { headers, concurrency, durationMs });
    if (ours.errors > 0 || bare.errors > 0) console.warn(`errors: engine ${ours.errors}, bare ${bare.errors}`);
    rows.push([`bare Bun.serve ${path}`, fmt(bare.rps, 0), fmt(bare.p50), fmt(bare.p99), "1.00"]);
    rows.push([`engine ${path}`, fmt(ours.rps, 0), fmt(ours.p50), fmt(ours.p99), fmt(ours.rps / bare.rps)]);
  }
  printRows(
    `API (compiled binary, ${concurrency} keep-alive connections, ${durationMs} ms each; client in this process)`,
    ["target", "req/s", "p50 ms", "p99 ms", "req/s ratio"],
    rows,
  );
} finally {
  anchor?.kill();
  engine.kill("SIGTERM");
  await engine.exited;
  rmSync(dataDir, { recursive: true, force: true });
}
