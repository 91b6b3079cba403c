import { describe, expect, test } from "bun:test";
import { DEFAULT_RESTORE_TIMEOUT_S, MAX_RESTORE_TIMEOUT_S } from "../../../src/contract/defaults";
import { RestoreRequest, ServiceStatus } from "../../../src/contract/engine";
import {
  describeHealthSpec,
  describeLastDump,
  describeProbe,
  formatBytes,
  gpuDefault,
  hasColour,
  initials,
  serviceActions,
} from "../../../src/engine/ui/format";

/** at writes a time as the tests read it, so rows do not depend on the machine's locale. */
const at = (iso: string) => `@${iso}`;

describe("describeHealthSpec", () => {
  test.each([
    [
      "an http probe with its own port",
      { type: "http", path: "/health", port: 8000, interval_s: 10, timeout_s: 2, failure_threshold: 3 },
      null,
      "HTTP GET :8000/health every 10 s, timeout 2 s, 3 failures",
    ],
    [
      "an http probe of the service's port",
      { type: "http", path: "/ready", interval_s: 10, timeout_s: 5, failure_threshold: 3 },
      5000,
      "HTTP GET :5000/ready every 10 s, timeout 5 s, 3 failures",
    ],
    [
      "an http probe without a path or a port",
      { type: "http", interval_s: 0.5, timeout_s: 0.25 },
      null,
      "HTTP GET / on the service's port every 0.5 s, timeout 0.25 s",
    ],
    [
      "a tcp probe",
      { type: "tcp", interval_s: 10, timeout_s: 5, failure_threshold: 1 },
      5432,
      "TCP connect to :5432 every 10 s, timeout 5 s, 1 failure",
    ],
    [
      "an exec probe given to a shell",
      { type: "exec", command: ["/bin/sh", "-c", "pg_isready -q"], interval_s: 30, timeout_s: 3, failure_threshold: 2 },
      null,
      "run pg_isready -q every 30 s, timeout 3 s, 2 failures",
    ],
    [
      "a model's probe with a start period",
      { type: "http", path: "/health", interval_s: 10, timeout_s: 2, failure_threshold: 3, start_period_s: 1800 },
      8000,
      "HTTP GET :8000/health every 10 s, timeout 2 s, 3 failures, start period 1800 s",
    ],
    ["a start period of 0 says nothing", { type: "tcp", interval_s: 5, start_period_s: 0 }, 6379, "TCP connect to :6379 every 5 s"],
    ["an exec probe's argv", { type: "exec", command: ["redis-cli", "ping"], interval_s: 5 }, null, "run redis-cli ping every 5 s"],
  ])("%s", (_name, spec, port, expected) => {
    expect(describeHealthSpec(spec, port)).toBe(expected);
  });
});

describe("describeProbe", () => {
  test.each([
    [
      "a failing probe with its count",
      { ok: false, at: "2025-01-01T00:00:00Z", duration_ms: 3, detail: "connect ECONNREFUSED 127.0.0.1:8000", consecutive_failures: 2 },
      "failed at @2025-01-01T00:00:00Z (connect ECONNREFUSED 127.0.0.1:8000, 3 ms); 2 consecutive failures",
    ],
    [
      "a passing probe",
      { ok: true, at: "2025-01-01T00:00:00Z", duration_ms: 12, detail: "HTTP 200", consecutive_failures: 0 },
      "passed at @2025-01-01T00:00:00Z (HTTP 200, 12 ms)",
    ],
    ["a bare record", { ok: false }, "failed"],
  ])("%s", (_name, probe, expected) => {
    expect(describeProbe(probe, at)).toBe(expected);
  });
});

describe("formatBytes", () => {
  test.each([
    [0, "0 B"],
    [1023, "1023 B"],
    [1024, "1.0 KiB"],
    [1536, "1.5 KiB"],
    [20 * 1048576, "20.0 MiB"],
    [3 * 1073741824, "3.0 GiB"],
    [5 * 1099511627776, "5.0 TiB"],
    [5000 * 1099511627776, "5000.0 TiB"],
  ])("%p bytes read %p", (bytes, expected) => {
    expect(formatBytes(bytes)).toBe(expected);
  });
});

describe("describeLastDump", () => {
  const base = {
    dump: "/srv/dumps/notes.sql",
    format: "sqlite-sql",
    engine: "sqlite",
    started_at: "2025-01-01T00:00:00Z",
    finished_at: "2025-01-01T00:00:02Z",
    duration_s: 1.5,
    bytes: 2048,
    total_bytes: 2048,
  };
  test.each([
    [
      "a restore that succeeded",
      { ...base, result: "ok", message: null },
      [
        ["Last dump", "/srv/dumps/notes.sql, 2.0 KiB, @2025-01-01T00:00:02Z"],
        ["Result", "restored in 1.5 s"],
        ["Format", "sqlite-sql into sqlite"],
      ],
    ],
    [
      "a restore that failed says why",
      { ...base, result: "failed", message: "syntax error near line 3" },
      [
        ["Last dump", "/srv/dumps/notes.sql, 2.0 KiB, @2025-01-01T00:00:02Z"],
        ["Result", "failed in 1.5 s: syntax error near line 3"],
        ["Format", "sqlite-sql into sqlite"],
      ],
    ],
    [
      "a restore past its timeout",
      { ...base, result: "timeout", message: "the restore passed its timeout of 1 s" },
      [
        ["Last dump", "/srv/dumps/notes.sql, 2.0 KiB, @2025-01-01T00:00:02Z"],
        ["Result", "stopped at its timeout in 1.5 s; the database was left as it was"],
        ["Format", "sqlite-sql into sqlite"],
      ],
    ],
    [
      "a download under way, its size not known yet",
      {
        ...base,
        dump: "https://example.test/d.sql.gz",
        format: null,
        finished_at: null,
        duration_s: null,
        bytes: 1048576,
        total_bytes: null,
        result: "running",
        message: null,
      },
      [
        ["Last dump", "https://example.test/d.sql.gz, 1.0 MiB read, @2025-01-01T00:00:00Z"],
        ["Result", "restoring now"],
        ["Format", "into sqlite"],
      ],
    ],
  ])("%s", (_name, dump, expected) => {
    expect(describeLastDump(dump, at)).toEqual(expected as [string, string][]);
  });
});

