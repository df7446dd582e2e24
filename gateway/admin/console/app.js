// The console's shell: login, the hash routes (#operator, #security, #auditor, and #api
// for any role), and the 403 page for a role that may not use a page. Each page module exports
// `render(node, context)` and returns a function that stops its polling.

import { ApiError, forget, get, setToken, token, unsafeOrigin } from "./api.js";
import { h, show } from "./dom.js";
import * as apidocs from "./apidocs.js";
import * as auditor from "./auditor.js";
import * as operator from "./operator.js";
import * as security from "./security.js";

const PAGES = { operator, security, auditor, api: apidocs };
const NAMES = Object.keys(PAGES);
const ROLES = ["operator", "security", "auditor"]; // the pages whoami's `may` grants

let stop = () => {};
let who = null; // {role, may} from /admin/v1/whoami

const $ = (id) => document.getElementById(id);

// The 403 page: what the API (or whoami's `may`) said, and the role the page needs.
function forbidden(node, page, message) {
  show(node, h("section", { class: "card forbidden", "data-forbidden": page },
    h("span", { class: "code" }, "403"),
    h("p", {}, `This page needs the ${page} role`,
      who ? ` (you are logged in as ${who.role}).` : "."),
    message ? h("p", { class: "muted" }, message) : null));
}

// An API error where a page shows it: 403 as the page above, 401 back to the login.
function failed(node, page, error) {
  if (error instanceof ApiError && error.status === 401) {
    logout(error.message);
    return;
  }
  if (error instanceof ApiError && error.status === 403) {
    forbidden(node, page, error.message);
    return;
  }
  if (!(error instanceof ApiError)) {
    console.error(error); // a bug in the page, not an answer: the browser tests fail on it
  }
  show(node, h("p", { class: "error" }, error instanceof ApiError
    ? `${error.status} ${error.code || ""}: ${error.message}` : String(error)));
}

function logout(message) {
  stop();
  forget();
  who = null;
  $("nav").hidden = true;
  $("logout").hidden = true;
  show($("who"));
  show($("page"));
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("token").focus();
}

async function identify() {
  try {
    who = await get("/admin/v1/whoami");
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) throw error;
    who = null; // an API without whoami: each page learns its access from its calls
  }
}

function route() {
  stop();
  stop = () => {};
  const wanted = location.hash.replace(/^#/, "");
  const mayUse = who && Array.isArray(who.may) ? who.may : ROLES;
  const page = NAMES.includes(wanted) ? wanted : (mayUse[0] || "operator");
  if (wanted !== page) {
    history.replaceState(null, "", `#${page}`);
  }
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.page === page);
  }
  const node = $("page");
  node.dataset.page = page;
  if (ROLES.includes(page) && who && Array.isArray(who.may) && !who.may.includes(page)) {
    forbidden(node, page, `Your token may use: ${who.may.join(", ") || "no page"}.`);
    return;
  }
  show(node);
  stop = PAGES[page].render(node, { fail: (where, error) => failed(where, page, error) });
}

async function start() {
  $("login").hidden = true;
  try {
    await identify();
  } catch (error) {
    logout(error.message);
    return;
  }
  $("nav").hidden = false;
  $("logout").hidden = false;
  show($("who"), who ? `role: ${who.role}` : "");
  route();
}

function boot() {
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("token").value.trim();
    $("token").value = "";
    if (!value) return;
    const unsafe = unsafeOrigin(); // never keep (nor send) a token on a rebindable page
    if (unsafe) {
      logout(unsafe);
      return;
    }
    setToken(value);
    start();
  });
  $("logout").addEventListener("click", () => logout(""));
  window.addEventListener("hashchange", () => {
    if (token()) route();
  });
  if (token() && !unsafeOrigin()) start();
  else logout(unsafeOrigin() || "");
}

boot();
