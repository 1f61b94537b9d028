"""Reports of ``fleetserve bench knee``: rich tables, ``<name>.md``, ``.json``, ``.png``.

Every table fits 80 columns. The PNG has achieved throughput, p50 and p99 against
offered load, all targets on one figure, each target's knee marked.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .knee_find import Knee, KneePoint
from .report import cpu_flags, machine


@dataclass
class TargetResult:
    name: str
    url: str
    model: str
    rates: list[float] = field(default_factory=list)  # the nominal offered rates
    points: list[KneePoint] = field(default_factory=list)
    knee: Knee | None = None
    capacity_rps: float | None = None  # the closed-loop probe, when rates were automatic
    first_error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "model": self.model,
            "capacity_rps": self.capacity_rps,
            "points": [
                {"rate_rps": r, **p.as_dict()} for r, p in zip(self.rates, self.points, strict=True)
            ],
            "knee": self.knee.as_dict() if self.knee else None,
            "first_error": self.first_error,
        }


def fmt(v: float | None, digits: int = 3) -> str:
    """Three significant figures, thousands separated; '-' for nothing."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if abs(v) >= 10 ** (digits - 1):
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


POINT_COLUMNS = ("offered/s", "target", "achieved/s", "tokens/s", "p50 ms", "p99 ms", "err")
KNEE_COLUMNS = ("target", "knee req/s", "tokens/s", "p99 ms", "Kneedle req/s")


def point_rows(results: Sequence[TargetResult]) -> list[list[str]]:
    """By offered rate, then target: the order they were measured in."""
    rows = []
    n = max((len(r.points) for r in results), default=0)
    for k in range(n):
        for r in results:
            if k < len(r.points):
                p = r.points[k]
                rows.append(
                    [
                        fmt(p.offered_rps),
                        r.name,
                        fmt(p.achieved_rps),
                        fmt(p.achieved_tokens_s),
                        fmt(p.p50_ms),
                        fmt(p.p99_ms),
                        str(p.errors),
                    ]
                )
    return rows


def knee_rows(results: Sequence[TargetResult]) -> list[list[str]]:
    rows = []
    for r in results:
        k, p = r.knee, r.knee.point if r.knee else None
        rows.append(
            [
                r.name,
                fmt(k.knee_rps if k else None) + (" +" if k and k.beyond_sweep else ""),
                fmt(p.achieved_tokens_s if p else None),
                fmt(p.p99_ms if p else None),
                fmt(k.kneedle_rps if k else None),
            ]
        )
    return rows


def table(title: str, columns: Sequence[str], rows: list[list[str]]) -> Table:
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, justify="left" if c == "target" else "right", overflow="fold")
    for row in rows:
        t.add_row(*(escape(cell) for cell in row))
    return t


def _md_table(columns: Sequence[str], rows: list[list[str]]) -> list[str]:
    align = ["---" if c == "target" else "---:" for c in columns]
    lines = ["| " + " | ".join(columns) + " |", "| " + " | ".join(align) + " |"]
    return lines + ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]


def markdown(results: Sequence[TargetResult], header: str, notes: Sequence[str]) -> str:
    lines = [header, ""]
    lines += _md_table(KNEE_COLUMNS, knee_rows(results))
    lines += [""] + [f"- {n}" for n in notes] + [""]
    lines += _md_table(POINT_COLUMNS, point_rows(results))
    return "\n".join(lines) + "\n"


def knee_notes(results: Sequence[TargetResult]) -> list[str]:
    """One line per target: its knee's reason; '+' marks a knee above the sweep."""
    return [f"{r.name}: {r.knee.reason}" for r in results if r.knee is not None]


