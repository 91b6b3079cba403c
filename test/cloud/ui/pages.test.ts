import { afterAll, beforeAll, expect, test } from "bun:test";
import { CONSOLE_PAGES } from "../../../src/cloud/ui";
import { describeEachDialect, startTestCloud, type TestCloud } from "../helpers";

describeEachDialect("console pages", (dialect) => {
  let cloud: TestCloud;
  beforeAll(async () => {
    cloud = await startTestCloud(dialect);
  });
  afterAll(async () => {
    await cloud?.close();
  });

  test.each(Object.entries(CONSOLE_PAGES))("%s is an HTML shell that loads the bundled script, unframeable", async (path, { page }) => {
    const response = await fetch(`${cloud.url}${path}`);
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toStartWith("text/html");
    expect(response.headers.get("content-security-policy")).toContain("frame-ancestors 'none'");
    expect(response.headers.get("referrer-policy")).toBe("no-referrer");
    const html = await response.text();
    expect(html).toContain(`data-page="${page}"`);
    const script = /src="(\/ui\/app\.js\?v=[a-z0-9]+)"/.exec(html)?.[1] as string;
    expect(script).toBeTruthy();
    const js = await fetch(`${cloud.url}${script}`);
    expect(js.status).toBe(200);
    expect(js.headers.get("content-type")).toStartWith("text/javascript");
    expect(await js.text()).toContain("x-engine-csrf");
  });

  test("/ sends the browser to the nodes page", async () => {
    const response = await fetch(`${cloud.url}/`, { redirect: "manual" });
    expect(response.status).toBe(303);
    expect(response.headers.get("location")).toBe("/nodes");
  });
});

describeEachDialect("sign-in callback for a browser's navigation", (dialect) => {
  let cloud: TestCloud;
  beforeAll(async () => {
    cloud = await startTestCloud(dialect);
  });
  afterAll(async () => {
    await cloud?.close();
  });

  test.each(["/api/auth/callback", "/api/auth/social/callback"])(
    "%s: a failed navigation lands on the sign-in page naming the error; an API client still reads JSON",
    async (path) => {
      const navigated = await fetch(`${cloud.url}${path}?code=x&state=y`, {
        redirect: "manual",
        headers: { "sec-fetch-mode": "navigate" },
      });
      expect(navigated.status).toBe(303);
      expect(navigated.headers.get("location")).toBe("/signin?error=login_failed");
      const api = await cloud.api("GET", `${path}?code=x&state=y`);
      expect(api.status).toBe(401);
      expect(api.body.error.code).toBe("login_failed");
      // Validation still comes first for both.
      const invalid = await fetch(`${cloud.url}${path}?code=x`, { redirect: "manual", headers: { "sec-fetch-mode": "navigate" } });
      expect(invalid.status).toBe(422);
    },
  );
});
