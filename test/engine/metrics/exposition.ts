/** Helpers for the /metrics tests of both binaries: a reader of the text format, and promtool. */

export interface ParsedSeries {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** parseExposition reads the samples of a text-format answer (comments skipped); it throws on a line it cannot read. */
export function parseExposition(text: string): ParsedSeries[] {
  const series: ParsedSeries[] = [];
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$/.exec(line);
    if (!match) throw new Error(`not a sample line: ${line}`);
    const labels: Record<string, string> = {};
    for (const pair of (match[3] ?? "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) {
      labels[pair[1] as string] = (pair[2] as string).replace(/\\n/g, "\n").replace(/\\(.)/g, "$1");
    }
    const raw = match[4] as string;
    series.push({ name: match[1] as string, labels, value: raw === "+Inf" ? Infinity : raw === "-Inf" ? -Infinity : Number(raw) });
  }
  return series;
}

/** seriesValue is the value of the one series of `name` whose labels include `labels`; undefined when none. */
export function seriesValue(series: ParsedSeries[], name: string, labels: Record<string, string> = {}): number | undefined {
  const found = series.filter((s) => s.name === name && Object.entries(labels).every(([key, value]) => s.labels[key] === value));
  if (found.length > 1) throw new Error(`${found.length} series of ${name} match ${JSON.stringify(labels)}`);
  return found[0]?.value;
}

/**
 * promtoolCheck runs `promtool check metrics` (Debian's prometheus package) over the text and
 * returns its exit code and what it printed: 0 and nothing when it found no problem.
 */
export async function promtoolCheck(text: string): Promise<{ code: number; output: string }> {
  const promtool = Bun.which("promtool");
  if (!promtool) throw new Error("promtool is not installed: apt-get install prometheus (.ci/run does)");
  const proc = Bun.spawn([promtool, "check", "metrics"], { stdin: new Blob([text]), stdout: "pipe", stderr: "pipe" });
  const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  return { code, output: (out + err).trim() };
}
