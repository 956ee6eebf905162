// Time series charts over the vendored uPlot (docs/ui.md, "Charts").
//
// The server renders each chart as {% time_chart chart %}: a <figure data-chart> with its title
// and unit, and an element #<id>-data whose data-chart-data attribute holds the chart as JSON:
// {"id", "title", "unit", "series": [{"label", "tone"}], "columns": [[unix s…], [values…]…]}.
// A push that replaces #<id>-data (hx-swap-oob) moves the chart. All charts of a page share one
// time window (default 15 min, or the page's <select data-chart-window>; on a young system from a
// minute before the first count) and one cursor.
"use strict";

(() => {
  const plots = new Map(); // chart id -> {plot, figure, json}
  let windowS = 15 * 60;

  function tone(name) {
    const value = getComputedStyle(document.documentElement).getPropertyValue(`--${name}`);
    return value.trim() || "#5b6675";
  }

  function timeRange(data) {
    // Every chart ends at the newest time any chart has, so that their windows line up.
    let end = 0;
    for (const { plot } of plots.values()) {
      const times = plot.data[0];
      if (times.length) end = Math.max(end, times[times.length - 1]);
    }
    if (data[0].length) end = Math.max(end, data[0][data[0].length - 1]);
    end = end || Date.now() / 1000;
    // A young system: the axis starts a minute before the first count, not at the start of a
    // window that is mostly empty (the lines would be a few pixels at its right edge).
    let first = Infinity;
    for (const { plot } of plots.values()) first = Math.min(first, firstCounted(plot.data));
    first = Math.min(first, firstCounted(data));
    const start = first === Infinity ? end - windowS : Math.min(first - 60, end - 60);
    return [Math.max(end - windowS, start), end];
  }

  // The time of the first point that any series has a value for; Infinity when none has.
  function firstCounted(data) {
    for (let i = 0; i < data[0].length; i++) {
      if (data.slice(1).some((values) => values[i] != null)) return data[0][i];
    }
    return Infinity;
  }

  // Axis and legend times in the viewer's clock, 24 h: 13:04 (13:04:05 in the legend).
  const clock = (seconds, withSeconds) => new Date(seconds * 1000).toLocaleTimeString([], {
    hour: "2-digit", minute: "2-digit", second: withSeconds ? "2-digit" : undefined, hour12: false,
  });

  function build(figure, json) {
    const chart = JSON.parse(json);
    const target = figure.querySelector(".chart-plot");
    const unit = chart.unit;
    const written = (value) => window.Nexus.format.value(value, unit);
    const plot = new uPlot(
      {
        width: Math.max(target.clientWidth, 240),
        height: 180,
        cursor: { sync: { key: "nexus-page" } },
        scales: { x: { time: true, range: () => timeRange(chart.columns) } },
        axes: [
          // Seconds on the axis once ticks are closer than a minute (a young system's window).
          {
            stroke: tone("muted"),
            values: (u, ticks, axis, space, incr) => ticks.map((t) => clock(t, incr < 60)),
          },
          { stroke: tone("muted"), size: 72, values: (u, ticks) => ticks.map(written) },
        ],
        series: [
          { label: "Time", value: (u, t) => (t == null ? "—" : clock(t, true)) },
          ...chart.series.map((series) => ({
            label: series.label,
            stroke: tone(series.tone),
            width: 2,
            value: (u, value) => written(value),
          })),
        ],
      },
      chart.columns,
      target,
    );
    new ResizeObserver(() => plot.setSize({ width: Math.max(target.clientWidth, 240), height: 180 }))
      .observe(target);
    return plot;
  }

  function refresh() {
    for (const [id, entry] of plots) {
      if (!document.body.contains(entry.figure)) {
        entry.plot.destroy();
        plots.delete(id);
      }
    }
    for (const figure of document.querySelectorAll("figure[data-chart]")) {
      const source = document.getElementById(`${figure.id}-data`);
      if (!source) continue;
      const json = source.dataset.chartData;
      const entry = plots.get(figure.id);
      if (!entry) {
        plots.set(figure.id, { plot: build(figure, json), figure, json });
      } else if (entry.json !== json) {
        entry.json = json;
        entry.plot.setData(JSON.parse(json).columns);
      }
    }
    for (const { plot } of plots.values()) {
      plot.setScale("x", { min: timeRange(plot.data)[0], max: timeRange(plot.data)[1] });
    }
  }

  document.addEventListener("change", (event) => {
    const chooser = event.target.closest("select[data-chart-window]");
    if (!chooser) return;
    windowS = Number(chooser.value);
    refresh();
  });

  for (const name of ["htmx:afterSettle", "htmx:oobAfterSwap", "htmx:wsAfterMessage"]) {
    document.addEventListener(name, refresh);
  }
  document.addEventListener("DOMContentLoaded", () => {
    const chooser = document.querySelector("select[data-chart-window]");
    if (chooser) windowS = Number(chooser.value);
    refresh();
  });

  window.NexusCharts = { refresh, plots };
})();
