import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { AppError } from "../../lib/errors";

// build.ts compiles shim.c and embeds the executable, base64, so the compiled engine needs no compiler.
declare const __ENGINE_EMBEDDED_SHIM__: string | undefined;

const SOURCE_URL = new URL("./shim.c", import.meta.url);

/** shimSource returns the shim's C source, or null inside a compiled binary that has no sources. */
export function shimSource(): string | null {
  try {
    return readFileSync(SOURCE_URL, "utf8");
  } catch {
    return null;
  }
}

function shortHash(data: string | Uint8Array): string {
  return new Bun.CryptoHasher("sha256").update(data).digest("hex").slice(0, 12);
}

/**
 * compileShim builds the shim from source with the host's C compiler: statically where the
 * C library allows (so the file runs on any Linux of the architecture), else dynamically.
 */
export function compileShim(source: string, outfile: string): void {
  const cc = Bun.which("cc") ?? Bun.which("gcc") ?? Bun.which("clang");
  if (!cc) {
    throw new AppError(
      "shim_unavailable",
      "the engine runs from source here and needs a C compiler (cc) to build its process shim once; install gcc, or use the compiled engine binary, or set ENGINE_SHIM to a built shim",
    );
  }
  mkdirSync(dirname(outfile), { recursive: true });
  const srcFile = `${outfile}.${process.pid}.c`;
  const tmpOut = `${outfile}.${process.pid}.tmp`;
  writeFileSync(srcFile, source);
  try {
    let result = Bun.spawnSync([cc, "-O2", "-static", "-s", "-o", tmpOut, srcFile], { stderr: "pipe" });
    if (result.exitCode !== 0) result = Bun.spawnSync([cc, "-O2", "-s", "-o", tmpOut, srcFile], { stderr: "pipe" });
    if (result.exitCode !== 0) {
      throw new AppError("shim_unavailable", `compiling the process shim failed: ${result.stderr.toString().trim().slice(0, 500)}`);
    }
    chmodSync(tmpOut, 0o755);
    renameSync(tmpOut, outfile);
  } finally {
    Bun.spawnSync(["rm", "-f", srcFile, tmpOut]);
  }
}

/**
 * installByHash writes `content` into `binDir` (made 0700 when missing) as
 * `<prefix>-<hash of content><suffix>` unless that file is there already, and returns its path.
 * Named by content, an upgraded engine never overwrites a file that processes of the previous
 * version were started from; written to a temporary name and renamed, no process ever starts
 * from half a file.
 */
export function installByHash(binDir: string, prefix: string, content: string | Uint8Array, mode: number, suffix = ""): string {
  mkdirSync(binDir, { recursive: true, mode: 0o700 });
  const path = join(binDir, `${prefix}-${shortHash(content)}${suffix}`);
  if (!existsSync(path)) {
    const tmp = `${path}.${process.pid}.tmp`;
    writeFileSync(tmp, content, { mode });
    renameSync(tmp, path);
  }
  return path;
}

/**
 * ensureShim returns the path of a runnable shim executable under `binDir`, named by the hash
 * of its content, so that an upgraded engine never overwrites the file that running shims of
 * the previous version were started from. Order: an explicit override, the shim embedded in a
 * compiled engine, then a build from source.
 */
export function ensureShim(binDir: string, override?: string): string {
  if (override) {
    if (!existsSync(override)) throw new AppError("shim_unavailable", `ENGINE_SHIM names ${override}, which does not exist`);
    return override;
  }
  // The shims run as the engine's user, and nobody else needs bin/: in a data dir others may
  // traverse (0711 as root) it stays closed, also when an older engine made it 0755.
  mkdirSync(binDir, { recursive: true, mode: 0o700 });
  chmodSync(binDir, 0o700);
  if (typeof __ENGINE_EMBEDDED_SHIM__ === "string") {
    return installByHash(binDir, "engine-shim", Buffer.from(__ENGINE_EMBEDDED_SHIM__, "base64"), 0o755);
  }
  const source = shimSource();
  if (source === null) throw new AppError("shim_unavailable", "this engine carries neither the shim nor its source");
  const path = join(binDir, `engine-shim-${shortHash(source)}`);
  if (!existsSync(path)) compileShim(source, path);
  return path;
}
