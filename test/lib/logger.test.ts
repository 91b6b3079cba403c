import { afterEach, describe, expect, test } from "bun:test";
import { closeSync, existsSync, openSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { createLogger, redactSecrets } from "../../src/lib/logger";
import { eventually, tempDir } from "../helpers";
import { removeAfterRun } from "../run-dirs";
import { mountTmpfs, type Tmpfs } from "../tmpfs";

let disk: Tmpfs | null = null;
const fds: number[] = [];
afterEach(() => {
  for (const fd of fds.splice(0)) closeSync(fd);
  disk?.unmount();
  disk = null;
});

function lines(path: string): Record<string, unknown>[] {
  return readFileSync(path, "utf8")
    .split("\n")
    .filter(Boolean)
    .map((line) => JSON.parse(line));
}

/** topLevelKeys lists a JSON object line's own keys in order, duplicates kept (JSON.parse would merge them). */
function topLevelKeys(line: string): string[] {
  const keys: string[] = [];
  let depth = 0;
  for (const match of line.matchAll(/"(?:[^"\\]|\\.)*"(\s*:)?|[{}[\]]/g)) {
    const token = match[0];
    if (token === "{" || token === "[") depth++;
    else if (token === "}" || token === "]") depth--;
    else if (match[1] && depth === 1) keys.push(JSON.parse(token.slice(0, token.lastIndexOf(":")).trim()));
  }
  return keys;
}

