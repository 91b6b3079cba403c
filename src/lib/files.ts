import { chmodSync, closeSync, constants, fsyncSync, mkdirSync, openSync, renameSync, writeSync } from "node:fs";
import { dirname } from "node:path";

/**
 * writePrivateFile writes a file readable only by its owner (mode 0600), atomically: it
 * writes a temporary sibling, syncs it and renames it over the target, so a crash never
 * leaves a half-written secret behind.
 */
export function writePrivateFile(path: string, contents: string | Uint8Array): void {
  mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
  const temporary = `${path}.${process.pid}.tmp`;
  const fd = openSync(temporary, constants.O_WRONLY | constants.O_CREAT | constants.O_TRUNC, 0o600);
  try {
    writeSync(fd, typeof contents === "string" ? Buffer.from(contents) : contents);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  chmodSync(temporary, 0o600);
  renameSync(temporary, path);
}
