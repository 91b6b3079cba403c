import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import type { ServiceRecord } from "../../../src/contract/engine";
import { createToken, ENGINE_ENTRY, eventually, runCli, startTestEngine, type TestEngine, tempDir } from "../../helpers";
import { ERAS, type Era, structured, toolError } from "./harness";

let engine: TestEngine;
let readonly: string;

beforeAll(async () => {
  engine = await startTestEngine();
  readonly = (await createToken(engine, { name: "ro", role: "readonly" })).secret;
  const deployed = await engine.json("POST", "/api/services", { body: { name: "sleeper", command: "exec sleep 300" } });
  expect(deployed.status).toBe(201);
  await eventually(async () => (await engine.json<ServiceRecord>("GET", "/api/services/sleeper")).body.status === "running", {
    timeoutMs: 15_000,
  });
});
afterAll(() => engine?.close());

/**
 * connectStdio starts `engine mcp` as a desktop assistant does, a subprocess speaking MCP on
 * its stdin and stdout, with only the environment a user's config would give it.
 */
async function connectStdio(era: Era, args: string[], env: Record<string, string> = {}) {
  const client = new Client(
    { name: "engine-test", version: "1.0.0" },
    era === "2026-07-28" ? { versionNegotiation: { mode: { pin: "2026-07-28" } } } : {},
  );
  const transport = new StdioClientTransport({
    command: ENGINE_ENTRY[0] as string,
    args: [...ENGINE_ENTRY.slice(1), "mcp", ...args],
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: process.env.HOME ?? "/tmp", ...env },
    stderr: "pipe",
  });
  await client.connect(transport);
  return { client, close: () => client.close() };
}

describe.each(ERAS)("engine mcp over stdio, protocol %s", (era) => {
  test("over the unix socket (admin): lists the tools and calls them", async () => {
    const session = await connectStdio(era, ["--data-dir", engine.dataDir]);
    try {
      const { tools } = await session.client.listTools();
      expect(tools.map((tool) => tool.name)).toContain("stop_service");
      expect(tools.length).toBe(18);
      const listed = structured<{ services: ServiceRecord[] }>(await session.client.callTool({ name: "list_services", arguments: {} }));
      expect(listed.services.map((s) => s.name)).toEqual(["sleeper"]);
      const diagnosis = structured<{ cause: string }>(
        await session.client.callTool({ name: "diagnose", arguments: { service: "sleeper" } }),
      );
      expect(diagnosis.cause).toBe("running: nothing wrong found");
    } finally {
      await session.close();
    }
  });

  test("with ENGINE_TOKEN of a readonly token: stop_service is the API's 403, and --read-only lists only reading tools", async () => {
    const session = await connectStdio(era, [], { ENGINE_URL: engine.url, ENGINE_TOKEN: readonly });
    try {
      const refused = toolError(await session.client.callTool({ name: "stop_service", arguments: { service: "sleeper" } }));
      expect({ status: refused.status, code: refused.error?.code }).toEqual({ status: 403, code: "forbidden" });
      expect((await engine.json<ServiceRecord>("GET", "/api/services/sleeper")).body.status).toBe("running");
    } finally {
      await session.close();
    }
    const narrowed = await connectStdio(era, ["--read-only", "--toolsets", "services,gpu", "--data-dir", engine.dataDir]);
    try {
      const { tools } = await narrowed.client.listTools();
      expect(tools.map((tool) => tool.name)).toEqual(["list_services", "show_service", "diagnose", "gpus", "proxy_status"]);
    } finally {
      await narrowed.close();
    }
  });
});

describe("engine mcp", () => {
  test("--disable-destructive leaves out stop, restart, remove, deploy and restore", async () => {
    const session = await connectStdio("2025-11-25", ["--disable-destructive", "--data-dir", engine.dataDir]);
    try {
      const names = (await session.client.listTools()).tools.map((tool) => tool.name);
      for (const name of ["stop_service", "restart_service", "remove_service", "deploy_service", "deploy_template", "restore_database"]) {
        expect(names).not.toContain(name);
      }
      expect(names).toContain("start_service");
    } finally {
      await session.close();
    }
  });

  test("with no engine running, a call fails with engine_unreachable and the server stays up", async () => {
    const empty = tempDir();
    const session = await connectStdio("2026-07-28", ["--data-dir", empty], { ENGINE_URL: "http://127.0.0.1:9", ENGINE_TOKEN: "eng_x" });
    try {
      const failed = toolError(await session.client.callTool({ name: "list_services", arguments: {} }));
      expect(failed.error?.code).toBe("engine_unreachable");
      expect((await session.client.listTools()).tools.length).toBe(18);
    } finally {
      await session.close();
      rmSync(empty, { recursive: true, force: true });
    }
  });

  test("an unknown toolset is refused at start with the list of toolsets", async () => {
    const result = await runCli(["mcp", "--toolsets", "containers", "--data-dir", engine.dataDir]);
    expect(result.code).toBe(1);
    expect(result.stdout).toBe("");
    expect(result.stderr).toContain("unknown toolset");
    expect(result.stderr).toContain("services, logs, gpu, templates, db");
  });
});
