import { readdirSync } from "node:fs";

/** processIds lists the pids of every process this one can see in /proc; none where /proc cannot be read. */
export function processIds(): number[] {
  let entries: string[];
  try {
    entries = readdirSync("/proc");
  } catch {
    return [];
  }
  const pids: number[] = [];
  for (const entry of entries) if (/^\d+$/.test(entry)) pids.push(Number(entry));
  return pids;
}
