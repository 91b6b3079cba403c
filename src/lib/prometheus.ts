/**
 * The Prometheus text exposition format 0.0.4, written by both binaries at GET /metrics
 * (docs/decisions.md 330). It is the format every Prometheus scrapes and `promtool check
 * metrics` reads: one `# HELP` and one `# TYPE` line per family, then its samples; label
 * values escape `\`, `"` and newlines; a counter's name ends in `_total`; a histogram writes
 * cumulative `_bucket` samples ending with `le="+Inf"`, then `_sum` and `_count`.
 */

/** PROMETHEUS_CONTENT_TYPE is the media type of the text format, as Prometheus asks for it. */
export const PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";

export type Labels = Readonly<Record<string, string>>;

/** Sample is one labelled value of a gauge or counter family. */
export interface Sample {
  labels: Labels;
  value: number;
}

/** HistogramData is one labelled histogram: per-bucket counts (not cumulative), their sum and count. */
export interface HistogramData {
  labels: Labels;
  /** counts[i] counts observations in (bounds[i-1], bounds[i]]; counts[bounds.length] those above the last bound. */
  counts: readonly number[];
  sum: number;
}

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL = /^[a-zA-Z_][a-zA-Z0-9_]*$/;

/** formatValue writes a sample value as Go's strconv would: integers plainly, NaN and ±Inf by name. */
export function formatValue(value: number): string {
  if (Number.isNaN(value)) return "NaN";
  if (value === Number.POSITIVE_INFINITY) return "+Inf";
  if (value === Number.NEGATIVE_INFINITY) return "-Inf";
  return String(value);
}

function escapeLabelValue(value: string): string {
  return value.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");
}

function escapeHelp(help: string): string {
  return help.replace(/\\/g, "\\\\").replace(/\n/g, "\\n");
}

function labelText(labels: Labels, extra?: [string, string]): string {
  const parts: string[] = [];
  for (const [name, value] of Object.entries(labels)) parts.push(`${name}="${escapeLabelValue(value)}"`);
  if (extra) parts.push(`${extra[0]}="${escapeLabelValue(extra[1])}"`);
  return parts.length === 0 ? "" : `{${parts.join(",")}}`;
}

function checkNames(name: string, labels: Labels): void {
  if (!NAME.test(name)) throw new Error(`invalid metric name ${JSON.stringify(name)}`);
  for (const label of Object.keys(labels)) {
    if (!LABEL.test(label) || label.startsWith("__")) throw new Error(`invalid label name ${JSON.stringify(label)} on ${name}`);
  }
}

/**
 * MetricsText collects families and writes them in the order they were added. A family with
 * no sample is left out entirely (promtool reports a HELP without samples as a problem only
 * in newer versions, and an empty family tells a reader nothing).
 */
export class MetricsText {
  private readonly lines: string[] = [];
  private readonly seen = new Set<string>();

  private header(name: string, help: string, type: string): void {
    if (this.seen.has(name)) throw new Error(`metric family ${name} written twice`);
    this.seen.add(name);
    this.lines.push(`# HELP ${name} ${escapeHelp(help)}`, `# TYPE ${name} ${type}`);
  }

  gauge(name: string, help: string, samples: readonly Sample[]): this {
    return this.simple(name, help, "gauge", samples);
  }

  /** counter writes a counter family; its name must end in `_total`. */
  counter(name: string, help: string, samples: readonly Sample[]): this {
    if (!name.endsWith("_total")) throw new Error(`counter ${name} must end in _total`);
    return this.simple(name, help, "counter", samples);
  }

  private simple(name: string, help: string, type: string, samples: readonly Sample[]): this {
    if (samples.length === 0) return this;
    this.header(name, help, type);
    for (const sample of samples) {
      checkNames(name, sample.labels);
      this.lines.push(`${name}${labelText(sample.labels)} ${formatValue(sample.value)}`);
    }
    return this;
  }

  /** histogram writes a histogram family with the given upper bounds (seconds, bytes…), ascending. */
  histogram(name: string, help: string, bounds: readonly number[], data: readonly HistogramData[]): this {
    if (data.length === 0) return this;
    this.header(name, help, "histogram");
    for (const item of data) {
      checkNames(name, item.labels);
      let cumulative = 0;
      bounds.forEach((bound, i) => {
        cumulative += item.counts[i] ?? 0;
        this.lines.push(`${name}_bucket${labelText(item.labels, ["le", formatValue(bound)])} ${cumulative}`);
      });
      cumulative += item.counts[bounds.length] ?? 0;
      this.lines.push(`${name}_bucket${labelText(item.labels, ["le", "+Inf"])} ${cumulative}`);
      this.lines.push(`${name}_sum${labelText(item.labels)} ${formatValue(item.sum)}`);
      this.lines.push(`${name}_count${labelText(item.labels)} ${cumulative}`);
    }
    return this;
  }

  toString(): string {
    return this.lines.length === 0 ? "" : `${this.lines.join("\n")}\n`;
  }
}

/** bucketIndex returns the bucket an observation falls in: the first bound it does not exceed, else bounds.length. */
export function bucketIndex(bounds: readonly number[], value: number): number {
  for (let i = 0; i < bounds.length; i++) if (value <= (bounds[i] as number)) return i;
  return bounds.length;
}

/** Histogram is a labelled histogram's running counts, for the families above. */
export class Histogram {
  readonly counts: number[];
  sum = 0;

  constructor(readonly bounds: readonly number[]) {
    this.counts = new Array(bounds.length + 1).fill(0);
  }

  observe(value: number): void {
    this.counts[bucketIndex(this.bounds, value)]! += 1;
    this.sum += value;
  }
}

/** metricsResponse answers a scrape with the text format. */
export function metricsResponse(text: string): Response {
  return new Response(text, { headers: { "content-type": PROMETHEUS_CONTENT_TYPE, "cache-control": "no-store" } });
}
