import { afterAll, expect, test } from "bun:test";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { copyTree } from "../../../src/cloud/managed/providers/local";
import { tempDir } from "../../helpers";

const dirs: string[] = [];
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

test("a backup's copy of a running box leaves out what went while it was copied, and still fails on a missing root", () => {
  const dir = tempDir("engine-copy-tree-");
  dirs.push(dir);
  const from = join(dir, "from");
  const service = join(from, "services", "svc_1");
  mkdirSync(join(service, "runs", "run_a"), { recursive: true });
  writeFileSync(join(service, "runs", "run_a", "exit.json"), "{}\n");
  // Two entries of one directory, listed together: whichever the copy reaches first removes
  // the other, as the engine would meanwhile (a spare renamed into place, a log rotated).
  mkdirSync(join(service, ".next-run.123"));
  writeFileSync(join(service, ".next-run.123", "pids.tmp"), "");
  writeFileSync(join(service, "output.log"), "a line\n");
  const pair = [".next-run.123", "output.log"];
  let removed: string | null = null;
  const to = join(dir, "to");
  const prefix = "services/svc_1/";
  copyTree(from, to, (relative) => {
    const name = relative.slice(prefix.length);
    if (removed === null && relative.startsWith(prefix) && pair.includes(name)) {
      removed = pair.find((other) => other !== name) ?? null;
      rmSync(join(service, removed ?? ""), { recursive: true });
    }
    return true;
  });
  expect(removed).not.toBeNull();
  const copied = readdirSync(join(to, "services", "svc_1")).sort();
  expect(copied).toEqual(["runs", pair.find((name) => name !== removed) ?? ""].sort());
  expect(readFileSync(join(to, "services", "svc_1", "runs", "run_a", "exit.json"), "utf8")).toBe("{}\n");
  expect(existsSync(join(to, "services", "svc_1", removed ?? ""))).toBe(false);
  // The copy's own root is not a vanished entry: it is an error.
  expect(() => copyTree(join(dir, "absent"), join(dir, "to-2"), () => true)).toThrow(/ENOENT/);
});
