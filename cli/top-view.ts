import type { GpuInventoryRecord, ServiceRecord, ServiceStatsRecord } from "../src/contract/engine";

/**
 * top-view.ts lays out one frame of `engine top`: the GPUs with utilization and memory bars
 * and the services holding them, then the services with status, CPU, memory, GPU memory and
 * restarts. It is pure (a snapshot and a terminal size in, lines out) so the command only
 * fetches, times and draws; test/cli/top-view.test.ts checks it with tables.
 *
 * A narrow terminal drops whole columns before it cuts any: the services' MESSAGE first, then
 * UPTIME, KIND, PID, RESTARTS, GPU MEM, MEM and CPU; NAME and STATUS stay. The GPUs' HELD BY
 * goes first, then NAME; the index and the utilization and memory figures stay (the bars give
 * way to the figures). What still does not fit is cut at the edge.
 */

/** TopSnapshot is what one refresh read from the engine, with the CPU shares worked out from the previous one. */
export interface TopSnapshot {
  /** target names the engine: its socket or URL. */
  target: string;
  at: Date;
  intervalS: number;
  services: ServiceRecord[];
  gpus: GpuInventoryRecord | null;
  /** stats is null when the engine has no /api/stats (an older daemon): CPU and MEM then show "-". */
  stats: ServiceStatsRecord | null;
  /** cpuPercent is each service's CPU use since the previous sample, in % of one core. */
  cpuPercent: ReadonlyMap<string, number>;
  /**
   * gpuUsedMb is the GPU memory each service's processes hold, as nvidia-smi measured it (the
   * engine's metrics history); absent where nothing was measured: GPU MEM then shows the reservation.
   */
  gpuUsedMb?: ReadonlyMap<string, number>;
  /** error says why the latest refresh failed; the frame then shows the last data it had. */
  error: string | null;
}

export interface FrameOptions {
  width: number;
  /** height bounds the lines; Infinity for a frame printed to a pipe. */
  height: number;
  color: boolean;
  /** interactive frames name the refresh interval and the key that quits. */
  interactive: boolean;
}

// SGR codes, applied after padding so they never count towards a width.
const SGR = { bold: "1", dim: "2", red: "31", green: "32", yellow: "33", cyan: "36", inverse: "7" } as const;
type Style = keyof typeof SGR;
const paint = (text: string, style: Style | undefined, color: boolean) => (color && style ? `\x1b[${SGR[style]}m${text}\x1b[0m` : text);

/** STATUS_STYLE colours a status the way a person scans for trouble: red failed, yellow in motion, dim at rest. */
const STATUS_STYLE: Record<string, Style> = {
  running: "green",
  paused: "cyan",
  failed: "red",
  degraded: "yellow",
  retrying: "yellow",
  restarting: "yellow",
  building: "yellow",
  pending: "yellow",
  scheduled: "yellow",
  stopped: "dim",
  completed: "dim",
  cancelled: "dim",
};

/** loadStyle colours a bar by how full it is, as nvitop does. */
const loadStyle = (pct: number): Style => (pct >= 80 ? "red" : pct >= 50 ? "yellow" : "green");

interface Cell {
  text: string;
  style?: Style;
  /** segments replace text when a cell is drawn in parts of different colours (a bar and its figure). */
  segments?: { text: string; style?: Style }[];
}

interface Column<Row> {
  header: string;
  /**
   * shrink is how narrow the column may get by cutting its text (a name, a message); unset,
   * its text is never cut and the column is dropped instead.
   */
  shrink?: number;
  /** minWidth overrides the narrowest width (a meter: its figure without the bar). */
  minWidth?(rows: Row[]): number;
  /** max bounds how wide it grows (its content's width when unset). */
  max?: number;
  /** dropRank orders dropping in a narrow terminal: the lowest goes first; unset: never dropped. */
  dropRank?: number;
  align?: "right";
  /** cell draws a row's cell at a given width; it may return less and is padded, or more and is cut. */
  cell(row: Row, width: number): Cell;
  /** natural is the width the column would like (a bar wants more than its text). */
  natural?(rows: Row[]): number;
  /** comfortable is the width it gets before any column grows to its natural width. */
  comfortable?(rows: Row[]): number;
}

