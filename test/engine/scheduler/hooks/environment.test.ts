import { expect, test } from "bun:test";
import { environmentHook } from "../../../../src/engine/scheduler/hooks/environment";
import { hostOf, launchOf } from "./launch";

test("assembles the parts in their precedence and names the sources and keys, never the values", () => {
  const hold = { device_uuids: ["GPU-a"], visible_ids: ["0"], whole: true, memory_mb: 1 };
  const launch = launchOf(
    "/nonexistent",
    { env: { MODE: "env", CUDA_VISIBLE_DEVICES: "all" }, bindings: ["db"], secret_keys: ["TOKEN"] },
    { hold },
  );
  launch.parts = {
    engine: { SERVICE_NAME: "app", MODE: "engine" },
    bindings: { DB_HOST: "127.0.0.1", TOKEN: "from the binding" },
    secrets: { TOKEN: "secret" },
    gpu: { CUDA_VISIBLE_DEVICES: "0" },
  };
  environmentHook.run(launch, hostOf("/nonexistent", { baseEnv: { PATH: "/bin", SECRET_OF_THE_DAEMON: "x" } }));
  expect(launch.env).toEqual({
    PATH: "/bin",
    SERVICE_NAME: "app",
    MODE: "env",
    DB_HOST: "127.0.0.1",
    TOKEN: "secret",
    CUDA_VISIBLE_DEVICES: "0",
  });
  expect(launch.envSource).toBe("engine+bindings:db+env+secrets+gpu");
  expect(launch.injectedKeys).not.toContain("secret");
  expect(launch.injectedKeys).toEqual(expect.arrayContaining(["SERVICE_NAME", "DB_HOST", "TOKEN", "CUDA_VISIBLE_DEVICES"]));
});
