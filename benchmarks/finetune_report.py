"""The fine-tuning demonstration's table (markdown), figure (PNG) and JSON."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fleetserve.bench.loadgen import percentile

TARGETS = {"sv": 0.60, "en": 0.12}  # relative nDCG@10 gain the issue asks for
PHASES = {
    "idle": "no job yet",
    "training": "a job training",
    "after": "the bench scoring both models through the API",
}


def _pct(xs: Sequence[float], q: float) -> float:
    return percentile(list(xs), q) if xs else float("nan")


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for run in result["runs"]:
        job = run["job"]
        res = job.get("result") or {}
        base, ad = res.get("base", {}), res.get("adapter", {})
        b, a = base.get("ndcg_at_10", float("nan")), ad.get("ndcg_at_10", float("nan"))
        gain = a / b - 1 if b else float("nan")
        out.append({
            "lang": run["lang"], "status": run["status"], "base": b, "adapter": a,
            "gain": gain, "target": TARGETS.get(run["lang"]),
            "met": bool(gain >= TARGETS.get(run["lang"], 0)),
            "recall_base": base.get("recall_at_10"), "recall_adapter": ad.get("recall_at_10"),
            "train_s": res.get("train_seconds"), "job_s": res.get("job_seconds"),
            "cost_usd": res.get("cost_usd"), "registered": res.get("registered"),
            "first_call_s": run.get("first_call_s"),
            "served_base": run.get("served_base", {}).get("ndcg_at_10"),
            "served_adapter": run.get("served_adapter", {}).get("ndcg_at_10"),
            "model": job.get("fine_tuned_model"),
        })  # fmt: skip
    return out


def markdown(result: dict[str, Any], table: list[dict[str, Any]]) -> str:
    probe = result["probe"]
    lines = [
        f"# Fine-tuning jobs: {result['hardware_class']} ({result['lscpu_model_name']})",
        "",
        f"{result['machine']}; {result['date']}. Base: {result['model']}; "
        f"train_threads {result['train_threads']}; hyperparameters "
        f"`{json.dumps(result['hyperparameters'])}`; price ${result['price_per_hour']}/h.",
        "",
        "| set | nDCG@10 base | adapter | gain | target | recall@10 | train s | job s "
        "| cost $ | served: base / adapter | first call s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        lines.append(
            f"| {r['lang']} | {r['base']:.3f} | {r['adapter']:.3f} | {r['gain']:+.1%} "
            f"| {r['target'] or 0:+.0%} {'met' if r['met'] else 'missed'} "
            f"| {r['recall_base'] or 0:.3f} -> {r['recall_adapter'] or 0:.3f} "
            f"| {r['train_s'] or 0:.1f} | {r['job_s'] or 0:.1f} | {r['cost_usd'] or 0:.5f} "
            f"| {r['served_base'] or 0:.3f} / {r['served_adapter'] or 0:.3f} "
            f"| {r['first_call_s'] or 0:.3f} |"
        )
    lines += ["", "Interactive one-sentence queries (ms), probed all along:", "",
              "| phase | n | p50 | p99 |", "|---|---|---|---|"]  # fmt: skip
    for phase in ("idle", "training", "after"):
        ms = probe.get(phase, [])
        p50 = statistics.median(ms) if ms else float("nan")
        lines.append(f"| {PHASES[phase]} | {len(ms)} | {p50:.1f} | {_pct(ms, 0.99):.1f} |")
    lines.append(f"\nprobe errors: {result['probe_errors']}")
    return "\n".join(lines) + "\n"


def figure(result: dict[str, Any], table: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    x = range(len(table))
    ax1.bar([i - 0.2 for i in x], [r["base"] for r in table], 0.4, label="base")
    ax1.bar([i + 0.2 for i in x], [r["adapter"] for r in table], 0.4, label="LoRA")
    for i, r in enumerate(table):
        ax1.text(i + 0.2, r["adapter"] + 0.01, f"{r['gain']:+.0%}", ha="center", fontsize=8)
    ax1.set_xticks(list(x), [r["lang"] for r in table])
    ax1.set_ylim(0, 1)
    ax1.set_ylabel("nDCG@10, 120 held-out questions")
    ax1.legend(fontsize=8)
    phases = ["idle", "training"]
    probe = result["probe"]
    p50 = [statistics.median(probe[p]) if probe.get(p) else 0 for p in phases]
    p99 = [_pct(probe.get(p, []), 0.99) for p in phases]
    ax2.bar([i - 0.2 for i in range(2)], p50, 0.4, label="p50")
    ax2.bar([i + 0.2 for i in range(2)], p99, 0.4, label="p99")
    ax2.set_xticks([0, 1], ["no job", "job training"])
    ax2.set_ylabel("interactive query latency, ms")
    ax2.legend(fontsize=8)
    fig.suptitle(f"{result['hardware_class']}: {result['lscpu_model_name']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(result: dict[str, Any], out: Path, tag: str = "") -> str:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"finetune-{tag + '-' if tag else ''}{result['hardware_class']}"
    table = rows(result)
    text = markdown(result, table)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(text)
    figure(result, table, stem.with_suffix(".png"))
    return text
