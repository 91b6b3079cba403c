import { existsSync, mkdirSync, readFileSync, rmdirSync, writeFileSync } from "node:fs";
import { join, relative } from "node:path";

/** MemoryCgroup is the cgroup one run is started in. */
export interface MemoryCgroup {
  dir: string;
  /** procsPath is the file the shim's child writes its pid to before exec. */
  procsPath: string;
}

/**
 * CgroupDriver puts runs in memory-limited cgroups and reads back whether the kernel's OOM
 * killer acted in them: v2 `memory.max` + `memory.events`, v1 `memory.limit_in_bytes` +
 * `memory.oom_control`. One cgroup per run keeps the OOM counter a fact about that run.
 */
export interface CgroupDriver {
  version: 1 | 2;
  /** parent is the directory under which the engine makes its runs' cgroups. */
  parent: string;
  create(name: string, memoryMb: number | null): MemoryCgroup;
  /** oomKills is the number of processes the OOM killer killed in the cgroup, or null if unreadable. */
  oomKills(dir: string): number | null;
  /** remove kills whatever is left in the cgroup and removes it; it never throws. */
  remove(dir: string): void;
}

interface CgroupLine {
  hierarchy: string;
  controllers: string[];
  path: string;
}

function parseProcCgroup(text: string): CgroupLine[] {
  return text
    .split("\n")
    .filter(Boolean)
    .map((line) => {
      const [hierarchy = "", controllers = "", ...rest] = line.split(":");
      return { hierarchy, controllers: controllers ? controllers.split(",") : [], path: rest.join(":") };
    });
}

export interface MountEntry {
  root: string;
  mountPoint: string;
  fsType: string;
  /** source is the mounted device or name ("/dev/vda", "tmpfs"). */
  source: string;
  superOptions: string[];
}

/** parseMountInfo reads the lines of /proc/<pid>/mountinfo. */
export function parseMountInfo(text: string): MountEntry[] {
  const entries: MountEntry[] = [];
  for (const line of text.split("\n")) {
    if (!line) continue;
    const [left = "", right = ""] = line.split(" - ");
    const fields = left.split(" ");
    const [fsType = "", source = "", superOptions = ""] = right.split(" ");
    entries.push({ root: fields[3] ?? "/", mountPoint: fields[4] ?? "", fsType, source, superOptions: superOptions.split(",") });
  }
  return entries;
}

function readCounter(file: string, key: string): number | null {
  try {
    const match = new RegExp(`^${key} (\\d+)$`, "m").exec(readFileSync(file, "utf8"));
    return match ? Number(match[1]) : null;
  } catch {
    return null;
  }
}

/**
 * killAndRemove kills what is left in a cgroup and removes it. It never blocks the daemon: a
 * cgroup whose processes are still dying is retried a few times in the background, and one
 * that still cannot go is left for a later sweep.
 */
function killAndRemove(dir: string, attempt = 0): void {
  try {
    const pids = readFileSync(join(dir, "cgroup.procs"), "utf8").split("\n").filter(Boolean).map(Number);
    for (const pid of pids) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // already gone
      }
    }
    rmdirSync(dir);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT" || attempt >= 20) return;
    setTimeout(() => killAndRemove(dir, attempt + 1), 50).unref?.();
  }
}

/**
 * detectCgroupDriver finds the memory controller of the engine's own cgroup and checks it can
 * make a child there. It returns null with a reason when it cannot: then memory limits are not
 * enforced and OOM kills are inferred from exit signals only, which Diagnosis says.
 */
export function detectCgroupDriver(
  options: { procSelf?: string; parentName?: string } = {},
): { driver: CgroupDriver } | { driver: null; reason: string } {
  const procSelf = options.procSelf ?? "/proc/self";
  const parentName = options.parentName ?? "engine";
  let lines: CgroupLine[];
  let mounts: MountEntry[];
  try {
    lines = parseProcCgroup(readFileSync(join(procSelf, "cgroup"), "utf8"));
    mounts = parseMountInfo(readFileSync(join(procSelf, "mountinfo"), "utf8"));
  } catch (error) {
    return { driver: null, reason: `cannot read the process's cgroups: ${(error as Error).message}` };
  }

  const v1Line = lines.find((line) => line.controllers.includes("memory"));
  const v1Mount = mounts.find((mount) => mount.fsType === "cgroup" && mount.superOptions.includes("memory"));
  if (v1Line && v1Mount) {
    const own = join(v1Mount.mountPoint, relative(v1Mount.root, v1Line.path));
    return probe(1, join(own, parentName));
  }
  const v2Line = lines.find((line) => line.hierarchy === "0");
  const v2Mount = mounts.find((mount) => mount.fsType === "cgroup2");
  if (v2Line && v2Mount) {
    const own = join(v2Mount.mountPoint, relative(v2Mount.root, v2Line.path));
    const controllers = safeRead(join(own, "cgroup.controllers"));
    if (!controllers?.split(" ").includes("memory")) {
      return { driver: null, reason: `the memory controller is not available in ${own}` };
    }
    return probe(2, join(own, parentName));
  }
  return { driver: null, reason: "no memory cgroup controller is mounted" };
}

function safeRead(file: string): string | null {
  try {
    return readFileSync(file, "utf8").trim();
  } catch {
    return null;
  }
}

function probe(version: 1 | 2, parent: string): { driver: CgroupDriver } | { driver: null; reason: string } {
  try {
    mkdirSync(parent, { recursive: true });
    if (version === 2) {
      // cgroup v2 delegates a controller to children only through subtree_control.
      writeFileSync(join(parent, "cgroup.subtree_control"), "+memory");
    }
  } catch (error) {
    return { driver: null, reason: `cannot create ${parent}: ${(error as Error).message}` };
  }
  const driver: CgroupDriver = {
    version,
    parent,
    create(name, memoryMb) {
      const dir = join(parent, name);
      mkdirSync(dir, { recursive: true });
      if (memoryMb !== null) {
        const bytes = String(memoryMb * 1024 * 1024);
        if (version === 1) {
          writeFileSync(join(dir, "memory.limit_in_bytes"), bytes);
          // Without a memsw limit a workload could spill past its limit into swap.
          if (existsSync(join(dir, "memory.memsw.limit_in_bytes"))) {
            try {
              writeFileSync(join(dir, "memory.memsw.limit_in_bytes"), bytes);
            } catch {
              // swap accounting off: the memory limit alone applies
            }
          }
        } else {
          writeFileSync(join(dir, "memory.max"), bytes);
          try {
            writeFileSync(join(dir, "memory.swap.max"), "0");
          } catch {
            // no swap controller
          }
        }
      }
      return { dir, procsPath: join(dir, "cgroup.procs") };
    },
    oomKills(dir) {
      return version === 1 ? readCounter(join(dir, "memory.oom_control"), "oom_kill") : readCounter(join(dir, "memory.events"), "oom_kill");
    },
    remove: killAndRemove,
  };
  return { driver };
}
