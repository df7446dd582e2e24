// Building the page from data with DOM APIs only: every value becomes a text node
// (textContent), never markup, so a hostile backend id, tenant, rule or error message
// shows as the text it is. Nothing here takes HTML.

// h("td", {class: "num"}, 42): an element with attributes (a function for "on<event>"
// is a listener) and children (strings and numbers as text nodes, nodes as they are,
// null/undefined skipped, arrays flattened).
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (typeof value === "function" && name.startsWith("on")) {
      node.addEventListener(name.slice(2), value);
    } else {
      node.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(node, children);
  return node;
}

export function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// Replace what `node` shows.
export function show(node, ...children) {
  node.replaceChildren();
  return append(node, children);
}

// A table: `columns` are [title, {num: true}?]; rows are arrays of cell contents.
export function table(columns, rows, empty = "none") {
  const head = h("tr", {}, columns.map(([title, opts]) =>
    h("th", { class: opts && opts.num ? "num" : null }, title)));
  const body = rows.length
    ? rows.map((row) => h("tr", {}, row.map((cell, i) => {
        const opts = columns[i] && columns[i][1];
        return h("td", { class: opts && opts.num ? "num" : null }, cell);
      })))
    : [h("tr", {}, h("td", { colspan: columns.length, class: "muted" }, empty))];
  return h("table", {}, h("thead", {}, head), h("tbody", {}, body));
}

export function card(title, ...children) {
  return h("section", { class: "card" }, h("h2", {}, title), children);
}

// How a number reads in a table: "-" for unknown (null), fixed digits otherwise.
export function num(value, digits = 0) {
  if (value === null || value === undefined) return "-";
  return typeof value === "number" ? value.toFixed(digits) : String(value);
}

export function percent(value) {
  return value === null || value === undefined ? "-" : `${(value * 100).toFixed(1)}%`;
}

export function when(unixSeconds) {
  if (unixSeconds === null || unixSeconds === undefined) return "-";
  return new Date(unixSeconds * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}
