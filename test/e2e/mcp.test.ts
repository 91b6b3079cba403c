import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { copyFileSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";
import { connectHttp, ERAS, structured, toolError } from "../engine/mcp/harness";
import { reapWorkloads, type SpawnedEngine, spawnEngine, tempDir } from "../helpers";
import { buildBinaries } from "./binaries";

let workDir: string;
let binary: string;
let engine: SpawnedEngine;
let adminToken: string;

beforeAll(async () => {
  workDir = tempDir("engine-e2e-mcp-");
  // Run the compiled binary from a directory with nothing beside it: the SDK must be inside it.
  binary = join(workDir, "bin", "engine");
  Bun.spawnSync(["mkdir", "-p", join(workDir, "bin")]);
  copyFileSync((await buildBinaries()).engine, binary);
  Bun.spawnSync(["chmod", "755", binary]);
  engine = await spawnEngine(join(workDir, "data"), { command: [binary], env: { ENGINE_SHIM: "" } });
  adminToken = readFileSync(join(workDir, "data", "admin.token"), "utf8").trim();
}, 180_000);

afterAll(async () => {
  await engine?.stop();
  reapWorkloads(join(workDir, "data"));
  rmSync(workDir, { recursive: true, force: true });
});

describe("the compiled engine's MCP server", () => {
  test.each(ERAS)("/mcp answers the SDK v2 client (%s)", async (era) => {
    const session = await connectHttp(engine.url, adminToken, era);
    try {
      expect((await session.client.listTools()).tools.length).toBe(18);
      const gpus = structured<{ source: string }>(await session.client.callTool({ name: "gpus", arguments: {} }));
      expect(typeof gpus.source).toBe("string");
      const missing = toolError(await session.client.callTool({ name: "diagnose", arguments: { service: "nothing" } }));
      expect(missing.error?.code).toBe("service_not_found");
    } finally {
      await session.close();
    }
  });

  test.each(ERAS)("`engine mcp` serves stdio from the binary (%s)", async (era) => {
    const client = new Client(
      { name: "engine-e2e", version: "1.0.0" },
      era === "2026-07-28" ? { versionNegotiation: { mode: { pin: "2026-07-28" } } } : {},
    );
    await client.connect(
      new StdioClientTransport({
        command: binary,
        args: ["mcp", "--toolsets", "services", "--data-dir", join(workDir, "data")],
        env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: workDir },
        stderr: "pipe",
      }),
    );
    try {
      const names = (await client.listTools()).tools.map((tool) => tool.name);
      expect(names).toContain("diagnose");
      expect(names).not.toContain("logs");
      const listed = structured<{ services: unknown[] }>(await client.callTool({ name: "list_services", arguments: {} }));
      expect(listed.services).toEqual([]);
    } finally {
      await client.close();
    }
  });
});
