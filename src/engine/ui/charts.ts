/**
 * charts.ts draws the web UI's usage charts from GET /api/metrics/history (docs/decisions.md
 * 331, 338): uPlot line charts on the GPUs and service pages, and small SVG sparklines in the
 * services list. Every chart has a text alternative (role="img" with what its latest values
 * are), since a canvas says nothing to a screen reader.
 */
import uPlot from "uplot";

/** MetricsHistory is the answer of GET /api/metrics/history (src/contract/engine.ts). */
export interface MetricsHistory {
  interval_s: number;
  window_s: number;
  now: number;
  times: number[];
  gpus: {
    index: number;
    uuid: string;
    name: string;
    memory_total_mb: number | null;
    utilization_pct: (number | null)[];
    memory_used_mb: (number | null)[];
  }[];
  services: {
    id: string;
    name: string;
    cpu_pct: (number | null)[];
    rss_bytes: (number | null)[];
    gpu_memory_mb: (number | null)[];
  }[];
}

/** SeriesSpec is one line of a chart. */
export interface SeriesSpec {
  label: string;
  values: (number | null)[];
  /** scale names the axis the line is drawn against; lines with the same scale share one. */
  scale: string;
  colour: string;
  format: (value: number) => string;
}

/** ChartSpec is one chart: its title (also its accessible name) and lines over shared times. */
export interface ChartSpec {
  title: string;
  times: number[];
  series: SeriesSpec[];
  /** max fixes a scale's top (100 for percent, a GPU's memory); otherwise it follows the data. */
  ranges?: Record<string, [number, number]>;
}

/** CHART_HEIGHT is each chart's drawing height in CSS pixels. */
const CHART_HEIGHT = 180;

/** COLOURS are the lines' colours: distinguishable in light and dark mode, and for the common colour blindnesses. */
export const COLOURS = { blue: "#3b82f6", orange: "#e8710a", purple: "#9b59b6", teal: "#12a4a4" };

export const formatPercent = (value: number) => `${value.toFixed(value < 10 ? 1 : 0)} %`;

/** formatBytes writes a byte count in binary units, as the CLI does. */
export function formatBytes(value: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let scaled = value;
  let unit = 0;
  while (scaled >= 1024 && unit < units.length - 1) {
    scaled /= 1024;
    unit++;
  }
  return `${scaled.toFixed(scaled < 10 && unit > 0 ? 1 : 0)} ${units[unit]}`;
}

export const formatMib = (value: number) => formatBytes(value * 1024 * 1024);

/** latest is a series' newest measured value, or null. */
export function latest(values: readonly (number | null)[]): number | null {
  for (let i = values.length - 1; i >= 0; i--) if (values[i] !== null && values[i] !== undefined) return values[i] as number;
  return null;
}

/** describe is a chart's text alternative: each line's newest value. */
export function describeChart(spec: ChartSpec): string {
  const parts = spec.series.map((series) => {
    const value = latest(series.values);
    return `${series.label} ${value === null ? "not measured" : series.format(value)}`;
  });
  return `${spec.title}, last hour: now ${parts.join(", ")}`;
}

/**
 * Chart is one uPlot chart in a container that keeps its size: it is made once and then given
 * new data, so a refresh neither flickers nor loses a hover.
 */
export class Chart {
  private plot: uPlot | null = null;
  readonly element: HTMLElement;
  private key = "";
  private readonly resize: ResizeObserver;

  constructor(readonly className = "chart") {
    this.element = document.createElement("figure");
    this.element.className = className;
    this.element.setAttribute("role", "img");
    // The chart follows its box: the page's width, a narrow window, a phone turned sideways.
    this.resize = new ResizeObserver(() => {
      const width = this.width();
      if (this.plot && Math.abs(this.plot.width - width) > 4) this.plot.setSize({ width, height: CHART_HEIGHT });
    });
    this.resize.observe(this.element);
  }

  private width(): number {
    return Math.max(240, Math.floor(this.element.clientWidth || this.element.parentElement?.clientWidth || 600));
  }

