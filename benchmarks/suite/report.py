"""The suite's CPU account as Markdown, JSON and a PNG (the files by CPU, by phase)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _table(title: str, rows: list[tuple[str, float]], top: int, total: float) -> list[str]:
    out = [f"| {title} | CPU-s | share |", "| --- | ---: | ---: |"]
    for name, cpu in rows[:top]:
        share = f"{100 * cpu / total:.1f} %" if total else "-"
        out.append(f"| {name.replace('|', '/')} | {cpu:.1f} | {share} |")
    if len(rows) > top:
        rest = sum(cpu for _, cpu in rows[top:])
        out.append(f"| ({len(rows) - top} more) | {rest:.1f} | |")
    return [*out, ""]


def markdown(r: dict[str, Any], top: int = 30) -> str:
    a, run = r["account"], r["run"]
    suite = sum(cpu for _, cpu in a["by_phase"])
    kernel = sum(cpu for _, cpu in a["kernel"])
    lines = [
        f"# Where `{run['command']}` spends its CPU ({r['machine']['class']})",
        "",
        f"{run['when']}; {r['machine']['summary']}; flags: "
        f"{' '.join(r['machine'].get('features', [])) or '-'}. Exit status {run['rc']}, "
        f"{run['wall_s']:.0f} s wall. The command's processes used {run['cpu_s']:.0f} "
        f"CPU-s (getrusage); {a['seen_cpu_s']:.0f} were sampled from /proc every "
        f"{run['tick_s']} s, kernel threads included: {suite:.0f} in the suite's pytest "
        f"runs, {kernel:.0f} in kernel threads, the rest outside the suite (the install, "
        "the machine's own). A process that lived less than a tick is not seen.",
        "",
    ]
    lines += _table("phase (a pytest run, by its marker expression)", a["by_phase"], top, suite)
    lines += _table("file (its servers and children included)", a["by_file"], top, suite)
    lines += _table("test", a["by_test"], top, suite)
    lines += _table("process kind", a["by_kind"], top, suite)
    lines += _table("kernel thread", a["kernel"], 10, a["seen_cpu_s"])
    lines += _table("outside the suite", a["outside"], 10, a["seen_cpu_s"])
    return "\n".join(lines)


def plot(r: dict[str, Any], path: Path, top: int = 25) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = r["account"]
    files = a["by_file"][:top][::-1]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 7), gridspec_kw={"width_ratios": [3, 1]})
    ax.barh([f[-55:] for f, _ in files], [c for _, c in files], color="tab:blue")
    ax.set_xlabel("CPU-seconds (the file's tests, servers and children)")
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title(f"{r['run']['command']} on {r['machine']['class']}: the {top} costliest files")
    parts = [(p, c) for p, c in a["by_phase"]] + [
        ("kernel threads", sum(c for _, c in a["kernel"])),
        ("outside the suite", sum(c for _, c in a["outside"])),
    ]
    ax2.bar(range(len(parts)), [c for _, c in parts], color="tab:gray")
    ax2.set_xticks(range(len(parts)), [p or "(pytest)" for p, _ in parts], rotation=60,
                   ha="right", fontsize=7)  # fmt: skip
    ax2.set_ylabel("CPU-seconds")
    ax2.set_title("by phase")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(out: Path, r: dict[str, Any], top: int = 30) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "suite-cpu.json", out / "suite-cpu.md", out / "suite-cpu.png"]
    paths[0].write_text(json.dumps(r, indent=1) + "\n")
    paths[1].write_text(markdown(r, top))
    plot(r, paths[2])
    return paths
