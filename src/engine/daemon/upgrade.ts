import { chmodSync, closeSync, copyFileSync, fstatSync, linkSync, openSync, renameSync, rmSync, statSync } from "node:fs";
import { basename, dirname, isAbsolute, join } from "node:path";
import { AppError } from "../../lib/errors";

declare const __ENGINE_COMPILED__: boolean | undefined;

/** runsCompiled says whether this engine is the compiled binary (build.ts), the only one `engine upgrade` can replace. */
export function runsCompiled(): boolean {
  return typeof __ENGINE_COMPILED__ !== "undefined" && __ENGINE_COMPILED__ === true;
}

/** BinaryFacts is what `engine version --no-daemon --json` says of a binary. */
export interface BinaryFacts {
  cli: string;
  /** store_schema is the id of the newest store migration the binary knows. */
  store_schema: string;
  /** store_migrations are all the store migrations it knows, oldest first. */
  store_migrations: string[];
}

/** VERSION_TIMEOUT_MS bounds the run of `<new binary> version`. */
const VERSION_TIMEOUT_MS = 30_000;

/** invalid is the one error for a binary that cannot be an upgrade, with the reason. */
function invalid(path: string, reason: string): AppError {
  return new AppError("binary_invalid", `${path} cannot be the new engine binary: ${reason}`, { loc: ["body", "binary"] });
}

/**
 * StagedUpgrade is a new binary checked and copied beside the running one, not yet in its place.
 * swap() puts it there atomically, keeping the running one as `<path>.previous`; rollback()
 * puts that one back; discard() removes the copy of an upgrade that does not go ahead.
 */
export interface StagedUpgrade {
  /** target is the running binary's path, which the new one replaces. */
  target: string;
  previous: string;
  facts: BinaryFacts;
  swap(): void;
  rollback(): void;
  discard(): void;
}

/**
 * stageUpgrade checks the binary at `source` and stages it beside `target` (the running
 * binary's path), refusing (docs/decisions.md 364-365):
 *
 * - a path that is not absolute, not a regular file, not executable by its owner, owned by
 *   someone other than root or the engine's user, or writable by its group or others
 *   (`binary_invalid`, 422): the engine runs it as itself, root included;
 * - a binary that does not run `version --no-daemon --json` within 30 s and say its version
 *   and store schema (`binary_invalid`);
 * - a binary that does not know every migration this data dir has (`schema_downgrade`, 409):
 *   a newer store schema is migrated by the new binary at its start, an older one is refused.
 *
 * The checks and the copy read one open descriptor, so what was checked is what runs; the
 * version is asked of the copy itself.
 */
