/**
 * bench/proxy.ts: the engine's reverse proxy against nginx and Caddy as plain reverse proxies
 * of the same upstream (a Bun.serve answering "hello", run as an engine service), over HTTP and
 * HTTPS, driven by wrk with keep-alive connections. Each figure is printed next to its anchors
 * measured in the same run: the upstream reached directly, and nginx. "cpu us/req" is the
 * proxy's own processes' CPU time per request served, the steadiest figure on a small noisy box
 * where the load generator, the proxy and the upstream share the cores.
 *
 * The engine is started from source with its proxy on free ports; the upstream is deployed with
 * a `port` through POST /api/services and reached by its `.localhost` name, which the proxy
 * serves on both its HTTP and HTTPS ports. When a part cannot run (no wrk, nginx, caddy or
 * openssl; the engine's proxy not available) the bench says so and measures the rest.
 * Every process it starts is ended, on failure too.
 *
 * Fairness: nginx runs one worker per core (`worker_processes auto`), Caddy one Go thread per
 * core (its default), and the engine its default of one proxy process per core unless
 * `--proxy-processes` says otherwise; all three keep connections to the upstream alive (nginx
 * `keepalive 64`, Caddy's and the engine's pools by default) and add the same forwarding
 * fields; nginx and Caddy serve an ECDSA P-256 certificate like the engine's local CA issues,
 * and the TLS version and cipher each one negotiates are printed. The runs are interleaved
 * (the proxies' order rotates each run, the direct anchor runs last in each) so that the load
 * of other processes on this shared box, and the moment just after the direct anchor, fall on
 * every proxy alike, and each run prints the load average it met. The tables give the
 * median of the runs and their spread (lowest–highest); the ratio to nginx is taken run by run.
 *
 * On a machine with many cores, `--wrk-threads` gives the load generator more threads and
 * `--upstream-processes` runs the upstream as that many processes on one SO_REUSEPORT port, so
 * that neither the client nor the upstream is what bounds the proxies.
 *
 * `--compiled` runs the engine as users do, the compiled `dist/engine` (its proxy processes are
 * the binary itself, running the proxy bundle it carries), instead of Bun on the source. After the runs, each
 * proxy's processes' memory is printed: resident and anonymous (the heap and the allocator's
 * pages, what a process adds beyond the shared binary).
 *
 * The engine pins each proxy process's event loop to a CPU of its own by default (decision 521);
 * `--no-cpu-affinity` runs it with ENGINE_PROXY_CPU_AFFINITY=off, and `--nginx-cpu-affinity`
 * gives nginx the same (`worker_cpu_affinity auto`, which its default leaves off).
 *
 * BUN_JSC_* settings in the bench's environment go to the engine and its proxy processes (lib.ts
 * runtimeOptions), to measure the runtime's options (its collector's, say).
 *
 * Usage: bun bench/proxy.ts [--duration-s 5] [--warmup-s 1] [--runs 5] [--connections 32] [--proxy-processes N]
 *          [--wrk-threads 2] [--upstream-processes 1] [--compiled] [--no-cpu-affinity] [--nginx-cpu-affinity]
 */
import { chmodSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { availableParallelism, loadavg } from "node:os";
import { join } from "node:path";
import { readTcpSockets, socketInodes } from "../src/engine/services/diagnose/ports";
import { reapWorkloads, type SpawnedEngine, spawnEngine, tempDir } from "../test/helpers";
import { allocatorSettingOf, fmt, freePort, median, numericArg, printRows, runtimeOptions } from "./lib";

const DURATION_S = numericArg("--duration-s", 5);
const RUNS = numericArg("--runs", 5);
/** WARMUP_S of unrecorded load on a target precede each of its measurements (`--warmup-s 0`: none). */
const WARMUP_S = numericArg("--warmup-s", 1, 0);
const CONNECTIONS = numericArg("--connections", 32);
const PROXY_PROCESSES = numericArg("--proxy-processes", 0);
const WRK_THREADS = numericArg("--wrk-threads", 2);
const UPSTREAM_PROCESSES = numericArg("--upstream-processes", 1);
/** NO_CPU_AFFINITY leaves the engine's proxy processes unpinned; NGINX_CPU_AFFINITY pins nginx's workers (decision 521). */
const NO_CPU_AFFINITY = process.argv.includes("--no-cpu-affinity");
const NGINX_CPU_AFFINITY = process.argv.includes("--nginx-cpu-affinity");
/** COMPILED is the built binary, run instead of the source with --compiled. */
const COMPILED = process.argv.includes("--compiled") ? join(import.meta.dir, "..", "dist", "engine") : null;
if (COMPILED && !existsSync(COMPILED)) {
  console.error(`--compiled: ${COMPILED} does not exist; run bun build.ts first`);
  process.exit(1);
}
/** SERVICE is the upstream's service name; the proxy routes `<SERVICE>.localhost` to it. */
const SERVICE = "hello";
const HOST = `${SERVICE}.localhost`;
/** STARTUP_DEADLINE_MS bounds each wait for a process or route to come up. */
const STARTUP_DEADLINE_MS = 20_000;

interface WrkResult {
  rps: number;
  p99Ms: number;
  requests: number;
  errors: number;
  cpuUsPerRequest: number;
  /** load is the 1-minute load average when the run began. */
  load: number;
  /** split is how many of wrk's connections each of the proxy's processes held a second in, most first. */
  split: number[];
}

interface Target {
  name: string;
  /** config says how the target is set up, for the bench's output. */
  config: string;
  http?: string;
  https?: string;
  /** pids are the proxy's processes, whose CPU time is charged to its requests (none for direct). */
  pids: () => number[];
}

const wrk = Bun.which("wrk");
if (!wrk) {
  console.log("\nProxy: skipped (wrk is not installed; apt-get install wrk)");
  process.exit(0);
}

const clockTicks = (() => {
  const result = Bun.spawnSync(["getconf", "CLK_TCK"], { stdout: "pipe", stderr: "ignore" });
  const ticks = Number(result.stdout.toString().trim());
  return Number.isFinite(ticks) && ticks > 0 ? ticks : 100;
})();

/** cpuTicks sums user and system time of `pids` (all their threads), in clock ticks. */
function cpuTicks(pids: number[]): number {
  let total = 0;
  for (const pid of pids) {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
      // Fields after the command name, which is in parentheses and may contain spaces.
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      total += Number(fields[11]) + Number(fields[12]);
    } catch {
      // exited
    }
  }
  return total;
}

/** memoryOf is the resident and anonymous memory of each of `pids`, in MB, read from /proc (processes gone are left out). */
function memoryOf(pids: number[]): { rss: number; anon: number }[] {
  return pids.flatMap((pid) => {
    try {
      const text = readFileSync(`/proc/${pid}/smaps_rollup`, "utf8");
      const kb = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(text)?.[1] ?? Number.NaN);
      return [{ rss: kb("Rss") / 1024, anon: kb("Anonymous") / 1024 }];
    } catch {
      return [];
    }
  });
}

/** withChildren returns `pid` and its direct children (nginx's workers under its master). */
function withChildren(pid: number | undefined): number[] {
  if (!pid) return [];
  const pids = [pid];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      if (Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]) === pid) pids.push(Number(entry));
    } catch {
      // exited
    }
  }
  return pids;
}

function toMs(value: string, unit: string): number {
  const n = Number(value);
  return unit === "us" ? n / 1000 : unit === "s" ? n * 1000 : unit === "m" ? n * 60_000 : n;
}

