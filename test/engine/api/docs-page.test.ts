import { afterAll, beforeAll, expect, test } from "bun:test";
import type { Browser } from "playwright-core";
import { launchChromium } from "../../e2e/processes";
import { startTestEngine, type TestEngine } from "../../helpers";

let engine: TestEngine;
let browser: Browser;
beforeAll(async () => {
  [engine, browser] = await Promise.all([startTestEngine({ mdns: "off" }), launchChromium()]);
});
afterAll(async () => {
  await browser?.close();
  await engine?.close();
});

test("the docs page shows every request body, with shared records inline rather than as $refs", async () => {
  const page = await browser.newPage();
  await page.goto(`${engine.url}/api/docs`);
  const tokens = page.locator("details", { has: page.locator("summary", { hasText: "Create a token" }) });
  await tokens.locator("summary").click();
  const text = (await tokens.textContent()) ?? "";
  expect(text).toContain("Body");
  // The body's own fields, and the created token's record expanded from its component.
  expect(text).toContain('"scope_services"');
  expect(text).toContain('"last_used_at"');
  expect(await page.locator("#ops").textContent()).not.toContain("$ref");
  expect(await page.locator("details").count()).toBeGreaterThan(20);
  await page.close();
}, 60_000);
