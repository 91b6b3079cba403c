import { describe, expect, test } from "bun:test";
import { formatValue, Histogram, MetricsText } from "../../src/lib/prometheus";
import { promtoolCheck } from "../engine/metrics/exposition";

/** The text exposition format both /metrics answers are written in (docs/decisions.md 330). */

describe("MetricsText", () => {
  test("families with HELP and TYPE, escaped label values, a cumulative histogram; promtool finds no problem", async () => {
    const histogram = new Histogram([0.1, 1]);
    for (const value of [0.05, 0.5, 0.7, 3]) histogram.observe(value);
    const text = new MetricsText()
      .gauge("x_temperature_celsius", "A gauge.\nWith a second line and a \\ backslash.", [
        { labels: { name: 'say "hi"\\now\n' }, value: 21.5 },
        { labels: {}, value: Number.NaN },
      ])
      .counter("x_requests_total", "A counter.", [{ labels: { code: "2xx" }, value: 3 }])
      .gauge("x_empty", "No samples: left out.", [])
      .histogram("x_duration_seconds", "A histogram.", histogram.bounds, [
        { labels: { route: "/" }, counts: histogram.counts, sum: histogram.sum },
      ])
      .toString();
    expect(text).toBe(
      [
        "# HELP x_temperature_celsius A gauge.\\nWith a second line and a \\\\ backslash.",
        "# TYPE x_temperature_celsius gauge",
        'x_temperature_celsius{name="say \\"hi\\"\\\\now\\n"} 21.5',
        "x_temperature_celsius NaN",
        "# HELP x_requests_total A counter.",
        "# TYPE x_requests_total counter",
        'x_requests_total{code="2xx"} 3',
        "# HELP x_duration_seconds A histogram.",
        "# TYPE x_duration_seconds histogram",
        'x_duration_seconds_bucket{route="/",le="0.1"} 1',
        'x_duration_seconds_bucket{route="/",le="1"} 3',
        'x_duration_seconds_bucket{route="/",le="+Inf"} 4',
        'x_duration_seconds_sum{route="/"} 4.25',
        'x_duration_seconds_count{route="/"} 4',
        "",
      ].join("\n"),
    );
    expect(await promtoolCheck(text)).toEqual({ code: 0, output: "" });
  });

  test.each([
    ["a counter without _total", () => new MetricsText().counter("x_requests", "h", [{ labels: {}, value: 1 }])],
    ["a bad metric name", () => new MetricsText().gauge("1x", "h", [{ labels: {}, value: 1 }])],
    ["a reserved label name", () => new MetricsText().gauge("x", "h", [{ labels: { __name__: "y" }, value: 1 }])],
    ["a family twice", () => new MetricsText().gauge("x", "h", [{ labels: {}, value: 1 }]).gauge("x", "h", [{ labels: {}, value: 2 }])],
  ])("%s throws", (_label, write) => {
    expect(write).toThrow();
  });

  test.each([
    [1, "1"],
    [0.25, "0.25"],
    [Number.POSITIVE_INFINITY, "+Inf"],
    [Number.NEGATIVE_INFINITY, "-Inf"],
    [Number.NaN, "NaN"],
  ])("formatValue(%p) is %p", (value, text) => {
    expect(formatValue(value)).toBe(text);
  });
});
