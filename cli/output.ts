import type { Command } from "commander";

/** Output prints either machine JSON (--json) or human tables. */
export interface Output {
  json: boolean;
}

export function printJson(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value, null, 2)}\n`);
}

/** printTable writes rows as aligned columns with a header; empty cells show as "-". */
export function printTable(columns: string[], rows: (string | number | boolean | null | undefined)[][]): void {
  const cells = rows.map((row) => row.map((cell) => (cell === null || cell === undefined || cell === "" ? "-" : String(cell))));
  const widths = columns.map((column, index) => Math.max(column.length, ...cells.map((row) => (row[index] ?? "").length)));
  const line = (row: string[]) =>
    row
      .map((cell, index) => cell.padEnd(widths[index] ?? 0))
      .join("  ")
      .trimEnd();
  process.stdout.write(`${[line(columns.map((c) => c.toUpperCase())), ...cells.map(line)].join("\n")}\n`);
}

/** formatPairs aligns `key  value` lines on the longest key; a value's further lines are indented under it. */
export function formatPairs(rows: [string, string][]): string[] {
  const width = Math.max(...rows.map(([key]) => key.length));
  return rows.map(([key, value]) => `${key.padEnd(width)}  ${value.replaceAll("\n", `\n${" ".repeat(width + 2)}`)}`.trimEnd());
}

export function printPairs(rows: [string, string][]): void {
  process.stdout.write(`${formatPairs(rows).join("\n")}\n`);
}

export function emit(output: Output, value: unknown, human: () => void): void {
  if (output.json) printJson(value);
  else human();
}

/**
 * hintHelpAfterError makes a usage error (a typo, a missing argument) end with its own hint
 * ("Did you mean services?") and one line on where the help is, for every command, instead of
 * burying the hint under the whole help text.
 */
export function hintHelpAfterError(command: Command, path: string): void {
  command.showHelpAfterError(`(run '${path} --help' for usage)`);
  for (const sub of command.commands) hintHelpAfterError(sub, `${path} ${sub.name()}`);
}
