import { afterAll, beforeAll, expect, test } from "bun:test";
import { readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { digestSecret } from "../../src/lib/crypto";
import { createLogger } from "../../src/lib/logger";
import { tempDir } from "../helpers";
import { describeEachDialect, startTestCloud, type TestCloud } from "./helpers";

/**
 * Secret is one plaintext the console handed out (or was shown) during the flows below.
 * `digested` marks secrets stored as a plain SHA-256, so the scan can prove it read the rows
 * that hold them: their digest must be there while the plaintext is not.
 */
interface Secret {
  label: string;
  value: string;
  digested?: boolean;
}

/** filesUnder lists every plain file under a directory, recursively. */
function filesUnder(dir: string): string[] {
  const files: string[] = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) files.push(...filesUnder(path));
    else if (entry.isFile()) files.push(path);
  }
  return files;
}

/** textOf turns a row into searchable text: strings as they are, numbers and big integers as digits, bytes as latin1. */
function textOf(value: unknown): string {
  if (value === null || value === undefined) return "";
  if (typeof value === "string") return value;
  if (typeof value === "number" || typeof value === "bigint" || typeof value === "boolean") return String(value);
  if (value instanceof Uint8Array) return Buffer.from(value).toString("latin1");
  if (value instanceof Date) return value.toISOString();
  if (Array.isArray(value)) return value.map(textOf).join("\u0000");
  if (typeof value === "object")
    return Object.values(value as Record<string, unknown>)
      .map(textOf)
      .join("\u0000");
  return String(value);
}

/**
 * variantsOf is what the scan looks for per secret: the plaintext, its random part without the
 * type prefix (`ecs_`, `epk_`, `enc_`, `NL-`, ...), and that part in upper and lower case, so
 * a secret stored without its prefix or case-folded is caught too.
 */
function variantsOf(secret: string): string[] {
  const tail = secret.replace(/^[A-Za-z]{2,4}[_-]/, "");
  return [...new Set([secret, tail, tail.toLowerCase(), tail.toUpperCase()])].filter((variant) => variant.length >= 8);
}

/**
 * The secret scan: every flow the console serves runs once, every plaintext it handed out is
 * remembered in `secrets`, and then every row of every table of the test's database, and
 * every file in the data dir and the log dir (logging at `trace`), is searched for each of
 * them. To cover a new flow, add a step that runs it and `remember`s what it returned; flows
 * whose routes are not mounted are skipped with a note.
 */
