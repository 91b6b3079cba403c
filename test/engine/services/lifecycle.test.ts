import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, existsSync, readdirSync, readFileSync, realpathSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { RUNS_KEPT } from "../../../src/engine/services/store";
import { createToken, eventually, REPO_ROOT, startTestEngine, type TestEngine, tempDir } from "../../helpers";
import { removeAfterRun } from "../../run-dirs";
import { processExists, processState, ServiceClient } from "./harness";

let engine: TestEngine;
let api: ServiceClient;
let scratch: string;
beforeAll(async () => {
  engine = await startTestEngine();
  api = new ServiceClient(engine);
  scratch = removeAfterRun(tempDir("engine-svc-"));
});
afterAll(async () => {
  await engine.close();
});

describe("statuses", () => {
  test("a stop that comes while the launch is under way stops what the launch started", async () => {
    // Deploy and stop at once, before the process is up: the stop waits for the launch, so the
    // service ends stopped with no process, never `stopped` on record with its workload running.
    for (let round = 0; round < 5; round++) {
      const name = `hasty-${round}`;
      await api.deployed({ name, command: "exec sleep 300" });
      await eventually(async () => ["scheduled", "running"].includes((await api.get(name)).status), { intervalMs: 2 });
      const stopped = await api.control(name, "stop");
      expect(stopped.body.status).toBe("stopped");
      // The run the launch started has ended (one that ignored the stop would still be running).
      await eventually(async () => (await api.diagnose(name)).last_run?.ended_at, { timeoutMs: 5000 });
      const record = await api.get(name);
      expect(record.status).toBe("stopped");
      expect(record.pid).toBeNull();
      expect((await engine.call("DELETE", `/api/services/${name}`)).status).toBe(200);
    }
  });

  test("a second service on a declared port another service holds is refused at deploy (409 naming it); once that one stops, it is not", async () => {
    await api.deployed({ name: "first-port", port: 18931, command: "exec sleep 300" });
    await api.waitFor("first-port", "running");
    const clash = await api.deploy({ name: "second-port", port: 18931, command: "exec sleep 300" });
    expect(clash.status).toBe(409);
    const error = (clash.body as unknown as { error: { code: string; message: string } }).error;
    expect(error.code).toBe("port_taken");
    expect(error.message).toContain("first-port");
    expect((await engine.call("GET", "/api/services/second-port")).status).toBe(404);
    // Redeploying the holder itself on its own port is no clash.
    expect((await api.deploy({ name: "first-port", port: 18931, command: "exec sleep 301" })).status).toBe(201);
    await api.control("first-port", "stop");
    expect((await api.deploy({ name: "second-port", port: 18931, command: "exec sleep 300" })).status).toBe(201);
    await api.control("second-port", "stop");
  });

  test("following the logs of a service that never printed answers at once with a ready event, then its lines", async () => {
    // The flag sits in the service's own data dir: a root engine runs the workload as its own user.
    const flag = join(engine.dataDir, "data", "silent", "speak-now");
    await api.deployed({
      name: "silent",
      command: 'while [ ! -e "$SERVICE_DATA_DIR/speak-now" ]; do sleep 0.05; done; echo at last; exec sleep 300',
    });
    await api.waitFor("silent", "running", (r) => r.pid !== null);
    const stop = new AbortController();
    try {
      // The headers and the first event arrive before the service has printed anything.
      const response = await Promise.race([
        fetch(`${engine.url}/api/services/silent/logs?follow=true&tail=10`, {
          headers: { authorization: `Bearer ${engine.adminToken}` },
          signal: stop.signal,
        }),
        Bun.sleep(5000).then(() => null),
      ]);
      if (!response) throw new Error("no answer within 5 s: the stream's headers were held back");
      expect(response.status).toBe(200);
      expect(response.headers.get("content-type")).toBe("text/event-stream");
      const reader = (response.body as ReadableStream<Uint8Array>).getReader();
      const decoder = new TextDecoder();
      let text = "";
      const readUntil = async (needle: string) => {
        const deadline = Date.now() + 5000;
        while (!text.includes(needle) && Date.now() < deadline) {
          const chunk = await Promise.race([reader.read(), Bun.sleep(deadline - Date.now()).then(() => null)]);
          if (!chunk || chunk.done) break;
          text += decoder.decode(chunk.value, { stream: true });
        }
        return text.includes(needle);
      };
      expect(await readUntil("event: ready")).toBe(true);
      expect(text).toContain('data: {"lines":0,"resumed":false}');

      // It carries the cursor where the stream starts: a reconnection resumes there (decision 366).
      expect(text).toMatch(/event: ready\nid: \d+-\d+\n/);
      expect(text).not.toContain("event: line");
      writeFileSync(flag, "");
      expect(await readUntil("at last")).toBe(true);
    } finally {
      stop.abort();
      await api.control("silent", "stop");
    }
  });

  test("a service runs under the shim, logs, and stops: pending → running → stopped", async () => {
    const deployed = await api.deploy({ name: "web", command: "echo hello from web; exec sleep 300" });
    expect(deployed.status).toBe(201);
    expect(deployed.body.version).toBe(1);
    const running = await api.waitFor("web", "running", (r) => r.pid !== null);
    const pid = running.pid as number;
    expect(processExists(pid)).toBe(true);
    // The workload leads its own process group, apart from the daemon's.
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const pgid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[2]);
    expect(pgid).toBe(pid);
    const logs = await eventually(async () => {
      const r = await engine.json<{ line: string; stream: string }[]>("GET", "/api/services/web/logs?tail=5");
      return r.body.find((l) => l.line === "hello from web") ? r.body : null;
    });
    expect(logs[0]?.stream).toBe("stdout");
    const stopped = await api.control("web", "stop");
    expect(stopped.status).toBe(200);
    expect(stopped.body.status).toBe("stopped");
    expect(stopped.body.pid).toBeNull();
    await eventually(() => !processExists(pid));
    const diagnosis = await api.diagnose("web");
    expect(diagnosis.desired_state).toBe("stopped");
    expect(diagnosis.last_run?.end_reason).toBe("stopped");
    expect(diagnosis.restarts.count).toBe(0);
    // start again: a new run, a new pid
    expect((await api.control("web", "start")).status).toBe(200);
    const again = await api.waitFor("web", "running", (r) => r.pid !== null && r.pid !== pid);
    expect((await api.control("web", "start")).status).toBe(409);
    const restarted = await api.control("web", "restart");
    expect(restarted.status).toBe(200);
    await api.waitFor("web", "running", (r) => r.pid !== null && r.pid !== again.pid);
    expect((await api.get("web")).restarts).toBe(0); // a requested restart is not a crash
    const removed = await engine.json<{ deleted: boolean }>("DELETE", "/api/services/web");
    expect(removed.status).toBe(200);
    expect((await engine.json("GET", "/api/services/web")).status).toBe(404);
  });

  test("a batch job that exits 0 is completed; one that fails under policy never is failed with its exit code", async () => {
    await api.deploy({ name: "job-ok", kind: "batch", command: ["true"] });
    await api.waitFor("job-ok", "completed");
    await api.deploy({ name: "job-bad", kind: "batch", command: "echo boom >&2; exit 3", restart: { policy: "never" } });
    await api.waitFor("job-bad", "failed");
    const diagnosis = await api.diagnose("job-bad");
    expect(diagnosis.forensics.last_exit_code).toBe(3);
    expect(diagnosis.error).toEqual({ class: "exit_code", message: "exited with code 3", key_line: null });
    expect(diagnosis.remediation?.code).toBe("inspect_logs");
    expect(diagnosis.logs.map((l) => l.line)).toContain("boom");
    expect(diagnosis.forensics.last_crash_at).not.toBeNull();
  });

  test("a plain command string runs without a shell, in the environment the shell would have given it; one with shell syntax runs under /bin/sh", async () => {
    // `sleep 300` under dash would leave sh as the workload, waiting for its sleep.
    const plain = await api.deployed({ name: "plain-cmd", command: "sleep 300" });
    expect(plain.command).toEqual(["/bin/sh", "-c", "sleep 300"]); // the record keeps the command as deployed
    const running = await api.waitFor("plain-cmd", "running", (r) => r.pid !== null);
    expect(readFileSync(`/proc/${running.pid}/cmdline`, "utf8").split("\0").filter(Boolean)).toEqual(["sleep", "300"]);
    await api.deployed({ name: "shell-cmd", command: "sleep 300; true" });
    const shellRun = await api.waitFor("shell-cmd", "running", (r) => r.pid !== null);
    expect(readFileSync(`/proc/${shellRun.pid}/comm`, "utf8").trim()).toBe("sh");
    for (const name of ["plain-cmd", "shell-cmd"]) await engine.call("DELETE", `/api/services/${name}`);

    // PWD is the run's working directory either way, as the shell sets it.
    await api.deploy({ name: "pwd-plain", kind: "batch", command: "printenv PWD" });
    await api.deploy({ name: "pwd-shell", kind: "batch", command: 'echo "$PWD"' });
    for (const name of ["pwd-plain", "pwd-shell"]) {
      await api.waitFor(name, "completed");
      const lines = (await engine.json<{ line: string }[]>("GET", `/api/services/${name}/logs?tail=5`)).body.map((l) => l.line);
      expect(lines).toContain(realpathSync(join(engine.dataDir, "data", name)));
      await engine.call("DELETE", `/api/services/${name}`);
    }
  });

  test("jobs that end together are each settled with their own exit", async () => {
    // Submitted at once, they end within moments of each other, and the launcher reports their
    // ends together: each one's status and exit code are its own.
    const codes = Array.from({ length: 16 }, (_, i) => i % 4);
    await Promise.all(
      codes.map((code, i) =>
        api.deployed({ name: `job-together-${i}`, kind: "batch", command: `exit ${code}`, restart: { policy: "never" } }),
      ),
    );
    for (const [i, code] of codes.entries()) {
      await api.waitFor(`job-together-${i}`, code === 0 ? "completed" : "failed");
      expect((await api.diagnose(`job-together-${i}`)).forensics.last_exit_code).toBe(code);
    }
  });

  test("stopping a batch job cancels it", async () => {
    await api.deploy({ name: "job-long", kind: "batch", command: "exec sleep 300" });
    await api.waitFor("job-long", "running");
    const stopped = await api.control("job-long", "stop");
    expect(stopped.body.status).toBe("cancelled");
  });

  test("a batch job that fails is retried (retrying) until it succeeds", async () => {
    // The workload writes in its own data dir: as root, the engine runs it as a user of its own.
    const marker = join(engine.dataDir, "data", "job-retry", "attempts");
    await api.deploy({
      name: "job-retry",
      kind: "batch",
      command: `echo x >> "$SERVICE_DATA_DIR/attempts"; [ $(wc -l < "$SERVICE_DATA_DIR/attempts") -ge 2 ]`,
      restart: { policy: "on-failure", max_restarts: 3, window_seconds: 60, backoff_s: 1 },
    });
    await api.waitFor("job-retry", "retrying");
    const during = await api.diagnose("job-retry");
    expect(during.restarts.count).toBe(1);
    expect(during.restarts.next_retry_in_s).toBeGreaterThanOrEqual(0);
    await api.waitFor("job-retry", "completed");
    expect(readFileSync(marker, "utf8").trim().split("\n").length).toBe(2);
  });

  test("pause sends SIGSTOP to the group and resume SIGCONT", async () => {
    await api.deploy({ name: "pausable", command: "exec sleep 300" });
    const { pid } = await api.waitFor("pausable", "running", (r) => r.pid !== null);
    const paused = await api.control("pausable", "pause");
    expect(paused.body.status).toBe("paused");
    await eventually(() => processState(pid as number) === "T");
    expect((await api.control("pausable", "pause")).status).toBe(409);
    const resumed = await api.control("pausable", "resume");
    expect(resumed.body.status).toBe("running");
    await eventually(() => processState(pid as number) === "S");
    await api.control("pausable", "pause");
    // stopping a paused service continues it so it can take SIGTERM
    expect((await api.control("pausable", "stop")).body.status).toBe("stopped");
    await eventually(() => !processExists(pid as number));
  });
});