const GAP = 2;

/** cut shortens text to width, marking the cut with "…". */
export function cut(text: string, width: number): string {
  if (width <= 0) return "";
  return text.length <= width ? text : `${text.slice(0, Math.max(0, width - 1))}…`;
}

/**
 * layoutColumns decides which columns show and how wide each is: columns are dropped in
 * dropRank order until the narrowest widths fit, then each grows towards its natural width,
 * left to right.
 */
function layoutColumns<Row>(columns: Column<Row>[], rows: Row[], width: number): { column: Column<Row>; width: number }[] {
  const textWidth = (column: Column<Row>) =>
    Math.max(column.header.length, ...rows.map((row) => cellText(column.cell(row, Number.MAX_SAFE_INTEGER)).length));
  const natural = new Map(columns.map((column) => [column, column.natural?.(rows) ?? textWidth(column)]));
  const least = new Map(
    columns.map((column) => {
      const full = natural.get(column) ?? 0;
      const min = column.minWidth?.(rows) ?? (column.shrink !== undefined ? Math.min(column.shrink, full) : full);
      return [column, Math.max(min, column.header.length)];
    }),
  );
  let shown = [...columns];
  const need = (list: Column<Row>[]) => list.reduce((sum, c) => sum + (least.get(c) ?? 0), 0) + GAP * Math.max(0, list.length - 1);
  while (need(shown) > width) {
    const droppable = shown.filter((c) => c.dropRank !== undefined).sort((a, b) => (a.dropRank ?? 0) - (b.dropRank ?? 0));
    const first = droppable[0];
    if (!first) break;
    shown = shown.filter((c) => c !== first);
  }
  const widths = shown.map((c) => least.get(c) ?? 0);
  let spare = width - need(shown);
  // Grow every column to a comfortable width first (a meter: a short bar), then towards its
  // natural one, left to right: one wide bar does not starve the columns after it.
  const growTo = (target: (column: Column<Row>) => number) =>
    shown.forEach((column, index) => {
      const wanted = Math.min(column.max ?? Number.MAX_SAFE_INTEGER, target(column));
      const grow = Math.max(0, Math.min(spare, wanted - (widths[index] ?? 0)));
      widths[index] = (widths[index] ?? 0) + grow;
      spare -= grow;
    });
  growTo((column) => column.comfortable?.(rows) ?? natural.get(column) ?? 0);
  growTo((column) => natural.get(column) ?? 0);
  // Still too wide (a very narrow terminal): the columns on the right give way, down to nothing.
  for (let index = widths.length - 1; spare < 0 && index >= 0; index--) {
    const give = Math.min(-spare, (widths[index] ?? 0) + (index > 0 ? GAP : 0));
    widths[index] = Math.max(0, (widths[index] ?? 0) - give);
    spare += give;
  }
  return shown.map((column, index) => ({ column, width: widths[index] ?? 0 })).filter((entry) => entry.width > 0);
}

const cellText = (cell: Cell) => (cell.segments ? cell.segments.map((s) => s.text).join("") : cell.text);

/** drawRow pads (or cuts) each cell to its width and joins them; colour codes go on after. */
function drawRow(cells: { cell: Cell; width: number; align?: "right" }[], color: boolean): string {
  return cells
    .map(({ cell, width, align }, index) => {
      const last = index === cells.length - 1;
      const parts = cell.segments ?? [{ text: cell.text, style: cell.style }];
      let used = 0;
      const drawn: string[] = [];
      for (const part of parts) {
        const room = width - used;
        if (room <= 0) break;
        const text = used + part.text.length > width && parts.length === 1 ? cut(part.text, room) : part.text.slice(0, room);
        used += text.length;
        drawn.push(paint(text, part.style, color));
      }
      const pad = " ".repeat(Math.max(0, width - used));
      if (align === "right") return pad + drawn.join("");
      return last ? drawn.join("") : drawn.join("") + pad;
    })
    .join(" ".repeat(GAP))
    .trimEnd();
}

