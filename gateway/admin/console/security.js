// The security page: tenants (their models, limits and current use) and the policy set
// that decides for them, decisions and refusals per rule over time, the explain form
// (tenant, model, data class -> eligible backends and the trace), the policy test cases,
// and tenant key management (list, create: shown once, revoke).

import { del, every, get, post, timeline } from "./api.js";
import { lineChart, seriesOf } from "./charts.js";
import { card, h, num, percent, show, table, when } from "./dom.js";

const POLL_MS = 3000;

function pairs(object) {
  const entries = Object.entries(object || {}).filter(([, v]) => v !== null);
  return entries.length
    ? h("span", { class: "mono" }, entries.map(([k, v]) => `${k}: ${v}`).join("\n")) : "-";
}

function policyCard(policy) {
  return h("div", {},
    h("p", {}, "Policy set ", h("code", { "data-policy-id": policy.id }, policy.id),
      ` version ${policy.version}`, policy.builtin ? " (built in: private backends only)" : "",
      ` · loaded ${when(policy.loaded_at)}`),
    h("p", {}, "digest ", h("code", {}, policy.digest)),
    policy.last_reload_error
      ? h("p", { class: "error" }, `last reload failed: ${policy.last_reload_error}`) : null);
}

// The policy that binds a tenant (a tenant no policy binds is denied everything).
function boundBy(policySet, tenant) {
  const policy = policySet.policies.find((p) => p.tenants.includes(tenant));
  return policy ? h("code", { "data-tenant-policy": tenant }, policy.id)
    : h("span", { class: "bad", "data-tenant-policy": tenant }, "none: denied everything");
}

function tenantsTable(tenants, policySet, explainFor) {
  return table([["tenant"], ["policy"], ["models"], ["keys", { num: true }], ["limits"],
    ["use"], [""]],
  tenants.map((t) => [
    h("span", { class: "mono", "data-tenant": t.id }, t.id),
    boundBy(policySet, t.id),
    t.models.join(", "),
    num(t.keys),
    pairs(t.limits),
    pairs(t.use),
    h("button", { type: "button", onclick: () => explainFor(t) }, "Explain"),
  ]), "no tenants");
}

function ruleTotals(samples, field) {
  const totals = {};
  for (const sample of samples) {
    for (const [rule, count] of Object.entries(sample[field] || {})) {
      totals[rule] = (totals[rule] || 0) + count;
    }
  }
  return totals;
}

// Every rule the set declares, by the policy declaring it (the set's own last), with the
// decisions it took part in and the requests it refused over the timeline's window.
function rulesCard(policySet, timeline) {
  const decisions = ruleTotals(timeline.samples, "decisions");
  const refusals = ruleTotals(timeline.samples, "refusals");
  const owned = new Set(policySet.policies.flatMap((p) => p.rules));
  const groups = [...policySet.policies.map((p) => [p, p.rules]),
    [null, policySet.rules.filter((rule) => !owned.has(rule))]];
  const rows = groups.flatMap(([policy, rules]) => rules.map((rule) => [
    policy ? h("code", {}, policy.id) : h("span", { class: "muted" }, "(the set)"),
    policy ? policy.tenants.join(", ") : "-",
    h("code", { "data-rule": rule }, rule),
    num(decisions[rule] || 0),
    h("span", { class: refusals[rule] ? "bad" : null, "data-refusals": rule },
      num(refusals[rule] || 0)),
  ]));
  return h("div", {},
    table([["policy"], ["tenants"], ["rule"], ["decisions", { num: true }],
      ["refusals", { num: true }]], rows, "no rules"),
    h("div", { class: "grid" },
      lineChart("Decisions per rule", seriesOf(timeline.samples, (s) => s.decisions,
        (v) => v, 0)),
      lineChart("Refusals per rule", seriesOf(timeline.samples, (s) => s.refusals,
        (v) => v, 0))));
}

function explained(result) {
  return h("div", { id: "explain-result" },
    h("p", {}, "private: ", result.private.length ? result.private.join(", ") : "none",
      " · hosted: ", result.hosted.length ? result.hosted.join(", ") : "none",
      ` · fallback: ${result.fallback} (rule ${result.fallback_rule})`,
      result.data_class ? ` · data class ${result.data_class}` : ""),
    result.refusal ? h("p", { class: "bad" }, `refused by ${result.refusal.rule || ""}: `,
      result.refusal.message || JSON.stringify(result.refusal)) : null,
    table([["backend"], ["verdict"], ["rule"], ["reason"]], result.trace.map((row) => [
      h("code", {}, row.backend), h("span", { class: row.verdict === "eligible" ? "ok" : "bad" },
        row.verdict), h("code", {}, row.rule), row.reason])));
}

function explainForm(ctx) {
  const tenant = h("input", { name: "tenant", id: "explain-tenant", required: true });
  const model = h("input", { name: "model", id: "explain-model", required: true });
  const dataClass = h("input", { name: "data_class", id: "explain-class",
    placeholder: "(none)" });
  const out = h("div", {});
  const form = h("form", { class: "inline", id: "explain-form" },
    h("label", {}, "tenant", tenant), h("label", {}, "model", model),
    h("label", {}, "data class", dataClass),
    h("button", { type: "submit", class: "primary" }, "Explain"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    show(out, "…");
    try {
      const body = { tenant: tenant.value, model: model.value };
      if (dataClass.value.trim()) body.data_class = dataClass.value.trim();
      show(out, explained(await post("/admin/v1/policies/explain", body)));
    } catch (error) {
      ctx.fail(out, error);
    }
  });
  const fill = (t) => {
    tenant.value = t.id;
    model.value = t.models.find((m) => !m.includes("*")) || "";
    form.requestSubmit();
  };
  return { node: h("div", {}, form, out), fill };
}