describe("restart policy", () => {
  test("a crash loop restarts at most max_restarts times in the window, then fails with crash_loop", async () => {
    await api.deploy({
      name: "crasher",
      command: "echo crashing; exit 1",
      restart: { policy: "always", max_restarts: 2, window_seconds: 60, backoff_s: 0 },
    });
    await api.waitFor("crasher", "failed");
    const diagnosis = await api.diagnose("crasher");
    expect(diagnosis.restarts).toMatchObject({
      policy: "always",
      max_restarts: 2,
      window_seconds: 60,
      count: 2,
      backoff_s: 0,
      next_retry_in_s: null,
    });
    expect(diagnosis.restarts.window_start).not.toBeNull();
    expect(diagnosis.restarts.last_exit_at).not.toBeNull();
    expect(diagnosis.remediation?.code).toBe("crash_loop");
    expect(diagnosis.error?.class).toBe("crash_loop");
    expect(diagnosis.logs.filter((l) => l.line === "crashing").length).toBe(3);
  });

  test("a service that restarted many times keeps the newest runs (RUNS_KEPT) and their directories, no more", async () => {
    const { id } = await api.deployed({
      name: "many-runs",
      command: "exit 1",
      restart: { policy: "always", max_restarts: RUNS_KEPT + 5, window_seconds: 600, backoff_s: 0 },
    });
    await api.waitFor("many-runs", "failed", () => true, 30_000);
    const runsDir = join(engine.dataDir, "services", id, "runs");
    // The dropped runs' directories are removed off the event loop: soon, not at once.
    await eventually(() => readdirSync(runsDir).length === RUNS_KEPT, { timeoutMs: 5000 });
    const kept = readdirSync(runsDir);
    expect((await api.diagnose("many-runs")).last_run?.id).toBeOneOf(kept);
  });

  test("a service its policy restarts has its next run's directory made while it runs, and a restart takes it; a batch job's first run makes none", async () => {
    const { id } = await api.deployed({
      name: "quick-restarter",
      command: "exec sleep 300",
      restart: { policy: "always", max_restarts: 5, window_seconds: 60, backoff_s: 0 },
    });
    const first = await api.waitFor("quick-restarter", "running");
    const serviceDir = join(engine.dataDir, "services", id);
    const spare = join(serviceDir, ".next-run");
    await eventually(() => existsSync(spare));
    const spareInode = statSync(spare).ino;
    process.kill(first.pid as number, "SIGKILL");
    const second = await api.waitFor("quick-restarter", "running", (record) => record.pid !== first.pid);
    const run = (await api.diagnose("quick-restarter")).last_run?.id as string;
    // The restart's run directory is the spare, renamed: no new directory, exit record or pids file on its way.
    expect(statSync(join(serviceDir, "runs", run)).ino).toBe(spareInode);
    expect(readdirSync(join(serviceDir, "runs")).length).toBe(2);
    await eventually(() => existsSync(spare) && statSync(spare).ino !== spareInode);
    expect(second.pid).not.toBe(first.pid);
    await api.control("quick-restarter", "stop");

    const job = await api.deployed({ name: "one-shot", kind: "batch", command: "true" });
    await api.waitFor("one-shot", "completed");
    expect(readdirSync(join(engine.dataDir, "services", job.id)).sort()).toEqual(["logs", "runs"]);
  });

  test("backoff is reported while restarting", async () => {
    await api.deploy({
      name: "slow-crasher",
      command: "exit 2",
      restart: { policy: "on-failure", max_restarts: 5, window_seconds: 600, backoff_s: 3 },
    });
    await api.waitFor("slow-crasher", "restarting");
    const diagnosis = await api.diagnose("slow-crasher");
    expect(diagnosis.restarts.count).toBe(1);
    expect(diagnosis.restarts.backoff_s).toBeGreaterThanOrEqual(3);
    expect(diagnosis.restarts.next_retry_in_s).toBeGreaterThanOrEqual(1);
    expect(diagnosis.restarts.next_retry_in_s).toBeLessThanOrEqual(4);
    expect(diagnosis.forensics.last_exit_code).toBe(2);
    await api.control("slow-crasher", "stop");
    expect((await api.get("slow-crasher")).status).toBe("stopped");
  });
});

