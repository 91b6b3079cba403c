import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { Diagnosis, GpuInventoryRecord, ServiceRecord } from "../../src/contract/engine";
import { createToken, ENGINE_ENTRY, eventually, freePort, runCli, startTestEngine, type TestEngine } from "../helpers";

let engine: TestEngine;
beforeAll(async () => {
  engine = await startTestEngine({ gpus: "RTX 4090:24564,A100:40960" });
});
afterAll(async () => {
  await engine.close();
});

const cli = (...args: string[]) => runCli(["--data-dir", engine.dataDir, ...args]);
const status = async (name: string) => (await engine.json<ServiceRecord>("GET", `/api/services/${name}`)).body.status;
const fixtureStatus = async (name: string) => (await engine.json("GET", `/api/services/${name}`)).status;

describe("engine services CLI", () => {
  test("deploy / list / show / logs / stop / rm a long-running service", async () => {
    const deployed = await cli(
      "services",
      "deploy",
      "sleeper",
      "--env",
      "GREETING=hi=there",
      "--gpus",
      "1",
      "--",
      "sh",
      "-c",
      "echo ready; exec sleep 300",
    );
    expect(deployed.code).toBe(0);
    expect(deployed.stdout).toMatch(/^deployed sleeper version 1 \(svc_[^)]+\): \w+/);
    await eventually(async () => (await status("sleeper")) === "running");

    const table = await cli("services", "list");
    expect(table.code).toBe(0);
    const [header, row] = table.stdout.split("\n");
    expect(header).toMatch(/^NAME\s+KIND\s+STATUS\s+PID\s+GPUS\s+RESTARTS\s+VERSION\s+MESSAGE$/);
    expect(row).toMatch(/^sleeper\s+service\s+running\s+\d+\s+1 \[0\]\s+0\s+1\s/);

    const list = JSON.parse((await cli("--json", "services", "list")).stdout) as ServiceRecord[];
    expect(list).toHaveLength(1);
    expect(list[0]).toMatchObject({
      name: "sleeper",
      command: ["sh", "-c", "echo ready; exec sleep 300"],
      env: { GREETING: "hi=there" },
      gpu_devices: ["0"],
    });

    const show = await cli("services", "show", "sleeper");
    expect(show.stdout).toMatch(/^command\s+sh -c 'echo ready; exec sleep 300'$/m);
    expect(show.stdout).toMatch(/^env\s+GREETING=hi=there$/m);
    expect(show.stdout).toMatch(process.geteuid?.() === 0 ? /^user\s+eng-sleeper$/m : /^user\s+the engine's$/m);

    const gpus = await cli("gpus");
    expect(gpus.code).toBe(0);
    expect(gpus.stdout.split("\n")[0]).toMatch(/^INDEX\s+NAME\s+MEMORY\s+USED\s+SOURCE\s+RESERVED\s+HOLDERS$/);
    expect(gpus.stdout).toMatch(/^0\s+RTX 4090\s+24564 MiB\s+-\s+declared \(ENGINE_GPUS, not detected\)\s+24564 MiB\s+sleeper$/m);
    expect(gpus.stdout).toMatch(/^1\s+A100\s+40960 MiB\s+-\s+declared/m);
    const inventory = JSON.parse((await cli("--json", "gpus")).stdout) as GpuInventoryRecord;
    expect(inventory.devices[0]?.holders).toEqual([{ service: "sleeper", whole: true, memory_mb: 24564 }]);

    const logs = await eventually(async () => {
      const result = await cli("logs", "sleeper");
      return result.stdout.includes("ready") ? result : null;
    });
    expect(logs.stdout).toMatch(/^\d{4}-\d\d-\d\dT\S+ stdout ready$/m);
    expect((await cli("logs", "--raw", "--tail", "1", "sleeper")).stdout).toBe("ready\n");

    const stopped = await cli("services", "stop", "sleeper");
    expect(stopped).toMatchObject({ code: 0, stdout: "sleeper: stopped — stopped by request\n" });
    const removed = await cli("services", "rm", "sleeper");
    expect(removed.code).toBe(0);
    expect(removed.stdout).toMatch(/^removed sleeper \(svc_\S+\)\n$/);
    expect(JSON.parse((await cli("--json", "services", "list")).stdout)).toEqual([]);
  });

  test("services wait: returns once the status is reached, fails at once when the service settles in another, and gives up at its timeout", async () => {
    // Deployed and waited for in one go: the wait sees it through pending and scheduled to running.
    expect((await cli("services", "deploy", "waited", "--", "sh", "-c", "sleep 0.3; exec sleep 300")).code).toBe(0);
    const running = await cli("services", "wait", "waited");
    expect(running.code).toBe(0);
    expect(running.stdout).toBe("waited: running\n");
    expect(await status("waited")).toBe("running");

    // A job that fails cannot complete: the wait says so as soon as it is failed, not at its timeout.
    expect(
      (await cli("services", "deploy", "job-fails", "--kind", "batch", "--restart", "never", "--command", "sleep 0.3; exit 3")).code,
    ).toBe(0);
    const started = performance.now();
    const failed = await cli("services", "wait", "job-fails", "--for", "completed", "--timeout", "60");
    expect(failed.code).not.toBe(0);
    expect(failed.stderr).toContain("job-fails: failed");
    expect(failed.stderr).toContain("will not be completed");
    expect(performance.now() - started).toBeLessThan(30_000);

    // A service that stays running never completes: the wait gives up after its timeout.
    const timedOut = await cli("services", "wait", "waited", "--for", "completed", "--timeout", "1");
    expect(timedOut.code).not.toBe(0);
    expect(timedOut.stderr).toContain("waited: running");
    expect(timedOut.stderr).toContain("not completed after 1 s");

    // --json answers the record it waited for.
    const json = await cli("--json", "services", "wait", "waited");
    expect((JSON.parse(json.stdout) as ServiceRecord).status).toBe("running");

    // Bad input is a clear error before anything is asked.
    const unknownStatus = await cli("services", "wait", "waited", "--for", "up");
    expect(unknownStatus.code).not.toBe(0);
    expect(unknownStatus.stderr).toContain("--for takes");
    const badTimeout = await cli("services", "wait", "waited", "--timeout", "soon");
    expect(badTimeout.code).not.toBe(0);
    expect(badTimeout.stderr).toContain("--timeout takes a whole number");
    const missing = await cli("services", "wait", "no-such-service");
    expect(missing.code).not.toBe(0);

    expect((await cli("services", "rm", "waited")).code).toBe(0);
    expect((await cli("services", "rm", "job-fails")).code).toBe(0);
  });

  test("deploy --wait: a service until it runs, a batch job until it completes, and a job that fails is a failed command", async () => {
    const service = await cli("services", "deploy", "deployed-waited", "--wait", "--", "sh", "-c", "sleep 0.3; exec sleep 300");
    expect(service.code).toBe(0);
    const [deployedLine, waitedLine] = service.stdout.split("\n");
    expect(deployedLine).toMatch(/^deployed deployed-waited version 1 \(svc_[^)]+\): \w+/);
    expect(waitedLine).toBe("deployed-waited: running");

    const job = await cli(
      "--json",
      "services",
      "deploy",
      "job-waited",
      "--kind",
      "batch",
      "--wait",
      "60",
      "--command",
      "sleep 0.3; echo done",
    );
    expect(job.code).toBe(0);
    // --json prints one record: the one waited for.
    expect((JSON.parse(job.stdout) as ServiceRecord).status).toBe("completed");

    const failing = await cli(
      "services",
      "deploy",
      "job-waited-fails",
      "--kind",
      "batch",
      "--restart",
      "never",
      "--wait",
      "--command",
      "exit 4",
    );
    expect(failing.code).not.toBe(0);
    expect(failing.stdout).toMatch(/^deployed job-waited-fails version 1/);
    expect(failing.stderr).toContain("job-waited-fails: failed");

    const badWait = await cli("services", "deploy", "never-deployed", "--wait", "soon", "--command", "sleep 1");
    expect(badWait.code).not.toBe(0);
    expect(badWait.stderr).toContain("--wait takes a whole number");
    expect(await fixtureStatus("never-deployed")).toBe(404);

    for (const name of ["deployed-waited", "job-waited", "job-waited-fails"]) expect((await cli("services", "rm", name)).code).toBe(0);
  });

  test("diagnose a failed batch job: the cause comes first, --json is the Diagnosis", async () => {
    const deployed = await cli(
      "services",
      "deploy",
      "job-bad",
      "--kind",
      "batch",
      "--restart",
      "never",
      "--command",
      "echo boom >&2; exit 3",
    );
    expect(deployed.code).toBe(0);
    await eventually(async () => (await status("job-bad")) === "failed");

    const report = await cli("diagnose", "job-bad");
    expect(report.code).toBe(0);
    const lines = report.stdout.split("\n");
    expect(lines[0]).toBe("job-bad: failed — exit_code: exited with code 3");
    expect(lines[1]).toStartWith("fix (inspect_logs): ");
    expect(report.stdout).toMatch(/^restarts\s+0\/\d+ in \d+ s \(policy never\)/m);
    expect(report.stdout).toMatch(/^forensics\s+exit code 3, no oom\/gpu_oom\/priv_denied, last crash /m);
    expect(report.stdout).toMatch(/^last run\s+run_\S+ .*exit 3/m);
    expect(report.stdout).toMatch(/^ {2}\S+ stderr boom$/m);

    const json = JSON.parse((await cli("--json", "diagnose", "job-bad")).stdout) as Diagnosis;
    expect(json).toMatchObject({ service_name: "job-bad", status: "failed", forensics: { last_exit_code: 3 } });

    expect((await cli("services", "rm", "job-bad")).code).toBe(0);
  });

  test("--health-start-period sets the probe's grace; show and diagnose say where it stands", async () => {
    const port = String(await freePort());
    const deployed = await cli(
      "services",
      "deploy",
      "graced",
      "--port",
      port,
      "--health",
      "http:/ready",
      "--health-start-period",
      "3600",
      "--command",
      "exec sleep 300",
    );
    expect(deployed.code).toBe(0);
    const show = await cli("services", "show", "graced");
    expect(show.stdout).toMatch(/^health\s+http \/ready, every 10 s, 3 failures to fail, 3600 s start period$/m);
    const report = await eventually(async () => {
      const result = await cli("diagnose", "graced");
      return /in start period: \d+ s of 3600 s left, [1-9]\d* failed probes? not counted/.test(result.stdout) ? result : null;
    });
    expect(report.stdout.split("\n")[0]).toBe("graced: running");
    expect(report.stdout).toMatch(/fail connect ECONNREFUSED 127\.0\.0\.1:\d+ \(\d+ ms\) \[start period: not counted\]$/m);
    expect(await status("graced")).toBe("running");
    expect((await cli("services", "rm", "graced")).code).toBe(0);
  });

  test("logs -f prints a line written after it started, until it is stopped", async () => {
    const marker = `${engine.dataDir}/go`;
    const command = `echo first; while [ ! -e ${marker} ]; do sleep 0.05; done; echo second; exec sleep 300`;
    expect((await cli("services", "deploy", "talker", "--command", command)).code).toBe(0);
    await eventually(async () => (await status("talker")) === "running");

    const follower = Bun.spawn([...ENGINE_ENTRY, "--data-dir", engine.dataDir, "logs", "-f", "--raw", "talker"], {
      env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: process.env.HOME ?? "/tmp" },
      stdout: "pipe",
      stderr: "pipe",
    });
    let text = "";
    const reader = (follower.stdout as ReadableStream<Uint8Array>).getReader();
    const decoder = new TextDecoder();
    void (async () => {
      for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) text += decoder.decode(chunk.value, { stream: true });
    })();
    try {
      await eventually(() => text.includes("first\n"), { timeoutMs: 10000 });
      expect(text).not.toContain("second");
      await Bun.write(marker, "");
      await eventually(() => text.includes("second\n"), { timeoutMs: 10000 });
    } finally {
      follower.kill("SIGINT");
    }
    expect(await follower.exited).toBe(0);
    expect(text).toBe("first\nsecond\n");
    expect((await cli("services", "rm", "talker")).code).toBe(0);
  });

  test("logs of a service that never printed say so on stderr, at once when following", async () => {
    expect((await cli("services", "deploy", "quiet", "--", "sleep", "300")).code).toBe(0);
    await eventually(async () => (await status("quiet")) === "running");
    expect(await cli("logs", "quiet")).toMatchObject({ code: 0, stdout: "", stderr: "quiet has printed nothing yet\n" });
    const follower = Bun.spawn([...ENGINE_ENTRY, "--data-dir", engine.dataDir, "logs", "-f", "quiet"], {
      env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: process.env.HOME ?? "/tmp" },
      stdout: "pipe",
      stderr: "pipe",
    });
    let stderr = "";
    const reader = (follower.stderr as ReadableStream<Uint8Array>).getReader();
    void (async () => {
      for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) stderr += new TextDecoder().decode(chunk.value);
    })();
    try {
      await eventually(() => stderr.includes("quiet has printed nothing yet; waiting for output (Ctrl-C to stop)\n"), { timeoutMs: 10000 });
    } finally {
      follower.kill("SIGINT");
    }
    expect(await follower.exited).toBe(0);
    expect(await new Response(follower.stdout).text()).toBe("");
    expect((await cli("services", "rm", "quiet")).code).toBe(0);
  });

  test("control commands answer with the new status", async () => {
    expect((await cli("services", "deploy", "ctl", "--", "sleep", "300")).code).toBe(0);
    await eventually(async () => (await status("ctl")) === "running");
    expect(await cli("services", "pause", "ctl")).toMatchObject({ code: 0, stdout: "ctl: paused — paused by request (SIGSTOP)\n" });
    expect(await cli("services", "resume", "ctl")).toMatchObject({ code: 0, stdout: "ctl: running\n" });
    expect((await cli("services", "rm", "ctl")).code).toBe(0);
  });

  test.each([
    [
      ["services", "deploy", "ghost", "--", "no-such-program-xyz"],
      "engine: command: the command no-such-program-xyz is not on the PATH of this host [validation]\n",
    ],
    [["services", "show", "nope"], 'engine: no service named or with id "nope" [service_not_found]\n'],
    [["logs", "nope"], 'engine: no service named or with id "nope" [service_not_found]\n'],
    [["logs", "-f", "nope"], 'engine: no service named or with id "nope" [service_not_found]\n'],
    [["diagnose", "nope"], 'engine: no service named or with id "nope" [service_not_found]\n'],
    [["services", "stop", "nope"], 'engine: no service named or with id "nope" [service_not_found]\n'],
    [["services", "stop"], "engine: give the service to stop, or --all to stop every one\n"],
    [["services", "stop", "nope", "--all"], "engine: give a service name or --all, not both\n"],
    [
      ["services", "deploy", "x", "--restart", "sometimes", "--", "true"],
      'engine: --restart takes always, on-failure or never (got "sometimes")\n',
    ],
    [["services", "deploy", "x", "--gpus", "two", "--", "true"], 'engine: --gpus takes a whole number (got "two")\n'],
    [["services", "deploy", "x", "--env", "NOVALUE", "--", "true"], 'engine: --env takes KEY=VALUE (got "NOVALUE")\n'],
    [
      ["services", "deploy", "x", "--health", "udp", "--", "true"],
      'engine: --health takes http:/path, http:PORT/path, tcp, tcp:PORT, exec:COMMAND or none (got "udp")\n',
    ],
    [
      ["services", "deploy", "x", "--health-start-period", "soon", "--", "true"],
      'engine: --health-start-period takes a whole number (got "soon")\n',
    ],
    [
      ["services", "deploy", "x", "--health", "none", "--health-start-period", "5", "--", "true"],
      "engine: --health-start-period needs a health check, not --health none\n",
    ],
    [
      ["services", "deploy", "x", "--health-start-period", "5", "--", "true"],
      "engine: --health: give the probe's type (http, tcp or exec): no template gives one [validation]\n",
    ],
    [
      ["services", "deploy", "x", "--health", "tcp:80", "--health-start-period", "86401", "--", "true"],
      "engine: --health-start-period: Input should be less than or equal to 86400 [validation]\n",
    ],
    [
      ["services", "deploy", "x", "--command", "true", "--", "true"],
      "engine: give the command after -- (as argv) or with --command (as a shell string), not both\n",
    ],
    [
      ["services", "deploy", "Bad_Name", "--", "true"],
      'engine: name "Bad_Name": a name is lowercase letters, digits and dashes, up to 63 characters, starting and ending with a letter or digit [validation]\n',
    ],
    [["restart", "--drain-timeout", "soon"], 'engine: --drain-timeout takes a whole number of seconds up to 3600 (got "soon")\n'],
  ])("user error %p is one line and exit 1", async (args, message) => {
    expect(await cli(...args)).toMatchObject({ code: 1, stderr: message });
  });
});

