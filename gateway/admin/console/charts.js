// Inline SVG line charts over time, drawn with DOM APIs (names are text nodes). One line
// per series; a null value (unknown in that interval) breaks the line rather than
// drawing a zero.

import { h } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
const W = 480, H = 170, LEFT = 46, RIGHT = 8, TOP = 10, BOTTOM = 22;

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function label(value, format) {
  if (format) return format(value);
  if (Math.abs(value) >= 1000) return `${(value / 1000).toFixed(1)}k`;
  return Number.isInteger(value) ? String(value) : value.toFixed(2);
}

// series: [{name, points: [[unixSeconds, value|null], ...]}]; format: value -> text.
export function lineChart(title, series, format) {
  const values = series.flatMap((s) => s.points.map((p) => p[1]).filter((v) => v !== null));
  const times = series.flatMap((s) => s.points.map((p) => p[0]));
  const figure = h("figure", { class: "chart", "data-chart": title });
  figure.append(h("h3", {}, title));
  if (!times.length) {
    figure.append(h("p", { class: "muted" }, "no samples yet"));
    return figure;
  }
  const t0 = Math.min(...times), t1 = Math.max(...times);
  const top = Math.max(...values, 0) || 1;
  const x = (t) => LEFT + (t1 === t0 ? 0 : ((t - t0) / (t1 - t0)) * (W - LEFT - RIGHT));
  const y = (v) => TOP + (1 - v / top) * (H - TOP - BOTTOM);
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" });
  chart.append(svg("title", {}, title));
  chart.append(svg("line", { class: "axis", x1: LEFT, y1: y(0), x2: W - RIGHT, y2: y(0) }));
  chart.append(svg("line", { class: "axis", x1: LEFT, y1: TOP, x2: LEFT, y2: y(0) }));
  chart.append(svg("text", { class: "tick", x: LEFT - 4, y: TOP + 8, "text-anchor": "end" },
    label(top, format)));
  chart.append(svg("text", { class: "tick", x: LEFT - 4, y: y(0), "text-anchor": "end" },
    label(0, format)));
  const span = Math.round(t1 - t0);
  chart.append(svg("text", { class: "tick", x: LEFT, y: H - 6 }, `-${span}s`));
  chart.append(svg("text", { class: "tick", x: W - RIGHT, y: H - 6, "text-anchor": "end" },
    "now"));
  series.forEach((s, i) => {
    let run = [];
    const flush = () => {
      if (run.length === 1) run.push([run[0][0] + 0.5, run[0][1]]);
      if (run.length) {
        chart.append(svg("polyline", {
          class: `line s${i % 8}`, points: run.map(([a, b]) => `${a},${b}`).join(" "),
        }));
      }
      run = [];
    };
    for (const [t, v] of s.points) {
      if (v === null || v === undefined) flush();
      else run.push([x(t), y(v)]);
    }
    flush();
  });
  figure.append(chart);
  figure.append(h("div", { class: "legend" }, series.map((s, i) =>
    h("span", {}, h("span", { class: `swatch s${i % 8}` }), s.name))));
  return figure;
}

// The series of a timeline: for each key that `pick(sample)` (an object) has, its value
// over the samples (`missing` where a sample lacks it: null for unknown, 0 for counts).
export function seriesOf(samples, pick, value = (v) => v, missing = null) {
  const names = [...new Set(samples.flatMap((s) => Object.keys(pick(s) || {})))].sort();
  return names.map((name) => ({
    name,
    points: samples.map((s) => {
      const entry = (pick(s) || {})[name];
      return [s.t, entry === undefined ? missing : value(entry)];
    }),
  }));
}
