import { afterAll, beforeAll, expect, test } from "bun:test";
import type { CloudConfigInput, SocialProvider } from "../../../src/cloud/config";
import { CONSOLE_PAGES } from "../../../src/cloud/ui";
import { readSignInOffer } from "../../../src/cloud/ui/client/signin";
import { startTestIdp, type TestIdp } from "../../fixtures/cloud/idp";
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

/** bodyAttributes reads the data attributes of a page shell's <body>. */
async function bodyAttributes(url: string): Promise<Record<string, string>> {
  const html = await (await fetch(url)).text();
  const body = /<body([^>]*)>/.exec(html)?.[1] ?? "";
  return Object.fromEntries([...body.matchAll(/([a-z-]+)="([^"]*)"/g)].map((m) => [m[1] as string, m[2] as string]));
}

describeEachDialect("the sign-in page offers only what is configured", (dialect) => {
  let idp: TestIdp;
  const clouds: TestCloud[] = [];
  const start = async (input: CloudConfigInput) => {
    const cloud = await startTestCloud(dialect, input);
    clouds.push(cloud);
    return cloud;
  };
  beforeAll(async () => {
    idp = await startTestIdp({ tls: false });
  });
  afterAll(async () => {
    for (const cloud of clouds) await cloud.close();
    await idp?.close();
  });

  test("no OpenID provider: no buttons, and the page names what the operator must set", async () => {
    const cloud = await start({});
    const attributes = await bodyAttributes(`${cloud.url}/signin`);
    expect(attributes).toMatchObject({ "data-page": "signin", "data-sign-in": "none", "data-social": "" });
    expect(attributes["data-public-url"]).toBe(cloud.deps.site.publicUrl);
    const offer = readSignInOffer({ signIn: attributes["data-sign-in"], social: attributes["data-social"] });
    expect(offer).toMatchObject({ configured: false, social: [] });
    // Only the sign-in page carries the offer.
    expect(Object.keys(await bodyAttributes(`${cloud.url}/nodes`))).toEqual(["data-page"]);
  });

  test.each<[string, string, SocialProvider[], SocialProvider[]]>([
    ["zero", "", [], ["github", "google"]],
    ["one", "github", ["github"], ["google"]],
    ["two", "google, github", ["github", "google"], []],
  ])("an OpenID provider with %s social providers: those buttons, and only those starts", async (_count, listed, shown, refused) => {
    const cloud = await start({ ...idp.cloudConfig, oidcSocialProviders: listed, trustedProxies: "127.0.0.1" });
    const attributes = await bodyAttributes(`${cloud.url}/signin`);
    expect(attributes["data-sign-in"]).toBe("oidc");
    expect(attributes["data-social"]).toBe(shown.join(" "));
    expect(readSignInOffer({ signIn: attributes["data-sign-in"], social: attributes["data-social"] }).social).toEqual(shown);
    let source = 0;
    const headers = () => ({ "x-forwarded-for": `198.51.100.${++source}` });
    for (const provider of shown)
      expect((await cloud.api("GET", `/api/auth/social?provider=${provider}`, { headers: headers() })).status).toBe(200);
    for (const provider of refused) {
      const answer = await cloud.api("GET", `/api/auth/social?provider=${provider}`, { headers: headers() });
      expect(answer.status).toBe(400);
      expect(answer.body.error.code).toBe("social_provider_not_configured");
    }
    // The provider's own sign-in is there whatever the list says.
    expect((await cloud.api("GET", "/api/auth/login", { headers: headers() })).status).toBe(200);
  });
});
