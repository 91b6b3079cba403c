/**
 * The builds module turns a git repository at a ref into a directory a service can run from:
 * it clones with the git CLI, runs the build command, and appends everything to a build log
 * from which credentials are redacted.
 */
export { type BuildCredential, type BuildOptions, type BuildResult, DEFAULT_BUILD_TIMEOUT_MS, runBuild } from "./run";
export { type BuildPlan, type BuildSpec, validateBuildSpec } from "./spec";
