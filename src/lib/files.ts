import { randomBytes } from "node:crypto";
import {
  chmodSync,
  closeSync,
  constants,
  existsSync,
  fsyncSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  statSync,
  writeSync,
} from "node:fs";
import { dirname, join } from "node:path";
import { AppError } from "./errors";

export const SECRET_KEY_FILE = "secret.key";

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

/** loadSecretKey reads `<data-dir>/secret.key` (32 bytes, base64, mode 0600), creating it on first use. */
export function loadSecretKey(dataDir: string): Buffer {
  const file = join(dataDir, SECRET_KEY_FILE);
  if (!existsSync(file)) writePrivateFile(file, randomBytes(32).toString("base64"));
  if ((statSync(file).mode & 0o077) !== 0) {
    throw new AppError("config_invalid", `${file} must be readable by its owner only (chmod 600 ${file})`);
  }
  const key = Buffer.from(readFileSync(file, "utf8").trim(), "base64");
  if (key.length !== 32) throw new AppError("config_invalid", `${file} does not hold a 32-byte base64 key`);
  return key;
}
