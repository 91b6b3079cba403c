import { expect, test } from "bun:test";
import { cloudConfigFromEnv, resolveCloudConfig } from "../../src/cloud/config";
import { isAppError } from "../../src/lib/errors";

const SIGN_IN = {
  ENGINE_CLOUD_OIDC_ISSUER: "https://idp.example",
  ENGINE_CLOUD_OIDC_CLIENT_ID: "engine-console",
  ENGINE_CLOUD_OIDC_CLIENT_SECRET: "s3cret",
};

/** fromEnv resolves a console configuration from these environment variables alone. */
const fromEnv = (env: Record<string, string>) => resolveCloudConfig({ dataDir: "/tmp/engine-cloud-config-test" }, cloudConfigFromEnv(env));

/** configError is the config_invalid message for an environment, or "accepted". */
const configError = (env: Record<string, string>): string => {
  try {
    fromEnv(env);
  } catch (error) {
    if (isAppError(error) && error.code === "config_invalid") return error.message;
    throw error;
  }
  return "accepted";
};

test("sign-in sends the secret as client_secret_basic unless ENGINE_CLOUD_OIDC_AUTH_METHOD says client_secret_post", () => {
  expect(fromEnv(SIGN_IN).oidc?.authMethod).toBe("client_secret_basic");
  expect(fromEnv({ ...SIGN_IN, ENGINE_CLOUD_OIDC_AUTH_METHOD: "client_secret_basic" }).oidc?.authMethod).toBe("client_secret_basic");
  expect(fromEnv({ ...SIGN_IN, ENGINE_CLOUD_OIDC_AUTH_METHOD: "client_secret_post" }).oidc?.authMethod).toBe("client_secret_post");
});

test.each([
  ["a method openid-client has but the console does not offer", "private_key_jwt"],
  ["another spelling", "CLIENT_SECRET_POST"],
  ["a short form", "post"],
])("ENGINE_CLOUD_OIDC_AUTH_METHOD refuses %s at start, naming the variable and the choices", (_name, value) => {
  const message = configError({ ...SIGN_IN, ENGINE_CLOUD_OIDC_AUTH_METHOD: value });
  expect(message).toContain("oidc_auth_method");
  expect(message).toContain("ENGINE_CLOUD_OIDC_AUTH_METHOD must be client_secret_basic or client_secret_post");
  expect(message).toContain(JSON.stringify(value));
  // Even where sign-in is off: the typo is found at the first start, not at the first sign-in.
  expect(configError({ ENGINE_CLOUD_OIDC_AUTH_METHOD: value })).toContain("oidc_auth_method");
});

test.each([
  ["unset", undefined, []],
  ["one", "google", ["google"]],
  ["both, in any order and case, spaced", " Google ,github ", ["github", "google"]],
  ["a repeat", "github,github", ["github"]],
  ["a trailing comma", "github,", ["github"]],
])("ENGINE_CLOUD_OIDC_SOCIAL_PROVIDERS: %s", (_name, value, expected) => {
  const env: Record<string, string> = { ...SIGN_IN };
  if (value !== undefined) env.ENGINE_CLOUD_OIDC_SOCIAL_PROVIDERS = value;
  expect(fromEnv(env).oidc?.socialProviders).toEqual(expected as never);
});

test("ENGINE_CLOUD_OIDC_SOCIAL_PROVIDERS refuses a provider outside the two", () => {
  const message = configError({ ...SIGN_IN, ENGINE_CLOUD_OIDC_SOCIAL_PROVIDERS: "github,gitlab" });
  expect(message).toContain("oidc_social_providers");
  expect(message).toContain("github, google");
});

test("hosted machines default to the local provider, the source engine at this version, 30 minutes of idle and 7 days of backups", () => {
  const { managed, role } = fromEnv({});
  expect(role).toBe("all");
  expect(managed.provider).toBe("local");
  expect(Object.keys(managed.releases)).toHaveLength(1);
  expect(Object.values(managed.releases)[0]?.at(-1)).toEndWith("cli/engine.ts");
  expect(managed).toMatchObject({ templateVersion: "1", sleepAfterMs: 30 * 60_000, backupRetentionMs: 7 * 86_400_000 });
  const set = fromEnv({
    ENGINE_CLOUD_BOX_PROVIDER: "off",
    ENGINE_CLOUD_BOX_RELEASES: "0.7.0=/opt/engine-0.7.0, 0.8.0=/opt/engine.ts",
    ENGINE_CLOUD_BOX_SLEEP_AFTER_MIN: "0",
    ENGINE_CLOUD_BOX_BACKUP_RETENTION_DAYS: "30",
    ENGINE_CLOUD_ROLE: "provisioner",
  });
  expect(set.role).toBe("provisioner");
  expect(set.managed).toMatchObject({
    provider: "off",
    releases: { "0.7.0": ["/opt/engine-0.7.0"], "0.8.0": [process.execPath, "/opt/engine.ts"] },
    sleepAfterMs: 0,
    backupRetentionMs: 30 * 86_400_000,
  });
});

test.each([
  ["a provider it does not have", { ENGINE_CLOUD_BOX_PROVIDER: "docker" }, "box_provider"],
  ["a release without a path", { ENGINE_CLOUD_BOX_RELEASES: "0.7.0=" }, "box_releases"],
  ["a release that is not a version", { ENGINE_CLOUD_BOX_RELEASES: "../x=/opt/engine" }, "box_releases"],
  ["idle minutes that are not a number", { ENGINE_CLOUD_BOX_SLEEP_AFTER_MIN: "soon" }, "box_sleep_after_min"],
  ["no retention", { ENGINE_CLOUD_BOX_BACKUP_RETENTION_DAYS: "0" }, "box_backup_retention_days"],
  ["a role it does not have", { ENGINE_CLOUD_ROLE: "boxes" }, "role"],
])("hosted-machine settings refuse %s at start, naming the field", (_name, env, field) => {
  expect(configError(env)).toContain(field);
});
