"""Medians, verdicts, tables (80 columns), JSON and PNG of ``python -m benchmarks priority``."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from fleetserve.bench.loadgen import percentile

from .fleet_report import _num, _pyplot, plain
from .hop import BUDGET_MS
from .priority_load import Sample

P99_MS = 100.0  # interactive p99 under bulk load, at most
BULK_SHARE = 0.90  # of the bulk-alone throughput, at least
ALONE = "alone"
VARIANTS = {"mixed": "none", "mixed+header": "X-Priority"}  # variant -> the queries' header


def repeat_row(s: Sample, others: float) -> dict[str, Any]:
    return {
        "bulk_tokens_per_s": s.bulk_tokens_per_s,
        "bulk_items_per_s": s.bulk_items_per_s,
        "bulk_done": s.bulk_done,
        "bulk_errors": s.bulk_errors,
        "queries": len(s.query_ms),
        "query_errors": s.query_errors,
        "error_codes": s.error_codes,
        "query_p50_ms": s.query(0.5),
        "query_p99_ms": s.query(0.99),
        "drain_s": s.drain_s,
        "others_cores": others,
    }


def _med(xs: Sequence[float]) -> float:
    good = [x for x in xs if x == x]
    return statistics.median(good) if good else float("nan")


def summarize(
    runs: Mapping[tuple[str, str], Sequence[tuple[Sample, float]]], hardware_class: str
) -> list[dict[str, Any]]:
    """A row per target and mixed variant: medians over repeats; the ratio of bulk
    throughput mixed to alone is taken per repeat (adjacent phases), then the median."""
    out = []
    for (target, variant), got in runs.items():
        if variant == ALONE:
            continue
        alone = [s.bulk_tokens_per_s for s, _ in runs.get((target, ALONE), [])]
        mixed = [s.bulk_tokens_per_s for s, _ in got]
        ratios = [m / a for m, a in zip(mixed, alone, strict=False) if a > 0]
        p99 = _med([s.query(0.99) for s, _ in got])
        ratio = _med(ratios)
        out.append(
            {
                "target": target,
                "variant": variant,
                "header": VARIANTS[variant],
                "hardware_class": hardware_class,
                "bulk_alone_tokens_per_s": _med(alone),
                "bulk_mixed_tokens_per_s": _med(mixed),
                "bulk_ratio": ratio,
                "query_p50_ms": _med([s.query(0.5) for s, _ in got]),
                "query_p99_ms": p99,
                "query_p99_pooled_ms": percentile([x for s, _ in got for x in s.query_ms], 0.99),
                "queries": sum(len(s.query_ms) for s, _ in got),
                "errors": sum(s.query_errors + s.bulk_errors for s, _ in got),
                "error_codes": _codes(s for s, _ in got),
                "met": bool(p99 <= P99_MS and ratio >= BULK_SHARE),
                "repeats": [repeat_row(s, o) for s, o in got],
                "repeats_alone": [repeat_row(s, o) for s, o in runs.get((target, ALONE), [])],
            }
        )
    return out


def _codes(samples: Iterable[Sample]) -> dict[int, int]:
    out: dict[int, int] = {}
    for s in samples:
        for code, n in s.error_codes.items():
            out[code] = out.get(code, 0) + n
    return out


def verdicts(result: Mapping[str, Any]) -> list[str]:
    lines = []
    for r in result.get("rows", []):
        lines.append(
            f"{r['target']} ({r['header']}): p99 {_num(r['query_p99_ms'])} ms, "
            f"bulk {_num(r['bulk_ratio'], 2)}x alone: {'met' if r['met'] else 'missed'}"
        )
    for h in result.get("hop", [])[1:]:
        lines.append(
            f"hop: {h['target']} p50 {h['p50_over_first_ms']:+.2f} ms over embedded "
            f"(<= +{BUDGET_MS:.0f}): {'met' if h['met'] else 'missed'}"
        )
    return lines


def _ms(v: float) -> str:
    return "-" if v != v else f"{v:,.1f}" if v < 1000 else f"{v:,.0f}"


def _table(title: str, caption: str = "") -> Table:
    return Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),  # with the box's separator: 2 columns between columns
        title=title,
        caption=caption or None,
    )


def mixed_table(result: Mapping[str, Any]) -> Table:
    a = result["args"]
    t = _table(
        "interactive queries under bulk load (medians over repeats)",
        f"bulk tokens/s: {a['bulk_clients']} closed-loop client(s) x {a['bulk_items']} "
        f"texts; queries: 1 sentence, Poisson {a['rate']:g}/s, their latency in ms; "
        f"{a['repeats']} repeat(s) x {a['seconds']:g} s; met: p99 <= {P99_MS:.0f} ms and "
        f"bulk >= {BULK_SHARE:.1f}x alone",
    )
    t.add_column("target", no_wrap=True)
    t.add_column("query\nheader", no_wrap=True)
    for title in ("bulk\nalone", "bulk\nmixed", "mixed/\nalone", "query\np50", "query\np99"):
        t.add_column(title, justify="right", no_wrap=True)
    t.add_column("met", no_wrap=True)
    for r in result["rows"]:
        t.add_row(
            r["target"],
            r["header"],
            f"{r['bulk_alone_tokens_per_s']:,.0f}",
            f"{r['bulk_mixed_tokens_per_s']:,.0f}",
            _num(r["bulk_ratio"], 2),
            _ms(r["query_p50_ms"]),
            _ms(r["query_p99_ms"]),
            "yes" if r["met"] else "no",
        )
    return t


def hop_table(result: Mapping[str, Any]) -> Table:
    a = result["args"]
    t = _table(
        "the broker hop: 1 client, 1 short sentence, sequential",
        f"{a['hop_requests']} requests per target after {a['hop_warmup']} warm-up; "
        f"target: NATS p50 within {BUDGET_MS:.0f} ms of embedded",
    )
    t.add_column("target", no_wrap=True)
    for title in ("p50 ms", "p99 ms", "mean ms", "p50 - embedded", "errors"):
        t.add_column(title, justify="right", no_wrap=True)
    for h in result["hop"]:
        t.add_row(
            h["target"],
            _num(h["p50_ms"], 2),
            _num(h["p99_ms"], 2),
            _num(h["mean_ms"], 2),
            f"{h['p50_over_first_ms']:+.2f} ms",
            str(h["errors"]),
        )
    return t


def search_table(result: Mapping[str, Any]) -> Table:
    t = _table("infinity-emb: its settings tried (bulk alone)")
    for title, right in (("candidate", False), ("tok/s", True), ("min cos", True), ("", False)):
        t.add_column(title, justify="right" if right else "left", no_wrap=True)
    for r in result["infinity_search"]:
        note = "chosen" if r.get("chosen") else ("failed" if "error" in r else "")
        if r.get("eligible") is False:
            note = "below quality"
        t.add_row(r["target"], _num(r.get("tokens_per_s")), _num(r.get("min_cos"), 5), note)
    return t


def print_tables(result: Mapping[str, Any], console: Console) -> None:
    if result.get("infinity_search"):
        console.print(search_table(result))
    if result.get("rows"):
        console.print(mixed_table(result))
    if result.get("hop"):
        console.print(hop_table(result))
    for line in verdicts(result):
        console.print(line)


def plot(result: Mapping[str, Any], path: Path) -> None:
    plt = _pyplot()
    rows, hop = result.get("rows", []), result.get("hop", [])
    panels = (2 if rows else 0) + (1 if hop else 0)
    fig, axes = plt.subplots(1, max(1, panels), figsize=(5 * max(1, panels), 4.2), squeeze=False)
    ax = list(axes[0])
    if rows:
        names = [f"{r['target']}\n{r['header']}" for r in rows]
        y = range(len(rows))
        ax[0].barh([k + 0.2 for k in y], [r["bulk_alone_tokens_per_s"] for r in rows], 0.4,
                   label="bulk alone", color="#999999")  # fmt: skip
        ax[0].barh([k - 0.2 for k in y], [r["bulk_mixed_tokens_per_s"] for r in rows], 0.4,
                   label="bulk with queries", color="#4c72b0")  # fmt: skip
        ax[0].set(yticks=list(y), yticklabels=names, xlabel="bulk tokens/s")
        ax[0].legend(fontsize=8)
        ax[1].barh(list(y), [r["query_p99_ms"] for r in rows], color="#dd8452")
        ax[1].axvline(P99_MS, color="k", ls="--", lw=1)
        ax[1].set(
            yticks=list(y), yticklabels=[], xscale="log", xlabel="query p99 ms (dashed: target)"
        )
        for a_ in ax[:2]:
            a_.invert_yaxis()
    if hop:
        h = ax[-1]
        h.bar([x["target"] for x in hop], [x["p50_ms"] for x in hop], color="#55a868")
        h.set(ylabel="p50 ms, 1 client, 1 sentence", title="broker hop")
    fig.suptitle(f"{result['hardware_class']}: {result['lscpu_model_name']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(out: Path, name: str, result: Mapping[str, Any], console: Console) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    full = {**result, "verdicts": verdicts(result)}
    path.write_text(json.dumps(plain(full), indent=1) + "\n")
    plot(result, path.with_suffix(".png"))
    console.print(f"wrote {path} and {path.with_suffix('.png')}")
    return path
