import { existsSync } from "node:fs";
import { resolve } from "node:path";
import type { Command } from "commander";
import { DEFAULT_RESTORE_TIMEOUT_S } from "../../src/contract/defaults";
import type { LogLine } from "../../src/contract/engine";
import { PROGRESS_PATTERN } from "../../src/engine/databases/restore";
import { CliError, type EngineClient } from "../client";
import type { Output } from "../output";

interface RestoreAnswer {
  service_name: string;
  dump: string;
  engine: string;
  duration_s: number;
}

/**
 * dumpArgument makes a dump argument the engine can use: URLs pass as they are; a local path
 * that exists here is made absolute (the engine does not share the CLI's directory).
 */
export function dumpArgument(dump: string, cwd = process.cwd()): string {
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(dump)) return dump;
  const absolute = resolve(cwd, dump);
  return existsSync(absolute) ? absolute : dump;
}

function mib(bytes: number): string {
  return `${(bytes / (1024 * 1024)).toFixed(1)} MiB`;
}

/** ProgressBar draws `[#####.....] 45%  90.1 MiB / 200.0 MiB  12.3 MiB/s` on one terminal line. */
class ProgressBar {
  static readonly WIDTH = 30;
  readonly #started = Date.now();
  #drawn = false;

  constructor(readonly label: string) {}

  update(bytesRead: number, totalBytes: number | null): void {
    const elapsed = Math.max(0.001, (Date.now() - this.#started) / 1000);
    const rate = `${mib(bytesRead / elapsed)}/s`;
    let bar: string;
    if (totalBytes) {
      const share = Math.min(1, bytesRead / totalBytes);
      const filled = Math.round(share * ProgressBar.WIDTH);
      bar = `[${"#".repeat(filled)}${".".repeat(ProgressBar.WIDTH - filled)}] ${String(Math.floor(share * 100)).padStart(3)}%  ${mib(bytesRead)} / ${mib(totalBytes)}`;
    } else {
      bar = `${mib(bytesRead)} read`;
    }
    process.stdout.write(`\r\x1b[K${this.label} ${bar}  ${rate}`);
    this.#drawn = true;
  }

  clear(): void {
    if (this.#drawn) process.stdout.write("\r\x1b[K");
  }
}

/** registerRestore adds `engine restore <db> <dump>`. */
export function registerRestore(program: Command, client: () => EngineClient, output: () => Output): void {
  program
    .command("restore <database> <dump>")
    .description(
      "restore a dump into a database service: a path (a file, or a pg_dump directory), a file:// or an https:// URL; the format is recognised from its content. The database is left as it was if the restore fails or passes --timeout.",
    )
    .option("--timeout <seconds>", "stop the restore (and keep the database as it was) after this long", String(DEFAULT_RESTORE_TIMEOUT_S))
    .action(async (database: string, dumpText: string, options: { timeout: string }) => {
      if (!/^\d+$/.test(options.timeout) || Number(options.timeout) < 1) {
        throw new CliError(`--timeout takes a whole number of seconds, at least 1 (got ${JSON.stringify(options.timeout)})`);
      }
      const dump = dumpArgument(dumpText);
      const json = output().json;
      const tty = process.stdout.isTTY === true && !json;
      const bar = tty ? new ProgressBar(`restoring into ${database}`) : null;
      const writeJson = (value: unknown) => process.stdout.write(`${JSON.stringify(value)}\n`);
      // Progress comes from the database's log, where the engine writes it as the restore reads.
      const follow = new AbortController();
      let sawEnd: () => void = () => undefined;
      const ended = new Promise<void>((resolve) => {
        sawEnd = resolve;
      });
      const path = `/api/services/${encodeURIComponent(database)}/logs?tail=0&follow=true`;
      const following = (async () => {
        try {
          for await (const event of client().events(path, follow.signal)) {
            if (event.event !== "line") continue;
            const line = JSON.parse(event.data) as LogLine;
            if (line.stream !== "engine" || !line.line.startsWith("restore: ")) continue;
            if (/^restore: (done|failed|stopped)/.test(line.line)) sawEnd();
            const progress = PROGRESS_PATTERN.exec(line.line);
            if (progress) {
              const bytesRead = Number(progress[1]);
              const totalBytes = progress[2] === "?" ? null : Number(progress[2]);
              if (json) writeJson({ event: "progress", bytes_read: bytesRead, total_bytes: totalBytes });
              else bar?.update(bytesRead, totalBytes);
            } else if (json) {
              writeJson({ event: "log", line: line.line });
            } else if (!tty && !/^restore: (failed|stopped)/.test(line.line)) {
              // A failure or timeout is the engine's answer too, printed once as the error.
              process.stdout.write(`${line.line}\n`);
            }
          }
        } catch {
          // Progress is a nicety: the restore's own answer decides the outcome.
        }
      })();
      const onSignal = () => {
        follow.abort();
        bar?.clear();
        process.stderr.write("engine: the restore goes on in the engine (Ctrl-C stops only this command)\n");
        process.exit(130);
      };
      process.once("SIGINT", onSignal);
      try {
        const answer = await client().request<RestoreAnswer>("POST", `/api/databases/${encodeURIComponent(database)}/restore`, {
          dump,
          timeout_s: Number(options.timeout),
        });
        // Let the last lines (the log is polled) arrive before the answer is printed.
        await Promise.race([ended, Bun.sleep(1000)]);
        bar?.clear();
        if (json) writeJson({ event: "restored", ...answer });
        else process.stdout.write(`restored ${answer.dump} into ${answer.service_name} (${answer.engine}) in ${answer.duration_s} s\n`);
      } catch (error) {
        await Promise.race([ended, Bun.sleep(1000)]);
        bar?.clear();
        if (json && error instanceof CliError) writeJson({ event: "failed", code: error.code, message: error.message });
        throw error;
      } finally {
        process.off("SIGINT", onSignal);
        follow.abort();
        await following;
      }
    });
}