test("services stop --all stops every running service the caller may stop, leaves settled ones, and says which", async () => {
  const own = await startTestEngine();
  try {
    const run = (...args: string[]) => runCli(["--data-dir", own.dataDir, ...args]);
    const state = async (name: string) => (await own.json<ServiceRecord>("GET", `/api/services/${name}`)).body.status;
    expect((await run("services", "deploy", "one", "--", "sleep", "300")).code).toBe(0);
    expect((await run("services", "deploy", "two", "--", "sleep", "300")).code).toBe(0);
    expect((await run("services", "deploy", "done", "--kind", "batch", "--restart", "never", "--", "true")).code).toBe(0);
    await eventually(
      async () => (await state("one")) === "running" && (await state("two")) === "running" && (await state("done")) === "completed",
    );

    // A readonly token may stop nothing: each refusal is said, and the exit is 1.
    const readonly = await createToken(own, { name: "viewer", role: "readonly" });
    const refused = await runCli(["--url", own.url, "--token", readonly.secret, "services", "stop", "--all"]);
    expect(refused.code).toBe(1);
    expect(refused.stdout).toBe("");
    expect(refused.stderr).toMatch(/^engine: could not stop one: .* \[forbidden\]$/m);
    expect(refused.stderr).toMatch(/^engine: could not stop two: .* \[forbidden\]$/m);
    expect(refused.stderr.trim().split("\n").at(-1)).toBe("engine: 2 of 2 services could not be stopped [forbidden]");
    expect(await state("one")).toBe("running");

    const stopped = await run("services", "stop", "--all");
    expect(stopped.code).toBe(0);
    expect(stopped.stdout.split("\n").filter(Boolean).sort()).toEqual([
      "stopped one (was running, now stopped)",
      "stopped two (was running, now stopped)",
    ]);
    // A completed batch job stays completed (a stop would have made it cancelled).
    expect(await state("done")).toBe("completed");
    const again = JSON.parse((await run("--json", "services", "stop", "--all")).stdout);
    expect(again).toEqual({ stopped: [], failed: [] });
  } finally {
    await own.close();
  }
}, 60_000);

test("engine restart asks the daemon to drain and restart", async () => {
  let restarts = 0;
  const restartable = await startTestEngine(
    {},
    {
      restart: () => {
        restarts += 1;
        return undefined;
      },
    },
  );
  try {
    const result = await runCli(["--data-dir", restartable.dataDir, "restart", "--drain-timeout", "0"]);
    expect(result.code).toBe(0);
    expect(result.stdout).toBe(
      `the daemon at ${restartable.daemon.socketPath} is draining (up to 0 s) and restarting; \`engine version\` shows when it is back\n`,
    );
    await eventually(() => restarts === 1);
  } finally {
    await restartable.close();
  }
});