/** runWrk drives `url` with wrk for `seconds`, Host: HOST, and charges the proxy's CPU to its requests. */
async function runWrk(url: string, pids: number[], seconds = DURATION_S, acceptors = pids): Promise<WrkResult> {
  const load = loadavg()[0] ?? Number.NaN;
  const before = cpuTicks(pids);
  const proc = Bun.spawn(
    [wrk as string, `-t${WRK_THREADS}`, `-c${CONNECTIONS}`, `-d${seconds}s`, "--latency", "--timeout", "5s", "-H", `Host: ${HOST}`, url],
    { stdout: "pipe", stderr: "pipe" },
  );
  const killer = setTimeout(() => proc.kill("SIGKILL"), (seconds + 15) * 1000);
  let split: number[] = [];
  const splitTimer = setTimeout(
    () => {
      split = connectionsByProcess(Number(new URL(url).port), acceptors);
    },
    Math.min(1000, (seconds * 1000) / 2),
  );
  const [out, err] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  clearTimeout(splitTimer);
  clearTimeout(killer);
  const after = cpuTicks(pids);
  const rps = Number(/Requests\/sec:\s+([\d.]+)/.exec(out)?.[1] ?? Number.NaN);
  const p99 = /^\s+99%\s+([\d.]+)(us|ms|s|m)\s*$/m.exec(out);
  const requests = Number(/(\d+) requests in/.exec(out)?.[1] ?? 0);
  const socket = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(out);
  const errors =
    Number(/Non-2xx or 3xx responses: (\d+)/.exec(out)?.[1] ?? 0) + (socket ? socket.slice(1).reduce((a, b) => a + Number(b), 0) : 0);
  if (!Number.isFinite(rps)) throw new Error(`wrk ${url}: ${(err || out).trim().slice(0, 300)}`);
  return {
    rps,
    p99Ms: p99 ? toMs(p99[1] ?? "", p99[2] ?? "ms") : Number.NaN,
    requests,
    errors,
    cpuUsPerRequest: pids.length > 0 && requests > 0 ? (((after - before) / clockTicks) * 1e6) / requests : Number.NaN,
    load,
    split,
  };
}

/** servingPids are a target's processes that accept and serve connections: nginx's workers, not its master. */
function servingPids(target: Target): number[] {
  return target.name === "nginx" ? target.pids().slice(1) : target.pids();
}

/**
 * connectionsByProcess counts the established TCP connections on local `port` that each of
 * `pids` holds, most first: how the kernel spread a client's connections over the processes
 * that accept them (the /proc readers of diagnosis's port holder).
 */
function connectionsByProcess(port: number, pids: number[]): number[] {
  const established = new Set((readTcpSockets("/proc", "01").get(port) ?? []).map((socket) => socket.inode));
  return pids.map((pid) => socketInodes(pid).filter((inode) => established.has(inode)).length).sort((a, b) => b - a);
}

/** answers fetches `url` with Host: HOST (TLS unverified: wrk does not verify either) and checks the body. */
async function answers(url: string): Promise<boolean> {
  try {
    const response = await fetch(url, { headers: { host: HOST }, tls: { rejectUnauthorized: false } } as RequestInit);
    return response.ok && (await response.text()) === "hello";
  } catch {
    return false;
  }
}

async function until(what: string, check: () => Promise<boolean>, timeoutMs = STARTUP_DEADLINE_MS): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check()) return;
    await Bun.sleep(100);
  }
  throw new Error(`${what} not ready within ${timeoutMs} ms`);
}

/** programVersion is the first version-looking word a program prints about itself, or "?". */
function programVersion(command: string[]): string {
  const result = Bun.spawnSync(command, { stdout: "pipe", stderr: "pipe" });
  const text = `${result.stdout.toString()} ${result.stderr.toString()}`;
  return /v?\d+\.\d+(?:\.\d+)?/.exec(text)?.[0] ?? "?";
}

/** negotiated is the TLS version and cipher `openssl s_client` gets from `url` with SNI HOST (what wrk's OpenSSL gets too). */
function negotiated(url: string): string {
  if (!Bun.which("openssl")) return "unknown (no openssl)";
  const { host } = new URL(url);
  const result = Bun.spawnSync(["openssl", "s_client", "-connect", host, "-servername", HOST, "-brief"], {
    stdin: new Blob([""]),
    stdout: "pipe",
    stderr: "pipe",
  });
  const text = `${result.stdout.toString()}\n${result.stderr.toString()}`;
  const version = /Protocol version: (\S+)/.exec(text)?.[1];
  const cipher = /Ciphersuite: (\S+)/.exec(text)?.[1];
  const signature = /Peer signature type: (\S+)/.exec(text)?.[1];
  return version && cipher ? `${version} ${cipher}${signature ? `, ${signature} signature` : ""}` : "unknown (openssl s_client failed)";
}

