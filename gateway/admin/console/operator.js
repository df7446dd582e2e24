// The operators' page: every backend as routing sees it (/admin/v1/status), charts of the
// last minutes per backend (/admin/v1/timeline/backends), and the drain and reload
// actions, each behind a confirm dialog, showing what the action did and its log index.

import { every, get, post, timeline as poller } from "./api.js";
import { lineChart, seriesOf } from "./charts.js";
import { card, h, num, percent, show, table } from "./dom.js";

const POLL_MS = 3000;

function scores(backend) {
  const entries = Object.entries(backend.scores || {});
  return entries.length ? entries.map(([model, score]) => `${model}: ${score.toFixed(3)}`)
    .join("\n") : "-";
}

// Requests per backend id over the timeline's window. The totals have no prototype: a
// backend may be named `constructor` or `toString` (valid ids), and on a plain object
// `totals[id]` was the inherited function (shown as its source text) until a count was set.
function requestTotals(timeline) {
  const totals = Object.create(null);
  for (const sample of timeline ? timeline.samples : []) {
    for (const [id, b] of Object.entries(sample.backends || {})) {
      totals[id] = (totals[id] || 0) + (b.requests || 0);
    }
  }
  return totals;
}

function backendsTable(status, timeline) {
  const served = requestTotals(timeline);
  const rows = status.backends.map((b) => [
    h("span", { class: "mono", "data-backend": b.id }, b.id),
    b.kind,
    h("span", { class: b.health === "healthy" ? "ok" : "bad" }, b.health),
    h("span", { class: b.breaker.state === "closed" ? "ok" : "bad" }, b.breaker.state),
    num(b.inflight),
    `${num(b.waiting)} / ${num(b.running)}`,
    percent(b.kv_usage),
    num(b.prefilling_tokens),
    h("span", { "data-requests": b.id }, timeline ? num(served[b.id] || 0) : "-"),
    h("span", { class: "mono" }, scores(b)),
  ]);
  return table([["backend"], ["kind"], ["health"], ["breaker"], ["in-flight", { num: true }],
    ["waiting / running", { num: true }], ["KV", { num: true }],
    ["prefill tokens", { num: true }], ["requests (window)", { num: true }], ["score"]],
  rows, "no backends");
}

function charts(timeline) {
  const samples = timeline.samples;
  const per = (field) => seriesOf(samples, (s) => s.backends, (b) => b[field]);
  const seconds = (v) => `${(v * 1000).toFixed(0)}ms`;
  return h("div", { class: "grid" },
    lineChart("Queue depth (waiting)", per("waiting")),
    lineChart("In-flight", per("inflight")),
    lineChart("TTFT p50", per("ttft_p50_s"), seconds),
    lineChart("TTFT p99", per("ttft_p99_s"), seconds),
    lineChart("Error rate", per("error_rate"), (v) => `${(v * 100).toFixed(0)}%`));
}

function action(name, path, question, resultNode, ctx) {
  return h("button", {
    type: "button", class: name === "drain" ? "danger" : "primary", id: `action-${name}`,
    onclick: async () => {
      if (!window.confirm(question)) return;
      show(resultNode, `${name}…`);
      try {
        const done = await post(path);
        show(resultNode, h("span", { "data-action-result": name },
          `${done.action}: changed ${done.changed}, logged at index ${num(done.log_index)}, `
          + "change digest ", h("code", {}, done.change_digest)));
      } catch (error) {
        ctx.fail(resultNode, error);
      }
    },
  }, name === "drain" ? "Drain" : "Reload");
}

export function render(node, ctx) {
  const summary = h("p", {});
  const backends = h("div", {}, h("p", { class: "muted" }, "loading…"));
  const chartsNode = h("div", { id: "backend-charts" });
  const result = h("p", { id: "action-result" });
  show(node,
    h("h1", {}, "Operators"),
    card("Gateway", summary,
      h("div", { class: "actions" },
        action("reload", "/admin/v1/reload",
          "Reload gateway.yaml, the keys file and the policy files now?", result, ctx),
        action("drain", "/admin/v1/drain",
          "Drain this gateway? /readyz turns 503 and it takes no new requests until it is "
          + "restarted.", result, ctx)),
      result),
    card("Backends", backends),
    card("The last minutes, per backend", chartsNode));
  let timeline = null;
  const backendsTimeline = poller("/admin/v1/timeline/backends");
  return every(POLL_MS, async (stop) => {
    try {
      const status = await get("/admin/v1/status");
      show(summary, h("span", { class: status.status === "ready" ? "ok" : "bad" },
        status.status), status.draining ? " (draining)" : "",
        ` · ${status.backends.length} backends`);
      show(backends, backendsTable(status, timeline));
    } catch (error) {
      if (error.status === 401 || error.status === 403) {
        stop();
        ctx.fail(node, error);
      } else {
        ctx.fail(backends, error);
      }
      return;
    }
    try {
      timeline = await backendsTimeline();
      chartsNode.dataset.samples = String(timeline.samples.length);
      show(chartsNode, charts(timeline));
    } catch (error) {
      ctx.fail(chartsNode, error);
    }
  });
}