describeEachDialect("secret scan: no plaintext at rest or in logs", (dialect) => {
  let cloud: TestCloud;
  let logDir: string;
  let flushLog: () => void;
  let paths: Record<string, Record<string, unknown>> = {};
  const secrets: Secret[] = [];
  let sources = 0;
  const source = () => {
    sources += 1;
    return { "x-forwarded-for": `10.40.${sources >> 8}.${sources & 255}` };
  };
  const remember = (label: string, value: unknown, digested = false) => {
    expect(typeof value).toBe("string");
    expect((value as string).length).toBeGreaterThanOrEqual(8);
    secrets.push({ label, value: value as string, digested });
  };
  /** mounted says whether the OpenAPI document lists a route, so a flow whose module is not registered yet is skipped. */
  const mounted = (method: string, path: string) => Boolean(paths[path]?.[method.toLowerCase()]);
  const skipUnless = (routes: [string, string][], flow: string): boolean => {
    const missing = routes.filter(([method, path]) => !mounted(method, path));
    if (missing.length === 0) return false;
    process.stderr.write(`note: secret scan [${dialect}]: ${flow} skipped; not mounted: ${missing.map((r) => r.join(" ")).join(", ")}\n`);
    return true;
  };

  beforeAll(async () => {
    logDir = tempDir("engine-cloud-secrets-log-");
    const made = createLogger({ level: "trace", dataDir: logDir, stdout: false, fileName: "cloud.log" });
    flushLog = made.flush;
    // Buckets in the database too, so their rows (named by digests) are part of the dump.
    cloud = await startTestCloud(dialect, { logLevel: "trace", rateLimits: "database", trustedProxies: "127.0.0.1" }, { log: made.log });
    paths = (await cloud.api("GET", "/api/openapi.json")).body.paths;
  });
  afterAll(async () => {
    await cloud?.close();
    rmSync(logDir, { recursive: true, force: true });
  });

  test("sessions: sign in, use by bearer and cookie, log out, log out everywhere", async () => {
    const ada = await cloud.signIn("ada@example.com");
    const adaAgain = await cloud.signIn("ada@example.com");
    const grace = await cloud.signIn("grace@example.com");
    remember("session token (ada)", ada.token, true);
    // Digested only while the session lives: logout deletes the row.
    remember("session token (ada, second)", adaAgain.token);
    remember("session token (grace)", grace.token, true);
    expect((await cloud.api("GET", "/api/auth/session", { token: ada.token })).status).toBe(200);
    expect((await cloud.api("GET", "/api/auth/session", { headers: { cookie: `engine_session=${grace.token}` } })).status).toBe(200);
    expect((await cloud.api("POST", "/api/auth/logout", { token: adaAgain.token })).status).toBe(204);
    expect((await cloud.api("GET", "/api/auth/session", { token: adaAgain.token })).status).toBe(401);
    const doomed = await cloud.signIn("doomed@example.com");
    remember("session token (ended by logout-all)", doomed.token);
    expect((await cloud.api("POST", "/api/auth/logout-all", { token: doomed.token })).status).toBe(200);
    expect((await cloud.api("GET", "/api/auth/session", { token: doomed.token })).status).toBe(401);
  });

  test("pre-authorized keys: mint, list, enroll, refusals, revoke", async () => {
    if (
      skipUnless(
        [
          ["POST", "/api/preauth-keys"],
          ["POST", "/api/link/preauth"],
        ],
        "pre-authorized keys",
      )
    )
      return;
    const { token } = await cloud.signIn("keys@example.com");
    const single = (await cloud.api("POST", "/api/preauth-keys", { token, body: { description: "single" } })).body;
    const multi = (await cloud.api("POST", "/api/preauth-keys", { token, body: { max_uses: 3 } })).body;
    remember("preauth key (single use)", single.key, true);
    remember("preauth key (three uses)", multi.key, true);
    expect((await cloud.api("GET", "/api/preauth-keys", { token })).status).toBe(200);

    const enroll = (key: string, hostname: string) =>
      cloud.api("POST", "/api/link/preauth", { body: { key, hostname, os: "linux", version: "0.6.0" }, headers: source() });
    // The third enrollment adopts the second's node and replaces its credential (and digest).
    for (const [key, hostname, current] of [
      [single.key, "preauth-one", true],
      [multi.key, "preauth-two", false],
      [multi.key, "preauth-two", true],
    ] as const) {
      const answer = await enroll(key, hostname);
      expect(answer.status).toBe(200);
      remember(`node credential (preauth ${hostname})`, answer.body.node_credential, current);
    }
    expect((await enroll(single.key, "spent")).status).toBe(409);
    expect((await cloud.api("DELETE", `/api/preauth-keys/${multi.id}`, { token })).status).toBe(204);
    expect((await enroll(multi.key, "revoked")).status).toBe(404);
    // A credential that was presented and refused must not be kept either.
    const invented = `epk_${Buffer.from(crypto.getRandomValues(new Uint8Array(32))).toString("base64url")}`;
    remember("preauth key (invented, refused)", invented);
    expect((await enroll(invented, "invented")).status).toBe(404);
  });

  test("link code: mint, claim, claim again", async () => {
    if (
      skipUnless(
        [
          ["POST", "/api/link/codes"],
          ["POST", "/api/link/claim"],
        ],
        "link code claim",
      )
    )
      return;
    const { token } = await cloud.signIn("codes@example.com");
    const minted = await cloud.api("POST", "/api/link/codes", { token, body: {} });
    expect(minted.status).toBe(201);
    remember("link code", minted.body.code);
    const claim = (hostname: string) =>
      cloud.api("POST", "/api/link/claim", {
        body: { code: minted.body.code, hostname, os: "linux", version: "0.6.0" },
        headers: source(),
      });
    const claimed = await claim("claimed-box");
    expect(claimed.status).toBe(200);
    remember("node credential (link code)", claimed.body.node_credential, true);
    expect((await claim("claimed-again")).status).toBe(409);
  });

  test("device link: request, look up, approve, poll; and a denied one", async () => {
    const routes: [string, string][] = [
      ["POST", "/api/link/device"],
      ["POST", "/api/link/device/poll"],
      ["POST", "/api/nodes/device-approvals/approve"],
    ];
    if (skipUnless(routes, "device link")) return;
    const { token } = await cloud.signIn("devices@example.com");
    const request = async (hostname: string) => {
      const answer = await cloud.api("POST", "/api/link/device", { body: { hostname, os: "linux", version: "0.6.0" }, headers: source() });
      expect(answer.status).toBe(201);
      const bare = String(answer.body.user_code).replace(/-/g, "");
      remember(`device code (${hostname})`, answer.body.device_code);
      remember(`user code (${hostname}, as shown)`, answer.body.user_code);
      remember(`user code (${hostname}, bare)`, bare);
      remember(`user code (${hostname}, dashed)`, `${bare.slice(0, 4)}-${bare.slice(4)}`);
      return { deviceCode: answer.body.device_code as string, bare };
    };

    const approved = await request("device-approved");
    if (mounted("POST", "/api/nodes/device-approvals/lookup")) {
      // Typed by a person: lower case, no dash.
      const lookup = await cloud.api("POST", "/api/nodes/device-approvals/lookup", {
        token,
        body: { user_code: approved.bare.toLowerCase() },
      });
      expect(lookup.status).toBe(200);
    }
    const approve = await cloud.api("POST", "/api/nodes/device-approvals/approve", { token, body: { user_code: approved.bare } });
    expect(approve.status).toBe(200);
    // The first poll of a device code is never early, so no wait is needed.
    const polled = await cloud.api("POST", "/api/link/device/poll", { body: { device_code: approved.deviceCode }, headers: source() });
    expect(polled.status).toBe(200);
    remember("node credential (device link)", polled.body.node_credential, true);

    if (mounted("POST", "/api/nodes/device-approvals/deny")) {
      const denied = await request("device-denied");
      const deny = await cloud.api("POST", "/api/nodes/device-approvals/deny", { token, body: { user_code: denied.bare } });
      expect(deny.status).toBe(200);
      const refused = await cloud.api("POST", "/api/link/device/poll", { body: { device_code: denied.deviceCode }, headers: source() });
      expect(refused.status).toBeGreaterThanOrEqual(400);
    }
  });

  test("no plaintext appears in any row of any table, or in any file of the data dir or the log", async () => {
    expect(secrets.length).toBeGreaterThanOrEqual(4);
    const sql = cloud.deps.db.sql;
    const tables: string[] =
      dialect === "sqlite"
        ? (await sql`SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name`).map((row: { name: string }) => row.name)
        : (
            await sql`SELECT table_name AS name FROM information_schema.tables
              WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY table_name`
          ).map((row: { name: string }) => row.name);
    expect(tables).toEqual(expect.arrayContaining(["accounts", "sessions", "nodes", "preauth_keys", "audit", "rate_buckets"]));

    const dump = new Map<string, string>();
    for (const table of tables) {
      const rows = await sql.unsafe(`SELECT * FROM "${table.replace(/"/g, '""')}"`);
      dump.set(`table ${table}`, rows.map(textOf).join("\n"));
    }
    flushLog();
    for (const file of [...filesUnder(cloud.dataDir), ...filesUnder(logDir)]) {
      if (statSync(file).size > 0) dump.set(`file ${file}`, readFileSync(file).toString("latin1"));
    }
    expect([...dump.keys()].some((where) => where.endsWith("cloud.log"))).toBe(true);

    const everything = [...dump.values()].join("\n");
    // The rows really were read: each digested secret's digest is there.
    for (const secret of secrets.filter((s) => s.digested)) {
      expect({ label: secret.label, found: everything.includes(digestSecret(secret.value)) }).toEqual({ label: secret.label, found: true });
    }
    const leaks: string[] = [];
    for (const secret of secrets) {
      for (const variant of variantsOf(secret.value)) {
        for (const [where, text] of dump) if (text.includes(variant)) leaks.push(`${secret.label} in ${where}`);
      }
    }
    expect(leaks).toEqual([]);
  });
});