describe("forensics", () => {
  // A real cgroup OOM kill: test/engine/services/diagnose/diagnose.test.ts ("an OOM kill stays oom_killed ...").

  test("a GPU OOM in the log is reported as gpu_oom", async () => {
    await api.deploy({
      name: "torch",
      kind: "batch",
      command:
        "echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 3.12 GiB is free.' >&2; exit 1",
      restart: { policy: "never" },
    });
    await api.waitFor("torch", "failed");
    const diagnosis = await api.diagnose("torch");
    expect(diagnosis.forensics.gpu_oom).toBe(true);
    expect(diagnosis.forensics.oom_killed).toBe(false);
    expect(diagnosis.remediation?.code).toBe("reduce_batch_or_gpu_memory");
  });

  test("PyTorch's real CUDA out-of-memory traceback (captured on an H200) is gpu_oom, its exception line the key", async () => {
    const traceback = readFileSync(join(REPO_ROOT, "test", "fixtures", "gpu", "h200", "pytorch-oom.stderr"), "utf8");
    await api.deploy({
      name: "torch-h200",
      kind: "batch",
      command: `cat >&2 <<'TRACEBACK'\n${traceback}\nTRACEBACK\nexit 1`,
      restart: { policy: "never" },
    });
    await api.waitFor("torch-h200", "failed");
    const diagnosis = await api.diagnose("torch-h200");
    expect(diagnosis.forensics.gpu_oom).toBe(true);
    expect(diagnosis.error?.class).toBe("gpu_oom");
    expect(diagnosis.error?.key_line).toStartWith("torch.OutOfMemoryError: CUDA out of memory.");
    expect(diagnosis.remediation?.code).toBe("reduce_batch_or_gpu_memory");
  });

  test("a program without the execute bit is priv_denied with fix_permissions", async () => {
    const script = join(scratch, "not-executable.sh");
    writeFileSync(script, "#!/bin/sh\necho hi\n");
    chmodSync(script, 0o644);
    await api.deploy({ name: "noexec", command: [script] });
    await api.waitFor("noexec", "failed");
    const diagnosis = await api.diagnose("noexec");
    expect(diagnosis.forensics.priv_denied).toBe(true);
    expect(diagnosis.remediation?.code).toBe("fix_permissions");
    expect(diagnosis.error?.message).toContain("EACCES");
    expect(diagnosis.restarts.count).toBe(0); // an exec failure is not retried
  });
});

