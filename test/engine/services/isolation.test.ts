import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, chownSync, existsSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { RedisEngine } from "../../../src/engine/databases";
import { serviceUserName, WORKLOAD_ID_RANGE } from "../../../src/engine/users";
import { buildBinaries } from "../../e2e/binaries";
import {
  createToken,
  eventually,
  reapWorkloads,
  spawnEngine,
  startTestEngine,
  type TestEngine,
  tempDir,
  workloadPath,
} from "../../helpers";
import { ServiceClient } from "./harness";

// Workload isolation (issue 13, item 1): a root engine runs each service as a system user of
// its own; an admin may choose another; an unprivileged engine runs everything as itself.
const asRoot = process.geteuid?.() === 0;
const rootOnly = asRoot ? describe : describe.skip;

const ADMIN_SECRET = "eng_isolationTestAdminSecret0123456789abcdef";

let engine: TestEngine;
let api: ServiceClient;
beforeAll(async () => {
  // The daemon's environment holds its admin token, as under systemd with ENGINE_ADMIN_TOKEN.
  engine = await startTestEngine({ adminToken: ADMIN_SECRET, workloadEnv: { ...process.env, ENGINE_ADMIN_TOKEN: ADMIN_SECRET } });
  api = new ServiceClient(engine);
});
afterAll(() => engine.close());

/** statusField reads one line of /proc/<pid>/status: "Uid", "Gid", "Groups". */
function statusField(pid: number, field: string): string {
  const line = readFileSync(`/proc/${pid}/status`, "utf8")
    .split("\n")
    .find((l) => l.startsWith(`${field}:`));
  return (line ?? "").slice(field.length + 1).trim();
}

/** groupId returns the gid of a group of this host, or null when it has none. */
function groupId(name: string): number | null {
  const line = readFileSync("/etc/group", "utf8")
    .split("\n")
    .find((l) => l.startsWith(`${name}:`));
  return line ? Number(line.split(":")[2]) : null;
}

async function logLines(name: string): Promise<string[]> {
  return (await engine.json<{ line: string }[]>("GET", `/api/services/${name}/logs`)).body.map((l) => l.line);
}

describe("the contract", () => {
  test("the engine's own OpenAPI document declares user in Diagnosis and in the service record, and on the deploy body", async () => {
    type Schema = { properties?: Record<string, unknown> };
    const doc = (await engine.json<{ components: { schemas: Record<string, Schema> } }>("GET", "/api/openapi.json")).body;
    expect(doc.components.schemas.Diagnosis?.properties?.user).toBeDefined();
    expect(doc.components.schemas.Service?.properties?.user).toBeDefined();
    expect(doc.components.schemas.ServiceDeploy?.properties?.user).toBeDefined();
  });
});

describe("the workload's environment", () => {
  test("no engine credential reaches a workload, even when the daemon's environment holds it", async () => {
    await api.deployed({ name: "env-dump", kind: "batch", command: "env" });
    await api.waitFor("env-dump", "completed");
    const lines = await logLines("env-dump");
    expect(lines.some((line) => line.startsWith("PATH="))).toBe(true);
    expect(lines.filter((line) => line.startsWith("ENGINE_") && !line.startsWith("ENGINE_RUN_ID="))).toEqual([]);
    expect(lines.join("\n")).not.toContain(ADMIN_SECRET);
  });
});

