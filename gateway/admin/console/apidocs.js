// The API page (#api, any role): the admin API's interactive docs, drawn from its own
// /openapi.json by this origin's scripts. FastAPI's Swagger UI loads from a CDN, and
// the console takes nothing from another origin (docs/console.md). Every operation,
// grouped by its tags (the roles it needs): method, path, summary, parameters, request
// and response schemas, and a "try it" form that calls it with the logged-in token and
// shows the status and the body as text. An operation that changes the gateway asks
// first.

import { exchange, get } from "./api.js";
import { card, h, show, table } from "./dom.js";
import { example, resolver, schemaView, typeName } from "./schema.js";

const METHODS = ["get", "put", "post", "delete", "patch"];
// POSTs that only compute an answer: every other method but GET changes the gateway (and
// is recorded in the provenance log), so it asks before it is sent; an endpoint added
// later asks too until it is listed here.
const READ_ONLY = new Set(["POST /admin/v1/policies/explain", "POST /admin/v1/policies/test",
  "POST /admin/v1/config/validate", "POST /admin/v1/receipts/verify"]);
const SHOWN_BYTES = 200000; // of an answer's body: the rest is counted, not drawn
const HEX_BYTES = 512; // of a binary answer (a tile)

function operations(document) {
  const found = [];
  for (const [path, item] of Object.entries(document.paths || {})) {
    for (const method of METHODS) {
      const op = item && item[method];
      if (!op) continue;
      const params = [...(item.parameters || []), ...(op.parameters || [])]
        .filter((p) => p && typeof p.name === "string");
      found.push({ method: method.toUpperCase(), path, op, params });
    }
  }
  return found;
}

function grouped(ops) {
  const groups = new Map();
  for (const entry of ops) {
    const key = (entry.op.tags || []).join(", ") || "untagged";
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(entry);
  }
  return groups;
}

function jsonSchema(content) {
  const json = content && content["application/json"];
  return json && json.schema ? json.schema : null;
}

function parametersView(params, resolve) {
  if (!params.length) return null;
  return h("div", {}, h("h4", {}, "Parameters"), table([["name"], ["in"], ["type"],
    ["required"], ["description"]], params.map((p) => [h("code", {}, p.name), p.in,
    typeName(p.schema, resolve), p.required ? "yes" : "no",
    p.description || (p.schema && p.schema.description) || ""])));
}

function bodyView(requestBody, resolve) {
  if (!requestBody) return null;
  const types = Object.keys(requestBody.content || {});
  const schema = jsonSchema(requestBody.content);
  return h("div", { class: "request-body" },
    h("h4", {}, "Request body", requestBody.required ? " (required)" : "",
      ` · ${types.join(", ")}`),
    schema ? schemaView(schema, resolve) : null);
}

function responsesView(responses, resolve) {
  return h("div", {}, h("h4", {}, "Responses"), Object.entries(responses || {}).map(
    ([status, answer]) => {
      const types = Object.keys(answer.content || {});
      const schema = jsonSchema(answer.content);
      return h("div", { class: "response", "data-response": status },
        h("p", {}, h("strong", {}, status), ` ${answer.description || ""}`,
          types.length ? h("span", { class: "muted" }, ` · ${types.join(", ")}`) : null),
        schema ? schemaView(schema, resolve) : null);
    }));
}

// The URL of a call: path parameters encoded into their segment (a value of "", "." or
// ".." would make another path, so it is refused), query parameters that have a value.
function target(path, fields) {
  let url = path;
  const query = new URLSearchParams();
  for (const [param, input] of fields) {
    const value = input.value;
    if (param.in === "path") {
      if (value === "" || value === "." || value === "..") {
        throw new Error(`the path parameter ${param.name} needs a value (not "." or "..")`);
      }
      url = url.split(`{${param.name}}`).join(encodeURIComponent(value));
    } else if (value !== "") {
      query.append(param.name, value);
    } else if (param.required) {
      throw new Error(`the query parameter ${param.name} needs a value`);
    }
  }
  const search = query.toString();
  return search ? `${url}?${search}` : url;
}

function hex(bytes) {
  const rows = [];
  for (let at = 0; at < bytes.length; at += 16) {
    rows.push(Array.from(bytes.subarray(at, at + 16),
      (b) => b.toString(16).padStart(2, "0")).join(" "));
  }
  return rows.join("\n");
}