describe("bad input: a clear error and nothing created", () => {
  test.each([
    ["an unknown template", { name: "bad-1", template_id: "no-such-template" }, 404, "template_not_found"],
    ["a command that does not exist", { name: "bad-2", command: ["/no/such/program"] }, 422, "command_not_found"],
    ["a program not on PATH", { name: "bad-3", command: "definitely-not-a-program --flag" }, 422, "command_not_found"],
    ["more GPUs than the host has", { name: "bad-4", command: ["true"], gpus: 4 }, 409, "gpu_request_impossible"],
    ["a binding to itself", { name: "bad-5", command: ["true"], bindings: ["bad-5"] }, 422, "value_error"],
    ["a template without its required env", { name: "bad-6", template_id: "open-webui" }, 422, "missing"],
    ["both gpus and gpu_memory_mb", { name: "bad-7", command: ["true"], gpus: 1, gpu_memory_mb: 100 }, 422, "value_error"],
  ])("%s", async (_label, body, status, code) => {
    const response = await api.deploy(body);
    expect(response.status).toBe(status);
    const payload = response.body as unknown as { error?: { code: string }; detail?: { type: string }[] };
    expect(payload.error?.code ?? payload.detail?.[0]?.type).toBe(code);
    expect((await engine.json("GET", `/api/services/${(body as { name: string }).name}`)).status).toBe(404);
  });

  test("a cyclic binding is refused", async () => {
    await api.deploy({ name: "cyc-a", command: "exec sleep 300", bindings: ["cyc-b"] });
    const response = await api.deploy({ name: "cyc-b", command: "exec sleep 300", bindings: ["cyc-a"] });
    expect(response.status).toBe(422);
    expect((response.body as unknown as { detail: { type: string; msg: string }[] }).detail[0]).toMatchObject({ type: "binding_cycle" });
    expect((await engine.json("GET", "/api/services/cyc-b")).status).toBe(404);
    await engine.call("DELETE", "/api/services/cyc-a");
  });

  test("deploys posted together are each checked against those written before them: a cycle, a port, a name twice", async () => {
    // Sent at once, they share the daemon's commit; the outcome is that of one after the other.
    const [a, b, p, q, v1, v2] = await Promise.all([
      api.deploy({ name: "tog-a", command: "exec sleep 300", bindings: ["tog-b"] }),
      api.deploy({ name: "tog-b", command: "exec sleep 300", bindings: ["tog-a"] }),
      api.deploy({ name: "tog-p", port: 18941, command: "exec sleep 300" }),
      api.deploy({ name: "tog-q", port: 18941, command: "exec sleep 300" }),
      api.deploy({ name: "tog-v", command: "exec sleep 300" }),
      api.deploy({ name: "tog-v", command: "exec sleep 301" }),
    ]);
    // One of each pair is written; the other is refused with its own error, and nothing of it is there.
    expect([a.status, b.status].sort()).toEqual([201, 422]);
    const cyclic = a.status === 422 ? a : b;
    expect((cyclic.body as unknown as { detail: { type: string }[] }).detail[0]).toMatchObject({ type: "binding_cycle" });
    expect([p.status, q.status].sort()).toEqual([201, 409]);
    const clash = (p.status === 409 ? p : q).body as unknown as { error: { code: string } };
    expect(clash.error.code).toBe("port_taken");
    const refused = [cyclic === a ? "tog-a" : "tog-b", p.status === 409 ? "tog-p" : "tog-q"];
    for (const name of refused) expect((await engine.call("GET", `/api/services/${name}`)).status).toBe(404);
    // The same name twice: a service and its second version, not two services.
    expect([v1.status, v2.status]).toEqual([201, 201]);
    expect([v1.body.version, v2.body.version].sort()).toEqual([1, 2]);
    await eventually(async () => (await api.get("tog-v")).version === 2);
    const listed = (await engine.json<{ name: string }[]>("GET", "/api/services")).body;
    expect(listed.filter((s) => s.name === "tog-v")).toHaveLength(1);
    for (const name of ["tog-a", "tog-b", "tog-p", "tog-q", "tog-v"]) await engine.call("DELETE", `/api/services/${name}`);
  });
});

