import { afterAll, beforeAll, expect, test } from "bun:test";
import { runCli, startTestEngine, type TestEngine } from "../helpers";

let engine: TestEngine;
beforeAll(async () => {
  engine = await startTestEngine();
});
afterAll(() => engine.close());

test("engine ui prints a one-time login link that opens a web session once", async () => {
  const { code, stdout } = await runCli(["--data-dir", engine.dataDir, "ui"]);
  expect(code).toBe(0);
  const url = /(http:\/\/\S+\/ui\/login\?code=\S+)/.exec(stdout)?.[1];
  expect(url?.startsWith(`${engine.url}/ui/login?code=`)).toBe(true);
  const first = await fetch(url ?? "", { redirect: "manual" });
  expect(first.status).toBe(303);
  expect(first.headers.get("set-cookie")).toContain("engine_ui_session=");
  expect((await fetch(url ?? "", { redirect: "manual" })).status).toBe(401);

  const json = await runCli(["--data-dir", engine.dataDir, "--json", "ui"]);
  expect(json.code).toBe(0);
  const link = JSON.parse(json.stdout) as { url: string; expires_at: string };
  expect(link.url).toStartWith(`${engine.url}/ui/login?code=`);
});
