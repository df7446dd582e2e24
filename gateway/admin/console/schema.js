// Reading the admin API's OpenAPI document (/openapi.json) for the API page: `$ref`s
// resolved into components/schemas (local ones only; a cycle is named, not followed;
// nesting shown to MAX_DEPTH levels), a schema drawn as a tree of text, and an example
// value built from a schema to prefill a request body. The document is data: every
// name, description and default becomes a text node, never markup.

import { h } from "./dom.js";

export const MAX_DEPTH = 6;
const PREFIX = "#/components/schemas/";

// `resolve(schema)` → [name, schema]: for a `$ref` into components/schemas its name and
// target (null when the document has no such schema), else [null, schema] itself.
export function resolver(document) {
  const schemas = (document.components && document.components.schemas) || {};
  return (schema) => {
    const ref = schema && typeof schema === "object" ? schema.$ref : undefined;
    if (typeof ref !== "string") return [null, schema];
    const name = ref.startsWith(PREFIX) ? ref.slice(PREFIX.length) : ref;
    return [name, ref.startsWith(PREFIX) && Object.hasOwn(schemas, name) ? schemas[name] : null];
  };
}

function options(schema) {
  return schema.anyOf || schema.oneOf || schema.allOf || null;
}

// A schema's type in a few words: "string", "array of KeyRow", "Limits | null", "map of
// QueueStatus", "\"json\" | \"html\"".
export function typeName(schema, resolve, depth = 0) {
  const [name, target] = resolve(schema);
  if (name !== null) return name;
  if (!target || typeof target !== "object") return "any";
  if (depth >= MAX_DEPTH) return "…";
  const choice = options(target);
  if (Array.isArray(choice)) {
    return choice.map((o) => typeName(o, resolve, depth + 1)).join(target.allOf ? " & " : " | ");
  }
  if (Array.isArray(target.enum)) return target.enum.map((v) => JSON.stringify(v)).join(" | ");
  if ("const" in target) return JSON.stringify(target.const);
  const type = Array.isArray(target.type) ? target.type.join(" | ") : target.type;
  if (type === "array") {
    return target.items ? `array of ${typeName(target.items, resolve, depth + 1)}` : "array";
  }
  const extra = target.additionalProperties;
  if (type === "object" && !target.properties && extra && typeof extra === "object") {
    return `map of ${typeName(extra, resolve, depth + 1)}`;
  }
  return type || (target.properties ? "object" : "any");
}

const LIMITS = [["default", "default"], ["format", "format"], ["minimum", "min"],
  ["maximum", "max"], ["minLength", "min length"], ["maxLength", "max length"],
  ["maxItems", "max items"], ["pattern", "pattern"]];

function limits(schema) {
  const found = LIMITS.filter(([key]) => key in schema)
    .map(([key, label]) => `${label} ${JSON.stringify(schema[key])}`);
  return found.length ? h("span", { class: "muted" }, ` (${found.join(", ")})`) : null;
}

// The fields of an object schema (through arrays, maps, unions and `$ref`s) as a nested
// list, or null for a schema with none. `seen`: the schemas on the way here.
function fields(schema, resolve, depth, seen) {
  const [name, target] = resolve(schema);
  if (!target || typeof target !== "object" || (name !== null && seen.has(name))) return null;
  const inside = name === null ? seen : new Set(seen).add(name);
  if (depth >= MAX_DEPTH) return h("p", { class: "muted" }, "(deeper levels not shown)");
  if (target.properties && typeof target.properties === "object") {
    const required = new Set(Array.isArray(target.required) ? target.required : []);
    return h("ul", { class: "schema" }, Object.entries(target.properties).map(([key, field]) => {
      const [, own] = resolve(field);
      return h("li", {}, h("code", {}, key), " ",
        h("span", { class: "type" }, typeName(field, resolve)),
        required.has(key) ? h("span", { class: "required" }, " required") : null,
        own && own.description ? ` — ${own.description}` : null, own ? limits(own) : null,
        fields(field, resolve, depth + 1, inside));
    }));
  }
  if (target.items) return fields(target.items, resolve, depth + 1, inside);
  if (target.additionalProperties && typeof target.additionalProperties === "object") {
    return fields(target.additionalProperties, resolve, depth + 1, inside);
  }
  const choice = options(target);
  if (Array.isArray(choice)) {
    const shown = choice.map((o) => fields(o, resolve, depth + 1, inside)).filter(Boolean);
    return shown.length ? h("div", {}, shown) : null;
  }
  return null;
}

// A schema as the page shows it: its type, description, limits and its fields.
export function schemaView(schema, resolve) {
  const [, target] = resolve(schema);
  return h("div", { class: "schema-view" },
    h("span", { class: "type" }, typeName(schema, resolve)),
    target && target.description ? h("span", { class: "muted" }, ` — ${target.description}`)
      : null,
    fields(schema, resolve, 0, new Set()));
}

function firstType(schema) {
  const types = Array.isArray(schema.type) ? schema.type : [schema.type];
  return types.find((t) => t !== "null") || (schema.properties ? "object" : undefined);
}

// An example value of `schema` to prefill a request body: its own example or default
// where it declares one, else built from the type (an object's required fields only: an
// optional field left out takes its default on the server).
export function example(schema, resolve, depth = 0, seen = new Set()) {
  const [name, target] = resolve(schema);
  if (!target || typeof target !== "object" || depth > MAX_DEPTH) return null;
  if (name !== null && seen.has(name)) return null;
  const inside = name === null ? seen : new Set(seen).add(name);
  if ("example" in target) return target.example;
  if (Array.isArray(target.examples) && target.examples.length) return target.examples[0];
  if ("default" in target) return target.default;
  if ("const" in target) return target.const;
  if (Array.isArray(target.enum) && target.enum.length) return target.enum[0];
  const choice = options(target);
  if (Array.isArray(choice)) {
    const option = choice.find((o) => {
      const [, t] = resolve(o);
      return t && t.type !== "null";
    });
    return option ? example(option, resolve, depth + 1, inside) : null;
  }
  switch (firstType(target)) {
    case "object": {
      const out = Object.create(null); // a field named "__proto__" stays a field
      const properties = target.properties || {};
      for (const key of Array.isArray(target.required) ? target.required : []) {
        if (Object.hasOwn(properties, key)) {
          out[key] = example(properties[key], resolve, depth + 1, inside);
        }
      }
      return out;
    }
    case "array": {
      const item = target.items ? example(target.items, resolve, depth + 1, inside) : null;
      return item === null ? [] : [item];
    }
    case "string": return "string";
    case "integer": case "number": return typeof target.minimum === "number" ? target.minimum : 0;
    case "boolean": return false;
    default: return null;
  }
}
