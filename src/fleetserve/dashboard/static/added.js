"use strict";
// The added-models view: every model `fleetserve add` added, newest first: its family
// and the file that decided it, the reference check, the tune against torch fp32 and
// its footprint. Reports follow fleetserve/add/report.py; any field may be missing.
(() => {
  const { el, fmt, isNum } = window.FS;
  const state = { models: [], root: null };
  const str = (v) => (v === null || v === undefined ? "" : String(v));
  const mib = (v) => (isNum(v) ? `${fmt.num(v / 1048576, 1)} MiB` : "—");

  function mount(root) {
    state.root = root;
    root.append(el("div", { class: "card" },
      el("h2", { text: "Added models" }),
      el("table", { id: "added-table", class: "fleet-table" })));
  }

  function show() {}

  async function refresh() {
    const body = await window.FS.api("/v1/added/models");
    state.models = Array.isArray(body && body.data) ? body.data : [];
    render();
  }

  function tuned(m) {
    if (!m.winner) return el("span", { class: "muted", text: str(m.not_tuned) || "not tuned" });
    const ratio = isNum(m.vs_torch_fp32) ? ` · ${fmt.num(m.vs_torch_fp32, 2)}x torch fp32` : "";
    return el("span", {}, el("code", { text: str(m.winner) }),
      ` ${fmt.num(m.tokens_per_s)} tokens/s${ratio}`);
  }

  function render() {
    const table = document.getElementById("added-table");
    if (!table) return;
    const head = el("tr", {}, ...["model", "family", "reference check", "tuned", "resident",
      "took"].map((h) => el("th", { text: h })));
    const rows = state.models.map((m) => el("tr", { "data-model": str(m.model) },
      el("td", { class: "model-id" }, el("span", { class: "model-name", text: str(m.model) }),
        el("span", { class: "muted", text: str(m.spec_file) })),
      el("td", {}, el("span", { text: str(m.family) }),
        el("div", { class: "muted", text: str(m.family_why) })),
      el("td", { class: `check-${str(m.check) || "unknown"}`,
        text: `${str(m.check) || "—"}${m.library ? ` (${str(m.library)})` : ""}` }),
      el("td", {}, tuned(m)),
      el("td", { text: mib(m.resident_bytes || m.weights_bytes) }),
      el("td", { text: isNum(m.seconds) ? `${fmt.num(m.seconds)} s` : "—" })));
    if (!rows.length) {
      rows.push(el("tr", {}, el("td", { colspan: "6", class: "empty" },
        "No models added yet. ", el("code", { text: "fleetserve add SOURCE" }), " adds one.")));
    }
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
  }

  window.FS.register({ name: "added", title: "Added models", mount, show, refresh });
})();