const workDir = tempDir("engine-bench-proxy-");
// As root the upstream service runs as its own user (eng-hello), which must reach its script.
chmodSync(workDir, 0o755);
const dataDir = join(workDir, "engine");
mkdirSync(dataDir);
const procs: ReturnType<typeof Bun.spawn>[] = [];
let engine: SpawnedEngine | undefined;
const notes: string[] = [];

/** start runs a helper process with its output in `<workDir>/<name>.log`; `finally` ends it. */
function start(name: string, command: string[], env: Record<string, string> = {}): ReturnType<typeof Bun.spawn> {
  const log = Bun.file(join(workDir, `${name}.log`));
  const proc = Bun.spawn(command, { cwd: workDir, env: { ...process.env, ...env }, stdout: log, stderr: log });
  procs.push(proc);
  return proc;
}

/**
 * stopStrayEngine ends an engine serving `dataDir` that spawnEngine gave up on (it throws
 * without a handle when the engine never says "listening"); the engine stops its proxy processes.
 */
async function stopStrayEngine(dataDir: string): Promise<void> {
  const marker = `\0--data-dir\0${dataDir}\0`;
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (readFileSync(`/proc/${entry}/cmdline`, "utf8").includes(marker)) process.kill(Number(entry), "SIGTERM");
    } catch {
      // exited, or not ours to read
    }
  }
  await Bun.sleep(1000);
}

/** exitedWith describes a helper that exited early, with the end of its log. */
function exitedWith(name: string, proc: ReturnType<typeof Bun.spawn>): Error {
  let log = "";
  try {
    log = readFileSync(join(workDir, `${name}.log`), "utf8")
      .trim()
      .split("\n")
      .slice(-2)
      .join(" | ");
  } catch {
    // no log
  }
  return new Error(`${name} exited with ${proc.exitCode}: ${log.slice(0, 300)}`);
}