function drawTable<Row>(columns: Column<Row>[], rows: Row[], options: FrameOptions): string[] {
  const layout = layoutColumns(columns, rows, options.width);
  const header = drawRow(
    layout.map(({ column, width }) => ({ cell: { text: column.header, style: "bold" as Style }, width, align: column.align })),
    options.color,
  );
  const lines = rows.map((row) =>
    drawRow(
      layout.map(({ column, width }) => ({ cell: column.cell(row, width), width, align: column.align })),
      options.color,
    ),
  );
  return [header, ...lines];
}

/** bytes writes a size in binary units, short: "512M", "1.5G", "23G". */
export function bytes(value: number): string {
  const units = ["B", "K", "M", "G", "T"];
  let amount = value;
  let unit = 0;
  while (amount >= 1024 && unit < units.length - 1) {
    amount /= 1024;
    unit += 1;
  }
  const digits = amount >= 10 || unit === 0 ? 0 : 1;
  return `${amount.toFixed(digits)}${units[unit]}`;
}

/** mib writes a size given in MiB; nothing is "0", not "0B". */
const mib = (value: number) => (value === 0 ? "0" : bytes(value * 1024 * 1024));

/** duration writes how long a service has run: "45s", "12m", "3h05m", "4d02h". */
export function duration(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86_400) return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  return `${Math.floor(s / 86_400)}d${String(Math.floor((s % 86_400) / 3600)).padStart(2, "0")}h`;
}

/** bar draws `[|||||     ]` filled to pct at the given width (brackets included), or null when too narrow. */
function bar(pct: number, width: number): { text: string; style?: Style }[] | null {
  const inner = width - 2;
  if (inner < 3) return null;
  const filled = Math.round((Math.min(100, Math.max(0, pct)) / 100) * inner);
  return [{ text: "[" }, { text: "|".repeat(filled), style: loadStyle(pct) }, { text: `${" ".repeat(inner - filled)}]` }];
}

/**
 * meter is a bar followed by its figure, right-aligned in figureWidth (the column's widest
 * figure, so the bars of one column line up); when the bar has no room, the figure alone.
 */
function meter(pct: number | null, figure: string, width: number, figureWidth: number): Cell {
  const room = width - figureWidth - 1;
  const drawn = pct === null ? null : bar(pct, Math.min(room, 40));
  if (!drawn || room < 5) return { text: figure, style: pct === null ? "dim" : undefined };
  const used = drawn.reduce((sum, part) => sum + part.text.length, 0);
  return { text: "", segments: [...drawn, { text: ` ${figure.padStart(width - used - 1)}` }] };
}

type GpuDevice = GpuInventoryRecord["devices"][number];

/** COMFORTABLE_BAR is the bar width (brackets included) each meter gets before either grows further. */
const COMFORTABLE_BAR = 12;

function gpuColumns(devices: GpuDevice[]): Column<GpuDevice>[] {
  const utilFigure = (d: GpuDevice) => (d.utilization_pct === null ? "n/a" : `${d.utilization_pct}%`);
  const memoryFigure = (d: GpuDevice) =>
    d.memory_used_mb === null ? `${mib(d.memory_total_mb)} total` : `${mib(d.memory_used_mb)}/${mib(d.memory_total_mb)}`;
  const widest = (figure: (d: GpuDevice) => string) => Math.max(0, ...devices.map((d) => figure(d).length));
  const utilWidth = widest(utilFigure);
  const memoryWidth = widest(memoryFigure);
  return [
    { header: "GPU", cell: (d) => ({ text: String(d.index) }) },
    {
      header: "NAME",
      shrink: 8,
      max: 28,
      dropRank: 2,
      cell: (d) => ({ text: `${d.name}${d.mig_profile ? ` MIG ${d.mig_profile}` : ""}` }),
    },
    {
      header: "UTIL",
      minWidth: () => utilWidth,
      comfortable: () => utilWidth + 1 + COMFORTABLE_BAR,
      natural: () => 30,
      cell: (d, width) => meter(d.utilization_pct, utilFigure(d), width, utilWidth),
    },
    {
      header: "MEMORY",
      minWidth: () => memoryWidth,
      comfortable: () => memoryWidth + 1 + COMFORTABLE_BAR,
      natural: () => 42,
      cell: (d, width) => {
        const pct = d.memory_used_mb === null ? null : (100 * d.memory_used_mb) / Math.max(1, d.memory_total_mb);
        return meter(pct, memoryFigure(d), width, memoryWidth);
      },
    },
    {
      header: "HELD BY",
      shrink: 7,
      dropRank: 1,
      cell: (d) =>
        d.holders.length === 0
          ? { text: "-", style: "dim" }
          : { text: d.holders.map((h) => (h.whole ? h.service : `${h.service} (${mib(h.memory_mb)})`)).join(", ") },
    },
  ];
}

