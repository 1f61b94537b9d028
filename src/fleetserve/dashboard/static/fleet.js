"use strict";
// The fleet view: the workers and the models resident on each (memory against the
// budget), queue lag and age per model and class, throughput and p50 / p99 per model,
// put-backs, redeliveries, dead letters and evictions, and the adapters. One document,
// GET /v1/fleet (fleetserve/dashboard/fleet.py), refreshed on each change event (about
// once a second while anything moves) or each poll. Any field may be missing.
(() => {
  const { el, fmt, isNum, charts } = window.FS;
  const HISTORY_S = 120;
  const MAX_CHIPS = 40; // adapters shown per base
  const CLASSES = ["interactive", "batch"];
  const state = { doc: null, history: [], root: null };
  const list = (v) => (Array.isArray(v) ? v.filter((x) => x && typeof x === "object") : []);
  const obj = (v) => (v && typeof v === "object" && !Array.isArray(v) ? v : {});
  const str = (v) => (v === null || v === undefined ? "" : String(v));
  const num = (v) => (isNum(v) ? v : 0);

  function bytes(n) {
    if (!isNum(n) || n <= 0) return "0";
    const units = [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
    for (const [unit, size] of units) if (n >= size) return `${fmt.auto(n / size)} ${unit}`;
    return `${fmt.num(n)} B`;
  }
  const rate = (v) => (isNum(v) ? (v === 0 ? "0" : fmt.auto(v)) : "—");
  const age = (s) => (isNum(s) && s > 0 ? fmt.dur(s) : "—");
  const badge = (value, kind) => el("span", {
    class: `badge fl-${kind || str(value).replace(/[^a-z_-]/gi, "") || "unknown"}`, text: str(value) || "unknown" });

  function mount(root) {
    state.root = root;
    root.append(el("div", { class: "fleet" },
      el("p", { id: "fleet-notes", class: "notice", hidden: true }),
      el("div", { id: "fleet-tiles", class: "tiles" }),
      el("div", { id: "fleet-charts", class: "card fleet-charts" }),
      el("div", { id: "fleet-workers", class: "card" }),
      el("div", { id: "fleet-models", class: "card" }),
      el("div", { id: "fleet-adapters", class: "card" })));
    let timer = null;
    window.addEventListener("resize", () => {
      clearTimeout(timer);
      timer = setTimeout(() => { if (!root.hidden && state.doc) render(); }, 150);
    });
  }

  function show() {}

  async function refresh() {
    const doc = await window.FS.api("/v1/fleet");
    state.doc = obj(doc);
    const t = Date.now() / 1000;
    const totals = obj(state.doc.totals);
    state.history.push({ t, rps: num(totals.rps), waiting: num(totals.waiting),
      inflight: num(totals.inflight) });
    state.history = state.history.filter((h) => t - h.t <= HISTORY_S);
    render();
  }

  function render() {
    const doc = state.doc;
    const notes = Array.isArray(doc.notes) ? doc.notes : [];
    const n = document.getElementById("fleet-notes");
    n.textContent = [...notes.map(str), doc.mode === "none" ? "This server has no fleet to show." : ""]
      .filter(Boolean).join(" ");
    n.hidden = !n.textContent;
    document.getElementById("fleet-tiles").replaceChildren(...tiles(obj(doc.totals), doc));
    renderCharts();
    renderWorkers(list(doc.workers));
    renderModels(list(doc.models), doc);
    renderAdapters(list(doc.adapters));
  }

  // -- the totals, one tile each ------------------------------------------------------
  function tiles(t, doc) {
    const tile = (key, label, value, sub, warn) => el("div",
      { class: `tile${warn ? " warn" : ""}`, "data-figure": key },
      el("span", { class: "tile-label", text: label }),
      el("span", { class: "tile-value", text: value }),
      el("span", { class: "tile-sub", text: sub || "" }));
    const budget = num(t.memory_budget);
    return [
      tile("workers", "workers", `${fmt.num(num(t.ready))} / ${fmt.num(num(t.workers))}`,
        `ready · ${str(doc.mode) || "?"} mode`, num(t.ready) < num(t.workers)),
      tile("resident", "resident models", fmt.num(num(t.resident)), ""),
      tile("memory", "memory", bytes(t.memory_used), budget ? `of ${bytes(budget)} (${fmt.pct(num(t.memory_used) / budget)})${num(t.memory_host) ? ` · hosts ${bytes(t.memory_host)}` : ""}` : ""),
      tile("rps", "throughput", `${rate(t.rps)} req/s`, `over ${fmt.dur(doc.rate_s)} · ${fmt.num(num(t.requests))} in ${fmt.dur(doc.window_s)}`),
      tile("requests", "answered", fmt.num(num(t.total)), "since start"),
      tile("waiting", "waiting", fmt.num(num(t.waiting)), `oldest ${age(t.age_s)} · ${fmt.num(num(t.inflight))} in flight`, num(t.waiting) > 0),
      tile("errors", "errors", fmt.num(num(t.errors)), "answered with an error", num(t.errors) > 0),
      tile("put_backs", "put-backs", fmt.num(num(t.put_backs)), ""),
      tile("redeliveries", "redeliveries", fmt.num(num(t.redeliveries)), ""),
      tile("dead_letters", "dead letters", fmt.num(num(t.dead_letters)), "", num(t.dead_letters) > 0),
      tile("evictions", "evictions", fmt.num(num(t.evictions)), ""),
    ];
  }

  function renderCharts() {
    const card = document.getElementById("fleet-charts");
    const width = Math.max(260, Math.min(620, ((card.clientWidth || 900) - 60) / 2));
    const now = Date.now() / 1000;
    const pts = (key) => state.history.map((h) => ({ x: h.t - now, y: h[key],
      title: `${fmt.auto(h[key])} ${fmt.dur(now - h.t)} ago` }));
    card.replaceChildren(el("h3", { text: `The last ${fmt.dur(HISTORY_S)} (since this page opened)` }),
      el("div", { class: "fleet-chart-row" },
        charts.plot({ width, height: 180, xLabel: "seconds from now", yLabel: "req/s", y0: true,
          label: "throughput over time", empty: "No samples yet.",
          series: [{ label: "throughput (req/s)", cls: "s-achieved", points: pts("rps") }] }),
        charts.plot({ width, height: 180, xLabel: "seconds from now", yLabel: "requests", y0: true,
          label: "waiting and in-flight requests over time", empty: "No samples yet.",
          series: [{ label: "waiting", cls: "s-p99", points: pts("waiting") },
            { label: "in flight", cls: "s-p50", points: pts("inflight") }] })));
  }

  // -- workers ----------------------------------------------------------------------------
  function renderWorkers(workers) {
    const card = document.getElementById("fleet-workers");
    card.replaceChildren(el("h3", { text: `Workers (${workers.length})` }));
    if (!workers.length) {
      card.append(el("p", { class: "empty", text: "No worker to show yet." }));
      return;
    }
    card.append(el("div", { class: "workers" }, workers.map((w) => {
      const mem = obj(w.memory);
      const used = num(mem.used);
      const budget = num(mem.budget);
      const share = budget ? Math.min(1, used / budget) : 0;
      const bar = el("div", { class: "membar", title: `${bytes(used)} of ${bytes(budget)}` }, el("span", { class: "fill" }));
      bar.firstChild.style.width = (share * 100).toFixed(1) + "%";
      if (share > 0.9) bar.classList.add("high");
      const models = list(w.models);
      const held = models.filter((m) => m.state !== "cold");
      const cold = models.length - held.length;
      return el("div", { class: "worker", "data-worker": str(w.id) },
        el("div", { class: "title-row" }, el("strong", { class: "worker-id", text: str(w.id) }),
          badge(w.ready ? "ready" : "not ready", w.ready ? "ready" : "notready"),
          el("span", { class: "muted", text: [str(w.device), w.pid ? `pid ${w.pid}` : ""].filter(Boolean).join(" · ") })),
        el("div", { class: "memline" }, bar,
          el("span", { class: "memtext", text: budget ?
            `${bytes(used)} of ${bytes(budget)} (${fmt.pct(share)})` : "memory not reported" })),
        hostTier(mem),
        el("ul", { class: "chips" }, held.map((m) => el("li", {
          class: `chip st-${str(m.state)}`, "data-resident": str(m.id), title: m.error ? str(m.error) : `${str(m.state)}, ${bytes(m.bytes)}${m.pinned ? ", pinned" : ""}` },
          el("span", { class: "chip-name", text: str(m.id) }),
          el("small", { text: chipText(m) }))),
          cold ? el("li", { class: "chip cold", text: `${cold} cold` }) : null,
          !models.length ? el("li", { class: "chip cold", text: "no models" }) : null));
    })));
  }

  // the host tier: sleeping models' weights, which leave the memory budget for it
  function hostTier(mem) {
    const tier = num(mem.host_tier_budget);
    return tier ? el("div", { class: "memtier", "data-host-tier": String(tier),
      text: `asleep: ${bytes(num(mem.host_tier_used))} of a ${bytes(tier)} host tier` }) : null;
  }

  function chipText(m) {
    const hot = Array.isArray(m.adapters) ? m.adapters.length : 0;
    return [` ${m.state === "resident" ? bytes(m.bytes) : str(m.state)}`, m.pinned ? "pinned" : "",
      hot ? `${hot} adapter${hot === 1 ? "" : "s"} hot` : ""].filter(Boolean).join(" · ");
  }

  // -- models -----------------------------------------------------------------------------
  function lane(m, cls, key) {
    const l = obj(obj(m.lanes)[cls]);
    return key === "age_s" ? age(l.age_s) : fmt.num(num(l[key]));
  }
  const active = (m) => num(m.waiting) + num(m.inflight) + num(m.requests) > 0 || m.state !== "cold";

  function renderModels(models, doc) {
    const card = document.getElementById("fleet-models");
    const rows = [...models].sort((a, b) => (active(b) - active(a)) || num(b.rps) - num(a.rps) ||
      str(a.id).localeCompare(str(b.id)));
    card.replaceChildren(el("h3", { text: `Models (${models.length})` }),
      el("p", { class: "muted", text: `Throughput over the last ${fmt.dur(doc.rate_s)}, p50 and p99 over ${fmt.dur(doc.window_s)}, as the gateway saw the replies; ` +
        "waiting and oldest per class (interactive / batch); the counters since each worker started." }));
    if (!rows.length) {
      card.append(el("p", { class: "empty", text: "No models." }));
      return;
    }
    const head = [["model"], ["state"], ["tuning", "--tune auto: rules, waiting, tuning, paused (for traffic), tuned; tokens/s before → after its swap"],
      ["on", "the workers it is resident on"],
      ["waiting", "waiting: interactive / batch"], ["oldest", "the oldest waiting: interactive / batch"],
      ["in flight", "pulled by a worker, not yet answered"], ["req/s"], ["p50"], ["p99"], ["errors"],
      ["put-backs", "pulled beyond a batch budget and put back"], ["redeliv.", "redeliveries"],
      ["dead", "dead letters"], ["evict.", "evictions"], ["adapters", "registered (hot)"]];
    const cell = (v, cls, key) =>
      el("td", { class: `num${cls ? " " + cls : ""}`, "data-figure": key || null, text: v });
    card.append(el("div", { class: "scroll" }, el("table", { class: "fleet-table" },
      el("thead", {}, el("tr", {}, head.map(([h, title]) => el("th", { text: h, title: title || null })))),
      el("tbody", {}, rows.map((m) => el("tr", { "data-model": str(m.id), class: active(m) ? null : "idle" },
        modelCell(m),
        el("td", {}, badge(m.state)),
        tuningCell(obj(m.tuning)),
        el("td", { class: "on" }, onWorkers(m.resident_on)),
        cell(CLASSES.map((c) => lane(m, c, "waiting")).join(" / "), num(m.waiting) ? "hot" : "", "waiting"),
        cell(CLASSES.map((c) => lane(m, c, "age_s")).join(" / ")),
        cell(fmt.num(num(m.inflight))),
        cell(rate(m.rps), "", "rps"),
        cell(fmt.ms(m.p50_ms)),
        cell(fmt.ms(m.p99_ms)),
        cell(fmt.num(num(m.errors)), num(m.errors) ? "bad" : ""),
        cell(fmt.num(num(m.put_backs))),
        cell(fmt.num(num(m.redeliveries))),
        cell(fmt.num(num(m.dead_letters)), num(m.dead_letters) ? "bad" : ""),
        cell(fmt.num(num(m.evictions))),
        cell(adapterCount(obj(m.adapters)))))))));
  }

  // the background tuner's state, with the figures of its last swap (or verdict)
  function tuningCell(t) {
    if (!t.state) return el("td", { class: "muted", "data-tuning": "off", text: "off" });
    const tps = (v) => (isNum(v) ? fmt.num(Math.round(v)) : "?");
    const figures = isNum(t.after_tokens_s) ? ` ${tps(t.before_tokens_s)} → ${tps(t.after_tokens_s)} tok/s` : "";
    return el("td", { "data-tuning": str(t.state), title: str(t.error || t.reason) || null },
      badge(str(t.state), `tu-${str(t.state)}`),
      el("span", { class: "muted", text: `${t.phase ? " " + str(t.phase) : ""}${figures}${num(t.swaps) ? ` · ${num(t.swaps)} swap${num(t.swaps) > 1 ? "s" : ""}` : ""}` }));
  }

  // the name in bold, its organisation and family below: ids stay readable when narrow
  function modelCell(m) {
    const id = str(m.id);
    const cut = id.lastIndexOf("/");
    const org = cut > 0 ? id.slice(0, cut) : "";
    return el("td", { class: "model-id", title: id },
      el("span", { class: "model-name", text: cut > 0 ? id.slice(cut + 1) : id }),
      el("small", { text: [org, str(m.family)].filter(Boolean).join(" · ") }));
  }

  function onWorkers(ids) {
    const all = Array.isArray(ids) ? ids.map(str) : [];
    if (!all.length) return "—";
    const shown = all.slice(0, 3).map((w) => el("span", { class: "on-worker", title: w, text: w }));
    return all.length > 3 ? [...shown, el("small", { text: `+${all.length - 3} more` })] : shown;
  }

  function adapterCount(a) {
    const hot = Object.keys(obj(a.hot)).length;
    if (!num(a.registered) && !hot) return "—";
    return `${fmt.num(num(a.registered))}${hot ? ` (${hot} hot)` : ""}`;
  }

  // -- adapters ---------------------------------------------------------------------------
  function renderAdapters(bases) {
    const card = document.getElementById("fleet-adapters");
    card.replaceChildren(el("h3", { text: "Adapters" }));
    if (!bases.length) {
      card.append(el("p", { class: "empty", text: "No adapters registered. POST /v1/adapters adds one." }));
      return;
    }
    for (const b of bases) {
      const hot = obj(b.hot);
      const registered = list(b.registered);
      const ids = new Set([...registered.map((r) => str(r.id)), ...Object.keys(hot)]);
      card.append(el("div", { class: "adapter-base", "data-base": str(b.base) },
        el("div", { class: "title-row" }, el("strong", { text: str(b.base) }),
          el("span", { class: "muted", text: `${registered.length} registered · ${Object.keys(hot).length} hot` })),
        el("ul", { class: "chips" }, [...ids].slice(0, MAX_CHIPS).map((id) => {
          const where = Array.isArray(hot[id]) ? hot[id].map(str) : [];
          const info = registered.find((r) => str(r.id) === id) || {};
          return el("li", { class: `chip${where.length ? " st-resident" : ""}`, "data-adapter": id,
            title: [isNum(info.rank) ? `rank ${info.rank}` : "", info.pinned ? "pinned" : "",
              where.length ? `hot on ${where.join(", ")}` : "not hot anywhere"].filter(Boolean).join(" · ") },
          el("span", { class: "chip-name", text: id }),
          where.length ? el("small", { text: ` on ${where.join(", ")}` }) : null);
        }), ids.size > MAX_CHIPS ? el("li", { class: "chip cold", text: `+${ids.size - MAX_CHIPS} more` }) : null)));
    }
  }

  window.FS.register({ name: "fleet", title: "Fleet", mount, show, refresh });
})();
