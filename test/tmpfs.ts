import { closeSync, mkdirSync, mkdtempSync, openSync, rmdirSync, rmSync, statfsSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/**
 * Tmpfs is a real, small tmpfs (issue 13: a full disk is tested on a real filesystem, not a
 * mock). Mounting needs root, which tests and CI have; a run without it fails loudly.
 */
export interface Tmpfs {
  dir: string;
  /** fill writes a filler file until the filesystem answers ENOSPC. */
  fill(): void;
  /** free removes the filler file. */
  free(): void;
  /** fillInodes creates empty files until no inode is left (ENOSPC without a full byte count). */
  fillInodes(): void;
  /** freeInodes removes them. */
  freeInodes(): void;
  /** freeBytes is what statfs reports as available. */
  freeBytes(): number;
  unmount(): void;
}

export function mountTmpfs(size = "8m", options = ""): Tmpfs {
  const dir = mkdtempSync(join(tmpdir(), "engine-tmpfs-"));
  const mounted = Bun.spawnSync(["mount", "-t", "tmpfs", "-o", `size=${size},mode=0755${options ? `,${options}` : ""}`, "tmpfs", dir], {
    stderr: "pipe",
  });
  if (mounted.exitCode !== 0) throw new Error(`mount -t tmpfs failed (root is needed): ${mounted.stderr.toString()}`);
  const filler = join(dir, "filler");
  const inodes = join(dir, "inodes");
  return {
    dir,
    fill() {
      const fd = openSync(filler, "a");
      const chunk = Buffer.alloc(64 * 1024, 120);
      try {
        for (;;) {
          try {
            writeSync(fd, chunk);
          } catch {
            // The last pages: fill them one byte at a time, then the disk is full.
            for (;;) writeSync(fd, chunk.subarray(0, 1));
          }
        }
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== "ENOSPC") throw error;
      } finally {
        closeSync(fd);
      }
    },
    free() {
      rmSync(filler, { force: true });
    },
    fillInodes() {
      mkdirSync(inodes, { recursive: true });
      try {
        for (let i = 0; ; i++) closeSync(openSync(join(inodes, String(i)), "w"));
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== "ENOSPC") throw error;
      }
    },
    freeInodes() {
      rmSync(inodes, { recursive: true, force: true });
    },
    freeBytes() {
      const stats = statfsSync(dir);
      return stats.bavail * stats.bsize;
    },
    unmount() {
      Bun.spawnSync(["umount", "-l", dir]);
      try {
        rmdirSync(dir);
      } catch {
        // still busy: the lazy unmount finishes when the last user goes
      }
    },
  };
}