rootOnly("as root: each service runs as a user of its own", () => {
  test("the service's user: its own uid and gid, HOME its data dir (0700, its own), GPU groups, never root", async () => {
    await api.deployed({ name: "own-user", command: 'echo "$HOME $USER $LOGNAME"; exec sleep 300' });
    const { pid } = await api.waitFor("own-user", "running", (r) => r.pid !== null);
    const user = serviceUserName("own-user");
    const passwd = readFileSync("/etc/passwd", "utf8")
      .split("\n")
      .find((l) => l.startsWith(`${user}:`))
      ?.split(":");
    expect(passwd?.[6]).toMatch(/nologin$/);
    const [uid, gid] = [Number(passwd?.[2]), Number(passwd?.[3])];
    // Numbered from the engine's own range (not useradd's system range of ~900 ids), the group alike.
    expect(uid).toBeGreaterThanOrEqual(WORKLOAD_ID_RANGE.min);
    expect(uid).toBeLessThanOrEqual(WORKLOAD_ID_RANGE.max);
    expect(gid).toBe(uid);
    expect(
      statusField(pid as number, "Uid")
        .split(/\s+/)
        .map(Number),
    ).toEqual([uid, uid, uid, uid]);
    expect(
      statusField(pid as number, "Gid")
        .split(/\s+/)
        .map(Number),
    ).toEqual([gid, gid, gid, gid]);
    // GPU device nodes stay usable: /dev/dri/renderD* is group render, some /dev/nvidia* group video.
    const groups = statusField(pid as number, "Groups")
      .split(/\s+/)
      .filter(Boolean)
      .map(Number);
    for (const name of ["video", "render"]) {
      const id = groupId(name);
      if (id !== null) expect(groups).toContain(id);
    }
    expect(groups).not.toContain(0);
    const dataDir = join(engine.dataDir, "data", "own-user");
    const stat = statSync(dataDir);
    expect({ uid: stat.uid, mode: stat.mode & 0o777 }).toEqual({ uid, mode: 0o700 });
    await eventually(async () => (await logLines("own-user")).includes(`${dataDir} ${user} ${user}`));
    expect((await api.get("own-user")).user).toBe(user);
    expect((await api.diagnose("own-user")).user).toBe(user);

    // Files an older engine's root workload left in the data dir become the user's at its first run.
    await api.control("own-user", "stop");
    chownSync(dataDir, 0, 0);
    writeFileSync(join(dataDir, "from-root"), "x");
    await api.control("own-user", "start");
    await api.waitFor("own-user", "running", (r) => r.pid !== null);
    expect([statSync(dataDir).uid, statSync(join(dataDir, "from-root")).uid]).toEqual([uid, uid]);

    // Deleted and deployed again, the service gets the same user back: its kept data dir is still its own.
    expect((await engine.call("DELETE", "/api/services/own-user")).status).toBe(200);
    await api.deployed({ name: "own-user", command: "exec sleep 300" });
    const again = await api.waitFor("own-user", "running", (r) => r.pid !== null);
    expect(Number(statusField(again.pid as number, "Uid").split(/\s+/)[0])).toBe(uid);
    await api.control("own-user", "stop");
  });

  test("an admin may choose the user, root included; Diagnosis shows it", async () => {
    const deployed = await api.deploy({ name: "as-root", command: "exec sleep 300", user: "root" });
    expect(deployed.status).toBe(201);
    expect(deployed.body.user).toBe("root");
    const { pid } = await api.waitFor("as-root", "running", (r) => r.pid !== null);
    expect(statusField(pid as number, "Uid").split(/\s+/)[0]).toBe("0");
    expect((await api.diagnose("as-root")).user).toBe("root");

    const byUid = await api.deploy({ name: "as-nobody", kind: "batch", command: "id -un", user: "65534" });
    expect(byUid.status).toBe(201);
    expect(byUid.body.user).toBe("nobody");
    await api.waitFor("as-nobody", "completed");
    expect(await logLines("as-nobody")).toContain("nobody");
    await api.control("as-root", "stop");
  });

  test("a cwd the service's user may not reach fails to start, though the engine could enter it", async () => {
    const closed = tempDir("engine-closed-"); // 0700 root: entered by root, it would open up what is inside
    try {
      await api.deployed({ name: "closed-cwd", kind: "batch", command: "cat ./secret", cwd: closed });
      const failed = await api.waitFor("closed-cwd", "failed");
      expect(failed.status_message).toContain(`is not reachable by the user eng-closed-cwd: it may not enter ${closed}`);
    } finally {
      rmSync(closed, { recursive: true, force: true });
    }
  });

  test("a submitter may not choose the user (403 forbidden); an unknown user is 422", async () => {
    const submitter = (await createToken(engine, { name: "chooser", role: "submitter" })).secret;
    const refused = await api.deploy({ name: "sneaky", command: "exec sleep 300", user: "root" }, submitter);
    expect(refused.status).toBe(403);
    expect((refused.body as unknown as { error: { code: string } }).error.code).toBe("forbidden");
    expect((await engine.call("GET", "/api/services/sneaky")).status).toBe(404);
    const unknown = await api.deploy({ name: "nobody-here", command: "exec sleep 300", user: "no-such-user-here" });
    expect(unknown.status).toBe(422);
    expect((unknown.body as unknown as { detail: { loc: string[] }[] }).detail[0]?.loc).toEqual(["body", "user"]);
  });
});

