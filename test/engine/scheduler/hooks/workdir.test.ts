import { afterAll, expect, test } from "bun:test";
import { chmodSync, mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { workdirHook } from "../../../../src/engine/scheduler/hooks/workdir";
import { tempDir } from "../../../helpers";
import { hostOf, launchOf } from "./launch";

const root = tempDir();
afterAll(() => rmSync(root, { recursive: true, force: true }));
const nobody = { name: "nobody", uid: 65534, gid: 65534, groups: [], home: "/nonexistent" };

test("refuses a working directory that is not there", () => {
  const launch = launchOf(root, {}, { cwd: join(root, "missing") });
  expect(() => workdirHook.run(launch, hostOf(root))).toThrow(`the working directory ${join(root, "missing")} does not exist`);
});

test("refuses a chosen cwd the user could not enter by itself, and takes one it can", () => {
  const closed = join(root, "closed");
  const inside = join(closed, "app");
  mkdirSync(inside, { recursive: true });
  chmodSync(root, 0o755);
  chmodSync(closed, 0o700);
  const refused = launchOf(root, { cwd: inside }, { cwd: inside, user: nobody });
  expect(() => workdirHook.run(refused, hostOf(root))).toThrow(`not reachable by the user nobody: it may not enter ${closed}`);
  chmodSync(closed, 0o755);
  expect(() => workdirHook.run(launchOf(root, { cwd: inside }, { cwd: inside, user: nobody }), hostOf(root))).not.toThrow();
});
