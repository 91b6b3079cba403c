import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { explainPortClash, findPortHolder, freePortNear, type LogCause } from "../../../../src/engine/services/diagnose";
import { parseProcNetTcp } from "../../../../src/engine/services/diagnose/ports";
import { tempDir } from "../../../helpers";

// /proc/net/tcp of a host with sshd on 22 (LISTEN, 0A), one established connection and 8000 on loopback.
const PROC_NET_TCP = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 18871 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 912345 1 0000000000000000 100 0 0 10 0
   2: 0F02000A:0016 0202000A:D3C4 01 00000000:00000000 02:000A7E2B 00000000     0        0 20004 4 0000000000000000 20 4 29 10 -1
`;

describe("parseProcNetTcp", () => {
  test("lists listening sockets by port with their inode and owner; connections are not listeners", () => {
    const listeners = parseProcNetTcp(PROC_NET_TCP);
    expect([...listeners.keys()].sort((a, b) => a - b)).toEqual([22, 8000]);
    expect(listeners.get(8000)).toEqual([{ inode: "912345", uid: 1001 }]);
  });

  test("lists the sockets of another state when asked: the established connection on 22", () => {
    expect([...parseProcNetTcp(PROC_NET_TCP, "01")]).toEqual([[22, [{ inode: "20004", uid: 0 }]]]);
  });
});

describe("findPortHolder on this host", () => {
  let server: Bun.TCPSocketListener<undefined>;
  beforeAll(() => {
    server = Bun.listen({ hostname: "127.0.0.1", port: 0, socket: { data() {} } });
  });
  afterAll(() => {
    server.stop(true);
  });

  test("names the process that listens, and the service serviceOf says it belongs to (by name, not its command line)", () => {
    const holder = findPortHolder(server.port, (pid) => (pid === process.pid ? "web1" : null), { enginePid: -1 });
    expect(holder).toMatchObject({ pid: process.pid, service: "web1", engine: false, command: null });
  });

  test("an outside process is named by its command line", () => {
    const holder = findPortHolder(server.port, () => null, { enginePid: -1 });
    expect(holder).toMatchObject({ pid: process.pid, service: null, engine: false });
    expect(holder?.command).toContain("bun");
  });

  test("an outside process's command line shows no secret option value or URL password", async () => {
    // A short command line: the holder's is cut to 120 characters.
    const dir = tempDir();
    writeFileSync(join(dir, "l.ts"), "console.log(Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } }).port);");
    const proc = Bun.spawn([process.execPath, "l.ts", "--api-token=hunter2", "postgres://app:pw-in-url@db/app"], {
      cwd: dir,
      stdout: "pipe",
    });
    try {
      const reader = (proc.stdout as ReadableStream<Uint8Array>).getReader();
      const port = Number(new TextDecoder().decode((await reader.read()).value).trim());
      const holder = findPortHolder(port, () => null);
      expect(holder?.pid).toBe(proc.pid);
      expect(holder?.command).toContain("--api-token=***");
      expect(holder?.command).toContain("postgres://app:***@db/app");
      expect(holder?.command).not.toContain("hunter2");
    } finally {
      proc.kill("SIGKILL");
      await proc.exited;
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("the engine's own process is the engine, not a service", () => {
    expect(findPortHolder(server.port, () => "web1")).toMatchObject({ pid: process.pid, engine: true, service: null });
  });

  test("a port nothing listens on has no holder; freePortNear skips the taken ones", () => {
    const free = freePortNear(server.port) as number;
    expect(free).toBeGreaterThan(server.port);
    expect(findPortHolder(free, () => null)).toBeNull();
  });

  test("explainPortClash blames the first candidate port something listens on", () => {
    const cause: LogCause = {
      class: "port_in_use",
      remediation: "free_port",
      key_line: "OSError: [Errno 98] Address already in use",
      stream: "stderr",
      subject: null,
      port: null,
      holder: null,
      free_port: null,
    };
    const free = freePortNear(server.port) as number;
    // "4" and the free port are numbers in the command line that nothing listens on.
    const explained = explainPortClash(
      cause,
      { command: ["python3", "serve.py", "--workers", "4", String(free), String(server.port)], env: {}, port: null },
      () => "web1",
      { enginePid: -1 },
    );
    expect(explained).toMatchObject({ port: server.port, subject: String(server.port), holder: { service: "web1", pid: process.pid } });
    expect(explained.free_port).toBeGreaterThan(server.port);
    // Nothing held: the declared port stays, without a holder.
    const unheld = explainPortClash(cause, { command: ["python3", "serve.py"], env: {}, port: free }, () => null);
    expect(unheld).toMatchObject({ port: free, holder: null });
  });
});
