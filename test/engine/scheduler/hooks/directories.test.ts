import { afterAll, expect, test } from "bun:test";
import { existsSync, rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { directoriesHook } from "../../../../src/engine/scheduler/hooks/directories";
import { tempDir } from "../../../helpers";
import { hostOf, launchOf } from "./launch";

const root = tempDir();
afterAll(() => rmSync(root, { recursive: true, force: true }));

const modeOf = (path: string) => statSync(path).mode & 0o7777;

test("makes the data dir with the mode its kind needs, and leaves the engine's logs and runs dirs to the shim", async () => {
  const launch = launchOf(root);
  await directoriesHook.run(launch, hostOf(root, { dataDirMode: () => 0o2770 }));
  expect(modeOf(launch.dataDir)).toBe(0o2770);
  expect(existsSync(join(root, "services", launch.service.id))).toBe(false);
});
