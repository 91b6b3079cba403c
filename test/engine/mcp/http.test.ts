import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { Diagnosis, LogLine, ServiceRecord } from "../../../src/contract/engine";
import { McpEndpoint, TOOLS } from "../../../src/engine/mcp";
import { AppError } from "../../../src/lib/errors";
import { createLogger } from "../../../src/lib/logger";
import { createToken, eventually, startTestEngine, type TestEngine, tempDir } from "../../helpers";
import { connectHttp, ERAS, structured, toolError } from "./harness";

let engine: TestEngine;
const secrets: Record<"admin" | "submitter" | "readonly" | "scoped", string> = { admin: "", submitter: "", readonly: "", scoped: "" };
let repo: string;

/** CHATTY_LINES is how many numbered lines the batch job `chatty` prints. */
const CHATTY_LINES = 300;

async function deploy(body: Record<string, unknown>): Promise<void> {
  const response = await engine.json("POST", "/api/services", { body });
  if (response.status !== 201) throw new Error(`deploy failed with ${response.status}: ${JSON.stringify(response.body)}`);
}

beforeAll(async () => {
  engine = await startTestEngine();
  secrets.admin = engine.adminToken;
  secrets.submitter = (await createToken(engine, { name: "sub", role: "submitter" })).secret;
  secrets.readonly = (await createToken(engine, { name: "ro", role: "readonly" })).secret;
  secrets.scoped = (await createToken(engine, { name: "scoped", role: "submitter", scope_services: ["mine"] })).secret;
  await deploy({ name: "chatty", kind: "batch", command: `for i in $(seq 1 ${CHATTY_LINES}); do echo chatty-line-$i; done` });
  await deploy({ name: "sleeper", command: "exec sleep 300" });
  await deploy({ name: "mine", command: "exec sleep 300" });
  await eventually(
    async () => {
      const lines = (await engine.json<LogLine[]>("GET", "/api/services/chatty/logs?tail=1")).body;
      const sleeper = (await engine.json<ServiceRecord>("GET", "/api/services/sleeper")).body;
      return lines.at(-1)?.line === `chatty-line-${CHATTY_LINES}` && sleeper.status === "running";
    },
    { timeoutMs: 20_000 },
  );
  // A repository stands for a remote every build user may read (as root the engine clones as the service's user).
  repo = tempDir("engine-mcp-repo-");
  chmodSync(repo, 0o755);
  const git = (...args: string[]) => {
    const result = Bun.spawnSync(["git", ...args], {
      cwd: repo,
      env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: repo, GIT_CONFIG_GLOBAL: "/dev/null", GIT_CONFIG_NOSYSTEM: "1" },
      stderr: "pipe",
    });
    if (result.exitCode !== 0) throw new Error(`git ${args.join(" ")}: ${result.stderr.toString()}`);
  };
  git("init", "-q", "-b", "main");
  mkdirSync(join(repo, "app"));
  writeFileSync(join(repo, "app", "serve.sh"), "#!/bin/sh\necho serving\nexec sleep 300\n");
  git("add", ".");
  git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "v1");
}, 60_000);

afterAll(async () => {
  await engine?.close();
  if (repo) rmSync(repo, { recursive: true, force: true });
});

