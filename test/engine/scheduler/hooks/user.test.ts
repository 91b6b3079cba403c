import { expect, test } from "bun:test";
import { userHook } from "../../../../src/engine/scheduler/hooks/user";
import { hostOf, launchOf } from "./launch";

const worker = { name: "eng-app", uid: 60001, gid: 60001, groups: [44], home: "/srv/app" };

test("the engine's own user: no user, no HOME/USER/LOGNAME of its own", async () => {
  const launch = launchOf("/nonexistent");
  await userHook.run(launch, hostOf("/nonexistent"));
  expect(launch.user).toBeNull();
  expect(launch.env).toEqual({});
});

test("the workload's user joins the bound SQLite databases' groups, once each, and names itself in the env", async () => {
  const launch = launchOf("/nonexistent");
  await userHook.run(launch, hostOf("/nonexistent", { workloadUser: async () => worker, fileBindingGroups: () => [44, 70001] }));
  expect(launch.user).toEqual({ ...worker, groups: [44, 70001] });
  expect(launch.env).toEqual({ HOME: "/srv/app", USER: "eng-app", LOGNAME: "eng-app" });
});

test("the deploy's env still sets HOME", async () => {
  const launch = launchOf("/nonexistent", { env: { HOME: "/data" } });
  launch.env = { HOME: "/data" };
  await userHook.run(launch, hostOf("/nonexistent", { workloadUser: async () => worker }));
  expect(launch.env).toEqual({ HOME: "/data", USER: "eng-app", LOGNAME: "eng-app" });
});
