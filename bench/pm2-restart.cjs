// bench/pm2-restart.cjs: PM2's kill -9 → restarted, the anchor bench/scheduler.ts prints next to the engine's.
// It runs under node with PM2 installed in a temporary prefix (never a project dependency):
//   PM2_HOME=<tmp> NODE_PATH=<tmp>/node_modules node bench/pm2-restart.cjs <kills> <gap-ms>
// and prints one JSON line: {"restartMs": [...], "busMs": [...]} (kill → PM2 reports a new pid online, polled over its RPC;
// then kill → its event bus says the process is online, with no polling).
const pm2 = require("pm2");

const kills = Number(process.argv[2] ?? 30);
const gapMs = Number(process.argv[3] ?? 50);
const DEADLINE_MS = 5000;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const call = (fn, ...args) => new Promise((resolve, reject) => fn.call(pm2, ...args, (err, out) => (err ? reject(err) : resolve(out))));

async function current() {
  const [proc] = await call(pm2.describe, "crashy");
  return proc && proc.pm2_env.status === "online" ? proc.pid : null;
}

async function main() {
  await call(pm2.connect, true);
  try {
    // No backoff, and no "unstable restart" limit: restarted at once, every time, as the engine's `always` with backoff 0.
    await call(pm2.start, {
      name: "crashy",
      script: "sleep",
      args: "600",
      interpreter: "none",
      autorestart: true,
      restart_delay: 0,
      min_uptime: 0,
      max_restarts: 100000,
    });
    let pid = null;
    for (const deadline = Date.now() + DEADLINE_MS; !pid && Date.now() < deadline; ) pid = await current();
    if (!pid) throw new Error("pm2 never reported crashy online");
    const restartMs = [];
    for (let i = 0; i < kills; i++) {
      await sleep(gapMs);
      const t = performance.now();
      process.kill(pid, "SIGKILL");
      let next = null;
      while (performance.now() - t < DEADLINE_MS) {
        next = await current();
        if (next && next !== pid) break;
        await sleep(1);
      }
      if (!next || next === pid) throw new Error(`pm2 did not restart crashy within ${DEADLINE_MS} ms`);
      restartMs.push(performance.now() - t);
      pid = next;
    }
    // The same kills, watched: PM2's event bus says `online` when the new process runs, with
    // no polling (the engine's side is a blocking read). The pid for the next kill is read after.
    const bus = await new Promise((resolve, reject) => pm2.launchBus((err, b) => (err ? reject(err) : resolve(b))));
    let online = null;
    bus.on("process:event", (packet) => {
      if (packet.event === "online" && packet.process && packet.process.name === "crashy" && online) online(performance.now());
    });
    const busMs = [];
    for (let i = 0; i < kills; i++) {
      await sleep(gapMs);
      const seen = new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`pm2 said nothing within ${DEADLINE_MS} ms`)), DEADLINE_MS);
        online = (at) => {
          clearTimeout(timer);
          online = null;
          resolve(at);
        };
      });
      const t = performance.now();
      process.kill(pid, "SIGKILL");
      busMs.push((await seen) - t);
      let next = null;
      for (const deadline = Date.now() + DEADLINE_MS; (!next || next === pid) && Date.now() < deadline; ) next = await current();
      if (!next || next === pid) throw new Error("pm2 said online but shows no new pid");
      pid = next;
    }
    console.log(JSON.stringify({ restartMs, busMs }));
  } finally {
    await call(pm2.delete, "crashy").catch(() => undefined);
    await call(pm2.killDaemon).catch(() => undefined);
    pm2.disconnect();
  }
}

main().catch((error) => {
  console.error(String(error?.stack ?? error));
  process.exit(1);
});
