// The auditors' page: the log's latest signed checkpoint and its size over time
// (/log/checkpoint, /admin/v1/timeline/log), witness coverage (/admin/v1/log/cosignatures),
// receipt verification (/admin/v1/receipts/verify), and where requests went per tenant,
// region and backend from `owngate audit report` of the live log, with the report's
// self-contained HTML file as a download (fetched with the token, offered as a Blob).

import { download, every, get, post, timeline } from "./api.js";
import { lineChart, seriesOf } from "./charts.js";
import { card, h, num, percent, show, table, when } from "./dom.js";

const POLL_MS = 3000;

function checkpointView(text) {
  const [origin, size, root] = text.split("\n");
  return h("div", {},
    h("p", {}, "origin ", h("code", {}, origin), " · size ",
      h("strong", { id: "log-size" }, size), " entries"),
    h("p", {}, "root ", h("code", {}, root)),
    h("pre", { class: "mono" }, text));
}

function logChart(timeline) {
  const field = (name) => (s) => ({ [name]: s[name] });
  const line = (name, title) => ({ name: title,
    points: seriesOf(timeline.samples, field(name))[0]?.points || [] });
  return lineChart("Log size and checkpoints", [
    line("entries", "entries"), line("checkpoint_size", "checkpoint size"),
    line("cosigned_size", "cosigned size")]);
}

function witnessesView(found) {
  return h("div", { "data-witnesses": "" },
    h("p", {}, "coverage ", h("strong", { id: "witness-coverage" }, percent(found.coverage)),
      found.checkpoint ? ` of checkpoint size ${found.checkpoint.size}` : " (no checkpoint)"),
    table([["witness"], ["key id"], ["cosigned size", { num: true }], ["lag", { num: true }],
      ["cosigned at"], ["valid"]], found.witnesses.map((w) => [w.name, h("code", {}, w.key_id),
      num(w.cosigned_size), num(w.lag), when(w.timestamp),
      h("span", { class: w.valid ? "ok" : "bad" }, w.valid ? "valid" : "INVALID")]),
    "no witnesses configured"));
}

// The policy a receipt's record names: {id, version, digest}, or {digest} alone when the
// log does not hold the record.
function policyOf(policy) {
  if (!policy) return "-";
  return h("span", {}, policy.id ? `${policy.id} version ${policy.version} ` : "",
    h("code", {}, policy.digest || ""));
}

function verified(result) {
  const inclusion = result.inclusion || {};
  return h("div", { id: "receipt-result" },
    h("p", { class: result.valid ? "ok" : "bad", id: "receipt-valid" },
      result.valid ? "valid receipt" : "NOT valid"),
    table([["field"], ["value"]], [
      ["request id", h("code", {}, result.request_id || "-")],
      ["served by backend", h("code", { id: "receipt-backend" }, result.backend || "-")],
      ["region", result.region || "-"],
      ["log index", num(result.log_index)],
      ["inclusion proof", h("span", { class: inclusion.checked ? "ok" : "bad",
        id: "receipt-inclusion" }, inclusion.checked
        ? `checked against checkpoint size ${num(inclusion.checkpoint_size)}` : "not checked")],
      ["policy", policyOf(result.policy)],
    ]),
    result.problems.length ? h("ul", { class: "error" },
      result.problems.map((p) => h("li", {}, p))) : null);
}

function receiptCard(ctx) {
  const text = h("textarea", { id: "receipt", name: "receipt", spellcheck: "false",
    placeholder: "the x-owngate-receipt a client got" });
  const out = h("div", {});
  const form = h("form", { id: "receipt-form" }, text,
    h("button", { type: "submit", class: "primary" }, "Verify receipt"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    let receipt = text.value.trim();
    try {
      receipt = JSON.parse(receipt);
    } catch (_) {
      // its string form: the API parses it
    }
    try {
      show(out, verified(await post("/admin/v1/receipts/verify", { receipt })));
    } catch (error) {
      ctx.fail(out, error);
    }
  });
  return card("Receipt lookup and verification", form, out);
}

function totalsTable(title, figure) {
  const totals = (figure && figure.totals) || {};
  const heading = (figure && figure.title) || title;
  return h("div", { "data-breakdown": title }, h("h3", {}, heading),
    table([[title], ["count", { num: true }]], Object.entries(totals).map(([key, count]) =>
      [h("code", {}, key), num(count)]), "none"));
}

function reportView(report) {
  const v = report.verification || {};
  if (!v.ok) {
    return h("p", { class: "bad" }, `the log did not verify: ${v.error || "unknown"}`);
  }
  const f = report.figures || {};
  return h("div", {},
    h("p", { class: "ok" }, `verified · ${num(report.totals.requests)} requests, `
      + `${num(report.totals.dispatches)} dispatches, ${num(report.totals.refusals)} refusals`),
    h("div", { class: "grid" },
      totalsTable("tenant", f.requests_by_tenant),
      totalsTable("region", f.dispatches_by_region),
      totalsTable("backend", f.dispatches_by_backend)));
}

function reportCard(ctx) {
  const out = h("div", {}, h("p", { class: "muted" }, "loading…"));
  const load = async () => {
    try {
      show(out, reportView(await get("/admin/v1/log/report?format=json")));
    } catch (error) {
      ctx.fail(out, error);
    }
  };
  const status = h("span", { class: "muted" });
  const save = h("button", { type: "button", id: "report-download", onclick: async () => {
    try {
      await download("/admin/v1/log/report?format=html", "owngate-audit-report.html");
      show(status, " downloaded");
    } catch (error) {
      ctx.fail(status, error);
    }
  } }, "Download the report (HTML)");
  load();
  return card("Where requests went", h("div", { class: "actions" },
    h("button", { type: "button", onclick: load }, "Refresh"), save, status), out);
}

export function render(node, ctx) {
  const checkpoint = h("div", {}, h("p", { class: "muted" }, "loading…"));
  const chart = h("div", {});
  const witnesses = h("div", {});
  const logTimeline = timeline("/admin/v1/timeline/log");
  show(node,
    h("h1", {}, "Auditors"),
    h("div", { class: "pair" }, card("Latest checkpoint", checkpoint),
      card("Log size over time", chart)),
    card("Witness coverage", witnesses),
    receiptCard(ctx),
    reportCard(ctx));
  return every(POLL_MS, async (stop) => {
    try {
      show(checkpoint, checkpointView(await get("/log/checkpoint")));
    } catch (error) {
      if (error.status === 401 || error.status === 403) {
        stop();
        ctx.fail(node, error);
      } else {
        ctx.fail(checkpoint, error);
      }
      return;
    }
    try {
      show(chart, logChart(await logTimeline()));
    } catch (error) {
      ctx.fail(chart, error);
    }
    try {
      show(witnesses, witnessesView(await get("/admin/v1/log/cosignatures")));
    } catch (error) {
      ctx.fail(witnesses, error);
    }
  });
}
