"""The pull-versus-push results: rows per (cost model, fleet size, lag), tables, verdict."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from .params import PUSH, Params
from .search import Point

TARGET = 1.5  # the target: pull >= 1.5x least-outstanding push at equal p99
TARGET_WORKERS = 64
TARGET_MIN_LAG = 20.0


def fmt(v: object, digits: int = 0) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def _ratio(a: float, b: float) -> float:
    return a / b if b else (math.inf if a else math.nan)


def headline_rows(points: list[Point]) -> list[dict[str, Any]]:
    """One row per (cost model, fleet size, lag): each policy's throughput at the SLO
    and pull's ratio over each push policy; pull variants as extra columns."""
    pulls = {(p.cost, p.workers, p.variant): p for p in points if p.policy == "pull"}
    push = {(p.cost, p.workers, p.lag_ms, p.policy): p for p in points if p.policy != "pull"}
    variants = sorted({p.variant for p in points if p.policy == "pull" and p.variant})
    keys = sorted({(c, w, lag) for c, w, lag, _ in push}, key=lambda k: (k[0], k[1], k[2] or 0))
    rows = []
    for cost, w, lag in keys:
        pull = pulls.get((cost, w, ""))
        row: dict[str, Any] = {"cost": cost, "workers": w, "lag_ms": lag}
        row["capacity_rps"] = pull.capacity_rps if pull else math.nan
        row["pull_slo_rps"] = pull.slo_rps if pull else math.nan
        for pol in PUSH:
            pt = push.get((cost, w, lag, pol))
            if pt is None:
                continue
            row["capacity_rps"] = pt.capacity_rps
            row[f"{pol}_slo_rps"] = pt.slo_rps
            if pull:
                row[f"pull_vs_{pol}"] = _ratio(pull.slo_rps, pt.slo_rps)
        for v in variants:
            pv = pulls.get((cost, w, v))
            if pv is not None:
                row[f"pull[{v}]_slo_rps"] = pv.slo_rps
                if "push-lor_slo_rps" in row:
                    row[f"pull[{v}]_vs_push-lor"] = _ratio(pv.slo_rps, row["push-lor_slo_rps"])
        rows.append(row)
    return rows


def _columns(rows: list[dict[str, Any]]) -> list[tuple[str, str, int, str]]:
    """(key, header, digits, suffix) for the columns the rows have."""
    have = set().union(*(r.keys() for r in rows)) if rows else set()
    cols = [("workers", "workers", 0, ""), ("lag_ms", "lag ms", 0, "")]
    cols += [("capacity_rps", "nominal req/s", 0, ""), ("pull_slo_rps", "pull", 0, "")]
    cols += [(f"{p}_slo_rps", p, 0, "") for p in PUSH if f"{p}_slo_rps" in have]
    cols += [(f"pull_vs_{p}", f"pull/{p}", 2, "x") for p in PUSH if f"pull_vs_{p}" in have]
    for k in sorted(have):
        if k.startswith("pull[") and k.endswith("_slo_rps"):
            v = k[len("pull[") : -len("]_slo_rps")]
            cols += [(k, f"pull {v}", 0, ""), (f"pull[{v}]_vs_push-lor", f"{v}/push-lor", 2, "x")]
    return cols


def _cells(row: dict[str, Any], cols: list[tuple[str, str, int, str]]) -> list[str]:
    out = []
    for key, _, digits, suffix in cols:
        v = row.get(key)
        if key == "lag_ms":
            out.append(f"{v:g}")
        elif isinstance(v, int):
            out.append(str(v))
        else:
            s = fmt(v, digits)
            out.append(s + suffix if s not in ("-", "inf") else s)
    return out


def headline_tables(rows: list[dict[str, Any]], slos: dict[str, float]) -> list[Table]:
    tables = []
    for cost in sorted({r["cost"] for r in rows}):
        mine = [r for r in rows if r["cost"] == cost]
        cols = _columns(mine)
        t = Table(title=f"{cost} cost model: req/s at p99 <= {slos[cost]:g} ms (simulated)")
        for i, (_, name, _, _) in enumerate(cols):
            t.add_column(name, justify="left" if i == 0 else "right")
        for r in mine:
            t.add_row(*_cells(r, cols))
        tables.append(t)
    return tables


def headline_markdown(rows: list[dict[str, Any]], slos: dict[str, float]) -> list[str]:
    lines: list[str] = []
    for cost in sorted({r["cost"] for r in rows}):
        mine = [r for r in rows if r["cost"] == cost]
        cols = _columns(mine)
        lines += [f"### {cost} cost model: requests/s at p99 <= {slos[cost]:g} ms", ""]
        lines.append("| " + " | ".join(name for _, name, _, _ in cols) + " |")
        lines.append("|" + " ---: |" * len(cols))
        lines += ["| " + " | ".join(_cells(r, cols)) + " |" for r in mine]
        lines.append("")
    return lines


