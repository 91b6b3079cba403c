import { closeSync, mkdirSync, openSync, writeSync } from "node:fs";
import { dirname } from "node:path";

const REDACTED = "***";

/**
 * BuildLog appends lines to a build's log file and keeps the last ones for BuildResult.log_tail.
 * Every line passes through redact() first, so no secret it knows reaches the file or the tail.
 */
export class BuildLog {
  readonly #fd: number;
  readonly #secrets: string[];
  readonly #tail: string[] = [];
  readonly #tailSize: number;

  constructor(path: string, secrets: string[], tailSize: number) {
    mkdirSync(dirname(path), { recursive: true });
    // 0600: the log is the engine's, whatever the directory above it lets others do.
    this.#fd = openSync(path, "a", 0o600);
    // Longest first, so a secret that contains another is hidden whole.
    this.#secrets = [...new Set(secrets.filter((secret) => secret !== ""))].sort((a, b) => b.length - a.length);
    this.#tailSize = tailSize;
  }

  /** redact replaces every known secret in a text. */
  redact(text: string): string {
    let result = text;
    for (const secret of this.#secrets) result = result.split(secret).join(REDACTED);
    return result;
  }

  /** line appends one line of output. */
  line(text: string): void {
    const clean = this.redact(text);
    writeSync(this.#fd, `${clean}\n`);
    this.#tail.push(clean);
    if (this.#tail.length > this.#tailSize) this.#tail.shift();
  }

  /** note appends a line of the engine's own, marked "==> " to set it apart from command output. */
  note(text: string): void {
    this.line(`==> ${text}`);
  }

  tail(): string[] {
    return [...this.#tail];
  }

  close(): void {
    closeSync(this.#fd);
  }
}