export async function stageUpgrade(source: string, target: string, applied: readonly string[]): Promise<StagedUpgrade> {
  if (!isAbsolute(source)) throw invalid(source, "the path must be absolute");
  const staged = join(dirname(target), `.${basename(target)}.upgrade-${process.pid}`);
  let fd: number;
  try {
    fd = openSync(source, "r");
  } catch (error) {
    throw invalid(source, `it cannot be opened (${(error as NodeJS.ErrnoException).code ?? (error as Error).message})`);
  }
  try {
    const stats = fstatSync(fd);
    const uid = process.getuid?.() ?? 0;
    if (!stats.isFile()) throw invalid(source, "it is not a regular file");
    if (stats.size === 0) throw invalid(source, "it is empty");
    if (stats.uid !== 0 && stats.uid !== uid)
      throw invalid(source, `it is owned by uid ${stats.uid}, not by root or the engine's user (uid ${uid})`);
    if ((stats.mode & 0o022) !== 0) throw invalid(source, `others may write to it (mode 0${(stats.mode & 0o777).toString(8)})`);
    if ((stats.mode & 0o100) === 0) throw invalid(source, `it is not executable (mode 0${(stats.mode & 0o777).toString(8)})`);
    rmSync(staged, { force: true });
    try {
      await Bun.write(staged, Bun.file(fd));
      chmodSync(staged, 0o755);
    } catch (error) {
      rmSync(staged, { force: true });
      throw new AppError(
        "binary_invalid",
        `cannot copy ${source} beside the running binary in ${dirname(target)} (${(error as NodeJS.ErrnoException).code ?? (error as Error).message})`,
        { loc: ["body", "binary"] },
      );
    }
  } finally {
    closeSync(fd);
  }
  let facts: BinaryFacts;
  try {
    facts = await askVersion(staged, source);
    const unknown = applied.filter((id) => !facts.store_migrations.includes(id));
    if (unknown.length > 0) {
      throw new AppError(
        "schema_downgrade",
        `${source} (version ${facts.cli}) knows the store schema up to ${facts.store_schema}, but this data dir is at ${applied.at(-1)} (${unknown.join(", ")} unknown to it): a downgrade of the store is refused; to go back, restore a backup of the data dir made with that version`,
      );
    }
  } catch (error) {
    rmSync(staged, { force: true });
    throw error;
  }
  const previous = `${target}.previous`;
  return {
    target,
    previous,
    facts,
    swap() {
      keepPrevious(target, previous);
      renameSync(staged, target);
    },
    rollback() {
      const back = `${previous}.restoring`;
      rmSync(back, { force: true });
      linkOrCopy(previous, back);
      renameSync(back, target);
      // rename(2) does nothing when both names are links to one file: the spare name is removed.
      rmSync(back, { force: true });
    },
    discard() {
      rmSync(staged, { force: true });
    },
  };
}

/** askVersion runs `<binary> version --no-daemon --json` and reads its facts. */
async function askVersion(binary: string, source: string): Promise<BinaryFacts> {
  const proc = Bun.spawn([binary, "version", "--no-daemon", "--json"], {
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: process.env.HOME ?? "/" },
    stdin: "ignore",
    stdout: "pipe",
    stderr: "pipe",
    timeout: VERSION_TIMEOUT_MS,
  });
  const [stdout, stderr, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  if (code !== 0) {
    const said = stderr.trim().split("\n").at(-1)?.slice(0, 200);
    throw invalid(source, `\`version --no-daemon --json\` exited with ${proc.signalCode ?? code}${said ? `: ${said}` : ""}`);
  }
  let facts: Partial<BinaryFacts>;
  try {
    facts = JSON.parse(stdout) as Partial<BinaryFacts>;
  } catch {
    throw invalid(source, "`version --no-daemon --json` did not print JSON (is it an engine binary?)");
  }
  if (
    typeof facts.cli !== "string" ||
    typeof facts.store_schema !== "string" ||
    !Array.isArray(facts.store_migrations) ||
    !facts.store_migrations.every((id) => typeof id === "string")
  ) {
    throw invalid(source, "`version --no-daemon --json` did not say its version and store schema (an engine older than `engine upgrade`?)");
  }
  return facts as BinaryFacts;
}

/**
 * keepPrevious makes `previous` the running binary: a hard link to `target` when that still is
 * the running image, else a copy of the image itself (/proc/self/exe), so a rollback restores
 * what ran, also when someone replaced the file since the start.
 */
function keepPrevious(target: string, previous: string): void {
  const pending = `${previous}.tmp`;
  rmSync(pending, { force: true });
  let sameImage = false;
  try {
    const running = statSync("/proc/self/exe");
    const onDisk = statSync(target);
    sameImage = running.ino === onDisk.ino && running.dev === onDisk.dev;
  } catch {
    // the target is gone: copy the image
  }
  if (sameImage) linkOrCopy(target, pending);
  else copyFileSync("/proc/self/exe", pending);
  chmodSync(pending, 0o755);
  renameSync(pending, previous);
  // rename(2) does nothing when both names are links to one file (previous already is it).
  rmSync(pending, { force: true });
}

function linkOrCopy(from: string, to: string): void {
  try {
    linkSync(from, to);
  } catch {
    copyFileSync(from, to);
  }
}
