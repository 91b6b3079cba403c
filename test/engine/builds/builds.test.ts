import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type BuildOptions, type BuildSpec, runBuild, validateBuildSpec } from "../../../src/engine/builds";
import { AppError } from "../../../src/lib/errors";
import { eventually, tempDir } from "../../helpers";
import { isAlive, readPids } from "../health/processes";
import { createOriginRepo, GIT_ENV, git, type OriginRepo, serveGitOverHttp } from "./fixture";

let root: string;
let origin: OriginRepo;
let builds = 0;

beforeAll(() => {
  root = tempDir("builds-");
  origin = createOriginRepo(root);
});

afterAll(() => {
  rmSync(root, { recursive: true, force: true });
});

/** fresh returns a new work dir and log path, as the engine gives one per version. */
function fresh(overrides: Partial<BuildOptions> = {}): BuildOptions {
  builds++;
  return { workDir: join(root, "builds", String(builds)), logPath: join(root, "logs", `${builds}.log`), env: GIT_ENV, ...overrides };
}

const readLog = (options: BuildOptions) => readFileSync(options.logPath, "utf8");

describe("runBuild", () => {
  test("clones the remote's HEAD and runs the command in the checkout", async () => {
    const options = fresh();
    const result = await runBuild({ repo_url: origin.url, command: "echo building; cat VERSION > built.txt" }, options);
    expect(result).toMatchObject({ ok: true, commit: origin.main, dir: options.workDir, reason: null });
    expect(readFileSync(join(options.workDir, "built.txt"), "utf8")).toBe("2\n");
    expect(result.log_tail).toContain("building");
    expect(result.duration_ms).toBeGreaterThanOrEqual(0);
    const log = readLog(options);
    expect(log).toContain("building\n");
    expect(log).toContain(`==> build succeeded in ${result.duration_ms} ms at ${origin.main}`);
    // A branch build is shallow.
    expect(git(options.workDir, "rev-list", "--count", "HEAD")).toBe("1");
  });

  test.each<[string, keyof OriginRepo, string]>([
    ["a tag", "first", "v1"],
    ["a branch", "feature", "feature"],
  ])("checks out %s", async (_name, expected, ref) => {
    const options = fresh();
    const result = await runBuild({ repo_url: origin.url, ref }, options);
    expect(result).toMatchObject({ ok: true, commit: origin[expected], reason: null });
    expect(existsSync(join(options.workDir, "feature.txt"))).toBe(ref === "feature");
  });

  test("a failing command fails the build with its exit code, and the log has its output", async () => {
    const options = fresh();
    const result = await runBuild(
      { repo_url: origin.url, command: "echo compiling; echo 'error: missing semicolon' >&2; exit 2" },
      options,
    );
    expect(result).toMatchObject({ ok: false, commit: origin.main, reason: "build command exited 2" });
    expect(result.log_tail).toContain("error: missing semicolon");
    const log = readLog(options);
    expect(log).toContain("compiling\n");
    expect(log).toContain("error: missing semicolon\n");
    expect(log).toContain("==> build failed in");
  });

  test("an unknown ref fails with git's own words", async () => {
    const options = fresh();
    const result = await runBuild({ repo_url: origin.url, ref: "nope", command: "touch ran" }, options);
    expect(result).toMatchObject({ ok: false, commit: null, reason: "git clone failed: Remote branch nope not found in upstream origin" });
    expect(readLog(options)).toContain("fatal: Remote branch nope not found in upstream origin");
    expect(existsSync(join(options.workDir, "ran"))).toBe(false);
  });

  test("a subdir is where the command runs and what dir points at", async () => {
    const options = fresh();
    const result = await runBuild({ repo_url: origin.url, subdir: "./app/", command: "pwd > where.txt; test -f main.txt" }, options);
    expect(result).toMatchObject({ ok: true, dir: join(options.workDir, "app") });
    expect(readFileSync(join(options.workDir, "app", "where.txt"), "utf8").trim()).toBe(join(options.workDir, "app"));
  });

  test("a subdir missing from the checkout fails the build", async () => {
    const result = await runBuild({ repo_url: origin.url, subdir: "service", command: "true" }, fresh());
    expect(result).toMatchObject({ ok: false, commit: origin.main, reason: "subdir service does not exist in the checkout" });
  });

  test.each<[string, (repo: OriginRepo) => string, keyof OriginRepo]>([
    ["a full commit id", (repo) => repo.first, "first"],
    ["a short commit id", (repo) => repo.first.slice(0, 7), "first"],
    ["a commit of another branch", (repo) => repo.feature, "feature"],
    ["a commit only a tag reaches", (repo) => repo.tagOnly, "tagOnly"],
  ])("checks out %s", async (_name, ref, expected) => {
    const options = fresh();
    const result = await runBuild({ repo_url: origin.url, ref: ref(origin), command: "cat VERSION > built.txt" }, options);
    expect(result).toMatchObject({ ok: true, commit: origin[expected], reason: null });
    expect(git(options.workDir, "rev-parse", "HEAD")).toBe(origin[expected]);
  });

  test("an unknown commit fails the build", async () => {
    const missing = "0123456789abcdef0123456789abcdef01234567";
    const result = await runBuild({ repo_url: origin.url, ref: missing }, fresh());
    expect(result).toMatchObject({ ok: false, reason: `commit ${missing} was not found in the repository` });
  });

  test.each<[string, BuildSpec, RegExp]>([
    ["an ftp URL", { repo_url: "ftp://example.com/repo.git" }, /repo_url "ftp:\/\/example.com\/repo.git" is not a git URL/],
    ["git's ext transport", { repo_url: "ext::sh -c touch% /tmp/pwned" }, /is not a git URL/],
    ["an option for a URL", { repo_url: "--upload-pack=touch /tmp/pwned" }, /is not a git URL/],
    ["a bare path", { repo_url: "/srv/git/repo" }, /is not a git URL/],
    ["an empty URL", { repo_url: "" }, /is not a git URL/],
    ["an ssh host that is an option", { repo_url: "ssh://-oProxyCommand=x/repo" }, /is not a git URL/],
    ["a ref that is an option", { repo_url: "https://example.com/r.git", ref: "--upload-pack=x" }, /ref .* is not a valid/],
    ["a ref with ..", { repo_url: "https://example.com/r.git", ref: "a..b" }, /ref .* is not a valid/],
    ["a subdir climbing out", { repo_url: "https://example.com/r.git", subdir: "app/../../etc" }, /subdir .* must be a relative path/],
    ["an absolute subdir", { repo_url: "https://example.com/r.git", subdir: "/etc" }, /subdir .* must be a relative path/],
  ])("rejects %s before anything runs", async (_name, spec, message) => {
    const options = fresh();
    const error = await runBuild(spec, options).catch((caught: unknown) => caught);
    expect(error).toBeInstanceOf(AppError);
    expect((error as AppError).code).toBe("build_failed");
    expect((error as AppError).message).toMatch(message);
    expect(existsSync(options.workDir)).toBe(false);
    expect(existsSync(options.logPath)).toBe(false);
  });

  test.each([
    "https://github.com/acme/api.git",
    "http://git.local/x",
    "ssh://git@host:2222/acme/api.git",
    "git@github.com:acme/api.git",
    "file:///srv/git/api",
  ])("accepts %s", (repo_url) => {
    expect(validateBuildSpec({ repo_url, ref: "release/1.2", subdir: "" })).toMatchObject({ repoUrl: repo_url, subdir: "" });
  });

  test("a timeout kills the command's whole process tree", async () => {
    const options = fresh({ timeoutMs: 1500 });
    const pidFile = join(root, "timeout.pids");
    const result = await runBuild(
      { repo_url: origin.url, command: `echo $$ >> ${pidFile}; sleep 30 & echo $! >> ${pidFile}; sleep 30` },
      options,
    );
    expect(result).toMatchObject({ ok: false, commit: origin.main, reason: "timed out after 1500 ms" });
    const pids = readPids(pidFile);
    expect(pids).toHaveLength(2);
    await eventually(() => pids.every((pid) => !isAlive(pid)));
  });

  test("an abort kills the command's whole process tree", async () => {
    const controller = new AbortController();
    const options = fresh({ signal: controller.signal });
    const pidFile = join(root, "abort.pids");
    const building = runBuild({ repo_url: origin.url, command: `echo $$ >> ${pidFile}; sleep 30 & echo $! >> ${pidFile}; wait` }, options);
    await eventually(() => readPids(pidFile).length === 2);
    const pids = readPids(pidFile);
    controller.abort();
    expect(await building).toMatchObject({ ok: false, reason: "aborted" });
    await eventually(() => pids.every((pid) => !isAlive(pid)));
  });
});