// An answer's body as text: JSON indented, other text as it is, binary as hex; bounded.
function bodyText(type, bytes) {
  const rest = bytes.length - SHOWN_BYTES;
  const more = rest > 0 ? `\n… (${rest} more bytes not shown)` : "";
  if (type && !type.includes("json") && !type.startsWith("text/")) {
    const left = bytes.length - HEX_BYTES;
    return hex(bytes.subarray(0, HEX_BYTES)) + (left > 0 ? `\n… (${left} more bytes)` : "");
  }
  const text = new TextDecoder().decode(bytes.subarray(0, SHOWN_BYTES));
  if (type.includes("json") && rest <= 0) {
    try {
      return JSON.stringify(JSON.parse(text), null, 2);
    } catch (_) {
      // not JSON after all: shown as the text it is
    }
  }
  return text + more;
}

async function answerView(response) {
  const type = response.headers.get("content-type") || "";
  const bytes = new Uint8Array(await response.arrayBuffer());
  return h("div", { class: "answer" },
    h("p", {}, h("strong", { class: response.ok ? "ok" : "bad", "data-status": response.status },
      `${response.status} ${response.statusText}`),
    h("span", { class: "muted" }, ` · ${type || "no content type"} · ${bytes.length} bytes`)),
    h("pre", { "data-answer": "" }, bodyText(type, bytes)));
}

function tryIt({ method, path, op, params }, resolve) {
  const fields = params.filter((p) => p.in === "path" || p.in === "query").map((p) => [p,
    h("input", { "data-param": p.name, required: p.in === "path", spellcheck: "false",
      placeholder: p.schema && "default" in p.schema ? String(p.schema.default) : p.in })]);
  const schema = op.requestBody ? jsonSchema(op.requestBody.content) : null;
  const body = op.requestBody ? h("textarea", { "data-body": "", spellcheck: "false" },
    schema ? JSON.stringify(example(schema, resolve), null, 2) : "") : null;
  const out = h("div", { class: "try-result" });
  const form = h("form", { class: "try" },
    h("h4", {}, "Try it"),
    fields.length ? h("div", { class: "inline" }, fields.map(([p, input]) =>
      h("label", {}, `${p.name} (${p.in})`, input))) : null,
    body ? h("label", { class: "body" }, "JSON body", body) : null,
    h("button", { type: "submit", class: READ_ONLY.has(`${method} ${path}`) || method === "GET"
      ? "primary" : "danger" }, `Send ${method}`), out);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    let url;
    try {
      url = target(path, fields);
    } catch (problem) {
      show(out, h("p", { class: "error" }, problem.message));
      return;
    }
    const changes = method !== "GET" && !READ_ONLY.has(`${method} ${path}`);
    if (changes && !window.confirm(`${method} ${url} changes the running gateway `
      + "(and is recorded in the provenance log). Send it?")) {
      return;
    }
    show(out, "sending…");
    const text = body && body.value.trim() ? body.value : undefined;
    try {
      show(out, await answerView(await exchange(method, url, text)));
    } catch (error) {
      show(out, h("p", { class: "error" }, `not sent: ${error.message || error}`));
    }
  });
  return form;
}

function operationView(entry, resolve) {
  const { method, path, op, params } = entry;
  return h("details", { class: "op", "data-operation": `${method} ${path}` },
    h("summary", {}, h("span", { class: `method m-${method.toLowerCase()}` }, method), " ",
      h("code", {}, path), " ", h("span", { class: "muted" }, op.summary || "")),
    op.description ? h("p", {}, op.description) : null,
    h("p", {}, "roles (tags): ", h("strong", {}, (op.tags || []).join(", ") || "none")),
    parametersView(params, resolve),
    bodyView(op.requestBody, resolve),
    responsesView(op.responses, resolve),
    tryIt(entry, resolve));
}

function page(document) {
  const resolve = resolver(document);
  const ops = operations(document);
  const info = document.info || {};
  return h("div", { "data-operations": ops.length },
    h("h1", {}, "API"),
    card(`${info.title || "API"} ${info.version || ""}`,
      info.description ? h("p", {}, info.description) : null,
      h("p", {}, "The OpenAPI schema: ", h("a", { href: "/openapi.json" }, "/openapi.json"),
        `, ${ops.length} operations. Open one to read it; "try it" calls it with the token`
        + " you logged in with (a role the operation does not name gets 403)."),
      h("p", { class: "muted" }, "An operation that changes the gateway asks before it is"
        + " sent, and the admin record it writes to the provenance log names your token.")),
    [...grouped(ops)].map(([tag, entries]) => h("section", { class: "card", "data-tag": tag },
      h("h2", {}, tag), entries.map((entry) => operationView(entry, resolve)))));
}

export function render(node, ctx) {
  let stopped = false;
  show(node, h("h1", {}, "API"), h("p", { class: "muted" }, "loading /openapi.json…"));
  get("/openapi.json").then((document) => {
    if (!stopped) show(node, page(document));
  }, (error) => {
    if (!stopped) ctx.fail(node, error);
  });
  return () => {
    stopped = true;
  };
}
