import type { WorkloadUser } from "./accounts";

/**
 * credentialsArg is the shim's CREDENTIALS argument: `UID:GID:G1,G2,...` (the groups may be
 * empty), or `-` to run the workload as the engine's own user.
 */
export function credentialsArg(user: WorkloadUser | null): string {
  if (!user) return "-";
  return `${user.uid}:${user.gid}:${user.groups.join(",")}`;
}

/**
 * asWorkloadUser prefixes argv with util-linux's setpriv so that a build step or an exec probe
 * runs as `user`, with exactly its supplementary groups (setpriv execs the command: no extra
 * process stays behind). Without a user it returns argv as it is.
 */
export function asWorkloadUser(user: WorkloadUser | null, argv: string[]): string[] {
  if (!user) return argv;
  const setpriv = Bun.which("setpriv") ?? "/usr/bin/setpriv";
  const groups = user.groups.length > 0 ? `--groups=${user.groups.join(",")}` : "--clear-groups";
  return [setpriv, `--reuid=${user.uid}`, `--regid=${user.gid}`, groups, "--", ...argv];
}
