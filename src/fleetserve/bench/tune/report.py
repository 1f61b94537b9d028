"""A tuning run's report: markdown (what won, by how much, the noise, every point),
the run document as JSON, and a PNG (throughput of every candidate; the knee)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import duel, noise, steal


def _f(v: object, digits: int = 0) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def markdown(run: dict[str, Any]) -> str:
    w = next((c for c in run["candidates"] if c["id"] == run.get("winner")), None)
    ref = next(
        (c for c in run["candidates"] if c["runtime"] == "torch" and c["precision"] == "fp32"),
        None,
    )
    lines = [
        f"# Tuning {run['model']} on {run['hardware_class']}",
        "",
        f"- Machine: {run['machine']}",
        f"- fleetserve {run.get('fleetserve', '?')}, {run['started_at']}; workload "
        f"`{run['workload']}`, {run['clients']} clients x "
        f"{1 if run.get('family') == 'generate' else run['batch']} items per request, "
        f"{run['measure_s']:g} s per measurement, through the queue, worker and runtime",
        f"- Budget {run['budget_s']:g} s, used {run['elapsed_s']:.0f} s; {noise_line(run)}",
    ]
    if w:
        lines.append(
            f"- **Winner: `{w['id']}`** at {_f(w['tokens_per_s'])} tokens/s"
            + (
                f", {w['tokens_per_s'] / ref['tokens_per_s']:.2f}x torch fp32 at the default "
                f"batch ({_f(ref['tokens_per_s'])})"
                if ref and ref.get("tokens_per_s")
                else ""
            )
            + (
                f"; quality {w['quality']['metric']} {w['quality']['value']:.6f}"
                if w.get("quality")
                else ""
            )
        )
    if run.get("duel"):
        lines.append(f"- Duel (the two best in turns; `tune/duel.py`): {duel.line(run['duel'])}")
    knee = run.get("knee") or {}
    if not knee.get("points") and knee.get("reason"):  # swept nothing: why
        lines.append(f"- Knee: {knee['reason']}")
    if knee.get("points"):
        lines.append(
            f"- Knee (open loop, Poisson arrivals of {knee.get('items_per_request', '?')}-item "
            f"requests): {_f(knee.get('knee_rps'), 1)} requests/s "
            f"= {_f(knee.get('knee_tokens_s'))} tokens/s; {knee.get('reason', '')}"
        )
    cost = run.get("cost_fit") or {}
    if "fixed_ms" in cost:
        lines.append(
            f"- Cost model: {cost['fixed_ms']:.3f} ms + {cost['per_token_ms']:.5f} ms/token + "
            f"{cost['per_padded_token_ms']:.5f} ms/padded slot; median error on held-out "
            f"shapes {cost['median_rel_error']:.1%}"
        )
    if run.get("adapters"):
        lines.append(f"- Adapters: {adapters_line(run['adapters'])}")
    if run.get("error"):
        lines.append(f"- Error: {run['error']}")
    lines += [f"- **Warning:** {w}" for w in run.get("warnings") or []]
    lines += [f"- Note: {n}" for n in run.get("notes") or []]
    lines += [
        "",
        "| candidate | status | quality | tokens/s | p50 ms | p99 ms | why |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for c in run["candidates"]:
        q = c.get("quality")
        qs = f"{q['metric']} {q['value']:.6f}" if q else "-"
        lines.append(
            f"| `{c['id']}` | {c['status']} | {qs} | {_f(c.get('tokens_per_s'))} | "
            f"{_f(c.get('p50_ms'), 1)} | {_f(c.get('p99_ms'), 1)} | {c.get('reason') or ''} |"
        )
    if knee.get("points"):
        lines += [
            "",
            "| offered req/s | achieved req/s | achieved tokens/s | p50 ms | p99 ms |",
            "| ---: | ---: | ---: | ---: | ---: |",
        ]
        for p in knee["points"]:
            lines.append(
                f"| {p['offered_rps']:.1f} | {p['achieved_rps']:.1f} | "
                f"{_f(p['achieved_tokens_s'])} | {_f(p['p50_ms'], 1)} | {_f(p['p99_ms'], 1)} |"
            )
    return "\n".join(lines) + "\n"


def adapters_line(a: dict[str, Any]) -> str:
    """Where the winner's LoRA adapters run (``adapter_path``), and the slots' gate."""
    q = a.get("quality") or {}
    gate = (f"{q['metric']} {q['value']:.6f} against PEFT at fp32 with a seeded adapter, "
            f"needs {q['threshold']:g}") if q else "no graph with slots"  # fmt: skip
    where = "in the graph, with LoRA slots" if a.get("runs") == "in_graph" else "on a torch copy"
    return f"{where} ({gate})"


def noise_line(run: dict[str, Any]) -> str:
    """The noise, how it was computed, and the CPU steal while measuring."""
    method = run.get("noise_method")
    line = noise.describe(
        float(run.get("noise") or 0.0),
        method,
        int(run.get("noise_repeats") or 0),
        int(run.get("noise_points") or 0),
        float(run.get("noise_range") or 0.0),
    )
    if method or run.get("steal") is not None:  # older documents never recorded it
        line += f"; {steal.describe(run.get('steal'))}"
    return line


def plot(run: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [c for c in run["candidates"] if c.get("tokens_per_s")]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, max(4.0, 0.28 * len(measured) + 1.5)))
    colors = {"won": "#2a9d8f", "lost": "#8d99ae", "rejected": "#e76f51"}
    names = [c["id"] for c in measured]
    ax1.barh(
        names,
        [c["tokens_per_s"] for c in measured],
        color=[colors.get(c["status"], "#8d99ae") for c in measured],
    )
    ax1.invert_yaxis()
    ax1.set_xlabel("tokens/s (saturation, through the worker)")
    ax1.tick_params(axis="y", labelsize=7)
    ax1.set_title(f"{run['model']} on {run['hardware_class']}")
    knee = run.get("knee") or {}
    pts = knee.get("points") or []
    if pts:
        x = [p["offered_tokens_s"] for p in pts]
        ax2.plot(x, [p["achieved_tokens_s"] for p in pts], "o-", label="achieved tokens/s")
        ax2.set_xlabel("offered tokens/s")
        ax2.set_ylabel("achieved tokens/s")
        ax3 = ax2.twinx()
        ax3.plot(x, [p["p50_ms"] for p in pts], "s--", color="#f4a261", label="p50 ms")
        ax3.plot(x, [p["p99_ms"] for p in pts], "^--", color="#e76f51", label="p99 ms")
        ax3.set_ylabel("latency ms")
        ax3.set_yscale("log")
        if knee.get("knee_tokens_s"):
            ax2.axvline(knee["knee_tokens_s"], color="#2a9d8f", ls=":", label="knee")
        h1, l1 = ax2.get_legend_handles_labels()
        h2, l2 = ax3.get_legend_handles_labels()
        ax2.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8)
        ax2.set_title("the winner under open-loop load")
    else:
        ax2.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def paths(folder: Path, stem: str) -> dict[str, str]:
    """Where :func:`write` puts the report: relative to the working directory when
    under it (so a report committed to a repository names its files portably)."""
    out = {}
    for key, ext in (("markdown", "md"), ("json", "json"), ("png", "png")):
        f = (folder / f"{stem}.{ext}").expanduser().absolute()
        try:
            out[key] = str(f.relative_to(Path.cwd()))
        except ValueError:
            out[key] = str(f)
    return out


def write(run: dict[str, Any], folder: Path, stem: str) -> dict[str, str]:
    """``stem.md``, ``stem.json`` and ``stem.png`` in ``folder``; their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    out = paths(folder, stem)
    md, js, png = (Path(out[k]) for k in ("markdown", "json", "png"))
    md.write_text(markdown(run))
    js.write_text(json.dumps({**run, "report": out}, indent=1, default=str))
    try:
        plot(run, png)
    except ImportError:  # matplotlib is a dev extra: the table and JSON still stand
        out.pop("png")
    return out


__all__ = ["markdown", "noise_line", "paths", "plot", "write"]