  /** show draws the spec, making the chart on first use or when its lines change. */
  show(spec: ChartSpec): void {
    this.element.setAttribute("aria-label", describeChart(spec));
    this.element.dataset.points = String(spec.times.length);
    const data = [spec.times, ...spec.series.map((series) => series.values)] as uPlot.AlignedData;
    const key = JSON.stringify([spec.title, spec.series.map((series) => [series.label, series.scale]), spec.ranges]);
    if (this.plot && key === this.key) {
      this.plot.setData(data);
      return;
    }
    this.key = key;
    this.plot?.destroy();
    const width = this.width();
    const scales: uPlot.Scales = { x: { time: true } };
    for (const [scale, range] of Object.entries(spec.ranges ?? {})) scales[scale] = { range };
    const scaleNames = [...new Set(spec.series.map((series) => series.scale))];
    const axes: uPlot.Axis[] = [
      {
        stroke: "currentColor",
        grid: { stroke: "rgba(128,128,128,0.2)" },
        ticks: { stroke: "rgba(128,128,128,0.3)" },
        // Room for a clock time under each tick, so labels never run into each other.
        space: 90,
        // Clock times: with seconds while the history is short, without once it spans minutes.
        values: (plot: uPlot, ticks: number[]) => {
          const span = (plot.scales.x?.max ?? 0) - (plot.scales.x?.min ?? 0);
          const options: Intl.DateTimeFormatOptions =
            span > 600 ? { hour: "2-digit", minute: "2-digit" } : { hour: "2-digit", minute: "2-digit", second: "2-digit" };
          return ticks.map((tick) => new Date(tick * 1000).toLocaleTimeString([], options));
        },
      },
      ...scaleNames.map((scale, i) => {
        const first = spec.series.find((series) => series.scale === scale) as SeriesSpec;
        return {
          scale,
          side: i === 0 ? 3 : 1,
          size: 64,
          stroke: "currentColor",
          grid: { show: i === 0, stroke: "rgba(128,128,128,0.2)" },
          ticks: { stroke: "rgba(128,128,128,0.3)" },
          values: (_plot: uPlot, ticks: number[]) => ticks.map((tick) => first.format(tick)),
        } satisfies uPlot.Axis;
      }),
    ];
    this.plot = new uPlot(
      {
        title: spec.title,
        width,
        height: CHART_HEIGHT,
        scales,
        axes,
        legend: { live: true },
        cursor: { drag: { x: false, y: false } },
        series: [
          {},
          ...spec.series.map((series) => ({
            label: series.label,
            scale: series.scale,
            stroke: series.colour,
            width: 2,
            fill: `${series.colour}22`,
            value: (_plot: uPlot, value: number | null) => (value === null || value === undefined ? "—" : series.format(value)),
          })),
        ],
      },
      data,
      this.element,
    );
  }

  destroy(): void {
    this.resize.disconnect();
    this.plot?.destroy();
    this.plot = null;
  }
}

const SVG = "http://www.w3.org/2000/svg";

/**
 * sparkline draws a tiny line of the values (no axes) as inline SVG, with its label and latest
 * value beside it for sighted readers and as its accessible name.
 */
export function sparkline(
  label: string,
  values: readonly (number | null)[],
  format: (value: number) => string,
  colour: string,
): HTMLElement {
  const wrap = document.createElement("span");
  wrap.className = "spark";
  const now = latest(values);
  const text = `${label} ${now === null ? "—" : format(now)}`;
  wrap.setAttribute("role", "img");
  wrap.setAttribute("aria-label", `${label}, last hour: now ${now === null ? "not measured" : format(now)}`);
  wrap.title = text;
  const width = 72;
  const height = 20;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("width", String(width));
  svg.setAttribute("height", String(height));
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("aria-hidden", "true");
  const measured = values.map((value, i) => [i, value] as const).filter(([, value]) => value !== null) as [number, number][];
  if (measured.length > 0) {
    const top = Math.max(...measured.map(([, value]) => value), 1e-9);
    const step = values.length > 1 ? width / (values.length - 1) : width;
    const points = measured.map(([i, value]) => `${(i * step).toFixed(1)},${(height - 1 - (value / top) * (height - 2)).toFixed(1)}`);
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", points.length === 1 ? `0,${points[0]?.split(",")[1]} ${points[0]}` : points.join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", colour);
    line.setAttribute("stroke-width", "1.5");
    svg.append(line);
  }
  const caption = document.createElement("span");
  caption.className = "spark-value";
  caption.textContent = now === null ? "—" : format(now);
  wrap.append(svg, caption);
  return wrap;
}
