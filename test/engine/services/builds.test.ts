import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { eventually, startTestEngine, type TestEngine, tempDir } from "../../helpers";
import { ServiceClient } from "./harness";

let engine: TestEngine;
let api: ServiceClient;
let repo: string;

const GIT_ENV = {
  ...process.env,
  GIT_CONFIG_GLOBAL: "/dev/null",
  GIT_CONFIG_NOSYSTEM: "1",
  GIT_AUTHOR_NAME: "test",
  GIT_AUTHOR_EMAIL: "test@example.com",
  GIT_COMMITTER_NAME: "test",
  GIT_COMMITTER_EMAIL: "test@example.com",
};

function git(...args: string[]): void {
  const result = Bun.spawnSync(["git", ...args], { cwd: repo, env: GIT_ENV, stderr: "pipe" });
  if (result.exitCode !== 0) throw new Error(`git ${args.join(" ")}: ${result.stderr.toString()}`);
}

beforeAll(async () => {
  repo = tempDir("engine-repo-");
  // The repository stands for a remote, which every build user may read: as root the engine
  // clones as the service's own user, never as itself.
  chmodSync(repo, 0o755);
  git("init", "-q", "-b", "main");
  mkdirSync(join(repo, "app"));
  writeFileSync(join(repo, "app", "serve.sh"), '#!/bin/sh\necho "serving $(cat built.txt)"\nexec sleep 300\n');
  git("add", ".");
  git("commit", "-q", "-m", "v1");
  engine = await startTestEngine();
  api = new ServiceClient(engine);
});
afterAll(async () => {
  await engine.close();
  rmSync(repo, { recursive: true, force: true });
});

describe("builds from git", () => {
  test("a build clones at the ref, runs the build command in the subdir, and the service runs from there", async () => {
    const deployed = await api.deploy({
      name: "built",
      command: "sh ./serve.sh",
      build: { repo_url: `file://${repo}`, ref: "main", subdir: "app", command: "echo v1-artifact > built.txt; id -un > builder.txt" },
    });
    expect(deployed.status).toBe(201);
    expect(deployed.body.status).toBe("building");
    await api.waitFor("built", "running");
    const logs = await eventually(async () => {
      const lines = (await engine.json<{ line: string }[]>("GET", "/api/services/built/logs")).body;
      return lines.some((l) => l.line === "serving v1-artifact") ? lines : null;
    });
    expect(logs.length).toBeGreaterThan(0);
    const diagnosis = await api.diagnose("built");
    expect(diagnosis.build).toEqual({ last_result: "succeeded", version: 1, reason: null });
    // The build ran the repository's code as the service's user (the engine's own when unprivileged).
    const builder = readFileSync(join(engine.dataDir, "data", ".builds", deployed.body.id, "1", "app", "builder.txt"), "utf8").trim();
    expect(builder).toBe(process.geteuid?.() === 0 ? "eng-built" : (process.env.USER ?? builder));
    expect(diagnosis.user).toBe(process.geteuid?.() === 0 ? "eng-built" : null);
  });

  test("a failed build of a new version leaves the previous version running, with fix_build", async () => {
    const before = await api.get("built");
    const redeployed = await api.deploy({
      name: "built",
      command: "sh ./serve.sh",
      build: { repo_url: `file://${repo}`, ref: "main", subdir: "app", command: "echo compiling; exit 2" },
    });
    expect(redeployed.status).toBe(201);
    const diagnosis = await eventually(async () => {
      const d = await api.diagnose("built");
      return d.build.last_result === "failed" ? d : null;
    });
    expect(diagnosis.build.version).toBe(2);
    expect(diagnosis.build.reason).toContain("2");
    expect(diagnosis.remediation?.code).toBe("fix_build");
    const after = await api.get("built");
    expect(after.status).toBe("running");
    expect(after.pid).toBe(before.pid);
    expect(after.version).toBe(1);
  });

  test("a failed first build fails the service; an unknown ref is a failed build", async () => {
    await api.deploy({ name: "never-built", command: "sh ./serve.sh", build: { repo_url: `file://${repo}`, ref: "no-such-branch" } });
    await api.waitFor("never-built", "failed");
    const diagnosis = await api.diagnose("never-built");
    expect(diagnosis.build.last_result).toBe("failed");
    expect(diagnosis.error?.class).toBe("build_failed");
    expect(diagnosis.remediation?.code).toBe("fix_build");
  });

  (process.geteuid?.() === 0 ? test : test.skip)(
    "as root, a local repository the service's user may not reach fails the build naming the directory and the fix",
    async () => {
      // As a user keeps a checkout: in a private directory (mkdtemp makes it 0700), not opened up.
      const closed = tempDir("engine-private-");
      const clone = join(closed, "repo");
      Bun.spawnSync(["git", "clone", "-q", repo, clone]);
      try {
        await api.deploy({
          name: "closed-repo",
          command: "sh ./serve.sh",
          build: { repo_url: `file://${clone}`, ref: "main", subdir: "app" },
        });
        await api.waitFor("closed-repo", "failed");
        const diagnosis = await api.diagnose("closed-repo");
        expect(diagnosis.build.last_result).toBe("failed");
        expect(diagnosis.build.reason).toContain(`under ${closed}, which the service's user eng-closed-repo may not enter`);
        expect(diagnosis.build.reason).toContain(`chmod o+rx ${closed}`);
      } finally {
        rmSync(closed, { recursive: true, force: true });
      }
    },
  );
});