interface ServiceRow {
  record: ServiceRecord;
  cpu: number | undefined;
  rss: number | undefined;
  gpuMb: number;
  /** gpuUsedMb is what its processes hold on the GPUs, measured; undefined when not measured. */
  gpuUsedMb: number | undefined;
  gpuIndexes: number[];
  uptimeS: number | null;
}

function serviceColumns(): Column<ServiceRow>[] {
  const dash: Cell = { text: "-", style: "dim" };
  return [
    { header: "NAME", shrink: 8, max: 32, cell: (r) => ({ text: r.record.name }) },
    { header: "STATUS", cell: (r) => ({ text: r.record.status, style: STATUS_STYLE[r.record.status] }) },
    {
      header: "CPU",
      align: "right",
      dropRank: 8,
      cell: (r) => (r.cpu === undefined ? dash : { text: `${r.cpu.toFixed(1)}%`, style: r.cpu >= 80 ? "red" : undefined }),
    },
    {
      header: "MEM",
      align: "right",
      dropRank: 7,
      cell: (r) =>
        r.rss === undefined ? dash : { text: r.record.memory_mb === null ? bytes(r.rss) : `${bytes(r.rss)}/${mib(r.record.memory_mb)}` },
    },
    {
      header: "GPU MEM",
      dropRank: 6,
      cell: (r) => {
        if (r.gpuIndexes.length === 0) return r.gpuUsedMb ? { text: mib(r.gpuUsedMb) } : dash;
        // Measured use beside the reservation when the engine measured it: "18.0G/24.0G gpu0".
        const used = r.gpuUsedMb === undefined ? "" : `${mib(r.gpuUsedMb)}/`;
        return { text: `${used}${mib(r.gpuMb)} gpu${r.gpuIndexes.join(",")}` };
      },
    },
    {
      header: "RESTARTS",
      align: "right",
      dropRank: 5,
      cell: (r) => ({ text: String(r.record.restarts), style: r.record.restarts > 0 ? "yellow" : undefined }),
    },
    { header: "PID", align: "right", dropRank: 4, cell: (r) => (r.record.pid === null ? dash : { text: String(r.record.pid) }) },
    { header: "KIND", dropRank: 3, cell: (r) => ({ text: r.record.kind }) },
    { header: "UPTIME", align: "right", dropRank: 2, cell: (r) => (r.uptimeS === null ? dash : { text: duration(r.uptimeS) }) },
    {
      header: "MESSAGE",
      shrink: 10,
      dropRank: 1,
      cell: (r) => (r.record.status_message ? { text: r.record.status_message, style: "dim" } : { text: "" }),
    },
  ];
}

