// Talking to the admin API: every call carries the token the user pasted into the login
// form, kept in sessionStorage (this tab only; never localStorage, never a URL). An API
// error (the OpenAI error object) becomes an ApiError with its status and message.

const TOKEN = "owngate.console.token";

// Why this page must not send a token, or null. A page served over plain HTTP under a DNS
// name can be a rebound name (DNS rebinding): an attacker's name that resolved to the admin
// listener while the console loaded and resolves to the attacker's server by the next
// call, which then carries the token. An IP address cannot be rebound, `localhost` is
// loopback (`*.localhost` is in some browsers only: refused), and over HTTPS the name must
// match the certificate of the server the browser reached (a reverse proxy's). The URL
// parser has already made the host canonical: lower case, `127.1` and `0x7f.1` as
// `127.0.0.1`, `localhost.` kept as it is (refused).
export function unsafeOrigin(where = location) {
  if (where.protocol === "https:") return null;
  const host = where.hostname;
  if (/^\d{1,3}(\.\d{1,3}){3}$/.test(host) || host.startsWith("[")) return null;
  if (host === "localhost") return null;
  return `This page was opened at ${host} over plain HTTP: a DNS name can be re-pointed ` +
    "(DNS rebinding) and the token sent wherever it then leads. Open the console at the " +
    "admin listener's IP address (http://127.0.0.1:PORT/console/), at localhost, or " +
    "through an HTTPS reverse proxy.";
}

export function token() {
  return sessionStorage.getItem(TOKEN);
}

export function setToken(value) {
  sessionStorage.setItem(TOKEN, value);
}

export function forget() {
  sessionStorage.removeItem(TOKEN);
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// One call with the token, `text` (JSON text, or undefined: no body) as its body: the
// Response whatever its status. The API page's "try it" shows it as it is.
export function exchange(method, path, text) {
  const unsafe = unsafeOrigin();
  if (unsafe) return Promise.reject(new ApiError(401, "unsafe_origin", unsafe));
  const headers = { Authorization: `Bearer ${token() || ""}` };
  const init = { method, headers, cache: "no-store", credentials: "omit" };
  if (text !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = text;
  }
  return fetch(path, init);
}

async function send(method, path, body) {
  const response = await exchange(method, path, body === undefined ? undefined
    : JSON.stringify(body));
  if (!response.ok) {
    let code = null;
    let message = response.statusText || `HTTP ${response.status}`;
    try {
      const error = (await response.json()).error;
      code = error.code;
      message = error.message;
    } catch (_) {
      // not an OpenAI error object: keep the status text
    }
    throw new ApiError(response.status, code, message);
  }
  return response;
}

// The JSON (or, for text/plain such as the checkpoint, the text) of a call.
export async function call(method, path, body) {
  const response = await send(method, path, body);
  const type = response.headers.get("content-type") || "";
  return type.includes("json") ? response.json() : response.text();
}

export const get = (path) => call("GET", path);
export const post = (path, body) => call("POST", path, body === undefined ? {} : body);
export const del = (path) => call("DELETE", path);

// A file from the API, fetched with the token and offered as a download (a Blob URL:
// the token never goes in a link).
export async function download(path, filename) {
  const blob = await (await send("GET", path)).blob();
  const url = URL.createObjectURL(blob);
  const link = document.createElement("a");
  link.href = url;
  link.download = filename;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
}

// Run `fn(stop)` now and every `ms` until the returned function (or `stop`) is called:
// a page's polling. A run still in flight when the next is due is not doubled.
export function every(ms, fn) {
  let busy = false;
  let timer = null;
  const stop = () => clearInterval(timer);
  const tick = async () => {
    if (busy) return;
    busy = true;
    try {
      await fn(stop);
    } finally {
      busy = false;
    }
  };
  timer = setInterval(tick, ms);
  tick();
  return stop;
}

// A timeline endpoint polled with `?since=` (only the samples newer than the last one
// held): each call returns {interval_s, samples} over the last `windowS` seconds, and
// the page keeps at most that window, however long it stays open.
export function timeline(path, windowS = 600) {
  let samples = [];
  return async () => {
    const last = samples.length ? samples[samples.length - 1].t : null;
    const found = await get(last === null ? path : `${path}?since=${last}`);
    samples = samples.concat(found.samples);
    // the wall clock stepped back between two samples: keep those after the step (the
    // older ones are dated after them and would be charted to their right)
    for (let i = samples.length - 1; i > 0; i -= 1) {
      if (samples[i].t < samples[i - 1].t) {
        samples = samples.slice(i);
        break;
      }
    }
    const newest = samples.length ? samples[samples.length - 1].t : 0;
    samples = samples.filter((sample) => sample.t > newest - windowS);
    return { interval_s: found.interval_s, samples };
  };
}