describe.each(ERAS)("over /mcp, protocol %s", (era) => {
  test("lists every tool in the table's order, with its annotations and an object schema in and out", async () => {
    const session = await connectHttp(engine.url, secrets.admin, era);
    try {
      // 2025-11-25 keeps a session; 2026-07-28 is stateless.
      if (era === "2025-11-25") expect(session.transport.sessionId).toMatch(/^[0-9a-f-]{36}$/);
      else expect(session.transport.sessionId).toBeUndefined();
      const { tools } = await session.client.listTools();
      expect(tools.map((tool) => tool.name)).toEqual(TOOLS.map((tool) => tool.name));
      for (const tool of tools) {
        const spec = TOOLS.find((row) => row.name === tool.name);
        expect(tool.name.length).toBeLessThanOrEqual(64);
        expect(tool.title).toBe(spec?.title);
        expect(tool.annotations).toEqual({
          title: spec?.title,
          readOnlyHint: spec?.readOnly,
          destructiveHint: spec?.destructive,
          idempotentHint: spec?.idempotent,
          openWorldHint: spec?.openWorld,
        });
        expect(tool.inputSchema.type).toBe("object");
        expect(tool.outputSchema?.type).toBe("object");
        expect(JSON.stringify(tool)).not.toContain('"$id"');
      }
      const stop = tools.find((tool) => tool.name === "stop_service");
      expect(stop?.annotations).toMatchObject({ readOnlyHint: false, destructiveHint: true });
      const logs = tools.find((tool) => tool.name === "logs");
      expect(Object.keys(logs?.inputSchema.properties ?? {})).toEqual(["service", "tail", "since", "grep", "ignore_case", "max_bytes"]);
    } finally {
      await session.close();
    }
  });

  test("list_services answers what GET /api/services answers, and a scoped submitter sees only its own", async () => {
    const admin = await connectHttp(engine.url, secrets.admin, era);
    const scoped = await connectHttp(engine.url, secrets.scoped, era);
    try {
      const all = structured<{ services: ServiceRecord[] }>(await admin.client.callTool({ name: "list_services", arguments: {} }));
      expect(all.services.map((s) => s.name).sort()).toEqual(["chatty", "mine", "sleeper"]);
      const direct = (await engine.json<ServiceRecord[]>("GET", "/api/services")).body;
      expect(all.services.map((s) => s.id).sort()).toEqual(direct.map((s) => s.id).sort());
      const own = structured<{ services: ServiceRecord[] }>(await scoped.client.callTool({ name: "list_services", arguments: {} }));
      expect(own.services.map((s) => s.name)).toEqual(["mine"]);
      const outside = toolError(await scoped.client.callTool({ name: "show_service", arguments: { service: "sleeper" } }));
      const http = await engine.json<{ error: { code: string; message: string } }>("GET", "/api/services/sleeper", {
        token: secrets.scoped,
      });
      expect(http.status).toBe(403);
      expect({ status: outside.status, code: outside.error?.code, message: outside.error?.message }).toEqual({
        status: 403,
        code: "out_of_scope",
        message: http.body.error.message,
      });
      const diagnosis = toolError(await scoped.client.callTool({ name: "diagnose", arguments: { service: "chatty" } }));
      expect(diagnosis.error?.code).toBe("out_of_scope");
    } finally {
      await admin.close();
      await scoped.close();
    }
  });

  test("diagnose answers the cause and the remediation first, then the record", async () => {
    const session = await connectHttp(engine.url, secrets.readonly, era);
    try {
      const result = await session.client.callTool({ name: "diagnose", arguments: { service: "sleeper" } });
      const answer = structured<{ cause: string; remediation: unknown; diagnosis: Diagnosis }>(result);
      expect(Object.keys(answer).slice(0, 2)).toEqual(["cause", "remediation"]);
      expect(answer.cause).toBe("running: nothing wrong found");
      expect(answer.diagnosis.service_name).toBe("sleeper");
      const text = result.content[0]?.type === "text" ? result.content[0].text : "";
      expect(text.split("\n")[0]).toBe("cause: running: nothing wrong found");
      expect(text.split("\n")[1]?.startsWith("remediation")).toBe(true);
      const missing = toolError(await session.client.callTool({ name: "diagnose", arguments: { service: "nothing-here" } }));
      expect({ status: missing.status, code: missing.error?.code }).toEqual({ status: 404, code: "service_not_found" });
    } finally {
      await session.close();
    }
  });

  test("logs: tail, grep and a byte cap that keeps the END of the output", async () => {
    const session = await connectHttp(engine.url, secrets.readonly, era);
    type Logs = { lines: LogLine[]; truncated: boolean; bytes: number; omitted_lines: number; matched: number };
    try {
      const tail = structured<Logs>(await session.client.callTool({ name: "logs", arguments: { service: "chatty", tail: 5 } }));
      expect(tail.lines.map((l) => l.line)).toEqual([296, 297, 298, 299, 300].map((i) => `chatty-line-${i}`));
      const capped = await session.client.callTool({ name: "logs", arguments: { service: "chatty", tail: CHATTY_LINES, max_bytes: 1024 } });
      const shaped = structured<Logs>(capped);
      expect(shaped.truncated).toBe(true);
      expect(shaped.bytes).toBeLessThanOrEqual(1024);
      expect(shaped.lines.at(-1)?.line).toBe(`chatty-line-${CHATTY_LINES}`);
      expect(shaped.lines.length + shaped.omitted_lines).toBe(CHATTY_LINES);
      const text = capped.content[0]?.type === "text" ? capped.content[0].text : "";
      expect(text.endsWith(`chatty-line-${CHATTY_LINES}`)).toBe(true);
      const grep = structured<Logs>(
        await session.client.callTool({ name: "logs", arguments: { service: "chatty", grep: "line-29", tail: 3 } }),
      );
      expect(grep.matched).toBe(11);
      expect(grep.lines.map((l) => l.line)).toEqual(["chatty-line-297", "chatty-line-298", "chatty-line-299"]);
      const since = structured<Logs>(await session.client.callTool({ name: "logs", arguments: { service: "chatty", since: "1h" } }));
      expect(since.matched).toBe(CHATTY_LINES);
      const badSince = toolError(await session.client.callTool({ name: "logs", arguments: { service: "chatty", since: "soon" } }));
      expect(badSince.error?.code).toBe("invalid_argument");
    } finally {
      await session.close();
    }
  });

  test("a readonly token cannot stop a service: the tool fails with the API's own 403, and nothing stops", async () => {
    const session = await connectHttp(engine.url, secrets.readonly, era);
    try {
      const refused = toolError(await session.client.callTool({ name: "stop_service", arguments: { service: "sleeper" } }));
      const http = await engine.json<{ error: { code: string; message: string } }>("POST", "/api/services/sleeper/stop", {
        token: secrets.readonly,
      });
      expect(http.status).toBe(403);
      expect({ status: refused.status, code: refused.error?.code, message: refused.error?.message }).toEqual({
        status: 403,
        code: "forbidden",
        message: http.body.error.message,
      });
      expect((await engine.json<ServiceRecord>("GET", "/api/services/sleeper")).body.status).toBe("running");
    } finally {
      await session.close();
    }
  });

  test("every reading tool answers structured content that fits its output schema", async () => {
    const session = await connectHttp(engine.url, secrets.readonly, era);
    try {
      const calls: [string, Record<string, unknown>][] = [
        ["show_service", { service: "sleeper" }],
        ["list_templates", {}],
        ["show_template", { template_id: "vllm" }],
        ["gpus", {}],
        ["proxy_status", {}],
      ];
      for (const [name, args] of calls) {
        const result = await session.client.callTool({ name, arguments: args });
        expect({ name, isError: result.isError ?? false, structured: typeof result.structuredContent }).toEqual({
          name,
          isError: false,
          structured: "object",
        });
      }
      const template = structured<{ id: string; env_schema: unknown[] }>(
        await session.client.callTool({ name: "show_template", arguments: { template_id: "vllm" } }),
      );
      expect(template.id).toBe("vllm");
    } finally {
      await session.close();
    }
  });

  test("a scoped submitter operates the service in its scope: pause, resume, restart, stop, start", async () => {
    // Only a running process can be paused: the other era's run of this test may have left it starting.
    await eventually(async () => (await engine.json<ServiceRecord>("GET", "/api/services/mine")).body.status === "running", {
      timeoutMs: 15_000,
    });
    const session = await connectHttp(engine.url, secrets.scoped, era);
    try {
      const call = async (name: string) =>
        structured<ServiceRecord>(await session.client.callTool({ name, arguments: { service: "mine" } }));
      expect((await call("pause_service")).status).toBe("paused");
      expect((await call("resume_service")).status).toBe("running");
      await call("restart_service");
      await eventually(async () => (await engine.json<ServiceRecord>("GET", "/api/services/mine")).body.status === "running", {
        timeoutMs: 15_000,
      });
      expect((await call("stop_service")).desired_state).toBe("stopped");
      expect((await call("start_service")).desired_state).toBe("running");
      await eventually(async () => (await engine.json<ServiceRecord>("GET", "/api/services/mine")).body.status === "running", {
        timeoutMs: 15_000,
      });
      const outside = toolError(await session.client.callTool({ name: "stop_service", arguments: { service: "sleeper" } }));
      expect(outside.error?.code).toBe("out_of_scope");
    } finally {
      await session.close();
    }
  }, 45_000);

  test("query parameters narrow the list: read_only, toolsets, disable_destructive", async () => {
    const cases: [string, string[]][] = [
      ["?read_only=true", ["list_services", "show_service", "diagnose", "logs", "list_templates", "show_template", "gpus", "proxy_status"]],
      ["?toolsets=logs,gpu", ["logs", "gpus"]],
      [
        "?toolsets=services&disable_destructive=true",
        ["list_services", "show_service", "diagnose", "proxy_status", "start_service", "pause_service", "resume_service"],
      ],
    ];
    for (const [query, expected] of cases) {
      const session = await connectHttp(engine.url, secrets.admin, era, query);
      try {
        const { tools } = await session.client.listTools();
        expect({ query, tools: tools.map((tool) => tool.name) }).toEqual({ query, tools: expected });
        // A tool left out is not callable either.
        const hidden = await session.client
          .callTool({ name: "remove_service", arguments: { service: "sleeper" } })
          .catch((error: Error) => error);
        expect(hidden instanceof Error || hidden.isError === true).toBe(true);
      } finally {
        await session.close();
      }
    }
    expect((await engine.json<ServiceRecord>("GET", "/api/services/sleeper")).body.status).toBe("running");
  });
});

