"""The fleet-memory scenario's results (``fleetserve bench sim fleet``): table, findings, PNG."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from .fleet_model import FleetRun
from .report import fmt

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


def fleet_rows(runs: Sequence[FleetRun]) -> list[dict[str, Any]]:
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
        fmt(row["load_s"]),
        f"{row['evictions']:,}",
        fmt(row["p50_ms"]),
        fmt(row["p99_ms"]),
        fmt(row["throughput_rps"]),
    ]


def fleet_table(rows: list[dict[str, Any]], title: str) -> Table:
    from rich import box

    # two spaces apart: ``hindsight`` fits whole beside the rest at 80 columns
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for key, name in FLEET_COLUMNS:
        left = key in ("affinity", "eviction")
        t.add_column(name, justify="left" if left else "right", no_wrap=key == "eviction")
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