rootOnly("the data dir's modes", () => {
  test("an engine started on a data dir with loose modes (an older engine's) tightens them before any workload runs", async () => {
    const dataDir = tempDir("engine-loose-");
    const first = await startTestEngine({ dataDir });
    const api1 = new ServiceClient(first);
    await api1.deployed({ name: "loose", kind: "batch", command: "true" });
    await api1.waitFor("loose", "completed");
    await first.close();
    const loose: [string, number][] = [
      [dataDir, 0o755],
      [join(dataDir, "engine.db"), 0o644],
      [join(dataDir, "engine.log"), 0o644],
      [join(dataDir, "admin.token"), 0o644],
      [join(dataDir, "services"), 0o755],
      [join(dataDir, "data"), 0o755],
    ];
    for (const [path, mode] of loose) chmodSync(path, mode);
    writeFileSync(join(dataDir, "notes.txt"), "not the engine's", { mode: 0o644 });
    const second = await startTestEngine({ dataDir });
    try {
      expect(statSync(join(dataDir, "notes.txt")).mode & 0o777).toBe(0o644); // only the engine's own entries are touched
      const modes = Object.fromEntries(loose.map(([path]) => [path.slice(dataDir.length) || "/", statSync(path).mode & 0o777]));
      expect(modes).toEqual({
        "/": 0o711,
        "/engine.db": 0o600,
        "/engine.log": 0o600,
        "/admin.token": 0o600,
        "/services": 0o700,
        "/data": 0o711,
      });
    } finally {
      await second.close();
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
});

rootOnly("a deleted service's user", () => {
  /** passwdLine is the service user's line in /etc/passwd, or undefined. */
  const passwdLine = (service: string) =>
    readFileSync("/etc/passwd", "utf8")
      .split("\n")
      .find((line) => line.startsWith(`${serviceUserName(service)}:`));
  const groupLine = (service: string) =>
    readFileSync("/etc/group", "utf8")
      .split("\n")
      .find((line) => line.startsWith(`${serviceUserName(service)}:`));

  test("goes with the service when its data dir is empty, and what it left in /tmp with it", async () => {
    const leftover = join("/tmp", `engine-leftover-${process.pid}-${Date.now()}`);
    await api.deployed({ name: "gone-job", kind: "batch", command: `echo scratch > ${leftover}` });
    await api.waitFor("gone-job", "completed");
    expect(passwdLine("gone-job")).toBeDefined();
    const uid = Number(passwdLine("gone-job")?.split(":")[2]);
    expect(statSync(leftover).uid).toBe(uid);
    const dataDir = join(engine.dataDir, "data", "gone-job");
    expect(existsSync(dataDir)).toBe(true);
    expect((await engine.call("DELETE", "/api/services/gone-job")).status).toBe(200);
    expect(passwdLine("gone-job")).toBeUndefined();
    expect(groupLine("gone-job")).toBeUndefined();
    expect(readFileSync("/etc/shadow", "utf8")).not.toContain(`${serviceUserName("gone-job")}:`);
    expect(existsSync(dataDir)).toBe(false);
    // The id is handed out again: a later service's user must not inherit the job's temp files.
    expect(existsSync(leftover)).toBe(false);
    // The same name deployed again gets a user and a data dir afresh.
    await api.deployed({ name: "gone-job", kind: "batch", command: 'test -w "$SERVICE_DATA_DIR"' });
    await api.waitFor("gone-job", "completed");
    expect(passwdLine("gone-job")).toBeDefined();
    expect((await engine.call("DELETE", "/api/services/gone-job")).status).toBe(200);
  });

  test("stays with the data it owns (decision 118): deployed again, the name gets both back", async () => {
    await api.deployed({ name: "kept-job", kind: "batch", command: 'echo result > "$SERVICE_DATA_DIR/result"' });
    await api.waitFor("kept-job", "completed");
    const line = passwdLine("kept-job");
    expect(line).toBeDefined();
    expect((await engine.call("DELETE", "/api/services/kept-job")).status).toBe(200);
    expect(passwdLine("kept-job")).toBe(line);
    const result = join(engine.dataDir, "data", "kept-job", "result");
    expect(readFileSync(result, "utf8")).toBe("result\n");
    await api.deployed({ name: "kept-job", kind: "batch", command: 'grep -q result "$SERVICE_DATA_DIR/result"' });
    await api.waitFor("kept-job", "completed");
    expect(passwdLine("kept-job")).toBe(line);
  });
});

describe("an unprivileged engine", () => {
  // Proves the laptop path: the engine as `nobody` runs workloads as itself, says so at start,
  // and refuses a `user` it cannot switch to.
  (asRoot && Bun.which("setpriv") ? test : test.skip)(
    "runs workloads as its own user, warns once at start, and answers 422 to another user",
    async () => {
      const dataDir = tempDir("engine-unpriv-");
      chownSync(dataDir, 65534, 65534);
      // The compiled binary, copied where nobody may run it: the checkout may be private.
      const binary = workloadPath((await buildBinaries()).engine);
      const spawned = await spawnEngine(join(dataDir, "state"), {
        command: ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", binary],
      });
      try {
        const token = readFileSync(join(dataDir, "state", "admin.token"), "utf8").trim();
        const call = (method: string, path: string, body?: unknown) =>
          fetch(`${spawned.url}${path}`, {
            method,
            headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
            body: body === undefined ? undefined : JSON.stringify(body),
          });
        expect(spawned.output()).toContain("the engine runs unprivileged");
        expect((await call("POST", "/api/services", { name: "laptop", kind: "batch", command: "id -u" })).status).toBe(201);
        const lines = await eventually(async () => {
          const logs = (await (await call("GET", "/api/services/laptop/logs")).json()) as { line: string }[];
          return logs.length > 0 ? logs.map((l) => l.line) : null;
        });
        expect(lines).toEqual(["65534"]);
        const record = (await (await call("GET", "/api/services/laptop")).json()) as { user: string | null };
        expect(record.user).toBeNull();
        const refused = await call("POST", "/api/services", { name: "escalate", command: "exec sleep 300", user: "root" });
        expect(refused.status).toBe(422);

        // Managed databases too: a SQLite file and a Redis server are the engine's user's, as before.
        const databases: [string, Record<string, unknown>][] = [["laptop-notes", { engine: "sqlite" }]];
        if (new RedisEngine().detectTools({ PATH: process.env.PATH ?? "" }).missing.length === 0) {
          databases.push(["laptop-cache", { template_id: "redis" }]);
        }
        for (const [name, body] of databases) {
          expect((await call("POST", "/api/services", { name, ...body })).status).toBe(201);
          const running = await eventually(
            async () => {
              const record = (await (await call("GET", `/api/services/${name}`)).json()) as {
                status: string;
                pid: number | null;
                user: string | null;
              };
              return record.status === "running" && record.pid !== null ? record : null;
            },
            { timeoutMs: 30_000 },
          );
          expect(running.user).toBeNull();
          expect(statusField(running.pid as number, "Uid").split(/\s+/)[0]).toBe("65534");
          expect(statSync(join(dataDir, "state", "data", name)).uid).toBe(65534);
          expect((await call("POST", `/api/services/${name}/stop`)).status).toBe(200);
        }
        expect(statSync(join(dataDir, "state", "data", "laptop-notes", "database.sqlite3")).uid).toBe(65534);
        // Nothing to share with bound services there (they run as the same user): the SQLite
        // dir and file keep their private modes (decision 290 is a root engine's).
        expect(statSync(join(dataDir, "state", "data", "laptop-notes")).mode & 0o7777).toBe(0o700);
        // (0640 less the umask: never the group's to write, nor others'.)
        expect(statSync(join(dataDir, "state", "data", "laptop-notes", "database.sqlite3")).mode & 0o7027).toBe(0);
      } finally {
        await spawned.stop();
        reapWorkloads(join(dataDir, "state"));
        rmSync(dataDir, { recursive: true, force: true });
      }
    },
    120_000,
  );
});