def plot(results: Sequence[TargetResult], path: Path, title: str, slo_ms: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.6))
    top = 0.0
    for r in results:
        if not r.points:
            continue
        xs = [p.offered_rps for p in r.points]
        top = max(top, *xs, *(p.achieved_rps for p in r.points))
        (line,) = ax1.plot(xs, [p.achieved_rps for p in r.points], marker="o", label=r.name)
        ax2.plot(xs, [p.p50_ms for p in r.points], marker="o", color=line.get_color())
        ax3.plot(xs, [p.p99_ms for p in r.points], marker="o", color=line.get_color())
        if r.knee is not None and r.knee.knee_rps is not None:
            for ax in (ax1, ax2, ax3):
                ax.axvline(r.knee.knee_rps, color=line.get_color(), ls=":", lw=1.2)
    low = min((p.offered_rps for r in results for p in r.points), default=1.0)
    ax1.plot([low, top], [low, top], color="grey", ls="--", lw=0.8, label="achieved = offered")
    ax1.set(xlabel="offered req/s", ylabel="achieved req/s", title="Throughput")
    ax2.set(xlabel="offered req/s", ylabel="ms", title="p50 latency")
    ax3.set(xlabel="offered req/s", ylabel="ms", title="p99 latency")
    ticker = matplotlib.ticker
    for ax in (ax1, ax2, ax3):  # log-log: the automatic rates are geometric
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(ticker.NullFormatter())
        ax.grid(True, which="major", alpha=0.3)
    if slo_ms is not None:
        ax3.axhline(slo_ms, color="red", ls="--", lw=0.8, label=f"SLO {slo_ms:g} ms")
        ax3.legend(fontsize=8)
    ax1.legend(fontsize=8)
    fig.suptitle(title + "  (dotted: each target's knee)", fontsize=10)
    fig.tight_layout()
    names = ", ".join(r.name for r in results)
    fig.savefig(path, dpi=110, metadata={"Title": f"fleetserve bench knee: {names}"})
    plt.close(fig)


def _finite(v: object) -> object:
    """The same data with NaN and infinities as null: JSON has no NaN."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_finite(x) for x in v]
    return v


def write(
    out: Path,
    name: str,
    data: dict[str, Any],
    md: str,
    results: Sequence[TargetResult],
    title: str,
) -> list[Path]:
    """``<name>.json``, ``.md`` and ``.png`` (with matplotlib) in ``out``; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.json", out / f"{name}.md", out / f"{name}.png"]
    paths[0].write_text(json.dumps(_finite(data), indent=2) + "\n")
    paths[1].write_text(md)
    try:
        plot(results, paths[2], title, data.get("slo_ms"))
    except ImportError:  # matplotlib: the bench extra
        return paths[:2]
    return paths


def report(
    args: argparse.Namespace,
    results: list[TargetResult],
    rates: list[float],
    stats: dict[str, float],
    console: Console,
) -> None:
    """Print the tables; write ``<out>/<name>.{json,md,png}``."""
    slo = f"p99 SLO {args.slo_ms:g} ms" if args.slo_ms is not None else "no SLO (Kneedle on p99)"
    workload = (
        f"{args.workload} ({args.items} texts/request; tokens "
        + "/".join(fmt(stats[k]) for k in ("min", "median", "p90", "max"))
        + " min/median/p90/max)"
    )
    title = f"fleetserve bench knee: {workload}, {slo}"
    header = (
        f"Machine: {machine()} ({', '.join(cpu_flags()) or 'no AVX/AMX flags'}). "
        f"Workload: {workload}. Open loop, Poisson arrivals, "
        f"{args.duration:g} s per rate, targets interleaved at each rate; {slo}; "
        f"{time.strftime('%Y-%m-%d')}. '+': every rate passed, the knee may lie above."
    )
    console.print(table("knee", KNEE_COLUMNS, knee_rows(results)))
    for note in knee_notes(results):
        console.print(f"  {note}", markup=False)
    console.print(table("every point", POINT_COLUMNS, point_rows(results)))
    for r in results:
        if r.first_error:
            console.print(f"{r.name}: first error: {r.first_error}", style="yellow", markup=False)
    md = markdown(results, header, knee_notes(results))
    data: dict[str, Any] = {
        "machine": machine(),
        "cpu_flags": cpu_flags(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "workload": {"kind": args.workload, "items_per_request": args.items, "tokens": stats},
        "slo_ms": args.slo_ms,
        "duration_s": args.duration,
        "rates_rps": rates,
        "targets": [r.as_dict() for r in results],
        "args": {**vars(args), "api_key": "<redacted>" if args.api_key else ""},
    }
    paths = write(Path(args.out), args.name, data, md, results, title)
    console.print("wrote " + ", ".join(str(p) for p in paths), markup=False)
    if len(paths) < 3:
        console.print("no PNG: no matplotlib (fleetserve[bench])", style="yellow", markup=False)
