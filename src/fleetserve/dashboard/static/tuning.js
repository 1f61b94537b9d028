"use strict";
// The tuning view: every run of `fleetserve tune`, newest first, and for the selected
// run its candidates (quality gate, throughput, why each lost), the knee and the chosen
// profile. Documents follow fleetserve/bench/tune/runs.py; any field may be missing.
(() => {
  const { el, fmt, ago, isNum, charts, link } = window.FS;
  const state = { runs: [], run: null, selected: "", missing: "", root: null };
  const list = (v) => (Array.isArray(v) ? v.filter((x) => x && typeof x === "object") : []);
  const obj = (v) => (v && typeof v === "object" && !Array.isArray(v) ? v : null);
  const str = (v) => (v === null || v === undefined ? "" : String(v));
  const plural = (n, word) => (isNum(n) ? `${fmt.num(n)} ${word}${n === 1 ? "" : "s"}` : "");
  const badge = (kind, value) =>
    el("span", { class: `badge ${kind}-${str(value).replace(/[^a-z_-]/gi, "") || "unknown"}`,
      text: str(value) || "unknown" });

  function mount(root) {
    state.root = root;
    root.append(el("div", { class: "tuning" },
      el("aside", { class: "runs card" }, el("h2", { text: "Tuning runs" }),
        el("ul", { id: "run-list", class: "run-list" })),
      el("div", { id: "run-detail", class: "run-detail" })));
    let timer = null;
    window.addEventListener("resize", () => {
      clearTimeout(timer);
      timer = setTimeout(() => { if (!root.hidden) renderRun(); }, 150);
    });
  }

  function show(arg) { state.selected = arg || ""; }

  async function refresh() {
    const body = await window.FS.api("/v1/tuning/runs");
    state.runs = list(body && body.data);
    const id = state.selected || (state.runs[0] ? str(state.runs[0].id) : "");
    if (!id) {
      state.run = null;
    } else {
      try {
        const run = await window.FS.api("/v1/tuning/runs/" + encodeURIComponent(id));
        state.run = obj(run);
        state.missing = "";
      } catch (e) {
        if (!(e instanceof window.FS.ApiError) || e.status !== 404) throw e;
        // gone, or unreadable for now: keep the last good copy of this run if we have one
        if (!state.run || str(state.run.id) !== id) state.run = null;
        state.missing = e.message;
      }
    }
    renderList();
    renderRun();
  }

  // -- the list of runs -------------------------------------------------------------------
  function renderList() {
    const ul = document.getElementById("run-list");
    const current = state.run ? str(state.run.id) : state.selected;
    ul.replaceChildren(...state.runs.map((r) => {
      const id = str(r.id);
      return el("li", { class: id === current ? "selected" : null },
        el("a", { href: link("tuning", id), "data-run": id },
          el("span", { class: "run-model", text: str(r.model) || id }),
          el("span", { class: "run-meta" }, badge("st", r.status),
            ` ${[str(r.hardware_class), plural(r.candidates, "candidate")].filter(Boolean).join(" · ")}`),
          r.winner ? el("span", { class: "run-winner", text: `winner: ${str(r.winner)}` }) : null,
          el("span", { class: "run-time" }, "started ", ago(r.started_at))));
    }));
    if (!state.runs.length) {
      ul.append(el("li", { class: "empty" }, "No tuning runs yet. ", el("code", { text: "fleetserve tune MODEL" }), " starts one."));
    }
  }

  // -- one run ------------------------------------------------------------------------------
  function renderRun() {
    const pane = document.getElementById("run-detail");
    if (!pane) return;
    const run = state.run;
    const width = Math.min(900, (pane.clientWidth || 600) - 34);
    if (!run) {
      pane.replaceChildren(el("div", { class: "card empty" },
        state.missing || (state.runs.length ? "Select a run." : "Nothing to show yet.")));
      return;
    }
    const candidates = list(run.candidates);
    const winner = candidates.find((c) => str(c.id) === str(run.winner) && run.winner) || null;
    pane.replaceChildren(...[
      state.missing ? el("p", { class: "notice", text: `${state.missing}; showing its last good version.` }) : null,
      header(run),
      run.error ? el("div", { class: "card run-error" }, el("h3", { text: "Error" }),
        el("pre", { text: str(run.error) })) : null,
      chosen(run, winner),
      candidatesCard(run, candidates, width),
      kneeCard(obj(run.knee), run.status === "running", width),
      costFit(obj(run.cost_fit)),
      report(obj(run.report)),
    ].filter(Boolean));
  }

  function header(run) {
    const budget = isNum(run.budget_s) && run.budget_s > 0 ? run.budget_s : null;
    const running = run.status === "running";
    const progress = running && budget && isNum(run.elapsed_s) ? Math.min(1, run.elapsed_s / budget) : null;
    const rows = [
      ["family", fmt.text(run.family)],
      ["hardware class", fmt.text(run.hardware_class)],
      ["started", ago(run.started_at)],
      ["updated", ago(run.updated_at)],
      ["finished", run.finished_at ? ago(run.finished_at) : "—"],
      ["elapsed", `${fmt.dur(run.elapsed_s)}${budget ? " of " + fmt.dur(budget) : ""}`],
      ["noise", isNum(run.noise) ? "±" + fmt.pct(run.noise) : "—"],
      ["machine", machine(run.machine)],
    ];
    const bar = progress === null ? null : el("div", { class: "progress", title: fmt.pct(progress) },
      el("span", { class: "fill" }));
    if (bar) bar.firstChild.style.width = (progress * 100).toFixed(1) + "%";
    return el("div", { class: "card run-head" },
      el("div", { class: "title-row" },
        el("h2", { class: "run-title", text: str(run.model) || str(run.id) }),
        badge("st", run.status), run.phase ? badge("ph", run.phase) : null),
      el("p", { class: "run-id", text: str(run.id) }),
      bar,
      el("dl", { class: "facts" }, rows.map(([k, v]) => [el("dt", { text: k }), el("dd", {}, v)])));
  }

  function machine(m) {
    const o = obj(m);
    if (!o) return fmt.text(m);
    const parts = Object.entries(o).filter(([, v]) => v !== null && v !== "" && typeof v !== "object")
      .map(([k, v]) => `${k}: ${v}`);
    return el("span", { class: "machine", title: JSON.stringify(o) }, parts.join(" · ") || "—");
  }

  // runtime and precision; then threads (x processes) and the batch budgets
  function config(c) {
    return [str(c.runtime), str(c.precision)].filter(Boolean).join(" ") || "—";
  }
  function budgets(c) {
    const parts = [];
    if (isNum(c.threads)) parts.push(`${c.threads} thr` + (isNum(c.processes) && c.processes > 1 ? ` × ${c.processes}` : ""));
    if (isNum(c.max_batch_tokens)) parts.push(`${fmt.num(c.max_batch_tokens)} tok`);
    if (isNum(c.max_batch_size)) parts.push(`≤ ${c.max_batch_size}`);
    return parts.join(" · ");
  }
  const describe = (c) => [config(c), budgets(c)].filter(Boolean).join(", ");

  function chosen(run, winner) {
    const profile = obj(run.profile);
    const card = el("div", { class: "card chosen" }, el("h3", { text: "Chosen profile" }));
    if (winner) {
      card.append(el("p", { class: "winner" }, "Winner ", el("strong", { class: "winner-id", text: str(winner.id) }),
        ` — ${describe(winner)}: ${fmt.num(winner.tokens_per_s)} tokens/s, p99 ${fmt.ms(winner.p99_ms)}`));
    } else if (run.winner) {
      card.append(el("p", { class: "winner" }, "Winner ", el("strong", { class: "winner-id", text: str(run.winner) })));
    }
    if (profile) {
      card.append(el("dl", { class: "facts profile" }, Object.entries(profile).map(([k, v]) =>
        [el("dt", { text: k }), el("dd", { text: fmt.text(v) })])));
    } else {
      const why = run.status === "running" ? "Not chosen yet: the run is still measuring."
        : run.status === "failed" ? "None: the run failed." : "None was written.";
      card.append(el("p", { class: "empty", text: why }));
    }
    return card;
  }

  function quality(q) {
    if (!q) return el("span", { class: "muted", text: "—" });
    const ok = q.passed === true ? "pass" : q.passed === false ? "fail" : "";
    const gate = `${str(q.metric) || "quality"}` + (isNum(q.threshold) ? ` ≥ ${fmt.precise(q.threshold)}` : "");
    return el("span", { class: `quality ${ok}`, title: fmt.text(q.detail) },
      el("span", {}, ok ? el("b", { text: ok === "pass" ? "✓ " : "✗ " }) : null, fmt.precise(q.value)),
      el("small", { text: gate }));
  }

  function candidatesCard(run, candidates, width) {
    const card = el("div", { class: "card candidates" },
      el("h3", { text: `Candidates (${candidates.length})` }));
    if (!candidates.length) {
      card.append(el("p", { class: "empty", text: "No candidates tried yet." }));
      return card;
    }
    const best = Math.max(1e-9, ...candidates.map((c) => (isNum(c.tokens_per_s) ? c.tokens_per_s : 0)));
    const points = (status) => candidates.filter((c) => str(c.status) === status)
      .map((c) => ({ x: c.tokens_per_s, y: obj(c.quality) ? c.quality.value : null,
        ring: str(c.id) === str(run.winner), title: `${str(c.id)}: ${describe(c)}` }));
    const thresholds = candidates.map((c) => obj(c.quality) && c.quality.threshold).filter(isNum);
    const plotted = candidates.some((c) => isNum(c.tokens_per_s) && obj(c.quality) && isNum(c.quality.value));
    if (plotted) card.append(charts.plot({
      width, height: 220, xLabel: "tokens/s", yLabel: "quality", label: "quality against throughput",
      series: ["won", "lost", "rejected", "measuring", "skipped", "pending"].map((s) =>
        ({ label: s, cls: `p-${s}`, kind: "dots", points: points(s) })),
      hlines: thresholds.length ? [{ y: Math.max(...thresholds), label: "quality gate", cls: "gate" }] : [],
    }));
    const head = ["candidate", "config", "status", "quality", "tokens/s", "items/s", "p50 / p99", "why"];
    const rows = candidates.map((c) => {
      const tps = isNum(c.tokens_per_s) ? c.tokens_per_s : null;
      const bar = tps === null ? null : el("span", { class: "bar" }, el("i"));
      if (bar) bar.firstChild.style.width = ((tps / best) * 100).toFixed(1) + "%";
      const samples = Array.isArray(c.samples) ? c.samples.filter(isNum) : [];
      return el("tr", { class: `cand-${str(c.status)}`, "data-candidate": str(c.id) },
        el("td", { class: "cand-id", text: str(c.id) }),
        el("td", { class: "config" }, el("span", { text: config(c) }), el("small", { text: budgets(c) })),
        el("td", {}, badge("c", c.status)),
        el("td", {}, quality(obj(c.quality))),
        el("td", { class: "num", title: samples.length ? `samples: ${samples.map(fmt.compact).join(", ")}` : null },
          el("span", { class: "tps" }, bar, fmt.num(tps))),
        el("td", { class: "num", text: fmt.auto(c.items_per_s) }),
        el("td", { class: "num", text: `${fmt.auto(c.p50_ms)} / ${fmt.ms(c.p99_ms)}` }),
        el("td", { class: "reason", text: str(c.reason) || (str(c.status) === "won" ? "chosen" : "") }));
    });
    card.append(el("div", { class: "scroll" }, el("table", { class: "cand-table" },
      el("thead", {}, el("tr", {}, head.map((h) => el("th", { text: h })))),
      el("tbody", {}, rows))));
    return card;
  }

  function kneeCard(knee, running, width) {
    const card = el("div", { class: "card knee" }, el("h3", { text: "Knee" }));
    const points = knee ? list(knee.points) : [];
    if (!points.length) {
      card.append(el("p", { class: "empty", text: !running ? "Not measured." : knee ?
        "No load points measured yet." : "Not measured yet: the knee comes after the candidates." }));
      return card;
    }
    const marks = [];
    if (isNum(knee.knee_rps)) marks.push({ x: knee.knee_rps, label: `knee ${fmt.auto(knee.knee_rps)} rps`, cls: "knee-mark" });
    if (isNum(knee.kneedle_rps) && knee.kneedle_rps !== knee.knee_rps) {
      marks.push({ x: knee.kneedle_rps, label: `kneedle ${fmt.auto(knee.kneedle_rps)}`, cls: "kneedle-mark" });
    }
    const series = (key, label, cls) => ({ label, cls, points: points.map((p) => ({
      x: p.offered_rps, y: p[key], title: `${fmt.auto(p.offered_rps)} rps offered: ${fmt.auto(p[key])}` })) });
    card.append(el("p", { class: "muted", text: `SLO p99 ${fmt.ms(knee.slo_ms)} · knee ${fmt.auto(knee.knee_rps)} rps` +
      (isNum(knee.kneedle_rps) ? ` · kneedle ${fmt.auto(knee.kneedle_rps)} rps` : "") }));
    card.append(el("div", { class: "charts" },
      charts.plot({ width, height: 220, xLabel: "offered load (requests/s)", yLabel: "achieved rps",
        label: "achieved against offered load", x0: true, y0: true, diagonal: true, vlines: marks,
        series: [series("achieved_rps", "achieved", "s-achieved")] }),
      charts.plot({ width, height: 220, xLabel: "offered load (requests/s)", yLabel: "latency (ms)",
        label: "latency against offered load", x0: true, y0: true, vlines: marks,
        hlines: isNum(knee.slo_ms) ? [{ y: knee.slo_ms, label: "SLO", cls: "gate" }] : [],
        series: [series("p50_ms", "p50", "s-p50"), series("p99_ms", "p99", "s-p99")] })));
    const head = ["offered rps", "achieved rps", "offered tok/s", "achieved tok/s", "p50", "p99", "errors"];
    card.append(el("details", {}, el("summary", { text: `${points.length} load points` }),
      el("div", { class: "scroll" }, el("table", {},
        el("thead", {}, el("tr", {}, head.map((h) => el("th", { text: h })))),
        el("tbody", {}, points.map((p) => el("tr", {},
          [p.offered_rps, p.achieved_rps, p.offered_tokens_s, p.achieved_tokens_s].map((v) =>
            el("td", { class: "num", text: fmt.auto(v) })),
          el("td", { class: "num", text: fmt.ms(p.p50_ms) }),
          el("td", { class: "num", text: fmt.ms(p.p99_ms) }),
          el("td", { class: "num", text: fmt.num(p.errors) }))))))));
    return card;
  }

  function costFit(fit) {
    if (!fit) return null;
    const rows = [["fixed", fmt.ms(fit.fixed_ms)], ["per token", fmt.ms(fit.per_token_ms)],
      ["per padded token", fmt.ms(fit.per_padded_token_ms)], ["median error", fmt.pct(fit.median_rel_error)]];
    return el("div", { class: "card cost-fit" }, el("h3", { text: "Cost model" }),
      el("dl", { class: "facts" }, rows.map(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })])));
  }

  function report(rep) {
    if (!rep) return null;
    const rows = Object.entries(rep).filter(([, v]) => v);
    if (!rows.length) return null;
    return el("div", { class: "card report" }, el("h3", { text: "Report" }),
      el("dl", { class: "facts" }, rows.map(([k, v]) => [el("dt", { text: k }), el("dd", {}, el("code", { text: str(v) }))])));
  }

  window.FS.register({ name: "tuning", title: "Tuning", mount, show, refresh });
})();