function testsCard(ctx) {
  const out = h("div", {});
  const run = h("button", { type: "button", id: "run-tests", class: "primary",
    onclick: async () => {
      show(out, "running…");
      try {
        const report = await post("/admin/v1/policies/test", {});
        show(out, h("p", { class: report.passed ? "ok" : "bad", id: "test-summary" },
          `${report.passed ? "passed" : "FAILED"}: ${report.total - report.failed} of `
          + `${report.total} cases, rule coverage ${percent(report.coverage)}`),
        table([["case"], ["result"], ["problems"]], report.cases.map((c) => [c.name,
          h("span", { class: c.passed ? "ok" : "bad" }, c.passed ? "passed" : "failed"),
          c.problems.join("\n")]), "no test cases configured"));
      } catch (error) {
        ctx.fail(out, error);
      }
    } }, "Run policy tests");
  return card("Policy tests", h("p", { class: "muted" },
    "Runs the running policy set's configured test cases."), run, out);
}

// Copies `text` to the clipboard; where the browser refuses, says to copy it by hand.
function copyButton(text) {
  const button = h("button", { type: "button", onclick: async () => {
    try {
      await navigator.clipboard.writeText(text);
      button.textContent = "Copied";
    } catch (_) {
      button.textContent = "Select the key and copy it by hand";
    }
  } }, "Copy");
  return button;
}

function keysCard(ctx, tenantsOf) {
  const list = h("div", {});
  const created = h("div", { id: "key-created" });
  const tenant = h("select", { name: "tenant", id: "key-tenant" });
  const digest = h("input", { name: "digest", id: "revoke-digest", size: 70,
    placeholder: "sha256:… (64 hex digits)" });
  const refresh = async () => {
    try {
      const keys = await get("/admin/v1/keys");
      show(list, table([["tenant"], ["key digest prefix"], ["state"]], keys.keys.map((k) => [
        k.tenant, h("code", { "data-key": k.hash_prefix }, k.hash_prefix),
        h("span", { "data-key-state": k.hash_prefix },
          k.revoked ? "revoked (still in gateway.yaml: remove it there)" : "active")]),
        "no keys"));
    } catch (error) {
      ctx.fail(list, error);
    }
  };
  const createForm = h("form", { class: "inline", id: "key-create" },
    h("label", {}, "tenant", tenant),
    h("button", { type: "submit", class: "primary" }, "Create key"));
  createForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const made = await post("/admin/v1/keys", { tenant: tenant.value });
      const key = h("code", { id: "new-key" }, made.key);
      show(created, h("div", { class: "notice" },
        h("p", {}, `New key for ${made.tenant} (logged at index ${num(made.log_index)}): `),
        h("pre", {}, key),
        h("p", {}, "Copy it now: it is shown once; only its digest ", h("code", {}, made.hash),
          " is stored. ",
          copyButton(made.key))));
      digest.value = made.hash;
      refresh();
    } catch (error) {
      ctx.fail(created, error);
    }
  });
  const revokeForm = h("form", { class: "inline", id: "key-revoke" },
    h("label", {}, "key digest", digest),
    h("button", { type: "submit", class: "danger" }, "Revoke"));
  revokeForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const value = digest.value.trim();
    if (!value || !window.confirm(`Revoke the key ${value}? Requests with it fail at once.`)) {
      return;
    }
    try {
      const done = await del(`/admin/v1/keys/${encodeURIComponent(value)}`);
      show(created, done.propagated === false
        ? h("p", { class: "warn" }, `${done.detail} (logged at index ${num(done.log_index)})`)
        : h("p", { class: "ok" }, `revoked (logged at index ${num(done.log_index)})`));
      refresh();
    } catch (error) {
      ctx.fail(created, error);
    }
  });
  const fillTenants = (tenants) => show(tenant, tenants.map((t) =>
    h("option", { value: t.id }, t.id)));
  tenantsOf(fillTenants);
  refresh();
  return card("Tenant API keys", list, createForm, revokeForm, created);
}

export function render(node, ctx) {
  const policy = h("div", {}, h("p", { class: "muted" }, "loading…"));
  const tenants = h("div", {});
  const rules = h("div", {});
  let tenantsFilled = false;
  const rulesTimeline = timeline("/admin/v1/timeline/policies");
  const explain = explainForm(ctx);
  const waiting = [];
  show(node,
    h("h1", {}, "Security"),
    card("Policy set", policy),
    card("Tenants and the policy that binds each", tenants),
    card("Policies, their rules, and decisions and refusals per rule", rules),
    card("Explain a decision", explain.node),
    testsCard(ctx),
    keysCard(ctx, (fn) => waiting.push(fn)));
  return every(POLL_MS, async (stop) => {
    let policySet;
    try {
      policySet = await get("/admin/v1/policies");
      show(policy, policyCard(policySet));
    } catch (error) {
      if (error.status === 401 || error.status === 403) {
        stop();
        ctx.fail(node, error);
      } else {
        ctx.fail(policy, error);
      }
      return;
    }
    try {
      const found = (await get("/admin/v1/tenants")).tenants;
      show(tenants, tenantsTable(found, policySet, explain.fill));
      if (!tenantsFilled) {
        tenantsFilled = true;
        waiting.forEach((fn) => fn(found));
      }
    } catch (error) {
      ctx.fail(tenants, error);
    }
    try {
      show(rules, rulesCard(policySet, await rulesTimeline()));
    } catch (error) {
      ctx.fail(rules, error);
    }
  });
}