describe("runBuild with a credential", () => {
  const credential = { username: "x-access-token", password: "ghs_S3cretBuildToken_9f8e7d6c5b4a" };
  const basic = `Basic ${Buffer.from(`${credential.username}:${credential.password}`).toString("base64")}`;
  let server: ReturnType<typeof serveGitOverHttp>;

  beforeAll(() => {
    git(root, "clone", "--quiet", "--bare", origin.dir, join(root, "served", "app.git"));
    server = serveGitOverHttp(join(root, "served"), credential);
  });
  afterAll(() => server.stop());

  const askpassDirs = () => readdirSync(tmpdir()).filter((name) => name.startsWith("engine-askpass-"));

  test("git presents it when challenged; it stays out of argv, the log, .git/config and the build command", async () => {
    const before = askpassDirs();
    const options = fresh({ credential });
    const result = await runBuild({ repo_url: `${server.url}/app.git`, command: "env > build-env.txt" }, options);
    expect(result).toMatchObject({ ok: true, commit: origin.main, reason: null });
    // The first request goes without credentials; git asks askpass after the 401.
    expect(server.authorizations[0]).toBe("");
    expect(server.authorizations).toContain(basic);
    expect(server.argvLeaks).toEqual([]);
    const config = readFileSync(join(options.workDir, ".git", "config"), "utf8");
    expect(config).toContain(`url = ${server.url}/app.git`);
    expect(config).not.toContain(credential.password);
    const log = readLog(options);
    expect(log).not.toContain(credential.password);
    expect(log).not.toContain(basic.slice("Basic ".length));
    const buildEnv = readFileSync(join(options.workDir, "build-env.txt"), "utf8");
    expect(buildEnv).not.toContain(credential.password);
    expect(buildEnv).not.toContain("GIT_ASKPASS");
    expect(askpassDirs()).toEqual(before);
  });

  test("a rejected credential fails the clone cleanly and is never logged", async () => {
    const wrong = { username: credential.username, password: "ghs_WrongToken_0123456789abcdef" };
    const sent = `Basic ${Buffer.from(`${wrong.username}:${wrong.password}`).toString("base64")}`;
    server.authorizations.length = 0;
    const options = fresh({ credential: wrong });
    const result = await runBuild({ repo_url: `${server.url}/app.git`, command: "touch ran" }, options);
    expect(result.ok).toBe(false);
    expect(result.commit).toBeNull();
    expect(result.reason).toBe(`git clone failed: Authentication failed for '${server.url}/app.git/'`);
    // The header carried the credential, so it really reached git.
    expect(server.authorizations).toContain(sent);
    expect(server.argvLeaks).toEqual([]);
    const log = readLog(options);
    expect(log).toContain("Authentication failed");
    expect(log).not.toContain(wrong.password);
    expect(JSON.stringify(result)).not.toContain(wrong.password);
    expect(existsSync(join(options.workDir, ".git"))).toBe(false);
  });

  test("without a credential git fails at once instead of prompting", async () => {
    const result = await runBuild({ repo_url: `${server.url}/app.git` }, fresh());
    expect(result.ok).toBe(false);
    expect(result.reason).toStartWith("git clone failed:");
  });

  test("a password in the URL is redacted from the log", async () => {
    const options = fresh();
    const url = server.url.replace("http://", `http://${credential.username}:${credential.password}@`);
    const result = await runBuild({ repo_url: `${url}/app.git` }, options);
    expect(result.ok).toBe(true);
    expect(readLog(options)).not.toContain(credential.password);
    expect(readLog(options)).toContain(`http://${credential.username}:***@`);
  });
});
