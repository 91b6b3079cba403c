import { afterAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { commandHook } from "../../../../src/engine/scheduler/hooks/command";
import { shellCommand } from "../../../../src/lib/shell";
import { tempDir } from "../../../helpers";
import { hostOf, launchOf } from "./launch";

const root = tempDir();
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe("commandHook", () => {
  test("a plain string runs as its argv, with PWD its working directory as the shell would set it", () => {
    const launch = launchOf(root, { command: shellCommand("exec sleep 600") });
    launch.argv = launch.spec.command;
    commandHook.run(launch, hostOf(root));
    expect(launch.argv).toEqual(["sleep", "600"]);
    expect(launch.env.PWD).toBe(launch.cwd);
    expect(launch.spec.command).toEqual(["/bin/sh", "-c", "exec sleep 600"]); // the record keeps the string
  });

  test("a PWD the deploy sets is kept; a string with shell syntax keeps /bin/sh and the environment as it was", () => {
    const own = launchOf(root, { command: shellCommand("sleep 600"), env: { PWD: "/elsewhere" } });
    own.env = { PWD: "/elsewhere" };
    commandHook.run(own, hostOf(root));
    expect(own.argv).toEqual(["sleep", "600"]);
    expect(own.env.PWD).toBe("/elsewhere");

    const shell = launchOf(root, { command: shellCommand("exec sleep $DELAY") });
    shell.argv = shell.spec.command;
    commandHook.run(shell, hostOf(root));
    expect(shell.argv).toEqual(["/bin/sh", "-c", "exec sleep $DELAY"]);
    expect(shell.env).toEqual({});
  });
});