/** STATUSES are every service status the contract names. */
const STATUSES = ServiceStatus.anyOf.map((literal) => literal.const as string);

describe("serviceActions", () => {
  /** enabled lists the actions a status allows, for a compact table. */
  const enabled = (status: string, kind = "service") =>
    serviceActions(status, kind)
      .filter((button) => button.disabledReason === null)
      .map((button): string => button.action);

  test.each([
    ["running", ["stop", "restart", "pause"]],
    ["degraded", ["stop", "restart", "pause"]],
    ["paused", ["stop", "restart", "resume"]],
    ["scheduled", ["stop", "restart"]],
    ["pending", ["start", "stop", "restart"]],
    ["restarting", ["start", "stop", "restart"]],
    ["retrying", ["start", "stop", "restart"]],
    ["building", ["stop"]],
    ["stopped", ["start", "restart"]],
    ["failed", ["start", "restart"]],
    ["completed", ["start", "restart"]],
    ["cancelled", ["start", "restart"]],
  ])("a %s service allows %p", (status, actions) => {
    expect(enabled(status)).toEqual(actions);
  });

  test("the table covers every status of the contract, and each disabled button says why", () => {
    expect(STATUSES.length).toBe(12);
    for (const status of STATUSES) {
      const buttons = serviceActions(status, "service");
      expect(buttons.map((button) => button.label)).toEqual(["Start", "Stop", "Restart", status === "paused" ? "Resume" : "Pause"]);
      for (const button of buttons) if (button.disabledReason !== null) expect(button.disabledReason.length).toBeGreaterThan(10);
    }
  });

  test("the reasons name the status and the kind", () => {
    const stopOnCompletedJob = serviceActions("completed", "batch").find((button) => button.action === "stop");
    expect(stopOnCompletedJob?.disabledReason).toBe("The job has completed: nothing runs to stop");
    const pauseOnStopped = serviceActions("stopped", "service").find((button) => button.action === "pause");
    expect(pauseOnStopped?.disabledReason).toBe("Only a running process can be paused; the service is stopped");
    const startOnRunning = serviceActions("running", "database").find((button) => button.action === "start");
    expect(startOnRunning?.disabledReason).toBe("The service is running: stop it first, or use Restart");
  });
});

describe("gpuDefault", () => {
  test.each([
    ["no GPUs: 0, whatever the template suggests", 1, 0, { value: 0, hint: "no GPUs on this host (the template suggests 1)" }],
    ["no GPUs and a CPU template", 0, 0, { value: 0, hint: "no GPUs on this host" }],
    ["fewer GPUs than the template asks", 4, 2, { value: 2, hint: "2 GPUs on this host (the template suggests 4)" }],
    ["enough GPUs: the template's default", 1, 2, { value: 1, hint: "2 GPUs on this host" }],
    ["one GPU", 0, 1, { value: 0, hint: "1 GPU on this host" }],
    ["an unreadable inventory keeps the template's default", 2, null, { value: 2, hint: null }],
  ])("%s", (_name, templateGpus, devices, expected) => {
    expect(gpuDefault(templateGpus, devices)).toEqual(expected);
  });
});

describe("initials", () => {
  test.each([
    ["Hello", "He"],
    ["Open WebUI", "OW"],
    ["llama.cpp", "LC"],
    ["vLLM", "VL"],
    ["TGI", "TG"],
    ["Text Embeddings Inference", "TE"],
    ["ComfyUI", "Co"],
    ["", "?"],
    ["  --  ", "?"],
    ["Ölbild", "Öl"],
  ])("%p reads %p", (name, expected) => {
    expect(initials(name)).toBe(expected);
  });
});

describe("hasColour", () => {
  /** pixels builds RGBA data of `count` pixels of one colour, then transparent ones. */
  const pixels = (count: number, rgba: [number, number, number, number], total = 64) => {
    const data = new Uint8ClampedArray(total * 4);
    for (let i = 0; i < count; i++) data.set(rgba, i * 4);
    return data;
  };
  test.each([
    ["an empty canvas", pixels(0, [0, 0, 0, 0]), false],
    ["a black missing-glyph box", pixels(40, [0, 0, 0, 255]), false],
    ["grey anti-aliasing", pixels(40, [128, 128, 128, 180]), false],
    ["a few noisy pixels", pixels(3, [200, 40, 40, 255]), false],
    ["colour under near-transparency", pixels(40, [255, 0, 0, 20]), false],
    ["a colour glyph", pixels(40, [240, 180, 40, 255]), true],
  ])("%s", (_name, data, expected) => {
    expect(hasColour(data)).toBe(expected);
  });
});

test("the restore timeout default is inside what the API accepts", () => {
  expect(DEFAULT_RESTORE_TIMEOUT_S).toBeGreaterThanOrEqual(RestoreRequest.properties.timeout_s.minimum ?? 1);
  expect(DEFAULT_RESTORE_TIMEOUT_S).toBeLessThanOrEqual(MAX_RESTORE_TIMEOUT_S);
  expect(RestoreRequest.properties.timeout_s.maximum).toBe(MAX_RESTORE_TIMEOUT_S);
});
