import { posix } from "node:path";
import { AppError } from "../../lib/errors";

/** BuildSpec says what to build: a git repository at a ref, a subdirectory of it and a command. */
export interface BuildSpec {
  /** repo_url is an https://, http://, ssh://, file:// or scp-like (git@host:path) git URL. */
  repo_url: string;
  /** ref is a branch, a tag or a commit (7 to 40 hex digits); it defaults to the remote's HEAD. */
  ref?: string;
  /** subdir is where, inside the checkout, the command runs and the service later starts; "" is the root. */
  subdir?: string;
  /** command runs with `/bin/sh -c` in the subdir; without one the build is the checkout alone. */
  command?: string;
}

/** BuildPlan is a BuildSpec that passed validateBuildSpec, normalised. */
export interface BuildPlan {
  repoUrl: string;
  /** ref is null for the remote's HEAD. */
  ref: string | null;
  /** refIsCommit says the ref is a commit id, which `git clone --branch` cannot take. */
  refIsCommit: boolean;
  /** subdir is relative and normalised; "" is the checkout's root. */
  subdir: string;
  command: string | null;
}

const COMMIT_ID = /^[0-9a-f]{7,40}$/i;
const SCP_LIKE = /^[A-Za-z0-9._-]+@[A-Za-z0-9][A-Za-z0-9.-]*:[^\s]+$/;
const URL_SCHEMES = new Set(["https:", "http:", "ssh:", "file:"]);
// git check-ref-format forbids these; rejecting them early also keeps a ref from reading as an option.
const BAD_REF = /[\s~^:?*[\\\x00-\x1f\x7f]|\.\.|@\{|^[-/.]|[/.]$|\/\/|\.lock$/;

/**
 * validateBuildSpec checks a spec before anything runs and returns it normalised. It throws
 * AppError("build_failed") naming the bad field when the repository URL has a scheme other
 * than https, http, ssh, file or scp-like git@host:path, when the ref is not a plausible git
 * ref, or when the subdir is absolute or climbs out of the checkout with "..".
 */
export function validateBuildSpec(spec: BuildSpec): BuildPlan {
  const repoUrl = typeof spec.repo_url === "string" ? spec.repo_url.trim() : "";
  if (!isGitUrl(repoUrl)) {
    throw new AppError(
      "build_failed",
      `repo_url ${JSON.stringify(spec.repo_url)} is not a git URL: use https://, http://, ssh://, git@host:path or file://`,
      { field: "repo_url" },
    );
  }

  const ref = spec.ref === undefined || spec.ref.trim() === "" ? null : spec.ref.trim();
  if (ref !== null && BAD_REF.test(ref)) {
    throw new AppError("build_failed", `ref ${JSON.stringify(spec.ref)} is not a valid branch, tag or commit name`, { field: "ref" });
  }

  const rawSubdir = spec.subdir ?? "";
  if (rawSubdir.startsWith("/") || /[\x00-\x1f\x7f]/.test(rawSubdir) || rawSubdir.split(/[/\\]/).includes("..")) {
    throw new AppError("build_failed", `subdir ${JSON.stringify(rawSubdir)} must be a relative path inside the checkout, without ".."`, {
      field: "subdir",
    });
  }
  const normalised = posix.normalize(rawSubdir === "" ? "." : rawSubdir).replace(/\/+$/, "");
  const subdir = normalised === "." ? "" : normalised;

  const command = spec.command === undefined || spec.command.trim() === "" ? null : spec.command;
  return { repoUrl, ref, refIsCommit: ref !== null && COMMIT_ID.test(ref), subdir, command };
}

function isGitUrl(text: string): boolean {
  if (text === "" || /[\s\x00-\x1f\x7f]/.test(text)) return false;
  if (SCP_LIKE.test(text)) return true;
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    return false;
  }
  if (!URL_SCHEMES.has(url.protocol)) return false;
  if (url.protocol === "file:") return url.pathname.length > 1;
  // A host that starts with "-" would reach ssh as an option.
  return url.hostname !== "" && !url.hostname.startsWith("-");
}

/** redactUrl hides the password of a URL's userinfo, for logs. */
export function redactUrl(text: string): string {
  return text.replace(/^([a-z][a-z0-9+.-]*:\/\/[^/@:]*):[^/@]*@/i, "$1:***@");
}
