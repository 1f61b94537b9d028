"""The simulation's results as rich tables, markdown and a PNG."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from .params import POLICIES, Params
from .search import Point

TARGET = 1.5  # the target: pull >= 1.5x push throughput at equal p99, 64 workers


def _push_policies(policies: Sequence[str]) -> list[str]:
    return [p for p in policies if p != "pull"]


def headline_rows(
    points: list[Point], workers: Sequence[int], policies: Sequence[str]
) -> list[dict[str, Any]]:
    by = {(p.workers, p.policy): p for p in points}
    rows = []
    for w in workers:
        row: dict[str, Any] = {"workers": w}
        for pol in policies:
            pt = by[(w, pol)]
            row["capacity_rps"] = pt.capacity_rps
            row[f"{pol}_slo_rps"] = pt.slo_rps
            row[f"{pol}_sat_rps"] = pt.saturation.throughput_rps
        if "pull" in policies:
            for pol in _push_policies(policies):
                push = row[f"{pol}_slo_rps"]
                row[f"pull_vs_{pol}"] = row["pull_slo_rps"] / push if push else math.inf
        rows.append(row)
    return rows


def _f(v: Any, digits: int = 0) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def _headline_cells(
    rows: list[dict[str, Any]], policies: Sequence[str]
) -> tuple[list[str], list[list[str]]]:
    push = _push_policies(policies)
    cols = ["workers", "nominal cap req/s"]
    cols += [f"{p} req/s" for p in policies]
    if "pull" in policies:
        cols += [f"pull / {p}" for p in push]
    cells = []
    for r in rows:
        c = [str(r["workers"]), _f(r["capacity_rps"])]
        c += [_f(r[f"{p}_slo_rps"]) for p in policies]
        if "pull" in policies:
            c += [_f(r[f"pull_vs_{p}"], 2) + "x" for p in push]
        cells.append(c)
    return cols, cells


def headline_table(rows: list[dict[str, Any]], policies: Sequence[str], params: Params) -> Table:
    cols, cells = _headline_cells(rows, policies)
    t = Table(title=f"throughput at p99 <= {params.slo_ms:g} ms (simulated)")
    for i, name in enumerate(cols):
        t.add_column(name, justify="left" if i == 0 else "right")
    for row in cells:
        t.add_row(*row)
    return t


DETAIL = [
    ("workers", "workers"),
    ("policy", "policy"),
    ("load", "load @SLO"),
    ("throughput_rps", "req/s @SLO"),
    ("items_per_s", "items/s"),
    ("p50_ms", "p50 ms"),
    ("p99_ms", "p99 ms"),
    ("utilization", "util"),
    ("batch_fill", "batch fill"),
    ("put_backs", "put-backs/req"),
    ("sat", "saturation req/s"),
    ("sat_util", "util @sat"),
]


def _detail_cells(points: list[Point]) -> list[list[str]]:
    out = []
    for pt in points:
        r = pt.at_slo
        sat = pt.saturation
        c = [str(pt.workers), pt.policy]
        if r is None:
            c += ["-"] * 8
        else:
            c += [
                f"{r.load:.3f}",
                _f(r.throughput_rps),
                _f(r.items_per_s),
                _f(r.p50_ms),
                _f(r.p99_ms),
                f"{r.utilization:.2f}",
                f"{r.batch_fill:.2f}",
                f"{r.put_backs / max(r.completed, 1):.2f}",
            ]
        c += [_f(sat.throughput_rps), f"{sat.utilization:.2f}"]
        out.append(c)
    return out


def detail_table(points: list[Point]) -> Table:
    t = Table(title="at the highest load within the SLO, and at saturation")
    for key, name in DETAIL:
        t.add_column(name, justify="left" if key == "policy" else "right")
    for c in _detail_cells(points):
        t.add_row(*c)
    return t


def target_verdict(rows: list[dict[str, Any]], policies: Sequence[str]) -> str:
    row = next((r for r in rows if r["workers"] == 64), None)
    if row is None or "pull" not in policies:
        return "target (64 workers, pull >= 1.5x push at equal p99): not evaluated in this sweep"
    parts = []
    for p in _push_policies(policies):
        ratio = row[f"pull_vs_{p}"]
        parts.append(f"{p} {ratio:.2f}x ({'met' if ratio >= TARGET else 'missed'})")
    return "target at 64 workers, pull >= 1.5x push throughput at equal p99: " + "; ".join(parts)


def markdown(
    rows: list[dict[str, Any]],
    points: list[Point],
    policies: Sequence[str],
    params: Params,
    iso: dict[str, float],
    verdict: str,
    runtime: float,
) -> str:
    cols, cells = _headline_cells(rows, policies)
    lines = [
        "# Pull vs push: discrete-event simulation",
        "",
        f"`fleetserve bench sim`, {time.strftime('%Y-%m-%d')}, {runtime:.0f} s. "
        "A model, not a measurement: only the cost coefficients come from real runs.",
        "",
        "Assumptions:",
        "",
        *[f"- {line}" for line in params.describe()],
        f"- served alone: p50/p99 {iso['p50_ms_slowest']:.0f}/{iso['p99_ms_slowest']:.0f} ms on "
        f"the slowest worker, {iso['p50_ms_mean']:.0f}/{iso['p99_ms_mean']:.0f} ms at the "
        "fleet's mean speed",
        "",
        f"## Throughput at p99 <= {params.slo_ms:g} ms (requests/s)",
        "",
        "| " + " | ".join(cols) + " |",
        "| ---: |" + " ---: |" * (len(cols) - 1),
        *["| " + " | ".join(c) + " |" for c in cells],
        "",
        f"**{verdict}**",
        "",
        "## Detail",
        "",
        "| " + " | ".join(name for _, name in DETAIL) + " |",
        "| ---: | --- |" + " ---: |" * (len(DETAIL) - 2),
        *["| " + " | ".join(c) + " |" for c in _detail_cells(points)],
        "",
        "Load is offered load over nominal capacity (full batches, no padding); util is the "
        "mean busy fraction of the workers; batch fill is padded slots over the batch budget.",
        "",
    ]
    return "\n".join(lines)


def plot(
    points: list[Point],
    rows: list[dict[str, Any]],
    policies: Sequence[str],
    params: Params,
    focus: int,
    path: Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 5.2))
    colour = {pol: f"C{i}" for i, pol in enumerate(POLICIES)}
    ws = [r["workers"] for r in rows]
    for pol in policies:
        ys = [r[f"{pol}_slo_rps"] or math.nan for r in rows]
        ax1.plot(ws, ys, marker="o", color=colour.get(pol), label=pol)
    ax1.plot(ws, [r["capacity_rps"] for r in rows], ls=":", color="grey", label="nominal cap")
    ax1.set(
        xscale="log",
        yscale="log",
        xlabel="workers",
        ylabel="requests/s",
        title=f"Throughput at p99 <= {params.slo_ms:g} ms",
    )
    if "pull" in policies:
        for pol in _push_policies(policies):
            ys = [min(r[f"pull_vs_{pol}"], 10.0) for r in rows]
            ax2.plot(ws, ys, marker="o", color=colour.get(pol), label=f"pull / {pol}")
        ax2.axhline(TARGET, ls="--", color="red", label=f"target {TARGET}x")
        ax2.axhline(1.0, ls=":", color="grey")
    ax2.set(
        xscale="log",
        ylim=(0, None),
        xlabel="workers",
        ylabel="ratio (capped at 10)",
        title="Pull over push, throughput at equal p99",
    )
    fw = focus if focus in ws else ws[len(ws) // 2]
    for pt in points:
        if pt.workers == fw:
            runs = [*pt.tried, pt.saturation]
            runs.sort(key=lambda r: r.load)
            xs, ys = [r.load for r in runs], [r.p99_ms for r in runs]
            ax3.plot(xs, ys, marker=".", color=colour.get(pt.policy), label=pt.policy)
    ax3.axhline(params.slo_ms or math.nan, ls="--", color="red", label="SLO")
    ax3.set(
        yscale="log",
        xlabel="offered load / nominal capacity",
        ylabel="p99 ms",
        title=f"p99 vs load at {fw} workers (search points)",
    )
    for ax in (ax1, ax2):
        ax.set_xticks(ws, [str(w) for w in ws])
        ax.minorticks_off()
    for ax in (ax1, ax2, ax3):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle("fleetserve bench sim: " + params.cost_source, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- the fleet-memory scenario (fleet.py) ---------------------------------------------

FLEET_COLUMNS = [
    ("workers", "w"),
    ("affinity", "aff"),
    ("eviction", "evict"),
    ("miss_rate", "miss"),
    ("loads", "loads"),
    ("load_s", "load s"),
    ("evictions", "evicts"),
    ("p50_ms", "p50 ms"),
    ("p99_ms", "p99 ms"),
    ("throughput_rps", "req/s"),
]


def fleet_rows(runs: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per configuration (``FleetRun``), in the table's units."""
    return [
        {
            "workers": r.workers,
            "affinity": "on" if r.affinity else "off",
            "eviction": r.eviction,
            "miss_rate": r.miss_rate,
            "loads": r.loads,
            "load_s": r.load_s,
            "evictions": r.evictions,
            "p50_ms": r.p50_s * 1000,
            "p99_ms": r.p99_s * 1000,
            "throughput_rps": r.throughput_rps,
            "utilization": r.utilization,
        }
        for r in runs
    ]


