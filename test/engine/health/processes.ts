import { existsSync, readFileSync } from "node:fs";

/** isAlive says whether a process exists and is not a zombie waiting for a reaper. */
export function isAlive(pid: number): boolean {
  const stat = `/proc/${pid}/stat`;
  if (!existsSync(stat)) return false;
  try {
    // The state follows the command name, which is in parentheses and may itself hold spaces.
    const text = readFileSync(stat, "utf8");
    return text.slice(text.lastIndexOf(")") + 2, text.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}

/** readPids reads the process ids a test command wrote, one per line. */
export function readPids(file: string): number[] {
  if (!existsSync(file)) return [];
  return readFileSync(file, "utf8")
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map(Number);
}
