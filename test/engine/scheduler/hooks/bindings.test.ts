import { expect, test } from "bun:test";
import { bindingsHook } from "../../../../src/engine/scheduler/hooks/bindings";
import { serviceRow } from "../../services/rows";
import { hostOf, launchOf } from "./launch";

test("gives the run the variables of each bound service that exists, none of one deleted meanwhile", () => {
  const launch = launchOf("/nonexistent", { bindings: ["cache", "gone"] });
  const host = hostOf("/nonexistent", {
    findService: (name) => (name === "cache" ? serviceRow("cache") : null),
    boundService: (service) => ({ name: service.name, kind: "service", template_id: null, port: 6379, env: {}, secrets: {} }),
  });
  bindingsHook.run(launch, host);
  expect(launch.parts.bindings).toEqual({ CACHE_HOST: "127.0.0.1", CACHE_PORT: "6379", CACHE_URL: "http://127.0.0.1:6379" });
});