def _fleet_cells(row: dict[str, Any]) -> list[str]:
    return [
        str(row["workers"]),
        row["affinity"],
        row["eviction"],
        f"{row['miss_rate']:.1%}",
        f"{row['loads']:,}",
        _f(row["load_s"]),
        f"{row['evictions']:,}",
        _f(row["p50_ms"]),
        _f(row["p99_ms"]),
        _f(row["throughput_rps"]),
    ]


def fleet_table(rows: list[dict[str, Any]], title: str) -> Table:
    from rich import box

    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for key, name in FLEET_COLUMNS:
        t.add_column(name, justify="left" if key in ("affinity", "eviction") else "right")
    last = None
    for row in rows:
        if last is not None and row["workers"] != last:
            t.add_section()
        last = row["workers"]
        t.add_row(*_fleet_cells(row))
    return t


def fleet_findings(rows: list[dict[str, Any]]) -> list[str]:
    """Affinity on against off, and GDSF against LRU, per fleet size, in words."""
    by = {(r["workers"], r["affinity"], r["eviction"]): r for r in rows}
    out = []
    for w in sorted({r["workers"] for r in rows}):
        for ev in ("gdsf", "lru"):
            on, off = by.get((w, "on", ev)), by.get((w, "off", ev))
            if on and off:
                out.append(
                    f"{w} workers, {ev}: affinity takes the miss rate from "
                    f"{off['miss_rate']:.1%} to {on['miss_rate']:.1%}, p99 from "
                    f"{off['p99_ms'] / 1000:.2f} s to {on['p99_ms'] / 1000:.2f} s"
                )
        for aff in ("on", "off"):
            g, lr = by.get((w, aff, "gdsf")), by.get((w, aff, "lru"))
            if g and lr:
                out.append(
                    f"{w} workers, affinity {aff}: gdsf {g['load_s']:,.0f} load s against "
                    f"lru {lr['load_s']:,.0f} ({g['load_s'] / max(lr['load_s'], 1e-9):.2f}x)"
                )
    return out


