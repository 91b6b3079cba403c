import { expect, test } from "bun:test";
import { SqliteEngine } from "../../../../src/engine/databases";
import { secretsHook } from "../../../../src/engine/scheduler/hooks/secrets";
import { hostOf, launchOf } from "./launch";

const host = hostOf("/nonexistent", { openSecrets: (version) => ({ API_KEY: `key of ${version.service_id}` }) });

test("opens the version's secrets into the run's environment", () => {
  const launch = launchOf("/nonexistent", { secret_keys: ["API_KEY"] });
  secretsHook.run(launch, host);
  expect(launch.parts.secrets).toEqual({ API_KEY: "key of svc_app" });
});

test("gives a managed database's server none: its adapter initialized it with them", () => {
  const database = {
    adapter: new SqliteEngine(),
    instance: { serviceId: "svc_app", serviceName: "app", dataDir: "/x", host: "127.0.0.1", port: null, credentials: {}, env: {} },
  };
  const launch = launchOf("/nonexistent", { secret_keys: ["API_KEY"] }, { database });
  secretsHook.run(launch, host);
  expect(launch.parts.secrets).toEqual({});
});
