import { afterAll, beforeAll, expect, test } from "bun:test";
import { join } from "node:path";
import { eventually, startTestEngine, type TestEngine } from "../../helpers";

const PEER = join(import.meta.dir, "..", "mdns", "mdns-peer.ts");

let engine: TestEngine;
beforeAll(async () => {
  engine = await startTestEngine({ proxy: true, httpsPort: 0, httpPort: 0, proxyProcesses: 1, mdns: "bonjour", hostname: "mdnsbox" });
});
afterAll(() => engine.close());

/** browse runs a second mDNS stack in its own process until it has seen `label` and an A answer for `name`. */
async function browse(label: string, name: string): Promise<{ code: number; lines: Record<string, unknown>[] }> {
  const proc = Bun.spawn([process.execPath, PEER, "browse", "--resolve", name, "--until-seen", label], { stdout: "pipe", stderr: "pipe" });
  const [out, code] = await Promise.all([new Response(proc.stdout).text(), proc.exited]);
  return {
    code,
    lines: out
      .split("\n")
      .filter(Boolean)
      .map((line) => JSON.parse(line) as Record<string, unknown>),
  };
}

test("a service's .local name is published over mDNS, seen by a second mDNS stack, and withdrawn when the service goes", async () => {
  const { status } = await engine.json("POST", "/api/services", { body: { name: "vllm", port: 18123, command: ["sleep", "300"] } });
  expect(status).toBe(201);
  const mdns = await eventually(
    async () => {
      const body = (await engine.json<{ mdns: { backend: string; published: boolean; names: string[] } }>("GET", "/api/proxy/status")).body;
      return body.mdns.names.includes("vllm-mdnsbox.local") && body.mdns.published ? body.mdns : null;
    },
    { timeoutMs: 10000 },
  );
  expect(mdns.backend).toBe("bonjour");
  expect(mdns.names).toContain("mdnsbox.local");

  const seen = await browse("vllm-mdnsbox", "vllm-mdnsbox.local");
  expect(seen.code).toBe(0);
  expect(seen.lines).toContainEqual(expect.objectContaining({ event: "up" }));
  expect(seen.lines.some((line) => line.event === "answer")).toBe(true);

  expect((await engine.json("DELETE", "/api/services/vllm")).status).toBe(200);
  await eventually(async () => {
    const body = (await engine.json<{ mdns: { names: string[] } }>("GET", "/api/proxy/status")).body;
    return !body.mdns.names.includes("vllm-mdnsbox.local");
  });
});
