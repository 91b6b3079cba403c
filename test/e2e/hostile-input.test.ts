import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { readAdminTokenFile } from "../../src/engine/auth";
import { reapWorkloads, type SpawnedEngine, spawnEngine, tempDir } from "../helpers";
import { type Binaries, buildBinaries } from "./binaries";
import { Children, cloudListening } from "./processes";

/**
 * The compiled binaries, run as users run them (no NODE_ENV set): a body of deeply nested
 * arrays, which overflowed the 422 serializer's stack and made Bun serve its development error
 * page (500 text/html with the working directory, stack frames and source lines), is a JSON
 * 422 on the routes that need no credential as on the others, and no answer names a source path.
 */

/** deep nests `levels` arrays in a JSON object's field (50,000 overflowed; the console's 64 KiB bound takes 20,000). */
const deep = (field: string, levels: number) => `{"${field}":${"[".repeat(levels)}${"]".repeat(levels)}}`;

const children = new Children();
let binaries: Binaries;
let workDir: string;
let engine: SpawnedEngine;
let cloudUrl: string;

beforeAll(async () => {
  binaries = await buildBinaries();
  workDir = tempDir("engine-e2e-hostile-");
  engine = await spawnEngine(join(workDir, "engine"), { command: [binaries.engine], env: { ENGINE_SHIM: "" } });
  const cloud = children.start([binaries.cloud, "--data-dir", join(workDir, "cloud"), "serve", "--port", "0"]);
  cloudUrl = await cloudListening(cloud);
}, 240_000);

afterAll(async () => {
  await engine?.stop();
  await children.stopAll();
  if (workDir) {
    reapWorkloads(join(workDir, "engine"));
    rmSync(workDir, { recursive: true, force: true });
  }
});

/** expectJsonWithoutSource fails on HTML, a stack frame, or any path of the build machine or the binary. */
async function expectJsonWithoutSource(response: Response): Promise<Record<string, unknown>> {
  const text = await response.text();
  expect(response.headers.get("content-type") ?? "").toStartWith("application/json");
  expect(text).not.toMatch(/<html|<!doctype/i);
  expect(text).not.toMatch(/\.ts:\d+|\/\$bunfs\/|at \w+ \(/);
  expect(text).not.toContain(workDir);
  expect(text).not.toContain(process.cwd());
  return JSON.parse(text);
}

describe("compiled binaries answer hostile bodies with JSON", () => {
  test.each([
    ["POST", "/ui/session", false],
    ["POST", "/api/tokens", true],
    ["POST", "/api/services", true],
    ["PUT", "/api/link/vcs-token", true],
  ])("engine %s %s: deep nesting is a JSON 422", async (method, path, authed) => {
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (authed) headers.authorization = `Bearer ${readAdminTokenFile(join(workDir, "engine"))}`;
    const response = await fetch(`${engine.url}${path}`, { method, headers, body: deep("name", 50_000) });
    expect(response.status).toBe(422);
    const body = await expectJsonWithoutSource(response);
    expect(body.detail).toEqual([expect.objectContaining({ loc: ["body"], type: "value_error" })]);
  });

  test.each(["/api/link/claim", "/api/link/device", "/api/link/device/poll", "/api/link/preauth"])(
    "engine-cloud POST %s (no session): deep nesting is a JSON 422",
    async (path) => {
      for (const levels of [20_000, 50_000]) {
        const response = await fetch(`${cloudUrl}${path}`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: deep("code", levels),
        });
        expect(response.status).toBe(422);
        const body = await expectJsonWithoutSource(response);
        expect(body.detail).toEqual([expect.objectContaining({ loc: ["body"], type: "value_error" })]);
      }
    },
  );

  test("both still answer health at once after", async () => {
    expect((await fetch(`${engine.url}/api/health`)).status).toBe(200);
    expect((await fetch(`${cloudUrl}/api/health`)).status).toBe(200);
  });
});
