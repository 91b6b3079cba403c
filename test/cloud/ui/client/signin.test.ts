import { describe, expect, test } from "bun:test";
import { cloudConfigFromEnv, resolveCloudConfig } from "../../../../src/cloud/config";
import { hostMismatchText, notConfiguredHelp, readSignInOffer, SIGN_IN_ENV, wrongHostText } from "../../../../src/cloud/ui/client/signin";

const PUBLIC = "http://127.0.0.1:8787";

describe("the sign-in page's wording", () => {
  test.each([
    ["nothing configured", { signIn: "none", social: "", publicUrl: PUBLIC }, { configured: false, social: [] }],
    ["a stray list without a provider", { signIn: "none", social: "github google" }, { configured: false, social: [] }],
    ["a provider, no social", { signIn: "oidc", social: "" }, { configured: true, social: [] }],
    ["one", { signIn: "oidc", social: "google" }, { configured: true, social: ["google"] }],
    ["two, in the page's order", { signIn: "oidc", social: "google github" }, { configured: true, social: ["github", "google"] }],
    ["an unknown one is dropped", { signIn: "oidc", social: "gitlab github" }, { configured: true, social: ["github"] }],
  ])("readSignInOffer: %s", (_name, dataset, expected) => {
    expect(readSignInOffer(dataset)).toMatchObject(expected);
  });

  test("the help names the variables that turn sign-in on, and they do", () => {
    const text = notConfiguredHelp(PUBLIC)
      .flat()
      .map((piece) => (typeof piece === "string" ? piece : piece.code))
      .join("");
    for (const name of [...SIGN_IN_ENV.required, SIGN_IN_ENV.social]) expect(text).toContain(name);
    expect(text).toContain(`${PUBLIC}/api/auth/callback`);
    expect(text).toContain(`${PUBLIC}/api/auth/social/callback`);
    // The same names, set, configure sign-in with both social providers: the help cannot name a variable config.ts does not read.
    const env: Record<string, string> = { [SIGN_IN_ENV.social]: "github,google" };
    for (const name of SIGN_IN_ENV.required) env[name] = name === "ENGINE_CLOUD_OIDC_ISSUER" ? "https://idp.example" : "x";
    const config = resolveCloudConfig({ dataDir: "/tmp/engine-signin-wording" }, cloudConfigFromEnv(env));
    expect(config.oidc).toMatchObject({ issuer: "https://idp.example", socialProviders: ["github", "google"] });
  });

  test.each([
    ["localhost vs 127.0.0.1", "http://localhost:8787", "http://127.0.0.1:8787", true],
    ["the other way round", "http://127.0.0.1:8787", "http://localhost:8787", true],
    ["the same host", "http://127.0.0.1:8787", "http://127.0.0.1:8787", false],
    // Cookies ignore the port: another port on the same host loses nothing.
    ["another port, same host", "http://127.0.0.1:9999", "http://127.0.0.1:8787", false],
    ["not an origin", "javascript:alert(1)", "http://127.0.0.1:8787", false],
    ["an origin with a path", "http://localhost:8787/evil", "http://127.0.0.1:8787", false],
    ["nothing", null, "http://127.0.0.1:8787", false],
  ])("hostMismatchText: %s", (_name, startedAt, here, explains) => {
    const text = hostMismatchText(startedAt, here, PUBLIC);
    if (!explains) {
      expect(text).toBeNull();
      return;
    }
    expect(text).toContain(`You started sign-in at ${startedAt} but came back at ${here}`);
    expect(text).toContain(`Open the console at ${PUBLIC}`);
  });

  test.each([
    ["at the public URL", PUBLIC, null],
    ["on another host", "http://localhost:8787", `This console's address is ${PUBLIC}.`],
    ["on another port", "http://127.0.0.1:9000", `This console's address is ${PUBLIC}.`],
  ])("wrongHostText: %s", (_name, here, expected) => {
    const text = wrongHostText(here, PUBLIC);
    if (expected === null) expect(text).toBeNull();
    else expect(text).toStartWith(expected as string);
  });
});
