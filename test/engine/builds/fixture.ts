import { mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

/** GIT_ENV isolates git from the host's configuration, so only what a test sets matters. */
export const GIT_ENV: Record<string, string> = {
  GIT_CONFIG_GLOBAL: "/dev/null",
  GIT_CONFIG_NOSYSTEM: "1",
  GIT_AUTHOR_NAME: "Test Author",
  GIT_AUTHOR_EMAIL: "author@example.test",
  GIT_COMMITTER_NAME: "Test Author",
  GIT_COMMITTER_EMAIL: "author@example.test",
};

/** git runs the git CLI in a directory with GIT_ENV and returns its trimmed stdout; it throws on failure. */
export function git(cwd: string, ...args: string[]): string {
  const result = Bun.spawnSync(["/usr/bin/git", ...args], {
    cwd,
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: cwd, LC_ALL: "C", ...GIT_ENV },
    stdout: "pipe",
    stderr: "pipe",
  });
  if (result.exitCode !== 0) throw new Error(`git ${args.join(" ")} failed: ${result.stderr.toString()}`);
  return result.stdout.toString().trim();
}

/** OriginRepo is a real git repository with known commits, a tag, a second branch and a commit only a tag reaches. */
export interface OriginRepo {
  dir: string;
  url: string;
  /** first is the commit tagged v1, with VERSION 1. */
  first: string;
  /** main is the tip of main, with VERSION 2. */
  main: string;
  /** feature is the tip of the feature branch, which adds feature.txt. */
  feature: string;
  /** tagOnly is a commit on no branch, reachable only from the tag "detached". */
  tagOnly: string;
}

/** createOriginRepo builds the test repository under root/origin. */
export function createOriginRepo(root: string): OriginRepo {
  const dir = join(root, "origin");
  mkdirSync(join(dir, "app"), { recursive: true });
  git(dir, "init", "--quiet", "--initial-branch=main");
  writeFileSync(join(dir, "VERSION"), "1\n");
  writeFileSync(join(dir, "app", "main.txt"), "the app\n");
  git(dir, "add", ".");
  git(dir, "commit", "--quiet", "-m", "first");
  git(dir, "tag", "v1");
  const first = git(dir, "rev-parse", "HEAD");

  writeFileSync(join(dir, "VERSION"), "2\n");
  git(dir, "commit", "--quiet", "-am", "second");
  const main = git(dir, "rev-parse", "HEAD");

  git(dir, "checkout", "--quiet", "-b", "feature");
  writeFileSync(join(dir, "feature.txt"), "feature\n");
  git(dir, "add", ".");
  git(dir, "commit", "--quiet", "-m", "feature");
  const feature = git(dir, "rev-parse", "HEAD");
  git(dir, "checkout", "--quiet", "main");

  const tree = git(dir, "write-tree");
  const tagOnly = git(dir, "commit-tree", tree, "-p", main, "-m", "on no branch");
  git(dir, "tag", "detached", tagOnly);

  return { dir, url: `file://${dir}`, first, main, feature, tagOnly };
}

/** GitHttpServer is a smart-HTTP git server in front of `git http-backend` that wants Basic auth. */
export interface GitHttpServer {
  url: string;
  /** authorizations are the Authorization headers received, "" for none, in order. */
  authorizations: string[];
  /** argvLeaks are command lines of processes, seen while serving, that held the secret. */
  argvLeaks: string[];
  stop(): void;
}

/**
 * serveGitOverHttp serves the repositories under projectRoot at /<name>, answering 401 with
 * `WWW-Authenticate: Basic` unless the request carries `expected` (a username and password).
 * While serving each request it looks through every process's command line for the password.
 */
export function serveGitOverHttp(projectRoot: string, expected: { username: string; password: string }): GitHttpServer {
  const authorizations: string[] = [];
  const argvLeaks: string[] = [];
  const wanted = `Basic ${Buffer.from(`${expected.username}:${expected.password}`).toString("base64")}`;
  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(request) {
      const authorization = request.headers.get("authorization") ?? "";
      authorizations.push(authorization);
      argvLeaks.push(...commandLinesContaining(expected.password));
      if (authorization !== wanted) {
        return new Response("authentication required\n", { status: 401, headers: { "WWW-Authenticate": 'Basic realm="test"' } });
      }
      const url = new URL(request.url);
      const body = new Uint8Array(await request.arrayBuffer());
      const cgi = Bun.spawn(["/usr/bin/git", "http-backend"], {
        env: {
          PATH: process.env.PATH ?? "/usr/bin:/bin",
          ...GIT_ENV,
          GIT_PROJECT_ROOT: projectRoot,
          GIT_HTTP_EXPORT_ALL: "1",
          PATH_INFO: url.pathname,
          QUERY_STRING: url.search.slice(1),
          REQUEST_METHOD: request.method,
          CONTENT_TYPE: request.headers.get("content-type") ?? "",
          CONTENT_LENGTH: String(body.byteLength),
          HTTP_CONTENT_ENCODING: request.headers.get("content-encoding") ?? "",
          GIT_PROTOCOL: request.headers.get("git-protocol") ?? "",
          REMOTE_USER: expected.username,
          REMOTE_ADDR: "127.0.0.1",
        },
        stdin: body,
        stdout: "pipe",
        stderr: "ignore",
      });
      const output = Buffer.from(await new Response(cgi.stdout).arrayBuffer());
      await cgi.exited;
      const split = output.indexOf("\r\n\r\n") >= 0 ? output.indexOf("\r\n\r\n") : output.indexOf("\n\n");
      const separator = output.indexOf("\r\n\r\n") >= 0 ? 4 : 2;
      const headers = new Headers();
      let status = 200;
      for (const line of output.subarray(0, split).toString("utf8").split(/\r?\n/)) {
        const colon = line.indexOf(":");
        if (colon < 0) continue;
        const name = line.slice(0, colon).trim();
        const value = line.slice(colon + 1).trim();
        if (name.toLowerCase() === "status") status = Number.parseInt(value, 10);
        else headers.append(name, value);
      }
      return new Response(output.subarray(split + separator), { status, headers });
    },
  });
  return { url: `http://127.0.0.1:${server.port}`, authorizations, argvLeaks, stop: () => server.stop(true) };
}

function commandLinesContaining(secret: string): string[] {
  const found: string[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const commandLine = readFileSync(`/proc/${entry}/cmdline`, "utf8").replaceAll("\0", " ");
      if (commandLine.includes(secret)) found.push(commandLine);
    } catch {
      // The process has gone.
    }
  }
  return found;
}
