/**
 * A drain restart without a gap (docs/decisions.md 360-363): the daemon hands its listeners
 * and its work to a stand-in, re-executes its own pid and takes them back. Requests sent all
 * along — over TCP and over the unix socket — all get answers; the workloads keep their pids;
 * a log follower resumes with Last-Event-ID and misses no line; nothing is left running.
 */
import { describe, expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { storeUnchanged } from "../../../src/engine/daemon/handover";
import { HANDOVER_BOOST } from "../../../src/lib/priority";
import { ENGINE_ENTRY, engineScratch, eventually, nices, runCli, type SpawnedEngine } from "../../helpers";

const { defer, scratch, started } = engineScratch("engine-handover-");

const listeningCount = (engine: SpawnedEngine) => engine.output().split('"msg":"listening"').length - 1;

/** adminHeaders reads the admin token the engine wrote. */
function adminHeaders(dataDir: string): Record<string, string> {
  return { authorization: `Bearer ${readFileSync(join(dataDir, "admin.token"), "utf8").trim()}`, "content-type": "application/json" };
}

/** startedWith starts an engine on a fresh data dir and deploys one service on it. */
async function startedWith(
  name: string,
  command: string,
): Promise<{ dataDir: string; engine: SpawnedEngine; headers: Record<string, string> }> {
  const dataDir = scratch();
  const engine = await started(dataDir);
  const headers = adminHeaders(dataDir);
  const deploy = await fetch(`${engine.url}/api/services`, { method: "POST", headers, body: JSON.stringify({ name, command }) });
  expect(deploy.status).toBe(201);
  return { dataDir, engine, headers };
}

/** restartAndWait asks for a drain restart and waits until the engine's own pid serves again (two starts). */
async function restartAndWait(engine: SpawnedEngine, dataDir: string): Promise<void> {
  const before = listeningCount(engine);
  const response = await fetch(`${engine.url}/api/daemon/restart`, {
    method: "POST",
    headers: adminHeaders(dataDir),
    body: JSON.stringify({ drain_timeout_s: 10 }),
  });
  expect(response.status).toBe(202);
  await eventually(() => listeningCount(engine) >= before + 2, { timeoutMs: 40_000 });
  await eventually(async () => ((await (await fetch(`${engine.url}/api/health`)).json()) as { pid: number }).pid === engine.proc.pid, {
    timeoutMs: 10_000,
  });
}

/**
 * restartWithRequestInFlight posts a token whose body arrives only once `finish` is called (a
 * request in flight, which the old process waits for before it releases its work), asks for a
 * drain restart, and waits until the old process hands over (it said `switch`). `finish` sends
 * the rest of the body and answers the token's response.
 */
async function restartWithRequestInFlight(
  engine: SpawnedEngine,
  headers: Record<string, string>,
): Promise<{ finish: () => Promise<Response> }> {
  const encoder = new TextEncoder();
  const bodyDone = Promise.withResolvers<void>();
  const body = new ReadableStream<Uint8Array>({
    async start(controller) {
      controller.enqueue(encoder.encode('{"name": "slow-'));
      await bodyDone.promise;
      controller.enqueue(encoder.encode('one", "role": "readonly"}'));
      controller.close();
    },
  });
  const slow = fetch(`${engine.url}/api/tokens`, { method: "POST", headers, body, duplex: "half" } as RequestInit);
  await Bun.sleep(200);
  const restart = await fetch(`${engine.url}/api/daemon/restart`, {
    method: "POST",
    headers,
    body: JSON.stringify({ drain_timeout_s: 30 }),
  });
  expect(restart.status).toBe(202);
  await eventually(() => engine.output().includes('"msg":"handing over to the new process"'), { timeoutMs: 30_000 });
  return {
    finish: () => {
      bodyDone.resolve();
      return slow;
    },
  };
}

interface Loop {
  answered: number;
  failures: string[];
  /** pids are the engine pids that answered /api/health, in order of first answer. */
  pids: number[];
}

/** apiLoop calls `call` back to back until stopped, counting answers and failures. */
function apiLoop(call: () => Promise<Response>, loop: Loop, running: () => boolean): Promise<void> {
  return (async () => {
    while (running()) {
      try {
        const response = await call();
        const body = await response.text();
        if (response.status !== 200) loop.failures.push(`${response.status} ${body.slice(0, 120)}`);
        else {
          loop.answered += 1;
          const pid = (JSON.parse(body) as { pid?: number }).pid;
          if (pid !== undefined && !loop.pids.includes(pid)) loop.pids.push(pid);
        }
      } catch (error) {
        loop.failures.push((error as Error).message);
      }
      await Bun.sleep(2);
    }
  })();
}

describe("storeUnchanged", () => {
  test("holds only where the predecessor said the same count of writes at its switch and its release", () => {
    const cases: [number | null | undefined, number | null | undefined | "gone", boolean][] = [
      [7, 7, true],
      [7, 8, false],
      [0, 0, true],
      [undefined, undefined, false], // an older engine says no count
      [null, null, false], // nor does one without a service store
      [7, "gone", false], // it went away without saying released
    ];
    for (const [before, after, unchanged] of cases) {
      const released = after === "gone" ? null : { store_writes: after };
      expect({ before, after, unchanged: storeUnchanged({ store_writes: before }, released) }).toEqual({ before, after, unchanged });
    }
  });
});

describe("drain restart with no gap", () => {
  test("API calls over TCP and the unix socket all get answers across a restart; workloads keep their pids; the stand-in is gone after", async () => {
    const { dataDir, engine, headers } = await startedWith("sleeper", "exec sleep 300");
    const running = async () => {
      const record = (await (await fetch(`${engine.url}/api/services/sleeper`, { headers })).json()) as {
        status: string;
        pid: number | null;
      };
      return record.status === "running" && record.pid !== null ? record.pid : null;
    };
    const workloadPid = await eventually(running, { timeoutMs: 15_000 });

    const loop: Loop = { answered: 0, failures: [], pids: [] };
    let go = true;
    const socket = join(dataDir, "engine.sock");
    const loops = [
      apiLoop(
        () => fetch(`${engine.url}/api/health`),
        loop,
        () => go,
      ),
      apiLoop(
        () => fetch(`${engine.url}/api/health`, { keepalive: false }),
        loop,
        () => go,
      ),
      apiLoop(
        () => fetch(`${engine.url}/api/tokens`, { headers }),
        loop,
        () => go,
      ),
      apiLoop(
        () => fetch("http://engine/api/health", { unix: socket }),
        loop,
        () => go,
      ),
      apiLoop(
        () => fetch("http://engine/api/services", { unix: socket }),
        loop,
        () => go,
      ),
    ];
    try {
      await eventually(() => loop.answered > 20);
      await restartAndWait(engine, dataDir);
      const answeredAfter = loop.answered;
      await eventually(() => loop.answered > answeredAfter + 20);
    } finally {
      go = false;
      await Promise.all(loops);
    }

    expect(loop.failures).toEqual([]);
    // The stand-in answered between the two: its pid shows up, then the engine's own again.
    expect(loop.pids[0]).toBe(engine.proc.pid);
    expect(loop.pids.length).toBe(2);
    const standIn = loop.pids[1] as number;
    expect(standIn).not.toBe(engine.proc.pid);
    expect(((await (await fetch(`${engine.url}/api/health`)).json()) as { pid: number }).pid).toBe(engine.proc.pid);
    expect(await running()).toBe(workloadPid);
    await eventually(() => !existsSync(`/proc/${standIn}`), { timeoutMs: 10_000 });
    // No control socket or private socket name is left in the data dir.
    expect(readdirSync(dataDir).filter((entry) => entry.startsWith("."))).toEqual([]);
  }, 90_000);

  test("`engine logs -f` and a raw event stream resume with Last-Event-ID across a restart and miss no line", async () => {
    const { dataDir, engine, headers } = await startedWith("counter", 'i=0; while true; do echo "n=$i"; i=$((i+1)); sleep 0.01; done');
    await eventually(
      async () => ((await (await fetch(`${engine.url}/api/services/counter/logs?tail=1`, { headers })).json()) as unknown[]).length > 0,
      { timeoutMs: 15_000 },
    );

    // The CLI follows over the unix socket and reconnects by itself.
    const follower = Bun.spawn([...ENGINE_ENTRY, "--data-dir", dataDir, "logs", "-f", "--raw", "--tail", "5", "counter"], {
      env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: process.env.HOME ?? "/tmp" },
      stdout: "pipe",
      stderr: "pipe",
    });
    defer(() => follower.kill("SIGKILL"));
    let printed = "";
    const reading = (async () => {
      const decoder = new TextDecoder();
      const reader = (follower.stdout as ReadableStream<Uint8Array>).getReader();
      for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read())
        printed += decoder.decode(chunk.value, { stream: true });
    })();

    // A raw event stream over TCP, reconnected by hand with Last-Event-ID, as an EventSource does.
    const raw: { id: string | null; line: string }[] = [];
    let reconnections = 0;
    let go = true;
    const rawReader = (async () => {
      let lastId: string | null = null;
      while (go) {
        try {
          const response = await fetch(`${engine.url}/api/services/counter/logs?tail=5&follow=true`, {
            headers: { ...headers, ...(lastId ? { "last-event-id": lastId } : {}) },
          });
          if (lastId) reconnections += 1;
          const reader = (response.body as ReadableStream<Uint8Array>).getReader();
          const decoder = new TextDecoder();
          let buffer = "";
          for (let chunk = await reader.read(); !chunk.done && go; chunk = await reader.read()) {
            buffer += decoder.decode(chunk.value, { stream: true });
            for (let end = buffer.indexOf("\n\n"); end >= 0; end = buffer.indexOf("\n\n")) {
              const block = buffer.slice(0, end);
              buffer = buffer.slice(end + 2);
              const fields = Object.fromEntries(
                block
                  .split("\n")
                  .filter((line) => !line.startsWith(":") && line.includes(":"))
                  .map((line) => [line.slice(0, line.indexOf(":")), line.slice(line.indexOf(":") + 1).trim()]),
              );
              if (fields.id) lastId = fields.id;
              if (fields.event === "line")
                raw.push({ id: fields.id ?? null, line: (JSON.parse(fields.data ?? "{}") as { line: string }).line });
            }
          }
          reader.cancel().catch(() => undefined);
        } catch {
          // the engine is between processes: try again
        }
        await Bun.sleep(20);
      }
    })();

    await eventually(() => printed.split("\n").length > 10 && raw.length > 10, { timeoutMs: 15_000 });
    await restartAndWait(engine, dataDir);
    const countAfter = raw.length;
    await eventually(() => raw.length > countAfter + 30, { timeoutMs: 15_000 });
    follower.kill("SIGINT");
    expect(await follower.exited).toBe(0);
    await reading;
    go = false;
    await rawReader;

    const numbers = (lines: string[]) => lines.filter((line) => line.startsWith("n=")).map((line) => Number(line.slice(2)));
    const contiguous = (values: number[]) => values.every((value, index) => index === 0 || value === (values[index - 1] as number) + 1);
    const cli = numbers(printed.split("\n"));
    expect(cli.length).toBeGreaterThan(40);
    expect(contiguous(cli)).toBe(true);
    const streamed = numbers(raw.map((entry) => entry.line));
    expect(contiguous(streamed)).toBe(true);
    expect(raw.every((entry) => entry.id !== null)).toBe(true);
    // Both the stand-in and the engine's own pid ended the stream once: two reconnections.
    expect(reconnections).toBeGreaterThanOrEqual(2);
  }, 90_000);

  test("a blocking read held at a restart is answered as the old process retires, and asked again it waits on the new one", async () => {
    const { dataDir, engine, headers } = await startedWith("steady", "exec sleep 300");
    const read = async (query = "") => {
      const response = await fetch(`${engine.url}/api/services/steady${query}`, { headers });
      return {
        status: response.status,
        index: response.headers.get("x-engine-index"),
        body: (await response.json()) as { pid: number | null },
      };
    };
    const running = await eventually(async () => {
      const answer = await read();
      return answer.body.pid !== null ? answer : null;
    });
    const heldAt = Date.now();
    const held = read(`?index=${running.index}&wait=120`);
    await Bun.sleep(200);
    await restartAndWait(engine, dataDir);
    // The old process answered it as it retired: the record unchanged, long before the wait ran out.
    const answered = await held;
    expect(answered.status).toBe(200);
    expect(answered.index).toBe(running.index);
    expect(Date.now() - heldAt).toBeLessThan(60_000);
    // The new process keeps the record as it was (the workload kept its pid) and holds the read again.
    const asked = Date.now();
    const answer = await read(`?index=${running.index}&wait=1`);
    expect(Date.now() - asked).toBeGreaterThanOrEqual(900);
    expect(answer.status).toBe(200);
    expect(answer.index).toBe(running.index);
    expect(answer.body.pid).toBe(running.body.pid);
  }, 90_000);

  test("`engine upgrade` of an engine run from source is one clear error (501 not_supported), and nothing restarts", async () => {
    const dataDir = scratch();
    const engine = await started(dataDir);
    const result = await runCli(["--data-dir", dataDir, "upgrade", "/bin/true"]);
    expect(result).toMatchObject({
      code: 1,
      stderr:
        "engine: `engine upgrade` replaces the compiled binary, and this engine runs from source (bun cli/engine.ts): update the checkout and run `engine restart` instead [not_supported]\n",
    });
    const response = await fetch(`${engine.url}/api/daemon/upgrade`, {
      method: "POST",
      headers: adminHeaders(dataDir),
      body: JSON.stringify({ binary: "/bin/true" }),
    });
    expect(response.status).toBe(501);
    expect(listeningCount(engine)).toBe(1);
    // A restart can follow: the refusal left nothing under way.
    await restartAndWait(engine, dataDir);
  }, 90_000);

  test("a request in flight at the switch finishes on the old process, which releases its work only after it", async () => {
    const dataDir = scratch();
    const engine = await started(dataDir);
    const headers = adminHeaders(dataDir);
    const before = listeningCount(engine);
    // A token request whose body arrives slowly: it is in flight when the restart switches.
    const slow = await restartWithRequestInFlight(engine, headers);
    // The stand-in has switched (it holds new requests) but cannot start: the old process waits for its request.
    await Bun.sleep(500);
    expect(listeningCount(engine)).toBe(before);
    const answer = await slow.finish();
    expect(answer.status).toBe(201);
    await eventually(() => listeningCount(engine) >= before + 2, { timeoutMs: 40_000 });
    const tokens = (await (await fetch(`${engine.url}/api/tokens`, { headers })).json()) as { name: string }[];
    expect(tokens.map((token) => token.name)).toContain("slow-one");
  }, 90_000);

  test("a successor keeps the rows it read while preparing only where its predecessor wrote none since the switch", async () => {
    const dataDir = scratch();
    const engine = await started(dataDir);
    const headers = adminHeaders(dataDir);
    // A service that ends when told, and is not restarted (a drain would wait for a batch job):
    // its user must see the file, so it goes in the shared /tmp.
    const go = join(tmpdir(), `engine-handover-go-${process.pid}-${Date.now()}`);
    defer(() => rmSync(go, { force: true }));
    const deploy = await fetch(`${engine.url}/api/services`, {
      method: "POST",
      headers,
      body: JSON.stringify({ name: "waiter", command: `while [ ! -e ${go} ]; do sleep 0.05; done`, restart: { policy: "never" } }),
    });
    expect(deploy.status).toBe(201);
    const status = async () =>
      ((await (await fetch(`${engine.url}/api/services/waiter`, { headers })).json()) as { status: string }).status;
    await eventually(async () => (await status()) === "running", { timeoutMs: 15_000 });
    const before = listeningCount(engine);
    // A request whose body arrives slowly keeps the old process from releasing its work after the switch.
    const slow = await restartWithRequestInFlight(engine, headers);
    // After its `switch`, the old process still owns the work: the service ends, and it settles the exit.
    writeFileSync(go, "");
    const ended = () =>
      engine
        .output()
        .split("\n")
        .some((line) => line.includes('"msg":"service process ended"') && line.includes(`"pid":${engine.proc.pid},`));
    await eventually(ended, { timeoutMs: 15_000 });
    expect((await slow.finish()).status).toBe(201);
    await eventually(() => listeningCount(engine) >= before + 2, { timeoutMs: 40_000 });
    // The stand-in read the rows again (its predecessor wrote since the switch); the re-executed
    // pid kept the rows it read while it prepared (the stand-in wrote none).
    const starts = engine
      .output()
      .split("\n")
      .filter((line) => line.includes('"msg":"listening"'))
      .map((line) => (JSON.parse(line) as { store_kept?: boolean }).store_kept);
    expect(starts).toEqual([undefined, false, true]);
    expect(await status()).toBe("completed");
  }, 90_000);

  test("a successor builds and warms its API before it takes the ports, and logs where its take-over's time went", async () => {
    const dataDir = scratch();
    const engine = await started(dataDir);
    const [priority] = nices(engine.proc.pid);
    await restartAndWait(engine, dataDir);
    const records = () =>
      engine
        .output()
        .split("\n")
        .filter((line) => line.includes('"phases_ms"'))
        .map(
          (line) =>
            JSON.parse(line) as {
              msg: string;
              standin?: boolean;
              phases_ms: Record<string, number>;
              modules_ms?: Record<string, number>;
              window_ms?: number;
              raised_priority?: number;
            },
        );
    // The re-executed pid answered the health check above: its take-over is logged once answered.
    await eventually(() => records().some((record) => record.msg === "took the work over" && record.standin === false), {
      timeoutMs: 15_000,
    });
    const taken = records().find((record) => record.msg === "took the work over" && record.standin === false);
    // Its API was built and warmed (prepare) before it bound the ports (bind), then it waited for the release and adopted.
    expect(Object.keys(taken?.phases_ms ?? {})).toEqual(["prepare", "bind", "wait_release", "start", "adopt", "api", "first_answer"]);
    expect(taken?.window_ms).toBeGreaterThanOrEqual(0);
    // Both predecessors (the engine's first image, then the stand-in) said how long their retire and release took.
    const released = records().filter((record) => record.msg === "released the work to the new process");
    expect(released.map((record) => Object.keys(record.phases_ms))).toEqual([
      ["retire", "release"],
      ["retire", "release"],
    ]);
    // As root, each side ran raised while new requests waited on it (decision 527); as a user, at its own priority.
    const raisedTo = process.getuid?.() === 0 && priority === 0 ? -HANDOVER_BOOST : undefined;
    expect([taken?.raised_priority, ...released.map((record) => record.raised_priority)]).toEqual([raisedTo, raisedTo, raisedTo]);
    // And the raise was given back: every thread of the engine's pid runs at its priority of before.
    await eventually(() => nices(engine.proc.pid).every((nice) => nice === priority), { timeoutMs: 10_000 });
    // And how long each module's stop took in the release, the log's flush last (it started first).
    for (const record of released) {
      const modules = Object.keys(record.modules_ms ?? {});
      expect(modules).toContain("services");
      expect(modules.at(-1)).toBe("log");
    }
    // Each successor (the stand-in, then the re-executed pid) says it takes over before it binds:
    // its first log line, whose cold cost would otherwise fall in the window (decision 516).
    const lines = engine
      .output()
      .split("\n")
      .filter((line) => line.startsWith("{"))
      .map((line) => JSON.parse(line) as { msg: string; pid: number; standin?: boolean });
    const taking = lines.filter((line) => line.msg === "taking the work over: binding the listeners");
    expect(taking.map((line) => line.standin)).toEqual([true, false]);
    // The re-executed pid then says it took over; the stand-in, which served no request, that it released.
    for (const [line, next] of [
      [taking[0], "released the work to the new process"],
      [taking[1], "took the work over"],
    ] as const) {
      const after = lines.findIndex((other) => other.pid === line?.pid && other.msg === next);
      expect({ next, after: after > (line ? lines.indexOf(line) : Number.POSITIVE_INFINITY) }).toEqual({ next, after: true });
    }
  }, 90_000);
});
