"""The pull-versus-push PNG: per cost model, throughput and ratio against lag, p99 vs load."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .params import POLICIES, PUSH
from .report import TARGET
from .search import Point

STYLES = (("--", "x"), (":", "s"), ("-.", "^"))  # pull variants (another high water)


def plot(
    points: list[Point], rows: list[dict[str, Any]], slos: dict[str, float], focus: int, path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    costs = sorted({r["cost"] for r in rows})
    fig, axes = plt.subplots(len(costs), 3, figsize=(17, 4.8 * len(costs)), squeeze=False)
    colour = {pol: f"C{i}" for i, pol in enumerate(POLICIES)}
    for (ax1, ax2, ax3), cost in zip(axes, costs, strict=True):
        ws = sorted({r["workers"] for r in rows if r["cost"] == cost})
        fw = focus if focus in ws else ws[len(ws) // 2]
        mine = [r for r in rows if r["cost"] == cost and r["workers"] == fw]
        lags = [r["lag_ms"] for r in mine]
        xs = [max(lag, 1.0) for lag in lags]  # log axis: 0 ms drawn at 1 ms
        for pol in ("pull", *PUSH):
            ys = [r.get(f"{pol}_slo_rps", math.nan) or math.nan for r in mine]
            ax1.plot(xs, ys, marker="o", color=colour[pol], label=pol)
            if pol != "pull":
                ax2.plot(
                    xs,
                    [min(r.get(f"pull_vs_{pol}", math.nan), 10.0) for r in mine],
                    marker="o",
                    color=colour[pol],
                    label=f"pull / {pol}",
                )
        variants = (
            [k[5:-9] for k in sorted(mine[0]) if k.startswith("pull[") and k.endswith("_slo_rps")]
            if mine
            else []
        )
        for j, v in enumerate(variants):
            ls, mk = STYLES[j % len(STYLES)]
            ys = [r[f"pull[{v}]_slo_rps"] or math.nan for r in mine]
            ax1.plot(xs, ys, ls=ls, marker=mk, color="C0", label=f"pull {v}")
            ys = [min(r.get(f"pull[{v}]_vs_push-lor", math.nan), 10.0) for r in mine]
            ax2.plot(
                xs, ys, ls=ls, marker=mk, color=colour["push-lor"], label=f"pull {v} / push-lor"
            )
        ax1.set(xscale="log", xlabel="router state lag, ms (0 drawn at 1)", ylabel="requests/s")
        ax1.set_title(f"{cost}: req/s at p99 <= {slos[cost]:g} ms, {fw} workers", fontsize=10)
        ax2.axhline(TARGET, ls="--", color="red", label=f"target {TARGET}x (vs push-lor)")
        ax2.axhline(1.0, ls=":", color="grey")
        ax2.set(
            xscale="log",
            ylim=(0, None),
            xlabel="router state lag, ms",
            ylabel="ratio (capped at 10)",
        )
        ax2.set_title(f"{cost}: pull over push at equal p99, {fw} workers", fontsize=10)
        lag = next((x for x in lags if x >= 20), lags[0] if lags else 0.0)
        style = {v: STYLES[j % len(STYLES)] for j, v in enumerate(variants)}
        for pt in points:
            if pt.cost != cost or pt.workers != fw or pt.lag_ms not in (None, lag):
                continue
            runs = sorted([*pt.tried, pt.saturation], key=lambda r: r.load)
            label = pt.policy + (f" {pt.variant}" if pt.variant else "")
            ls, mk = style.get(pt.variant, ("-", "."))
            xs3, ys3 = [r.load for r in runs], [r.p99_ms for r in runs]
            ax3.plot(xs3, ys3, marker=mk, ls=ls, color=colour[pt.policy], label=label)
        ax3.axhline(slos[cost], ls="--", color="red", label="SLO")
        ax3.set(yscale="log", xlabel="offered load / nominal capacity", ylabel="p99 ms")
        ax3.set_title(f"{cost}: p99 vs load, {fw} workers, push lag {lag:g} ms", fontsize=10)
        for ax in (ax1, ax2):
            ax.set_xticks(xs, [f"{x:g}" for x in lags])
            ax.minorticks_off()
        for ax in (ax1, ax2, ax3):
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
    fig.suptitle(
        "fleetserve bench sim: pull (central queue) vs push (router), simulated", fontsize=11
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
