"""The table and figure of ``python -m benchmarks lora``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .fleet_report import _pyplot, plain

TUNED = "base, tuned runtime"
MIXED = "8 adapters mixed (tuned server)"
ONE = "1 adapter, every row (tuned server)"
MIXED_COPY = "8 adapters mixed (torch copy)"
BASE = "base on torch"
MIXED_TORCH = "8 adapters mixed (torch server)"
SINGLE = "8 adapters, one per batch"


def ratios(result: dict[str, Any]) -> dict[str, float]:
    t = result["dense"]["throughput"]
    out = {
        "mixed / base on torch": t[MIXED_TORCH]["per_s"] / t[BASE]["per_s"],
        "mixed / base on tuned runtime": t[MIXED]["per_s"] / t[TUNED]["per_s"],
        "one adapter / base on tuned runtime": t[ONE]["per_s"] / t[TUNED]["per_s"],
        "mixed, torch copy / base on tuned runtime": t[MIXED_COPY]["per_s"] / t[TUNED]["per_s"],
        "mixed / one per batch (tuned server)": t[MIXED]["per_s"] / t[SINGLE]["per_s"],
    }
    chat = result.get("chat")
    if chat:
        out["chat: adapters / base"] = (
            chat["chat: 4 adapters, mixed"]["per_s"] / chat["chat: base"]["per_s"]
        )
    return out


def table(result: dict[str, Any]) -> Table:
    t = Table(title="LoRA: mixed adapters (medians over rounds)", width=80)
    t.add_column("phase")
    t.add_column("per s", justify="right")
    t.add_column("p50 ms", justify="right")
    rows = {**result["dense"]["throughput"], **result.get("chat", {})}
    for name, r in rows.items():
        unit = "tokens" if name.startswith("chat") else "texts"
        t.add_row(name, f"{r['per_s']:.1f} {unit}", f"{r['p50_ms']:.1f}")
    for name, v in ratios(result).items():
        t.add_row(f"[b]{name}[/]", f"{v:.2f}x", "")
    for name, u in result["dense"]["upload"].items():
        t.add_row(f"upload to first request: {name}", f"{u['first_served_s'] * 1e3:.0f} ms", "")
    return t


def write(out: Path, name: str, result: dict[str, Any], console: Console) -> Path:
    import json

    out.mkdir(parents=True, exist_ok=True)
    result = {**result, "ratios": ratios(result)}
    path = out / f"{name}.json"
    path.write_text(json.dumps(plain(result), indent=1) + "\n")
    plot(result, out / f"{name}.png")
    console.print(f"wrote {path} and {path.with_suffix('.png')}")
    return path


def plot(result: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    panels = [("embeddings: texts/s", result["dense"]["throughput"])]
    if result.get("chat"):
        panels.append(("chat: tokens/s", result["chat"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels), 3.8), squeeze=False)
    for ax, (title, rows) in zip(axes[0], panels, strict=True):
        names = list(rows)
        ax.barh(names, [rows[n]["per_s"] for n in names], color="#4c72b0")
        ax.set_title(title)
        ax.invert_yaxis()
    fig.suptitle(f"{result['hardware_class']}: {result['lscpu_model_name']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