def fleet_plot(rows: list[dict[str, Any]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workers = sorted({r["workers"] for r in rows})
    combos = [(a, e) for a in ("on", "off") for e in ("gdsf", "lru")]
    combos = [c for c in combos if any((r["affinity"], r["eviction"]) == c for r in rows)]
    by = {(r["workers"], r["affinity"], r["eviction"]): r for r in rows}
    panels = [
        ("miss_rate", "miss rate", 100.0, "% of requests"),
        ("load_s", "reload seconds (measured window)", 1.0, "s"),
        ("p99_ms", "p99 latency", 0.001, "s"),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4.6))
    width = 0.8 / max(len(combos), 1)
    for ax, (key, name, scale, unit) in zip(axes, panels, strict=True):
        for j, (a, e) in enumerate(combos):
            xs = [i + (j - (len(combos) - 1) / 2) * width for i in range(len(workers))]
            ys = [by[(w, a, e)][key] * scale if (w, a, e) in by else math.nan for w in workers]
            ax.bar(
                xs,
                ys,
                width,
                label=f"affinity {a}, {e}",
                color=f"C{j}",
                hatch="" if a == "on" else "//",
            )
        ax.set_xticks(range(len(workers)), [f"{w} workers" for w in workers])
        ax.set(title=name, ylabel=unit)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
