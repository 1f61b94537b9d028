"""The embed comparison's report: a rich table, a markdown table for the README, a PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

# (row key, column title)
COLUMNS = [
    ("target", "target"),
    ("tokens_per_s", "tokens/s (saturation)"),
    ("vs_infinity_default", "x infinity default"),
    ("vs_infinity_fp32", "x infinity fp32"),
    ("vs_infinity_best", "x best infinity"),
    ("vs_inprocess_best", "x best in-process"),
    ("p50_ms", "p50 ms (1 client, 1 text)"),
    ("p99_ms", "p99 ms"),
    ("min_cos", "min cosine"),
]


def _cells(row: dict[str, Any]) -> list[str]:
    return [_fmt(row.get(key), key) for key, _ in COLUMNS]


def table(rows: list[dict[str, Any]], title: str) -> Table:
    t = Table(title=title)
    for key, name in COLUMNS:
        t.add_column(name, justify="left" if key == "target" else "right")
    for r in rows:
        t.add_row(*_cells(r))
    return t


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    lines = [
        header,
        "",
        "| " + " | ".join(name for _, name in COLUMNS) + " |",
        "| --- |" + " ---: |" * (len(COLUMNS) - 1),
    ]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def _fmt(v: Any, key: str = "") -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if key == "min_cos":
        return f"{v:.6f}"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"
    return str(v)


def plot(knee: dict[str, list[dict[str, Any]]], rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(13, 8))
    grid = fig.add_gridspec(2, 2, height_ratios=[1, 0.9])
    ax1, ax2 = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
    ax3 = fig.add_subplot(grid[1, :])
    for name, pts in knee.items():
        cs = [p["concurrency"] for p in pts]
        ax1.plot(cs, [p["tokens_per_s"] for p in pts], marker="o", label=name)
        ax2.plot(
            [p["tokens_per_s"] for p in pts], [p["p99_ms"] for p in pts], marker="o", label=name
        )
    ax1.set(
        xscale="log", xlabel="concurrent clients", ylabel="tokens/s", title="Throughput vs load"
    )
    ax2.set(xlabel="tokens/s", ylabel="p99 ms", yscale="log", title="Latency vs throughput")
    names = [r["target"] for r in rows]
    ax3.barh(names, [r["tokens_per_s"] for r in rows])
    ax3.set(xlabel="tokens/s at saturation", title="Saturation throughput (median)")
    ax1.legend()
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save(out: Path, data: dict[str, Any], md: str, console: Console) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "embed.json").write_text(json.dumps(data, indent=2))
    (out / "embed.md").write_text(md + "\n")
    console.print(f"wrote {out / 'embed.json'}, {out / 'embed.md'} and {out / 'embed.png'}")
