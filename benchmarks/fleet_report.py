"""Reports of ``python -m benchmarks fleet``: rich tables (80 columns), JSON and PNG."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

MIB = 1 << 20


def _num(v: Any, digits: int = 0) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.{digits}f}"


def _ratio(v: Any) -> str:
    return "-" if v is None else f"x{v:.2f}"


# (stat, title, digits or None for MiB)
TRACE_COLUMNS = [
    ("errors", "err", 0), ("p50_ms", "p50\nms", 0), ("p99_ms", "p99\nms", 0),
    ("misses", "misses", 0), ("loads", "loads", 0), ("load_s", "load\ns", 1),
    ("evictions", "evic-\ntions", 0), ("peak_rss", "peak\nMiB", None),
    ("grown", "grown\nMiB", None),
]  # fmt: skip


def trace_table(result: dict[str, Any]) -> Table:
    t = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),  # two spaces apart: --before's four rows fit 80 columns
        title="fleet trace: medians per policy",
        caption=(
            f"{result['trace']['requests']} requests per run; budget "
            f"{result['budget_bytes'] / MIB:.0f} MiB ({result['budget_how']}); grown = "
            "peak RSS - RSS at ready, against the budget less the pinned model" + _simulated(result)
        ),
    )
    t.add_column("policy", no_wrap=True)
    for _, title, _ in TRACE_COLUMNS:
        t.add_column(title, justify="right", no_wrap=True)
    rows = {p: {**m, "grown": m["peak_rss"] - m["ready_rss"]} for p, m in result["medians"].items()}
    for policy, m in rows.items():
        cells = [_num(m[k] / MIB if d is None else m[k], d or 0) for k, _, d in TRACE_COLUMNS]
        t.add_row(policy, *cells)
    pairs = [("gdsf", "lru", "gdsf/lru")]
    pairs += [(p, f"{p}@before", f"{p}/before") for p in ("gdsf", "lru")]  # with --before
    for x, y, name in pairs:
        if x in rows and y in rows:
            a, b = rows[x], rows[y]
            ratios = [_ratio(a[k] / b[k] if b[k] else None) for k, _, _ in TRACE_COLUMNS[1:]]
            t.add_row(name, "", *ratios)
    return t


def _clients(n: int) -> str:
    return f"{n} client{'s' if n != 1 else ''}"


def _simulated(result: dict[str, Any]) -> str:
    """The simulator's gdsf/lru load seconds over the measured models, where run."""
    sim = result.get("sim") or {}
    if sim.get("load_s_gdsf_over_lru") is None:
        return ""
    runs = sim["runs"]
    foresight = sim.get("load_s_hindsight_over_lru")  # (results from before it was run)
    return (
        f"; simulated with the measured costs: gdsf/lru load s x"
        f"{sim['load_s_gdsf_over_lru']:.2f} ({runs['gdsf']['loads']} against "
        f"{runs['lru']['loads']} loads)"
        + ("" if foresight is None else f", hindsight/lru x{foresight:.2f}")
    )


COLD_COLUMNS = [
    ("load_s", "load\ns", 1), ("baseline_p50_ms", "base\np50", 0),
    ("baseline_p99_ms", "base\np99", 0), ("baseline_max_ms", "base\nmax", 0),
    ("load_p50_ms", "load\np50", 0), ("load_p99_ms", "load\np99", 0),
    ("load_max_ms", "load\nmax", 0), ("load_n", "n", 0), ("errors", "err", 0),
]  # fmt: skip


def cold_table(result: dict[str, Any]) -> Table:
    versions = {r["tree"]: f"{r['version']} ({r['src']})" for r in result["runs"]}
    t = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        title="fleet cold-load: the pinned model's latency (ms) while another loads",
        caption="; ".join(f"{k} = {v}" for k, v in versions.items())
        + ". base: before the cold request; load: until its answer (n requests, err "
        "errors in all windows)",
    )
    t.add_column("tree", no_wrap=True)
    for _, title, _ in COLD_COLUMNS:
        t.add_column(title, justify="right", no_wrap=True)
    repeated = len(result["runs"]) > len(versions)
    for r in result["runs"]:
        name = f"{r['tree']} #{r['run'] + 1}" if repeated else r["tree"]
        t.add_row(name, *[_num(r[k], d) for k, _, d in COLD_COLUMNS])
    if repeated:
        for tree, m in result["medians"].items():
            t.add_row(f"{tree} med", *[_num(m[k], d) for k, _, d in COLD_COLUMNS])
    return t


COPIES_ROWS = [
    ("budget_x", "peak RSS growth / budget", 2), ("grown_mib", "peak RSS growth (MiB)", 0),
    ("wrong", "wrong answers", 0), ("errors", "errors", 0),
    ("miss_p50_ms", "miss p50 ms (a load)", 0), ("wake_p50_ms", "miss p50 ms (a wake)", 0),
    ("hit_p50_ms", "hit p50 ms", 1), ("loads", "loads", 0), ("wakes", "wakes", 0),
    ("evictions", "evictions (sleeps too)", 0), ("drifts", "memory drifts", 0),
]  # fmt: skip


