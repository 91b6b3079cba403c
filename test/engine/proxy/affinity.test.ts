import { afterAll, describe, expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { allowedCpus, parseCpuList } from "../../../src/lib/affinity";
import { eventually, startTestEngine, type TestEngine } from "../../helpers";

interface Respawn {
  processes: number;
  pids: number[];
  cpus: (number | null)[];
  count: number;
}

const engines: TestEngine[] = [];
afterAll(async () => {
  for (const engine of engines) await engine.close();
});

/** cpusOf is the CPU list of one thread of a process, from /proc. */
function cpusOf(pid: number, tid = pid): number[] | null {
  return parseCpuList(/Cpus_allowed_list:\s*(\S+)/.exec(readFileSync(`/proc/${pid}/task/${tid}/status`, "utf8"))?.[1] ?? "");
}

async function respawnOf(engine: TestEngine): Promise<Respawn> {
  return (await engine.json<{ respawn: Respawn }>("GET", "/api/proxy/status")).body.respawn;
}

const own = allowedCpus() ?? [];

describe("the proxy processes' CPUs", () => {
  test("each process's event loop is pinned to the next of the daemon's CPUs; a respawned one takes its predecessor's", async () => {
    const engine = await startTestEngine({ proxy: true, httpsPort: 0, httpPort: 0, proxyProcesses: 2, mdns: "off" });
    engines.push(engine);
    const respawn = await eventually(async () => {
      const status = await respawnOf(engine);
      return status.processes === 2 && status.cpus.every((cpu) => cpu !== null) ? status : null;
    });
    const expected = [own[0] ?? null, own[1 % own.length] ?? null];
    expect([...respawn.cpus].sort()).toEqual([...expected].sort());
    for (const [index, pid] of respawn.pids.entries()) {
      expect(cpusOf(pid)).toEqual([respawn.cpus[index] as number]);
      // The runtime's helper threads that ran before the pin keep every CPU: a collection is not held to one core.
      const others = readdirSync(`/proc/${pid}/task`).filter((tid) => tid !== String(pid));
      expect(others.some((tid) => JSON.stringify(cpusOf(pid, Number(tid))) === JSON.stringify(own))).toBe(true);
    }

    const [victim = 0] = respawn.pids;
    const victimCpu = respawn.cpus[0];
    process.kill(victim, "SIGKILL");
    const after = await eventually(
      async () => {
        const status = await respawnOf(engine);
        return status.count === 1 && status.processes === 2 && !status.pids.includes(victim) && status.cpus.every((cpu) => cpu !== null)
          ? status
          : null;
      },
      { timeoutMs: 15000 },
    );
    const newcomer = after.pids.findIndex((pid) => !respawn.pids.includes(pid));
    expect(newcomer).toBeGreaterThanOrEqual(0);
    expect(after.cpus[newcomer]).toBe(victimCpu);
    expect(cpusOf(after.pids[newcomer] as number)).toEqual([victimCpu as number]);
  });

  test("ENGINE_PROXY_CPU_AFFINITY=off leaves every thread on every CPU", async () => {
    const engine = await startTestEngine({
      proxy: true,
      httpsPort: 0,
      httpPort: 0,
      proxyProcesses: 2,
      mdns: "off",
      proxyCpuAffinity: "off",
    });
    engines.push(engine);
    const respawn = await eventually(async () => {
      const status = await respawnOf(engine);
      return status.processes === 2 ? status : null;
    });
    expect(respawn.cpus).toEqual([null, null]);
    for (const pid of respawn.pids) {
      for (const tid of readdirSync(`/proc/${pid}/task`)) expect(cpusOf(pid, Number(tid))).toEqual(own);
    }
  });
});
