import { afterEach, expect, test } from "bun:test";
import { type CloudConfigInput, cloudConfigFromEnv, resolveCloudConfig } from "../../../src/cloud/config";
import { linkRoutes } from "../../../src/cloud/link";
import { isAppError } from "../../../src/lib/errors";
import { describeEachDialect, startTestCloud, type TestCloud } from "../helpers";

describeEachDialect("the client address", (dialect) => {
  let cloud: TestCloud | undefined;
  afterEach(async () => {
    await cloud?.close();
    cloud = undefined;
  });

  const start = async (input: CloudConfigInput) => {
    cloud = await startTestCloud(dialect, input, { modules: [(deps) => linkRoutes(deps)] });
    return cloud;
  };
  /** requestFrom asks for a device link with an X-Forwarded-For and answers the status and the address the console recorded. */
  const requestFrom = async (started: TestCloud, forwarded: string) => {
    const answer = await started.api("POST", "/api/link/device", {
      body: { hostname: "addr-box", os: "linux", version: "0.6.0" },
      headers: { "x-forwarded-for": forwarded },
    });
    if (answer.status !== 201) return { status: answer.status, source: null };
    const [row] = await started.deps.db.sql`SELECT source FROM device_requests WHERE id = ${answer.body.device_code.split(".")[0]}`;
    return { status: answer.status, source: row.source as string };
  };

  // The test client connects from 127.0.0.1.
  test.each([
    { label: "no trusted proxies (the default)", forwarded: "203.0.113.7", recorded: "127.0.0.1" },
    { label: "a trusted proxy that is not the peer", trustedProxies: "10.0.0.1", forwarded: "203.0.113.7", recorded: "127.0.0.1" },
    { label: "the peer is a trusted proxy", trustedProxies: "127.0.0.1", forwarded: "203.0.113.7", recorded: "203.0.113.7" },
    {
      label: "the peer is in a trusted range",
      trustedProxies: "10.0.0.0/8, 127.0.0.0/8",
      forwarded: "203.0.113.7",
      recorded: "203.0.113.7",
    },
    {
      label: "a client-written prefix is skipped",
      trustedProxies: "127.0.0.1",
      forwarded: "1.1.1.1, 203.0.113.7",
      recorded: "203.0.113.7",
    },
    {
      label: "a trusted chain resolves to its rightmost untrusted hop",
      trustedProxies: "127.0.0.1,10.0.0.0/8",
      forwarded: "198.51.100.4, 203.0.113.7, 10.2.3.4",
      recorded: "203.0.113.7",
    },
    { label: "a malformed value is ignored", trustedProxies: "127.0.0.1", forwarded: "not-an-address", recorded: "127.0.0.1" },
    { label: "an IPv6 client behind the proxy", trustedProxies: "127.0.0.1", forwarded: "[2001:DB8::7]:443", recorded: "2001:db8::7" },
  ])("$label: X-Forwarded-For $forwarded is recorded as $recorded", async ({ trustedProxies, forwarded, recorded }) => {
    const started = await start({ trustedProxies });
    expect(await requestFrom(started, forwarded)).toEqual({ status: 201, source: recorded });
  });

  test("spoofed X-Forwarded-For from an untrusted peer does not escape the per-address limit (device: 10)", async () => {
    const started = await start({ trustedProxies: "10.0.0.1" });
    const statuses = [];
    for (let i = 0; i < 11; i++) statuses.push((await requestFrom(started, `203.0.113.${i}`)).status);
    expect(statuses).toEqual([...Array(10).fill(201), 429]);
  });

  test("an IPv6 client cannot escape the per-address limit by rotating addresses within its /64", async () => {
    const started = await start({ trustedProxies: "127.0.0.1" });
    const statuses = [];
    for (let i = 0; i < 11; i++) statuses.push((await requestFrom(started, `2001:db8:5:6::${(i + 1).toString(16)}`)).status);
    expect(statuses).toEqual([...Array(10).fill(201), 429]);
    expect((await requestFrom(started, "2001:db8:5:7::1")).status).toBe(201);
  });
});

const configError = (input: CloudConfigInput, env: CloudConfigInput = {}): string => {
  try {
    resolveCloudConfig({ dataDir: "/tmp/engine-cloud-config-test", ...input }, env);
  } catch (error) {
    if (isAppError(error) && error.code === "config_invalid") return error.message;
    throw error;
  }
  return "accepted";
};

test.each([
  ["a name", "proxy.internal", "trusted_proxies"],
  ["a typo'd range", "10.0.0.1/8", "host bits set"],
  ["a prefix too long", "192.0.2.0/40", "prefix length"],
  ["a wildcard", "*", "trusted_proxies"],
  ["one bad entry among good ones", "127.0.0.1, ::1, nope", '"nope"'],
])("ENGINE_CLOUD_TRUSTED_PROXIES with %s stops the start with config_invalid", (_label, raw, message) => {
  expect(configError({}, cloudConfigFromEnv({ ENGINE_CLOUD_TRUSTED_PROXIES: raw }))).toContain(message);
});

test("ENGINE_CLOUD_TRUSTED_PROXIES is read, trimmed and kept; unset means none", () => {
  const config = resolveCloudConfig(
    { dataDir: "/tmp/x" },
    cloudConfigFromEnv({ ENGINE_CLOUD_TRUSTED_PROXIES: " 127.0.0.1 , ::1,10.0.0.0/8," }),
  );
  expect(config.trustedProxies.entries).toEqual(["127.0.0.1", "::1", "10.0.0.0/8"]);
  expect(resolveCloudConfig({ dataDir: "/tmp/x" }, cloudConfigFromEnv({})).trustedProxies.entries).toEqual([]);
});

test("the retired ENGINE_CLOUD_TRUST_FORWARDED_FOR stops the start and names its replacement", () => {
  for (const value of ["1", "true", "0"]) {
    expect(configError({}, cloudConfigFromEnv({ ENGINE_CLOUD_TRUST_FORWARDED_FOR: value }))).toContain("ENGINE_CLOUD_TRUSTED_PROXIES");
  }
});