describe("tokens: caps and scope", () => {
  test("max_gpus, max_concurrent_jobs and scope_services are enforced", async () => {
    const capped = await createToken(engine, {
      name: "capped",
      role: "submitter",
      max_gpus: 0,
      max_concurrent_jobs: 1,
      scope_services: ["cap-a", "cap-b"],
    });
    const outside = await api.deploy({ name: "cap-z", command: "exec sleep 300" }, capped.secret);
    expect(outside.status).toBe(403);
    expect((outside.body as unknown as { error: { code: string } }).error.code).toBe("out_of_scope");
    expect((await api.deploy({ name: "cap-a", command: "exec sleep 300" }, capped.secret)).status).toBe(201);
    await api.waitFor("cap-a", "running");
    expect((await api.deploy({ name: "cap-b", command: "exec sleep 300" }, capped.secret)).status).toBe(201);
    const waiting = await api.waitFor("cap-b", "pending", (r) => (r.status_message ?? "").includes("max_concurrent_jobs"));
    expect(waiting.status_message).toContain("token cap");
    await api.control("cap-a", "stop");
    await api.waitFor("cap-b", "running");
    await api.control("cap-b", "stop");
    const list = await engine.json<{ name: string }[]>("GET", "/api/services", { token: capped.secret });
    expect(list.body.map((s) => s.name).sort()).toEqual(["cap-a", "cap-b"]);
  });
});

