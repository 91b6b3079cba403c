import { copyFileSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { REPO_ROOT, tempDir } from "../helpers";
import { removeAfterRun } from "../run-dirs";

/** Binaries are the two compiled programs of one build: `engine` and `engine-cloud`, side by side. */
export interface Binaries {
  dir: string;
  engine: string;
  cloud: string;
}

let building: Promise<Binaries> | undefined;

/**
 * buildBinaries compiles dist/engine and dist/engine-cloud with build.ts into a temp dir, once
 * per test process: every e2e file that asks shares the one build (each takes 10-20 s on a
 * small machine). The directory is removed once the run is over (test/run-dirs.ts).
 */
export function buildBinaries(): Promise<Binaries> {
  building ??= (async () => {
    const dir = removeAfterRun(tempDir("engine-e2e-build-"));
    const engine = join(dir, "engine");
    const cloud = join(dir, "engine-cloud");
    const build = Bun.spawn([process.execPath, join(REPO_ROOT, "build.ts"), "--outfile", engine, "--cloud-outfile", cloud], {
      cwd: REPO_ROOT,
      stdout: "ignore",
      stderr: "pipe",
    });
    const [code, stderr] = await Promise.all([build.exited, new Response(build.stderr).text()]);
    if (code !== 0) throw new Error(`build failed (${code}): ${stderr}`);
    return { dir, engine, cloud };
  })();
  return building;
}

/** installEngine copies the built `engine` to `<dir>/bin/engine`, mode 0755, and returns its path. */
export async function installEngine(dir: string): Promise<string> {
  const built = (await buildBinaries()).engine;
  const binary = join(dir, "bin", "engine");
  mkdirSync(join(dir, "bin"), { recursive: true });
  copyFileSync(built, binary);
  Bun.spawnSync(["chmod", "755", binary]);
  return binary;
}

const versioned = new Map<string, Promise<string>>();

/**
 * buildEngineVersion compiles another dist/engine stamped with `version` (build.ts --version),
 * once per process and version, into a temp dir removed once the run is over: the upgrade
 * tests need two builds that say different versions.
 */
export function buildEngineVersion(version: string): Promise<string> {
  let build = versioned.get(version);
  if (!build) {
    build = (async () => {
      const dir = removeAfterRun(tempDir("engine-e2e-build-"));
      const engine = join(dir, "engine");
      const proc = Bun.spawn(
        [process.execPath, join(REPO_ROOT, "build.ts"), "--only", "engine", "--outfile", engine, "--version", version],
        {
          cwd: REPO_ROOT,
          stdout: "ignore",
          stderr: "pipe",
        },
      );
      const [code, stderr] = await Promise.all([proc.exited, new Response(proc.stderr).text()]);
      if (code !== 0) throw new Error(`build of ${version} failed (${code}): ${stderr}`);
      return engine;
    })();
    versioned.set(version, build);
  }
  return build;
}