describe("log lines", () => {
  test("every line has exactly one pid, the engine's; a field named pid is kept as other_pid", () => {
    const dir = tempDir();
    try {
      const { log, flush } = createLogger({ level: "info", dataDir: dir, stdout: false });
      log.info("plain");
      log.info({ service: "web", pid: 4242 }, "a field named pid");
      log.warn({ pid: 7, nested: { pid: 8 } }, "nested");
      flush();
      const text = readFileSync(join(dir, "engine.log"), "utf8").trim().split("\n");
      expect(text).toHaveLength(3);
      for (const line of text) {
        expect(topLevelKeys(line).filter((key) => key === "pid")).toEqual(["pid"]);
        expect(JSON.parse(line).pid).toBe(process.pid);
      }
      expect(JSON.parse(text[1] ?? "")).toMatchObject({ service: "web", other_pid: 4242, msg: "a field named pid" });
      expect(JSON.parse(text[2] ?? "")).toMatchObject({ other_pid: 7, nested: { pid: 8 } });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("topLevelKeys sees a duplicate key (so the test above can fail)", () => {
    expect(topLevelKeys('{"level":30,"pid":1,"a":{"pid":2},"pid":3,"msg":"x: \\"pid\\":"}')).toEqual(["level", "pid", "a", "pid", "msg"]);
  });
});

describe("logger on a full disk (issue 13)", () => {
  test("the log file drops and counts lines, says so once on stdout, and resumes when space returns", () => {
    disk = mountTmpfs("1m");
    const outDir = mountTmpfs("1m");
    try {
      const stdoutPath = join(outDir.dir, "stdout");
      const stdoutFd = openSync(stdoutPath, "a");
      fds.push(stdoutFd);
      const { log, sinks, flush } = createLogger({ level: "info", dataDir: disk.dir, stdout: true, stdoutFd, retryMs: 0 });
      const file = join(disk.dir, "engine.log");
      log.info("before");
      disk.fill();
      const started = Date.now();
      for (let i = 0; i < 500; i++) log.info({ i }, "while full");
      // Nothing waits or retries in a loop: 500 lines on a full disk take no time worth a name.
      expect(Date.now() - started).toBeLessThan(2000);
      const state = sinks().find((sink) => sink.name === file);
      expect(state).toMatchObject({ failing: true, error: "ENOSPC" });
      expect(state?.dropped).toBeGreaterThan(0);
      const notices = lines(stdoutPath).filter((line) => String(line.msg).includes("is not writable"));
      expect(notices).toHaveLength(1);
      expect(notices[0]?.msg).toBe(`${file} is not writable (ENOSPC): dropping log lines until it is`);

      disk.free();
      log.info("after");
      flush();
      const written = lines(file);
      const msgs = written.map((line) => line.msg);
      expect(msgs[0]).toBe("before");
      const recovery = written.find((line) => String(line.msg).startsWith("dropped "));
      expect(recovery?.msg).toMatch(new RegExp(`^dropped \\d+ log lines while ${file} was not writable$`));
      // Every line is either in the file (the log's last page had room) or counted as dropped.
      const kept = msgs.filter((msg) => msg === "while full").length;
      expect(Number(recovery?.dropped) + kept).toBe(500);
      expect(Number(recovery?.dropped)).toBeGreaterThan(0);
      expect(msgs.at(-1)).toBe("after");
      expect(sinks().every((sink) => !sink.failing)).toBe(true);
      // The recovery is said on stdout too, once.
      expect(lines(stdoutPath).filter((line) => String(line.msg).startsWith("dropped "))).toHaveLength(1);
    } finally {
      outDir.unmount();
    }
  });

  test("stdout to a full filesystem neither blocks nor throws, and resumes", () => {
    disk = mountTmpfs("1m");
    const stdoutPath = join(disk.dir, "stdout");
    const stdoutFd = openSync(stdoutPath, "a");
    fds.push(stdoutFd);
    const { log, sinks } = createLogger({ level: "info", stdout: true, stdoutFd, retryMs: 50 });
    disk.fill();
    for (let i = 0; i < 200; i++) log.info({ i, pad: "x".repeat(200) }, "while full");
    expect(sinks()[0]).toMatchObject({ name: "stdout", failing: true });
    disk.free();
    return eventually(
      () => {
        log.info("after");
        return existsSync(stdoutPath) && lines(stdoutPath).some((line) => line.msg === "after");
      },
      { timeoutMs: 3000, intervalMs: 60 },
    );
  });

  test("a pipe whose reader is gone (EPIPE) is dropped, not fatal", async () => {
    const [read, write] = await pipePair();
    closeSync(read);
    const { log, sinks } = createLogger({ level: "info", stdout: true, stdoutFd: write, retryMs: 1000 });
    fds.push(write);
    for (let i = 0; i < 10; i++) log.info({ i }, "into a closed pipe");
    await eventually(() => sinks()[0]?.failing);
    expect(sinks()[0]?.error).toBe("EPIPE");
  });
});

/** pipePair opens a real pipe (a FIFO in a temp dir) and returns its read and write ends. */
async function pipePair(): Promise<[number, number]> {
  const dir = removeAfterRun((await import("node:fs")).mkdtempSync("/tmp/engine-fifo-"));
  const path = join(dir, "fifo");
  Bun.spawnSync(["mkfifo", path]);
  const read = openSync(path, (await import("node:fs")).constants.O_RDONLY | (await import("node:fs")).constants.O_NONBLOCK);
  const write = openSync(path, "w");
  return [read, write];
}

describe("redactSecrets", () => {
  test("replaces secrets at the top, one level down, and in a headers object two levels down", () => {
    const fields = {
      token: "T1",
      service: "api",
      body: { password: "P1", name: "kept" },
      headers: { authorization: "Bearer T2", accept: "*/*" },
      request: { headers: { cookie: "c=1", host: "h" }, secret: "S1" },
      list: [{ token: "T3" }],
    };
    expect(redactSecrets(fields)).toEqual({
      token: "[redacted]",
      service: "api",
      body: { password: "[redacted]", name: "kept" },
      headers: { authorization: "[redacted]", accept: "*/*" },
      request: { headers: { cookie: "[redacted]", host: "h" }, secret: "[redacted]" },
      // A path's wildcard matched object keys, not array items two levels down: as before.
      list: [{ token: "T3" }],
    });
  });

  test("leaves the caller's objects as they were, and answers the same object when nothing is secret", () => {
    const body = { token: "T1" };
    const fields = { body };
    const redacted = redactSecrets(fields);
    expect(body.token).toBe("T1");
    expect(redacted.body).not.toBe(body);
    const plain = { service: "api", run: { id: "run_1" } };
    expect(redactSecrets(plain)).toBe(plain);
  });

  test("an error carrying a secret keeps its message and stack, the secret replaced", () => {
    const err = Object.assign(new Error("refused"), { token: "T1", code: "EACCES" });
    const redacted = redactSecrets({ err }).err as Record<string, unknown>;
    expect(redacted).toMatchObject({ type: "Error", message: "refused", code: "EACCES", token: "[redacted]" });
    expect(String(redacted.stack)).toContain("refused");
    expect(err.token).toBe("T1");
  });
});