describe("secrets and env", () => {
  test("secrets reach the workload but are never returned; injected keys are listed without values", async () => {
    const out = join(engine.dataDir, "data", "envy", "env-out");
    await api.deploy({
      name: "envy",
      kind: "batch",
      command: `printf '%s %s %s' "$GREETING" "$API_KEY" "$PORT" > "$SERVICE_DATA_DIR/env-out"`,
      env: { GREETING: "hi" },
      secrets: { API_KEY: "s3cr3t-value" },
      port: 18080,
    });
    await api.waitFor("envy", "completed");
    expect(readFileSync(out, "utf8")).toBe("hi s3cr3t-value 18080");
    const record = await engine.call("GET", "/api/services/envy");
    const text = await record.text();
    expect(text).not.toContain("s3cr3t-value");
    expect(JSON.parse(text).secret_keys).toEqual(["API_KEY"]);
    const diagnosis = await api.diagnose("envy");
    expect(diagnosis.injected_env_keys).toEqual(expect.arrayContaining(["API_KEY", "GREETING", "PORT", "SERVICE_DATA_DIR"]));
    expect(JSON.stringify(diagnosis)).not.toContain("s3cr3t-value");
    expect(readFileSync(join(engine.dataDir, "engine.db")).includes(Buffer.from("s3cr3t-value"))).toBe(false);
    expect(existsSync(join(engine.dataDir, "data", "envy"))).toBe(true);
  });
});