/** serviceRows joins each service with its stats and the GPU memory the inventory says it holds. */
function serviceRows(snapshot: TopSnapshot): ServiceRow[] {
  const stats = new Map((snapshot.stats?.services ?? []).map((s) => [s.name, s]));
  const held = new Map<string, { mb: number; indexes: number[] }>();
  for (const device of snapshot.gpus?.devices ?? []) {
    for (const holder of device.holders) {
      const entry = held.get(holder.service) ?? { mb: 0, indexes: [] };
      entry.mb += holder.whole ? device.memory_total_mb : holder.memory_mb;
      if (!entry.indexes.includes(device.index)) entry.indexes.push(device.index);
      held.set(holder.service, entry);
    }
  }
  return [...snapshot.services]
    .sort((a, b) => a.name.localeCompare(b.name))
    .map((record) => {
      const stat = stats.get(record.name);
      const live = stat !== undefined && stat.pid === record.pid;
      const gpu = held.get(record.name);
      return {
        record,
        cpu: live ? snapshot.cpuPercent.get(record.name) : undefined,
        rss: live ? stat.rss_bytes : undefined,
        gpuMb: gpu?.mb ?? 0,
        gpuUsedMb: snapshot.gpuUsedMb?.get(record.name),
        gpuIndexes: gpu?.indexes ?? [],
        uptimeS: record.pid !== null && record.started_at ? (snapshot.at.getTime() - new Date(record.started_at).getTime()) / 1000 : null,
      };
    });
}

/** renderTop draws one frame: no line wider than the terminal, no more lines than it has. */
export function renderTop(snapshot: TopSnapshot, options: FrameOptions): string[] {
  const { width, color } = options;
  const clock = snapshot.at.toTimeString().slice(0, 8);
  const running = snapshot.services.filter((s) => s.pid !== null).length;
  // The least needed part last, where a narrow terminal cuts it.
  const every = options.interactive ? `  every ${snapshot.intervalS}s, q quits` : "";
  const title = `engine top  ${clock}  ${running}/${snapshot.services.length} running${every}  ${snapshot.target}`;
  const lines: string[] = [paint(cut(title, width), "bold", color)];
  if (snapshot.error) lines.push(paint(cut(snapshot.error, width), "red", color));
  lines.push("");

  const devices = snapshot.gpus?.devices ?? [];
  if (devices.length === 0) {
    const why = snapshot.gpus === null ? "GPUs: not read yet" : "GPUs: none (nvidia-smi found none and ENGINE_GPUS declares none)";
    lines.push(paint(cut(why, width), "dim", color));
  } else {
    lines.push(...drawTable(gpuColumns(devices), devices, options));
    if (snapshot.gpus?.source === "declared") lines.push(paint(cut("declared with ENGINE_GPUS, not detected", width), "dim", color));
  }
  for (const warning of snapshot.gpus?.warnings ?? []) lines.push(paint(cut(`warning: ${warning}`, width), "yellow", color));
  lines.push("");

  if (snapshot.services.length === 0) {
    lines.push(paint(cut("no services yet: `engine services deploy` starts one", width), "dim", color));
  } else {
    const table = drawTable(serviceColumns(), serviceRows(snapshot), options);
    const room = options.height - lines.length;
    if (table.length > room && room >= 2) {
      // Keep the header and as many rows as fit, and say how many did not.
      const shown = table.slice(0, room - 1);
      lines.push(...shown, paint(cut(`… and ${table.length - shown.length} more (a taller terminal shows them)`, width), "dim", color));
    } else {
      lines.push(...table);
    }
  }
  if (snapshot.stats === null && snapshot.services.length > 0) {
    lines.push(paint(cut("CPU and MEM need an engine with GET /api/stats (restart the daemon after upgrading)", width), "dim", color));
  }
  return lines.slice(0, Number.isFinite(options.height) ? options.height : undefined);
}

/**
 * cpuShares works out each service's CPU use between two samples, in % of one core: the
 * growth of its CPU seconds over the time between the samples. A service whose pid changed
 * (it restarted) or that was not in the earlier sample has none yet.
 */
export function cpuShares(previous: ServiceStatsRecord | null, current: ServiceStatsRecord | null): Map<string, number> {
  const shares = new Map<string, number>();
  if (!previous || !current) return shares;
  const elapsed = (Date.parse(current.sampled_at) - Date.parse(previous.sampled_at)) / 1000;
  if (!(elapsed > 0)) return shares;
  const before = new Map(previous.services.map((s) => [s.name, s]));
  for (const now of current.services) {
    const then = before.get(now.name);
    if (!then || then.pid !== now.pid) continue;
    shares.set(now.name, Math.max(0, ((now.cpu_seconds - then.cpu_seconds) / elapsed) * 100));
  }
  return shares;
}