describe("/mcp over HTTP", () => {
  const post = (headers: Record<string, string>, body: unknown = { jsonrpc: "2.0", id: 1, method: "ping" }, path = "/mcp") =>
    fetch(`${engine.url}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json", accept: "application/json, text/event-stream", ...headers },
      body: JSON.stringify(body),
    });
  const initialize = {
    jsonrpc: "2.0",
    id: 1,
    method: "initialize",
    params: { protocolVersion: "2025-11-25", capabilities: {}, clientInfo: { name: "raw", version: "1" } },
  };

  test("without a token: 401 with WWW-Authenticate naming the protected-resource metadata, and no error code (RFC 6750 §3.1)", async () => {
    const response = await post({});
    expect(response.status).toBe(401);
    const challenge = response.headers.get("www-authenticate") ?? "";
    expect(challenge).toBe(`Bearer resource_metadata="${engine.url}/.well-known/oauth-protected-resource/mcp"`);
    const metadata = await fetch(/resource_metadata="([^"]+)"/.exec(challenge)?.[1] ?? "");
    expect(metadata.status).toBe(200);
    expect(await metadata.json()).toMatchObject({ resource: `${engine.url}/mcp`, bearer_methods_supported: ["header"] });
  });

  test("a bad, revoked or malformed token: 401 invalid_token with the same challenge", async () => {
    const revoked = await createToken(engine, { name: "gone", role: "admin" });
    expect((await engine.call("DELETE", `/api/tokens/${revoked.id}`)).status).toBe(200);
    for (const header of ["Bearer eng_notARealTokenAtAll0123456789", `Bearer ${revoked.secret}`, "Basic dXNlcjpwYXNz"]) {
      const response = await post({ authorization: header });
      expect(response.status).toBe(401);
      const challenge = response.headers.get("www-authenticate") ?? "";
      expect(
        challenge.startsWith(`Bearer resource_metadata="${engine.url}/.well-known/oauth-protected-resource/mcp", error="invalid_token"`),
      ).toBe(true);
    }
  });

  test("RFC 9728 metadata is served path-inserted for /mcp and at the root, and names /mcp", async () => {
    for (const path of ["/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"]) {
      const response = await fetch(`${engine.url}${path}`);
      expect(response.status).toBe(200);
      const body = (await response.json()) as { resource: string; authorization_servers?: unknown };
      expect(body.resource).toBe(`${engine.url}/mcp`);
      expect(body.authorization_servers).toBeUndefined();
    }
  });

  test("an Origin of another site is 403; none, this engine's own and a local one are served", async () => {
    const auth = { authorization: `Bearer ${secrets.admin}` };
    const evil = await post({ ...auth, origin: "https://evil.example" }, initialize);
    expect(evil.status).toBe(403);
    expect(((await evil.json()) as { error: { message: string } }).error.message).toContain("evil.example");
    expect((await post({ ...auth, origin: "null" }, initialize)).status).toBe(403);
    for (const origin of [engine.url, "http://localhost:6274", undefined]) {
      const response = await post(origin ? { ...auth, origin } : auth, initialize);
      expect({ origin, status: response.status }).toEqual({ origin, status: 200 });
    }
  });

  test("a Host that is not this machine's (DNS rebinding) is 403 before the token is looked at; an IP literal is served", async () => {
    const port = new URL(engine.url).port;
    const rebound = await fetch(`${engine.url}/mcp`, {
      method: "POST",
      headers: { host: `evil.example:${port}`, "content-type": "application/json", accept: "application/json, text/event-stream" },
      body: JSON.stringify(initialize),
    });
    expect(rebound.status).toBe(403);
    expect(rebound.headers.get("www-authenticate")).toBeNull();
    const metadata = await fetch(`${engine.url}/.well-known/oauth-protected-resource`, { headers: { host: `evil.example:${port}` } });
    expect(metadata.status).toBe(403);
    for (const host of [`localhost:${port}`, `127.0.0.1:${port}`, `10.1.2.3:${port}`]) {
      const response = await fetch(`${engine.url}/mcp`, {
        method: "POST",
        headers: {
          host,
          authorization: `Bearer ${secrets.admin}`,
          "content-type": "application/json",
          accept: "application/json, text/event-stream",
        },
        body: JSON.stringify(initialize),
      });
      expect({ host, status: response.status }).toEqual({ host, status: 200 });
    }
  });

  test("a 2025-11-25 session belongs to the token that opened it", async () => {
    const session = await connectHttp(engine.url, secrets.admin, "2025-11-25");
    try {
      const id = session.transport.sessionId ?? "";
      const stolen = await post(
        { authorization: `Bearer ${secrets.readonly}`, "mcp-session-id": id, "mcp-protocol-version": "2025-11-25" },
        {
          jsonrpc: "2.0",
          id: 2,
          method: "tools/list",
        },
      );
      expect(stolen.status).toBe(404);
      const own = await post(
        { authorization: `Bearer ${secrets.admin}`, "mcp-session-id": id, "mcp-protocol-version": "2025-11-25" },
        {
          jsonrpc: "2.0",
          id: 2,
          method: "tools/list",
        },
      );
      expect(own.status).toBe(200);
    } finally {
      await session.close();
    }
  });

  test("2026-07-28 on the wire: Mcp-Method must match the body, and a result says its resultType", async () => {
    const meta = {
      "io.modelcontextprotocol/protocolVersion": "2026-07-28",
      "io.modelcontextprotocol/clientInfo": { name: "raw", version: "1" },
      "io.modelcontextprotocol/clientCapabilities": {},
    };
    const headers = { authorization: `Bearer ${secrets.readonly}`, "mcp-protocol-version": "2026-07-28" };
    const call = { jsonrpc: "2.0", id: 1, method: "tools/call", params: { name: "gpus", arguments: {}, _meta: meta } };
    const ok = await post({ ...headers, "mcp-method": "tools/call", "mcp-name": "gpus" }, call);
    expect(ok.status).toBe(200);
    expect(ok.headers.get("mcp-session-id")).toBeNull();
    const body = (await ok.json()) as { result: { resultType: string; structuredContent: { source: string } } };
    expect(body.result.resultType).toBe("complete");
    expect(body.result.structuredContent.source).toBe("none");
    const mismatch = await post({ ...headers, "mcp-method": "tools/list" }, call);
    expect(mismatch.status).toBe(400);
    const discover = await post(
      { ...headers, "mcp-method": "server/discover" },
      { jsonrpc: "2.0", id: 2, method: "server/discover", params: { _meta: meta } },
    );
    expect(((await discover.json()) as { result: { supportedVersions: string[] } }).result.supportedVersions).toContain("2026-07-28");
  });

  test("an unknown toolset in the URL is a 400 naming the toolsets", async () => {
    const response = await post({ authorization: `Bearer ${secrets.admin}` }, initialize, "/mcp?toolsets=containers");
    expect(response.status).toBe(400);
    expect(((await response.json()) as { error: { message: string } }).error.message).toContain("services, logs, gpu, templates, db");
  });

  test("the machine's names, ENGINE_MCP_ALLOWED_HOSTS and the listen address are allowed hosts; others are not", async () => {
    const endpoint = new McpEndpoint({
      tokens: {
        authenticate: () => {
          throw new AppError("unauthenticated", "no token");
        },
      },
      dispatch: () => new Response(null, { status: 500 }),
      log: createLogger({ level: "silent", stdout: false }).log,
      clock: { now: () => new Date() },
      version: "test",
      hostname: "box",
      listenHost: "gpu-box.lan",
      allowedHosts: ["gpu.example.com"],
    });
    endpoint.start();
    try {
      const status = async (host: string) =>
        (await endpoint.fetch(new Request("http://x/mcp", { method: "POST", headers: { host } }))).status;
      for (const host of [
        "box",
        "box.local:9321",
        "gpu.example.com",
        "GPU.example.com:443",
        "gpu-box.lan:9321",
        "[fd00::1]:9321",
        "localhost",
      ]) {
        expect({ host, status: await status(host) }).toEqual({ host, status: 401 });
      }
      for (const host of ["evil.example", "box.evil.example", "gpu.example.com.evil.example", "localhost.evil.example"]) {
        expect({ host, status: await status(host) }).toEqual({ host, status: 403 });
      }
    } finally {
      await endpoint.stop();
    }
  });

  test("/mcp and /.well-known/* are outside the API contract: /api/openapi.json lists neither", async () => {
    const document = (await engine.json<{ paths: Record<string, unknown> }>("GET", "/api/openapi.json", { token: null })).body;
    const paths = Object.keys(document.paths);
    expect(paths.length).toBeGreaterThan(10);
    expect(paths.filter((path) => !path.startsWith("/api/") && !path.startsWith("/ui/") && path !== "/")).toEqual([]);
  });

  test("a deploy with a build answers an operation; get_operation reports it to its owner only, until the build is done", async () => {
    const submitter = await connectHttp(engine.url, secrets.submitter, "2026-07-28");
    const other = await connectHttp(engine.url, secrets.admin, "2025-11-25");
    try {
      const deployed = structured<{ service: ServiceRecord; operation: { id: string; state: string; kind: string } | null }>(
        await submitter.client.callTool({
          name: "deploy_service",
          arguments: { name: "built", command: "sh ./serve.sh", build: { repo_url: `file://${repo}`, ref: "main", subdir: "app" } },
        }),
      );
      expect(deployed.service.status).toBe("building");
      expect(deployed.operation).toMatchObject({ kind: "build", state: "running" });
      const id = deployed.operation?.id ?? "";
      const foreign = toolError(await other.client.callTool({ name: "get_operation", arguments: { operation_id: id } }));
      expect(foreign.error?.code).toBe("operation_not_found");
      const done = await eventually(
        async () => {
          const operation = structured<{ state: string; result: { version: number } | null }>(
            await submitter.client.callTool({ name: "get_operation", arguments: { operation_id: id } }),
          );
          return operation.state === "running" ? null : operation;
        },
        { timeoutMs: 30_000, intervalMs: 200 },
      );
      expect(done).toMatchObject({ state: "succeeded", result: { version: 1 } });
      const removed = structured<{ deleted: boolean }>(
        await submitter.client.callTool({ name: "remove_service", arguments: { service: "built" } }),
      );
      expect(removed.deleted).toBe(true);
    } finally {
      await submitter.close();
      await other.close();
    }
  }, 45_000);

  test("deploy_template is checked against the template's env_schema by the API: a missing required name is its 422", async () => {
    const session = await connectHttp(engine.url, secrets.submitter, "2026-07-28");
    try {
      const refused = toolError(
        await session.client.callTool({ name: "deploy_template", arguments: { template_id: "llama-cpp", name: "llm", gpus: 0 } }),
      );
      expect(refused.status).toBe(422);
      expect(JSON.stringify(refused.detail)).toContain("MODEL_PATH");
      expect((await engine.call("GET", "/api/services/llm")).status).toBe(404);
    } finally {
      await session.close();
    }
  });

  test("restore_database answers an operation with the API's refusal when the target is not a database", async () => {
    const session = await connectHttp(engine.url, secrets.admin, "2026-07-28");
    try {
      const operation = structured<{ state: string; error: { status: number; code: string } | null }>(
        await session.client.callTool({ name: "restore_database", arguments: { database: "sleeper", dump: "/nonexistent.sql" } }),
      );
      expect(operation).toMatchObject({ state: "failed", error: { status: 409, code: "not_a_database" } });
    } finally {
      await session.close();
    }
  });
});