DETAIL = [
    ("cost", "cost model"),
    ("workers", "workers"),
    ("policy", "policy"),
    ("lag", "lag ms"),
    ("load", "load @SLO"),
    ("throughput_rps", "req/s @SLO"),
    ("p50_ms", "p50 ms"),
    ("p99_ms", "p99 ms"),
    ("p99_interactive_ms", "p99 inter."),
    ("p99_batch_ms", "p99 batch"),
    ("utilization", "util"),
    ("batch_fill", "fill"),
    ("put_backs", "NAK/req"),
    ("parts", "parts/req"),
    ("sat", "sat. req/s"),
]


def detail_cells(points: list[Point]) -> list[list[str]]:
    out = []
    for pt in points:
        r, sat = pt.at_slo, pt.saturation
        name = pt.policy + (f" [{pt.variant}]" if pt.variant else "")
        c = [pt.cost, str(pt.workers), name, "-" if pt.lag_ms is None else f"{pt.lag_ms:g}"]
        if r is None:
            c += ["-"] * 10
        else:
            n = max(r.completed, 1)
            c += [f"{r.load:.3f}", fmt(r.throughput_rps), fmt(r.p50_ms), fmt(r.p99_ms)]
            c += [fmt(r.p99_interactive_ms), fmt(r.p99_batch_ms)]
            c += [f"{r.utilization:.2f}", f"{r.batch_fill:.2f}"]
            c += [f"{r.put_backs / n:.3f}", f"{r.parts / n:.3f}"]
        c.append(fmt(sat.throughput_rps))
        out.append(c)
    return out


def detail_table(points: list[Point]) -> Table:
    t = Table(title="at the highest load within the SLO, and at saturation (1.25x)")
    for key, name in DETAIL:
        t.add_column(name, justify="left" if key in ("cost", "policy") else "right")
    for c in detail_cells(points):
        t.add_row(*c)
    return t


def target_verdict(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's target, per cost model, at 64 workers and each lag >= 20 ms."""
    out = []
    for cost in sorted({r["cost"] for r in rows}):
        mine = [
            r
            for r in rows
            if r["cost"] == cost
            and r["workers"] == TARGET_WORKERS
            and (r["lag_ms"] or 0) >= TARGET_MIN_LAG
            and "pull_vs_push-lor" in r
        ]
        if not mine:
            continue
        parts = []
        for r in mine:
            x = r["pull_vs_push-lor"]
            how = "met" if x >= TARGET else f"missed by {TARGET / x:.2f}x" if x > 0 else "missed"
            parts.append(f"{r['lag_ms']:g} ms {x:.2f}x ({how})")
        out.append(
            f"target, {cost} cost model, {TARGET_WORKERS} workers: pull >= {TARGET}x "
            f"least-outstanding push at equal p99, lag >= {TARGET_MIN_LAG:g} ms: "
            + "; ".join(parts)
        )
    return out or [f"target ({TARGET_WORKERS} workers, lag >= 20 ms): not in this sweep"]


def slos_of(params: Sequence[Params]) -> dict[str, float]:
    return {p.cost_label: float(p.slo_ms or math.nan) for p in params}


def markdown(
    rows: list[dict[str, Any]],
    points: list[Point],
    params: Sequence[Params],
    iso: dict[str, dict[str, float]],
    verdict: list[str],
    command: str,
    when: str,
    runtime: float,
) -> str:
    slos = slos_of(params)
    lines = [
        "# Pull vs push: discrete-event simulation",
        "",
        f"`{command}`, {when}, {runtime:.0f} s. A model, not a measurement: only the cost "
        "coefficients marked fitted come from real runs; the pull decisions are the real "
        "worker's functions (`queue.sizing`, `worker.slicing`).",
        "",
    ]
    for p in params:
        i = iso[p.cost_label]
        lines += [f"## Assumptions: {p.cost_label} cost model", ""]
        lines += [f"- {line}" for line in p.describe()]
        lines += [
            f"- served alone: p50/p99 {i['p50_ms_slowest']:.0f}/{i['p99_ms_slowest']:.0f} ms "
            f"on the slowest worker, {i['p50_ms_mean']:.0f}/{i['p99_ms_mean']:.0f} ms at the "
            "fleet's mean speed",
            "",
        ]
    lines += ["## Throughput at equal p99", ""]
    lines += headline_markdown(rows, slos)
    if any(p.variant for p in points):
        lines += [
            "`pull hwX`: pull by a worker with another high water: it pulls while it holds "
            "less than X budgets (the worker today, `worker/loop.py`: 2; hw0: only when it "
            "holds nothing, for one budget); `/nofull`: a full worker does not pull queries "
            "(today it does, every 20 ms). Everything else is the same.",
            "",
        ]
    lines += [f"**{v}**" for v in verdict]
    lines += ["", "## Detail", ""]
    lines.append("| " + " | ".join(name for _, name in DETAIL) + " |")
    lines.append("| --- | ---: | --- |" + " ---: |" * (len(DETAIL) - 3))
    lines += ["| " + " | ".join(c) + " |" for c in detail_cells(points)]
    lines += [
        "",
        "Load is offered load over nominal capacity (full batches, no padding); util is the "
        "mean busy fraction of the workers; fill is padded slots over the full batch budget; "
        "NAK/req and parts/req are put-backs and published slices per completed request.",
        "",
    ]
    return "\n".join(lines)
