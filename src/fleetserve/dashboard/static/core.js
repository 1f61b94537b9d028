"use strict";
// The dashboard's core: the registry of views (tabs), API calls with the API key, live
// updates (server-sent events read with fetch, so the key can go in a header; polling
// as the fallback), hash routing and small DOM and formatting helpers.
//
// A view registers itself with FS.register({
//   name,            // matches the server view (change events carry it)
//   title,           // the tab's label
//   mount(root),     // once: build the view's skeleton in its <section>
//   show(arg),       // routed to: #/<name>/<arg>
//   refresh(),       // fetch and re-render (a promise); the core coalesces calls
// }).
(() => {
  const KEY = "fleetserve.apiKey";
  const POLL_MS = 3000;
  const views = new Map();
  const known = {}; // the last version seen of each view
  let active = null;
  let locked = false;
  const $ = (id) => document.getElementById(id);

  // -- DOM helpers ------------------------------------------------------------------
  function build(ns, tag, attrs, children) {
    const node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") node.textContent = String(v);
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }
  const el = (tag, attrs, ...children) => build(null, tag, attrs, children);
  const svg = (tag, attrs, ...children) =>
    build("http://www.w3.org/2000/svg", tag, attrs, children);

  // -- formatting: every helper takes anything and never throws ----------------------
  const isNum = (v) => typeof v === "number" && Number.isFinite(v);
  const fmt = {
    num(v, digits = 0) {
      if (!isNum(v)) return "—";
      return v.toLocaleString("en-US", {
        minimumFractionDigits: digits,
        maximumFractionDigits: digits,
      });
    },
    auto(v) {
      if (!isNum(v)) return "—";
      const a = Math.abs(v);
      return fmt.num(v, a >= 100 ? 0 : a >= 10 ? 1 : a >= 1 ? 2 : 3);
    },
    // short labels (axis ticks); `step` is the spacing between neighbours, if known
    compact(v, step) {
      if (!isNum(v)) return "";
      const a = Math.abs(v);
      const digits = (unit) => (isNum(step) && step > 0 ?
        Math.min(6, Math.max(0, -Math.floor(Math.log10(step / unit) + 1e-9))) : 1);
      if (a >= 1e6) return (v / 1e6).toFixed(digits(1e6)) + "M";
      if (a >= 1e3) return (v / 1e3).toFixed(digits(1e3)) + "k";
      if (isNum(step)) return v.toFixed(digits(1));
      return String(+v.toFixed(a >= 10 ? 0 : 2));
    },
    // quality metrics: 4 decimals (0.9993 against a 0.999 gate), else as auto
    precise: (v) => (isNum(v) && Math.abs(v) < 10 ? v.toFixed(4) : fmt.auto(v)),
    ms: (v) => (isNum(v) ? fmt.auto(v) + " ms" : "—"),
    pct: (v) => (isNum(v) ? fmt.num(v * 100, 1) + " %" : "—"),
    dur(s) {
      if (!isNum(s)) return "—";
      if (s < 60) return fmt.num(s, s < 10 ? 1 : 0) + " s";
      const [big, small, unit, sub] = s < 3600 ? [Math.floor(s / 60), Math.round(s % 60), "min", "s"]
        : [Math.floor(s / 3600), Math.round((s % 3600) / 60), "h", "min"];
      return small ? `${big} ${unit} ${small} ${sub}` : `${big} ${unit}`;
    },
    ago(iso) {
      const t = typeof iso === "string" ? Date.parse(iso) : NaN;
      if (!Number.isFinite(t)) return "—";
      const s = Math.max(0, (Date.now() - t) / 1000);
      if (s < 5) return "just now";
      if (s < 60) return `${Math.floor(s)} s ago`;
      if (s < 3600) return `${Math.floor(s / 60)} min ago`;
      if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
      return new Date(t).toISOString().slice(0, 10);
    },
    text: (v) => (v === null || v === undefined || v === "" ? "—" :
      typeof v === "object" ? JSON.stringify(v) : String(v)),
  };
  // a relative time that keeps itself current
  const ago = (iso) => el("time", { datetime: iso, title: iso, "data-ago": iso, text: fmt.ago(iso) });

  // -- the API key --------------------------------------------------------------------
  const storage = {
    get() { try { return sessionStorage.getItem(KEY) || ""; } catch { return ""; } },
    set(v) { try { sessionStorage.setItem(KEY, v); } catch { /* storage disabled */ } },
    clear() { try { sessionStorage.removeItem(KEY); } catch { /* storage disabled */ } },
  };
  function authHeaders() {
    const key = storage.get();
    return key ? { Authorization: "Bearer " + key } : {};
  }
  class AuthError extends Error {}
  class ApiError extends Error {
    constructor(message, status, code) { super(message); this.status = status; this.code = code; }
  }

  // a 401 locks only if it answers the key in use now: one that answers a request sent
  // with an older key (still in flight when a new key was entered) is stale
  function refused(sentWith) {
    if (sentWith === storage.get()) lock(sentWith ? "That key was refused." : "");
  }

  async function api(path) {
    const key = storage.get();
    const res = await fetch(path, {
      headers: { Accept: "application/json", ...authHeaders() },
      cache: "no-store",
    });
    if (res.status === 401) { refused(key); throw new AuthError("locked"); }
    let body = null;
    try { body = await res.json(); } catch { /* not JSON */ }
    if (!res.ok) {
      const err = body && body.error ? body.error : {};
      throw new ApiError(err.message || `${res.status} ${res.statusText}`, res.status, err.code);
    }
    return body;
  }

  function lock(message) {
    locked = true;
    setLive("locked", "API key needed");
    $("key-form").hidden = false;
    $("key-error").textContent = message || "";
    $("forget-key").hidden = true;
    $("key-input").focus();
  }
  function unlock(key) {
    storage.set(key);
    locked = false;
    $("key-form").hidden = true;
    $("forget-key").hidden = false;
    wake();
    refreshAll();
  }

  // -- refreshing views ------------------------------------------------------------------
  async function refresh(view) {
    if (view !== active) { view.dirty = true; return; } // refreshed when shown
    if (view.busy) { view.again = true; return view.busy; }
    view.busy = (async () => {
      do {
        view.again = false;
        try {
          await view.refresh();
          notice(view, "");
          if (live.state === "offline") setLive(live.pollTimer === null ? "live" : "polling");
        } catch (e) {
          if (!(e instanceof AuthError)) {
            notice(view, `Could not refresh: ${e.message}. Showing the last data.`);
            if (e instanceof TypeError) setLive("offline", "offline: " + e.message);
          }
        }
      } while (view.again && !locked);
      view.busy = null;
    })();
    return view.busy;
  }
  const refreshAll = () => { for (const v of views.values()) refresh(v); };

  function notice(view, message) {
    const n = view.root && view.root.querySelector(":scope > .view-notice");
    if (!n) return;
    n.textContent = message;
    n.hidden = !message;
  }

  // -- live updates: SSE over fetch, polling when that fails ----------------------------
  const live = { mode: "sse", state: "connecting", pollTimer: null, wakeUp: null };
  function setLive(state, label) {
    live.state = state;
    const node = $("live");
    node.dataset.state = state;
    node.textContent = label || state;
  }
  const sleep = (ms) => new Promise((r) => { live.wakeUp = r; setTimeout(r, ms); });
  const wake = () => { if (live.wakeUp) live.wakeUp(); };

  function onEvent(name, data) {
    if (name === "hello") {
      for (const [view, version] of Object.entries(data.versions || {})) seen(view, version);
    } else if (name === "change") {
      seen(data.view, data.version);
    }
  }
  function seen(name, version) {
    if (known[name] === version) return;
    known[name] = version;
    const view = views.get(name);
    if (view) refresh(view);
  }

  async function readEvents(body) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += value.replace(/\r\n?/g, "\n");
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        let name = "message";
        const data = [];
        for (const line of block.split("\n")) {
          if (line.startsWith("event:")) name = line.slice(6).trim();
          else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
        }
        if (!data.length) continue; // a comment (keep-alive) or retry:
        try { onEvent(name, JSON.parse(data.join("\n"))); } catch { /* a bad event */ }
      }
    }
  }

  async function sseLoop() {
    let failures = 0;
    for (;;) {
      if (locked) { await sleep(60000); continue; }
      try {
        const key = storage.get();
        const res = await fetch("/dashboard/events", {
          headers: { Accept: "text/event-stream", ...authHeaders() },
          cache: "no-store",
        });
        if (res.status === 401) { refused(key); continue; }
        if (!res.ok || !res.body) throw new Error(`events: ${res.status}`);
        failures = 0;
        stopPolling();
        setLive("live", "live");
        const opened = Date.now();
        await readEvents(res.body); // until the server ends the stream: reconnect at once
        if (Date.now() - opened < 2000) await sleep(2000); // unless it ends at once, again
      } catch (e) {
        failures += 1;
        startPolling();
      }
      if (failures) await sleep(Math.min(30000, 1000 * 2 ** failures));
    }
  }

  function startPolling() {
    if (live.pollTimer === null) {
      live.pollTimer = setInterval(() => { if (!locked && active) refresh(active); }, POLL_MS);
    }
    if (live.state !== "offline" && !locked) setLive("polling", "polling");
  }
  function stopPolling() {
    if (live.pollTimer !== null) clearInterval(live.pollTimer);
    live.pollTimer = null;
  }

  // -- tabs and routing: #/<view>/<arg> -----------------------------------------------------
  function route() {
    const parts = location.hash.replace(/^#\/?/, "").split("/");
    const view = views.get(decodeURIComponent(parts[0] || "")) || views.values().next().value;
    const arg = parts.slice(1).map(decodeURIComponent).join("/");
    return { view, arg };
  }
  const link = (name, arg) =>
    "#/" + encodeURIComponent(name) + (arg ? "/" + encodeURIComponent(arg) : "");

  function show() {
    const { view, arg } = route();
    if (!view) return;
    active = view;
    for (const v of views.values()) {
      v.root.hidden = v !== view;
      v.tab.setAttribute("aria-selected", String(v === view));
    }
    view.show(arg);
    view.dirty = false;
    refresh(view);
  }

  function start() {
    const tabs = $("tabs");
    const main = $("views");
    for (const view of views.values()) {
      view.tab = el("a", { class: "tab", role: "tab", href: link(view.name), text: view.title });
      tabs.append(view.tab);
      view.root = el("section", { class: "view", "data-view": view.name, role: "tabpanel" },
        el("p", { class: "view-notice notice", role: "alert", hidden: true }));
      main.append(view.root);
      view.mount(view.root);
    }
    $("key-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const key = $("key-input").value.trim();
      if (key) unlock(key);
    });
    $("forget-key").addEventListener("click", () => { storage.clear(); lock(""); });
    $("forget-key").hidden = !storage.get();
    window.addEventListener("hashchange", show);
    setInterval(() => {
      for (const t of document.querySelectorAll("[data-ago]")) t.textContent = fmt.ago(t.dataset.ago);
    }, 1000);
    const params = new URLSearchParams(location.search);
    live.mode = params.get("live") === "poll" || !window.TextDecoderStream ? "poll" : "sse";
    show();
    if (live.mode === "sse") sseLoop();
    else startPolling();
  }

  window.FS = {
    register: (view) => views.set(view.name, view),
    api, el, svg, fmt, ago, link, isNum, ApiError, AuthError,
    navigate: (name, arg) => { location.hash = link(name, arg); },
  };
  document.addEventListener("DOMContentLoaded", start);
})();