try {
  const upstreamFile = join(workDir, "upstream.ts");
  writeFileSync(
    upstreamFile,
    // With UPSTREAM_PROCESSES > 1 the first process starts the others, all on one SO_REUSEPORT
    // port; they share its process group, so stopping the service ends them all.
    `const processes = Number(process.env.UPSTREAM_PROCESSES || 1);
if (!process.env.UPSTREAM_CHILD) {
  for (let i = 1; i < processes; i++) Bun.spawn([process.execPath, import.meta.path], { env: { ...process.env, UPSTREAM_CHILD: "1" }, stdio: ["ignore", "inherit", "inherit"] });
}
Bun.serve({ hostname: "127.0.0.1", port: Number(process.env.PORT), reusePort: processes > 1, fetch: () => new Response("hello") });
`,
  );
  const upstreamEnv = { UPSTREAM_PROCESSES: String(UPSTREAM_PROCESSES) };

  // ------------------------------------------------------------ the engine, with the upstream as its service
  let upstreamPort = 0;
  let engineTarget: Target | undefined;
  let step = "starting the engine";
  try {
    engine = await spawnEngine(dataDir, {
      ...(COMPILED ? { command: [COMPILED] } : {}),
      env: {
        ENGINE_PROXY: "on",
        ENGINE_HTTPS_PORT: "0",
        ENGINE_HTTP_PORT: "0",
        ENGINE_MDNS: "off",
        ENGINE_HOSTNAME: "bench",
        ...(PROXY_PROCESSES > 0 ? { ENGINE_PROXY_PROCESSES: String(PROXY_PROCESSES) } : {}),
        ...(NO_CPU_AFFINITY ? { ENGINE_PROXY_CPU_AFFINITY: "off" } : {}),
        ...runtimeOptions(),
      },
    });
    const base = engine.url;
    const token = readFileSync(join(dataDir, "admin.token"), "utf8").trim();
    const headers = { authorization: `Bearer ${token}`, "content-type": "application/json" };
    step = "deploying the upstream";
    const port = await freePort();
    const deployed = await fetch(`${base}/api/services`, {
      method: "POST",
      headers,
      body: JSON.stringify({ name: SERVICE, port, command: [process.execPath, upstreamFile], env: upstreamEnv }),
    });
    if (deployed.status !== 201) throw new Error(`POST /api/services answered ${deployed.status}: ${await deployed.text()}`);
    await until("the upstream service", () => answers(`http://127.0.0.1:${port}/`));
    upstreamPort = port;
    step = "reading the proxy's status";
    interface Status {
      https_port?: number;
      tls?: { http_port?: number };
      respawn?: { processes?: number; pids?: number[]; cpus?: (number | null)[] };
      routes?: { items?: { host: string; state: string }[] };
    }
    const status = async (): Promise<Status> => {
      const response = await fetch(`${base}/api/proxy/status`, { headers });
      if (response.status !== 200) throw new Error(`GET /api/proxy/status answered ${response.status}`);
      return (await response.json()) as Status;
    };
    await until(`route ${HOST}`, async () => ((await status()).routes?.items ?? []).some((r) => r.host === HOST && r.state === "up"));
    const current = await status();
    const httpPort = current.tls?.http_port;
    const httpsPort = current.https_port;
    if (!httpPort || !httpsPort) throw new Error("GET /api/proxy/status has no https_port or tls.http_port");
    step = "proxying";
    const http = `http://127.0.0.1:${httpPort}/`;
    const https = `https://127.0.0.1:${httpsPort}/`;
    await until(`the proxy over HTTP (${http})`, () => answers(http));
    await until(`the proxy over HTTPS (${https})`, () => answers(https));
    const processes = current.respawn?.processes ?? 0;
    const cpus = current.respawn?.cpus ?? [];
    const pinned = cpus.some((cpu) => cpu !== null)
      ? `event loops pinned to CPUs ${cpus.map((cpu) => cpu ?? "none").join(" / ")}`
      : `not pinned${NO_CPU_AFFINITY ? " (--no-cpu-affinity)" : ""}`;
    const purge = allocatorSettingOf(current.respawn?.pids?.[0]);
    engineTarget = {
      name: "engine",
      config:
        `${COMPILED ? "the compiled dist/engine" : "from source"}, ` +
        `${processes} proxy process${processes === 1 ? "" : "es"} (${PROXY_PROCESSES > 0 ? "--proxy-processes" : "the default: one per core"}), ` +
        `${pinned}, ${purge}, SO_REUSEPORT, keep-alive pool to the upstream (256 idle connections at most), X-Forwarded-For/-Proto/-Host, X-Real-IP`,
      http,
      https,
      pids: () => current.respawn?.pids ?? [],
    };
  } catch (error) {
    notes.push(`engine proxy: not available (${step}: ${(error as Error).message.split("\n")[0]})`);
  }
  if (!upstreamPort) {
    upstreamPort = await freePort();
    start("upstream", [process.execPath, upstreamFile], { PORT: String(upstreamPort), ...upstreamEnv });
    await until("the upstream", () => answers(`http://127.0.0.1:${upstreamPort}/`));
  }
  const upstream = `127.0.0.1:${upstreamPort}`;

  // ------------------------------------------------------------ a certificate for nginx and Caddy
  let certificate: { cert: string; key: string } | undefined;
  if (Bun.which("openssl")) {
    const cert = join(workDir, "cert.pem");
    const key = join(workDir, "key.pem");
    const made = Bun.spawnSync(
      // ECDSA P-256, the key type of the engine's local CA leaves, so every handshake and signature costs the same.
      // biome-ignore format: one command line
      ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", `/CN=${HOST}`, "-addext", `subjectAltName=DNS:${HOST}`],
      { stdout: "ignore", stderr: "pipe" },
    );
    if (made.exitCode === 0) certificate = { cert, key };
    else notes.push(`HTTPS for nginx and Caddy: skipped (openssl failed: ${made.stderr.toString().trim().slice(0, 200)})`);
  } else notes.push("HTTPS for nginx and Caddy: skipped (openssl is not installed)");

  // ------------------------------------------------------------ nginx
  let nginxTarget: Target | undefined;
  if (Bun.which("nginx")) {
    try {
      const [http, https] = [await freePort(), await freePort()];
      const temp = (name: string) => `${name}_temp_path ${join(workDir, `nginx-${name}`)};`;
      writeFileSync(
        join(workDir, "nginx.conf"),
        `worker_processes auto;
${NGINX_CPU_AFFINITY ? "worker_cpu_affinity auto;\n" : ""}daemon off;
pid ${join(workDir, "nginx.pid")};
error_log ${join(workDir, "nginx-error.log")} warn;
events { worker_connections 4096; }
http {
  access_log off;
  ${["client_body", "proxy", "fastcgi", "uwsgi", "scgi"].map(temp).join("\n  ")}
  upstream bench { server ${upstream}; keepalive 64; }
  server {
    listen 127.0.0.1:${http};
    ${certificate ? `listen 127.0.0.1:${https} ssl;\n    ssl_certificate ${certificate.cert};\n    ssl_certificate_key ${certificate.key};\n    ssl_protocols TLSv1.3;` : ""}
    location / {
      proxy_pass http://bench;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
    }
  }
}
`,
      );
      const nginx = start("nginx", ["nginx", "-p", workDir, "-c", join(workDir, "nginx.conf"), "-e", join(workDir, "nginx-error.log")]);
      const urls = { http: `http://127.0.0.1:${http}/`, https: certificate ? `https://127.0.0.1:${https}/` : undefined };
      await until("nginx", async () => {
        if (nginx.exitCode !== null) throw exitedWith("nginx", nginx);
        return (await answers(urls.http)) && (!urls.https || (await answers(urls.https)));
      });
      const workers = withChildren(nginx.pid).length - 1;
      nginxTarget = {
        name: "nginx",
        config:
          `nginx ${programVersion(["nginx", "-v"])}: worker_processes auto (${workers} workers)${NGINX_CPU_AFFINITY ? ", worker_cpu_affinity auto" : ""}, access_log off, ssl_protocols TLSv1.3, ` +
          "upstream keepalive 64 over HTTP/1.1, X-Forwarded-For/-Proto, Host",
        ...urls,
        pids: () => withChildren(nginx.pid),
      };
    } catch (error) {
      notes.push(`nginx: not available (${(error as Error).message.split("\n")[0]})`);
    }
  } else notes.push("nginx: skipped (not installed)");

  // ------------------------------------------------------------ Caddy
  let caddyTarget: Target | undefined;
  if (Bun.which("caddy")) {
    try {
      const [http, https] = [await freePort(), await freePort()];
      writeFileSync(
        join(workDir, "Caddyfile"),
        `{
  admin off
  auto_https off
}
http://:${http} {
  bind 127.0.0.1
  reverse_proxy ${upstream}
}
${certificate ? `https://:${https} {\n  bind 127.0.0.1\n  tls ${certificate.cert} ${certificate.key}\n  reverse_proxy ${upstream}\n}\n` : ""}`,
      );
      // Caddy keeps its state under XDG dirs; point them at the temp dir so the bench leaves nothing behind.
      const caddy = start("caddy", ["caddy", "run", "--config", join(workDir, "Caddyfile"), "--adapter", "caddyfile"], {
        HOME: workDir,
        XDG_CONFIG_HOME: join(workDir, "xdg-config"),
        XDG_DATA_HOME: join(workDir, "xdg-data"),
      });
      const urls = { http: `http://127.0.0.1:${http}/`, https: certificate ? `https://127.0.0.1:${https}/` : undefined };
      await until("caddy", async () => {
        if (caddy.exitCode !== null) throw exitedWith("caddy", caddy);
        return (await answers(urls.http)) && (!urls.https || (await answers(urls.https)));
      });
      caddyTarget = {
        name: "caddy",
        config: `Caddy ${programVersion(["caddy", "version"])}: reverse_proxy with its defaults (keep-alive to the upstream, GOMAXPROCS = cores), admin off`,
        ...urls,
        pids: () => [caddy.pid],
      };
    } catch (error) {
      notes.push(`caddy: not available (${(error as Error).message.split("\n")[0]})`);
    }
  } else notes.push("caddy: skipped (not installed)");

  // ------------------------------------------------------------ measure, interleaved
  const direct: Target = {
    name: "direct",
    config: `wrk to the upstream itself (${UPSTREAM_PROCESSES} process${UPSTREAM_PROCESSES === 1 ? "" : "es"}), no proxy`,
    http: `http://${upstream}/`,
    pids: () => [],
  };
  const targets = [direct, engineTarget, nginxTarget, caddyTarget].filter((t): t is Target => t !== undefined);
  const missing = [
    engineTarget ? null : "the engine's proxy (see the note below): nothing to compare",
    nginxTarget ? null : "nginx (apt-get install nginx-light): no ratio to nginx can be given",
    caddyTarget ? null : "caddy (apt-get install caddy)",
    certificate ? null : "openssl (HTTPS for nginx and Caddy)",
  ].filter((line): line is string => line !== null);
  console.log(
    `\nProxy bench: wrk -t${WRK_THREADS} -c${CONNECTIONS} -d${DURATION_S}s --latency -H 'Host: ${HOST}', keep-alive; ${RUNS} runs, interleaved; each measurement follows ${WARMUP_S} s of unrecorded load on the same target`,
  );
  console.log(`machine: ${availableParallelism()} cores, shared by everything here (wrk, the upstream, the proxies, other work)`);
  console.log(`upstream: Bun.serve answering "hello" on ${upstream} (the engine's service "${SERVICE}")`);
  console.log("certificates: ECDSA P-256 for all three (the engine's from its local CA; nginx's and Caddy's self-signed); TLS 1.3");
  for (const target of targets) console.log(`${target.name}: ${target.config}`);
  for (const target of targets) {
    if (target.https) console.log(`TLS of ${target.name}: ${negotiated(target.https)}`);
  }
  for (const line of missing) console.log(`ANCHOR MISSING: ${line}`);

  const results = new Map<string, WrkResult[]>();
  for (let run = 0; run < RUNS; run++) {
    // Rotate the proxies each run so none always follows the same one or meets the same moment,
    // and run the direct anchor last. The first proxy measured after it is often 20-25 % slower,
    // nginx and the engine alike (decisions 472); with the anchor last, that moment falls on each
    // proxy in turn, at the start of the next run, rather than on whichever the rotation puts after it.
    const proxies = targets.filter((t) => t !== direct);
    const order = [...proxies.map((_, i) => proxies[(i + run) % proxies.length] as Target), ...(direct ? [direct] : [])];
    const line: string[] = [];
    for (const target of order) {
      for (const scheme of ["http", "https"] as const) {
        const url = target[scheme];
        if (!url) continue;
        try {
          if (WARMUP_S > 0) await runWrk(url, [], WARMUP_S);
          const result = await runWrk(url, target.pids(), DURATION_S, servingPids(target));
          const key = `${target.name} ${scheme}`;
          results.set(key, [...(results.get(key) ?? []), result]);
          const split = result.split.length > 1 ? `, connections ${result.split.join("/")}` : "";
          line.push(`${key} ${fmt(result.rps / 1000, 1)}k p99 ${fmt(result.p99Ms, 1)} ms (load ${fmt(result.load, 1)}${split})`);
        } catch (error) {
          notes.push(`${target.name} ${scheme}: ${(error as Error).message}`);
        }
      }
    }
    console.log(`run ${run + 1}: ${line.join(" | ")}`);
  }
  // Memory after the runs, each proxy's serving processes.
  const memoryLines = targets.flatMap((target) => {
    if (target === direct) return [];
    const memory = memoryOf(servingPids(target));
    if (memory.length === 0) return [];
    const each = (field: "rss" | "anon") => memory.map((m) => fmt(m[field], 1)).join(" / ");
    return [
      `${target.name} ${memory.length} process${memory.length === 1 ? "" : "es"}: RSS ${each("rss")} MB, anonymous ${each("anon")} MB`,
    ];
  });
  if (memoryLines.length > 0) console.log(`memory after the runs: ${memoryLines.join("; ")}`);

  /** spread is "median (lowest–highest)" of the figures. */
  const spread = (values: number[], digits: number) =>
    values.length === 0
      ? "n/a"
      : `${fmt(median(values), digits)} (${fmt(Math.min(...values), digits)}–${fmt(Math.max(...values), digits)})`;
  /** ratios pairs run i of `key` with run i of nginx: the two met the same moment of the box. */
  const ratios = (key: string, scheme: string, field: "rps" | "p99Ms" | "cpuUsPerRequest") => {
    const mine = results.get(key) ?? [];
    const theirs = results.get(`nginx ${scheme}`) ?? [];
    return mine.flatMap((result, i) => (theirs[i] ? [result[field] / (theirs[i] as WrkResult)[field]] : []));
  };
  for (const scheme of ["http", "https"] as const) {
    const rows: (string | number)[][] = [];
    for (const target of targets) {
      const runs = results.get(`${target.name} ${scheme}`);
      if (!runs || runs.length === 0) continue;
      rows.push([
        target.name,
        spread(
          runs.map((r) => r.rps),
          0,
        ),
        spread(
          runs.map((r) => r.p99Ms),
          2,
        ),
        nginxTarget ? spread(ratios(`${target.name} ${scheme}`, scheme, "rps"), 2) : "n/a (no nginx)",
        spread(
          runs.map((r) => r.cpuUsPerRequest),
          1,
        ),
        runs.reduce((sum, r) => sum + r.errors, 0),
        spread(
          runs.map((r) => r.load),
          1,
        ),
      ]);
    }
    printRows(
      `Proxy over ${scheme.toUpperCase()}: median (lowest–highest) of ${RUNS} runs; /nginx is taken run by run`,
      ["target", "req/s", "p99 ms", "/nginx", "cpu us/req", "errors", "load avg"],
      rows,
    );
  }

  // ------------------------------------------------------------ the goals of issue 17
  const goalRows: string[][] = [];
  for (const [scheme, label, goal, wanted] of [
    ["https", "proxy vs nginx, HTTPS keep-alive", "≥ 1.1× with p99 ≤ nginx's", 1.1],
    ["http", "proxy vs nginx, plain HTTP", "≥ 1.0× with p99 ≤ nginx's", 1.0],
  ] as const) {
    const rps = ratios(`engine ${scheme}`, scheme, "rps");
    const p99 = ratios(`engine ${scheme}`, scheme, "p99Ms");
    const cpu = ratios(`engine ${scheme}`, scheme, "cpuUsPerRequest");
    const engineP99 = (results.get(`engine ${scheme}`) ?? []).map((r) => r.p99Ms);
    const nginxP99 = (results.get(`nginx ${scheme}`) ?? []).map((r) => r.p99Ms);
    if (rps.length === 0) {
      goalRows.push([label, "n/a (engine or nginx missing)", "", "", goal, "unknown"]);
      continue;
    }
    const met = median(rps) >= wanted && median(p99) <= 1;
    goalRows.push([
      label,
      `${fmt(median(rps), 2)}× (${fmt(Math.min(...rps), 2)}–${fmt(Math.max(...rps), 2)})`,
      `${fmt(median(engineP99), 2)} vs ${fmt(median(nginxP99), 2)} ms (ratio ${fmt(median(p99), 2)})`,
      `${fmt(median(cpu), 2)}× (${fmt(Math.min(...cpu), 2)}–${fmt(Math.max(...cpu), 2)})`,
      goal,
      met ? "met" : "not met",
    ]);
  }
  printRows(
    "Issue 17's proxy goals (medians of the runs, spread in parentheses)",
    ["", "req/s ratio", "p99", "cpu us/req ratio", "goal", ""],
    goalRows,
  );
  for (const line of missing) console.log(`ANCHOR MISSING: ${line}`);
  for (const note of notes) console.log(note);
} finally {
  for (const proc of procs) if (proc.exitCode === null) proc.kill("SIGTERM");
  await Promise.all(procs.map((proc) => Promise.race([proc.exited, Bun.sleep(5000).then(() => proc.kill("SIGKILL"))])));
  // Stop the engine first (it hands workloads over and stops restarting them), then reap its service.
  if (engine) await engine.stop();
  else await stopStrayEngine(dataDir);
  if (existsSync(dataDir)) reapWorkloads(dataDir);
  rmSync(workDir, { recursive: true, force: true });
}
