"use strict";
// Small inline-SVG charts: lines and dots on linear axes, with reference lines.
//
// FS.charts.plot({
//   width, height, xLabel, yLabel, label (for screen readers),
//   series: [{label, cls, kind: "line" | "dots", points: [{x, y, title, ring}]}],
//   vlines: [{x, label, cls}], hlines: [{y, label, cls}],
//   diagonal: true,        // a y = x reference line
//   x0: true, y0: true,    // start the axis at zero
// }) -> <figure>
//
// Colours come from CSS classes (cls), so the stylesheet owns the palette.
(() => {
  const { svg, el, fmt, isNum } = window.FS;
  const MARGIN = { right: 14, top: 14, bottom: 42 };

  // "nice" ticks (1, 2, 5 x 10^k) covering [lo, hi]
  function ticks(lo, hi, count) {
    const raw = (hi - lo) / Math.max(1, count);
    const mag = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
    const start = Math.floor(lo / step) * step;
    const end = Math.ceil(hi / step) * step;
    const out = [];
    for (let v = start; v <= end + step / 2; v += step) out.push(+v.toPrecision(12));
    return out;
  }

  function domain(values, zero) {
    let lo = Math.min(...values);
    let hi = Math.max(...values);
    if (zero) lo = Math.min(0, lo);
    if (hi - lo < 1e-12) {
      const pad = Math.abs(hi) * 0.1 || 1;
      lo -= zero && lo === 0 ? 0 : pad;
      hi += pad;
    }
    return [lo, hi];
  }

  function plot(opts) {
    const width = Math.max(260, Math.round(opts.width || 560));
    const height = Math.max(160, Math.round(opts.height || 240));
    const series = (opts.series || []).map((s) => ({
      ...s,
      points: (s.points || []).filter((p) => p && isNum(p.x) && isNum(p.y)),
    }));
    const vlines = (opts.vlines || []).filter((l) => l && isNum(l.x));
    const hlines = (opts.hlines || []).filter((l) => l && isNum(l.y));
    const xs = series.flatMap((s) => s.points.map((p) => p.x)).concat(vlines.map((l) => l.x));
    const ys = series.flatMap((s) => s.points.map((p) => p.y)).concat(hlines.map((l) => l.y));
    const figure = el("figure", { class: "chart" });
    if (!series.some((s) => s.points.length)) {
      figure.append(el("p", { class: "empty", text: opts.empty || "No points yet." }));
      return figure;
    }
    const xt = ticks(...domain(xs, opts.x0), width < 400 ? 4 : 6);
    const yt = ticks(...domain(ys, opts.y0), 5);
    const [x0, x1, y0, y1] = [xt[0], xt[xt.length - 1], yt[0], yt[yt.length - 1]];
    const xstep = xt.length > 1 ? xt[1] - xt[0] : undefined;
    const ystep = yt.length > 1 ? yt[1] - yt[0] : undefined;
    const widest = Math.max(...yt.map((t) => fmt.compact(t, ystep).length));
    const M = { ...MARGIN, left: 30 + 6.5 * widest };
    const pw = width - M.left - M.right;
    const ph = height - M.top - M.bottom;
    const sx = (x) => M.left + ((x - x0) / (x1 - x0 || 1)) * pw;
    const sy = (y) => M.top + ph - ((y - y0) / (y1 - y0 || 1)) * ph;

    const root = svg("svg", {
      viewBox: `0 0 ${width} ${height}`, width, height, role: "img",
      "aria-label": opts.label || opts.yLabel || "chart",
    });
    const grid = svg("g", { class: "grid" });
    for (const t of xt) {
      grid.append(svg("line", { x1: sx(t), x2: sx(t), y1: M.top, y2: M.top + ph }));
      grid.append(svg("text", { x: sx(t), y: M.top + ph + 16, "text-anchor": "middle", text: fmt.compact(t, xstep) }));
    }
    for (const t of yt) {
      grid.append(svg("line", { x1: M.left, x2: M.left + pw, y1: sy(t), y2: sy(t) }));
      grid.append(svg("text", { x: M.left - 6, y: sy(t) + 4, "text-anchor": "end", text: fmt.compact(t, ystep) }));
    }
    root.append(grid);
    root.append(svg("rect", { class: "frame", x: M.left, y: M.top, width: pw, height: ph }));
    if (opts.xLabel) {
      root.append(svg("text", { class: "axis-label", x: M.left + pw / 2, y: height - 6,
        "text-anchor": "middle", text: opts.xLabel }));
    }
    if (opts.yLabel) {
      root.append(svg("text", { class: "axis-label", x: 12, y: M.top + ph / 2,
        "text-anchor": "middle", transform: `rotate(-90 12 ${M.top + ph / 2})`, text: opts.yLabel }));
    }
    if (opts.diagonal) {
      const a = Math.max(x0, y0);
      const b = Math.min(x1, y1);
      if (b > a) {
        root.append(svg("line", { class: "ref diagonal", x1: sx(a), y1: sy(a), x2: sx(b), y2: sy(b) }));
      }
    }
    for (const [i, l] of vlines.entries()) {
      root.append(svg("line", { class: `ref ${l.cls || ""}`, x1: sx(l.x), x2: sx(l.x), y1: M.top, y2: M.top + ph }));
      if (l.label) {
        const right = sx(l.x) > M.left + pw * 0.7;
        root.append(svg("text", { class: `ref-label ${l.cls || ""}`, x: sx(l.x) + (right ? -4 : 4),
          y: M.top + 12 + 14 * i, "text-anchor": right ? "end" : "start", text: l.label }));
      }
    }
    for (const l of hlines) {
      root.append(svg("line", { class: `ref ${l.cls || ""}`, x1: M.left, x2: M.left + pw, y1: sy(l.y), y2: sy(l.y) }));
      if (l.label) {
        root.append(svg("text", { class: `ref-label ${l.cls || ""}`, x: M.left + pw - 4, y: sy(l.y) - 4,
          "text-anchor": "end", text: l.label }));
      }
    }
    for (const s of series) {
      const g = svg("g", { class: `series ${s.cls || ""}` });
      if (s.kind !== "dots" && s.points.length > 1) {
        const pts = [...s.points].sort((a, b) => a.x - b.x);
        g.append(svg("polyline", { points: pts.map((p) => `${sx(p.x)},${sy(p.y)}`).join(" ") }));
      }
      for (const p of s.points) {
        const dot = svg("circle", { class: p.ring ? "ring" : null, cx: sx(p.x), cy: sy(p.y),
          r: s.kind === "dots" ? 5 : 3 });
        if (p.title) dot.append(svg("title", { text: p.title }));
        g.append(dot);
      }
      root.append(g);
    }
    figure.append(root);
    const legend = series.filter((s) => s.label && s.points.length);
    if (legend.length) {
      figure.append(el("figcaption", { class: "legend" },
        legend.map((s) => el("span", { class: `key ${s.cls || ""}` }, el("i"), s.label))));
    }
    return figure;
  }

  window.FS.charts = { plot, ticks };
})();