def copies_table(result: dict[str, Any]) -> Table:
    """A row per figure, a column per tree (and host tier): it fits 80 columns."""
    t = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        title=f"{result['copies']} copies of {result['model'].rsplit('/', 1)[-1]}: medians",
        caption=(
            f"{result['trace']['requests']} requests one at a time; budget "
            f"{result['budget_bytes'] / MIB:.0f} MiB = {result['room']:g} x what one copy "
            f"holds ({result['one_copy_bytes'] / MIB:.0f} MiB); grown = peak RSS - RSS at "
            "ready"
        ),
    )
    t.add_column("", no_wrap=True)
    trees = list(result["medians"])
    for tree in trees:
        t.add_column(tree, justify="right")
    for key, title, d in COPIES_ROWS:
        t.add_row(title, *[_num(result["medians"][tree][key], d) for tree in trees])
    return t


def copies_plot(result: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(11, 4.2))
    trees = list(result["medians"])
    colors = [f"C{i}" for i in range(len(trees))]
    for ax, key, title in zip(
        axes, ("budget_x", "miss_p50_ms", "wake_p50_ms"),
        ("peak RSS growth / budget", "miss p50 (ms): a load", "miss p50 (ms): a wake"),
        strict=True,
    ):  # fmt: skip
        ax.bar(trees, [result["medians"][t][key] or 0 for t in trees], color=colors)
        ax.set(title=title)
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    axes[0].axhline(1.10, color="k", linestyle="--", linewidth=1, label="target x1.10")
    axes[0].legend(loc="best")
    axes[1].axhline(300, color="k", linestyle="--", linewidth=1, label="target 300 ms")
    axes[2].axhline(100, color="k", linestyle="--", linewidth=1, label="target 100 ms")
    for ax in axes[1:]:
        ax.legend(loc="best")
    fig.suptitle(
        f"{result['copies']} copies, budget {result['budget_bytes'] / MIB:.0f} MiB, "
        f"{result['trace']['requests']} requests (Zipf s={result['trace']['zipf_s']})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plain(v: Any) -> Any:
    """JSON-safe: NaN and infinities as null, tuples as lists."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [plain(x) for x in v]
    return v


def write(out: Path, name: str, result: dict[str, Any], console: Console) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(plain(result), indent=1) + "\n")
    plots = {"fleet-trace-": trace_plot, "fleet-copies-": copies_plot}
    plot = next((f for p, f in plots.items() if name.startswith(p)), cold_plot)
    plot(result, out / f"{name}.png")
    console.print(f"wrote {path} and {path.with_suffix('.png')}")
    return path


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def trace_plot(result: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    policies = list(result["medians"])
    for ax, key, title in zip(
        axes, ("load_s", "p99_ms"), ("seconds spent loading", "p99 latency (ms)"), strict=True
    ):
        colors = [f"C{i}" for i in range(len(policies))]
        ax.bar(policies, [result["medians"][p][key] for p in policies], color=colors)
        for i, p in enumerate(policies):  # each run, over its median
            ys = [r[key] for r in result["runs"] if r["policy"] == p]
            ax.plot([i] * len(ys), ys, "k.", alpha=0.6)
        if key == "load_s" and result.get("sim"):  # the simulator, fed the measured costs
            sims = result["sim"]["runs"]  # (this tree's policies only)
            xs = [i for i, p in enumerate(policies) if p in sims]
            sim = [sims[policies[i]]["load_s"] for i in xs]
            ax.plot(xs, sim, "rx", markersize=10, label="simulated")
            if "hindsight" in sims:  # what knowing the requests to come gets
                line = sims["hindsight"]["load_s"]
                ax.axhline(line, color="r", ls="--", lw=1, label="hindsight (simulated)")
            ax.legend(loc="lower right")
        ax.set(title=title)
    runtimes = sorted({m.get("runtime", "torch") for m in result["models"]})
    fig.suptitle(
        f"{len(result['models'])} models ({', '.join(runtimes)}), budget "
        f"{result['budget_bytes'] / MIB:.0f} MiB, {result['trace']['requests']} requests "
        f"(Zipf s={result['trace']['zipf_s']}), {_clients(result.get('concurrency', 4))}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cold_plot(result: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    last = {r["tree"]: r for r in result["runs"]}  # the last run of each tree
    fig, axes = plt.subplots(len(last), 1, figsize=(9, 2.6 * len(last) + 0.6), sharey=True)
    axes = [axes] if len(last) == 1 else list(axes)
    for ax, (tree, r) in zip(axes, last.items(), strict=True):
        ts = [s[0] for s in r["samples"]]
        ms = [max(s[1], 0.1) for s in r["samples"]]
        ax.scatter(ts, ms, s=6, color="C0" if tree == "before" else "C1")
        ax.axvspan(0, r["load_s"], color="grey", alpha=0.2, label="cold model loading")
        ax.set(yscale="log", ylabel="latency ms", title=f"{tree} ({r['version']})")
        ax.legend(loc="best")
    axes[-1].set(xlabel="seconds since the cold request")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
