"""Reports of ``python -m benchmarks dist``: rich tables, ``<name>.md``, ``.json``, ``.png``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fleetserve.bench.report import machine

P50_BUDGET_MS = 3.0  # NATS p50 may exceed embedded p50 by this much
THROUGHPUT_SHARE = 0.90  # of embedded, at saturation

Column = tuple[str, str, str]  # (row key, title, format)
UNIFORM: list[Column] = [
    ("target", "target", "s"),
    ("tokens_per_s", "tokens/s (saturation)", ",.0f"),
    ("vs_embedded", "x embedded", ".2f"),
    ("p50_ms", "p50 ms (1 client, 1 sentence)", ".2f"),
    ("p99_ms", "p99 ms", ".2f"),
    ("p50_over_embedded_ms", "p50 - embedded ms", "+.2f"),
    ("min_cos", "min cosine vs embedded", ".6f"),
]
KNEES: list[Column] = [
    ("mode", "mode", "s"),
    ("knee_clients", "knee (clients)", "d"),
    ("knee_tokens_per_s", "tokens/s at knee", ",.0f"),
    ("knee_p50_ms", "p50 ms at knee", ",.0f"),
    ("knee_p99_ms", "p99 ms at knee", ",.0f"),
    ("knee_single_p99_ms", "p99 ms of 1-item requests at knee", ",.0f"),
    ("max_tokens_per_s", "best tokens/s", ",.0f"),
    ("top_p99_ms", "p99 ms at most clients", ",.0f"),
]
PUT_BACKS: list[Column] = [
    ("cluster", "cluster", "s"),
    ("phase", "workload", "s"),
    ("requests", "requests", ",.0f"),
    ("put_backs", "put-backs", ",.0f"),
    ("put_backs_per_1000", "put-backs / 1000 requests", ".1f"),
    ("redeliveries", "redeliveries", ",.0f"),
    ("redeliveries_per_1000", "redeliveries / 1000", ".1f"),
]


def machine_info() -> dict[str, Any]:
    summary = machine()
    return {"summary": summary, "cores": os.cpu_count(), "cpu": summary.split(", ")[0]}


def _fmt(v: Any, spec: str) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    return format(v, spec)


def _cells(row: dict[str, Any], cols: list[Column]) -> list[str]:
    return [_fmt(row.get(k), f) for k, _, f in cols]


def _md_table(rows: list[dict[str, Any]], cols: list[Column]) -> list[str]:
    lines = ["| " + " | ".join(t for _, t, _ in cols) + " |"]
    lines.append("| --- |" + " ---: |" * (len(cols) - 1))
    lines += ["| " + " | ".join(_cells(r, cols)) + " |" for r in rows]
    return lines


def _rich_table(rows: list[dict[str, Any]], cols: list[Column], title: str) -> Table:
    t = Table(title=title)
    for i, (_, name, _) in enumerate(cols):
        t.add_column(name, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*_cells(r, cols))
    return t


def sweep_columns(result: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Column]]:
    """The sweep as one row per client count, tokens/s and p99 per mode."""
    modes = list(dict.fromkeys(p["mode"] for p in result["sweep"]))
    by_c: dict[int, dict[str, Any]] = {}
    for p in result["sweep"]:
        row = by_c.setdefault(p["concurrency"], {"clients": p["concurrency"]})
        row[p["mode"] + ":tps"] = p["tokens_per_s"]
        row[p["mode"] + ":p99"] = p["p99_ms"]
        row[p["mode"] + ":p99s"] = p.get("single_p99_ms")
    cols: list[Column] = [("clients", "clients", "d")]
    for m in modes:
        cols += [
            (m + ":tps", f"{m} tokens/s", ",.0f"),
            (m + ":p99", f"{m} p99 ms", ",.0f"),
            (m + ":p99s", f"{m} p99 ms 1-item", ",.0f"),
        ]
    return [by_c[c] for c in sorted(by_c)], cols


def verdicts(result: dict[str, Any]) -> list[str]:
    rows = result["uniform"]
    out = []
    for r in rows[1:]:
        lat_ok = r["p50_over_embedded_ms"] <= P50_BUDGET_MS
        thr_ok = r["vs_embedded"] >= THROUGHPUT_SHARE
        out.append(
            f"{r['target']}: p50 {r['p50_over_embedded_ms']:+.2f} ms over embedded "
            f"(target <= +{P50_BUDGET_MS:.0f} ms: {'met' if lat_ok else 'missed'}); "
            f"throughput {r['vs_embedded']:.2f}x embedded "
            f"(target >= {THROUGHPUT_SHARE:.2f}x: {'met' if thr_ok else 'missed'})."
        )
    return out


def _noise(result: dict[str, Any]) -> list[str]:
    n = result.get("noise")
    if not n:
        return []
    return [
        f"Other processes on the machine during the measurements: median "
        f"{n['others_cores_median']:.2f} cores, max {n['others_cores_max']:.2f} "
        f"(steal included); {n['noisy_share']:.0%} of the measurements above 0.25 cores; "
        f"{n['waited_s']:.0f} s spent waiting for quiet.",
        "",
    ]


def markdown(result: dict[str, Any]) -> str:
    a, w = result["args"], result["workload"]
    sweep_rows, sweep_cols = sweep_columns(result)
    lines = [
        f"Machine: {result['machine']['summary']}. {time.strftime('%Y-%m-%d')}; "
        f"the whole run took {result['seconds']:.0f} s.",
        "",
        *_noise(result),
        "### Embedded against NATS (uniform 64-token sentences)",
        "",
        f"{a['rounds']} interleaved rounds, medians; saturation = {a['concurrency']} clients "
        f"x {a['batch']} sentences/request; latency = 1 client x 1 sentence. NATS: "
        "nats-server (JetStream, file storage) + gateway + workers, each a process.",
        "",
        *_md_table(result["uniform"], UNIFORM),
        "",
        *[f"- {v}" for v in verdicts(result)],
        "",
        "### Pull against push (mixed request sizes, the same 2 workers x 1 thread)",
        "",
        f"Requests: {w['single_item_share']:.0%} single items, mean {w['mean_items']:.1f} "
        f"items and {w['mean_tokens_per_request']:,.0f} tokens (max {w['max_items']} items); "
        f"item lengths log-uniform {w['item_tokens'][0]}-{w['item_tokens'][1]} tokens, "
        f"truncated at {w['max_seq_len']}; seed {a['seed']}. Closed loop; "
        f"{a['sweep_rounds']} interleaved rounds x {a['sweep_duration']:g} s per point "
        "(each round from another place in the request pool), latencies pooled. Tokens/s: "
        "what the workers computed in the window (their token counters); latency: every "
        "request sent in the window. Pull: both workers pull from one stream. Push: each "
        "worker has its own stream and a router in front (the gateway with a per-worker "
        "queue) picks round-robin (rr) or the worker with the fewest of its requests in "
        "flight (lor). Knee: the fewest clients reaching 95% of the mode's best throughput.",
        "",
        *_md_table(result["knees"], KNEES),
        "",
        *_md_table(sweep_rows, sweep_cols),
        "",
        "### Put-backs (pulled beyond the batch budget and NAK-ed for any worker)",
        "",
        *_md_table(result["put_backs"], PUT_BACKS),
    ]
    return "\n".join(lines)


def print_tables(result: dict[str, Any], console: Console) -> None:
    console.print(_rich_table(result["uniform"], UNIFORM, "embedded against NATS (medians)"))
    for v in verdicts(result):
        console.print(v)
    console.print(_rich_table(result["knees"], KNEES, "pull against push: the knee"))
    rows, cols = sweep_columns(result)
    console.print(_rich_table(rows, cols, "pull against push: the sweep"))
    console.print(_rich_table(result["put_backs"], PUT_BACKS, "put-backs"))


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ((ax1, ax2), (ax3, ax4)) = plt.subplots(2, 2, figsize=(13, 9))
    for mode in dict.fromkeys(p["mode"] for p in result["sweep"]):
        pts = sorted(
            (p for p in result["sweep"] if p["mode"] == mode), key=lambda p: p["concurrency"]
        )
        cs = [p["concurrency"] for p in pts]
        ax1.plot(cs, [p["tokens_per_s"] for p in pts], marker="o", label=mode)
        (line,) = ax2.plot(cs, [p["p99_ms"] for p in pts], marker="o", label=f"{mode}, all")
        single = [p.get("single_p99_ms") for p in pts]
        if all(x is not None for x in single):
            ax2.plot(
                cs, single, ls="--", marker=".", color=line.get_color(), label=f"{mode}, 1-item"
            )
    ax1.set(xscale="log", xlabel="concurrent clients", ylabel="tokens/s")
    ax1.set_title("Pull vs push: throughput (mixed sizes)")
    ax2.set(xscale="log", yscale="log", xlabel="concurrent clients", ylabel="p99 ms")
    ax2.set_title("Pull vs push: p99 (solid: all requests, dashed: 1-item)")
    for ax in (ax1, ax2):
        ax.set_xticks(sorted({p["concurrency"] for p in result["sweep"]}), minor=False)
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.legend()
    uni = result["uniform"]
    names = [r["target"] for r in uni]
    ax3.barh(names, [r["tokens_per_s"] for r in uni], color="tab:blue")
    ax3.set(xlabel="tokens/s (4 clients x 32 sentences)", title="Embedded vs NATS: throughput")
    ax4.barh(names, [r["p50_ms"] for r in uni], color="tab:orange")
    ax4.set(xlabel="p50 ms (1 client, 1 sentence)", title="Embedded vs NATS: latency")
    for ax in (ax3, ax4):
        ax.invert_yaxis()
    ax4.set_yticklabels([])
    fig.suptitle(result["machine"]["summary"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plain(v: Any) -> Any:
    """Strict JSON: NaN (no samples) becomes null."""
    if isinstance(v, float) and v != v:
        return None
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def write(out: Path, name: str, result: dict[str, Any], console: Console) -> None:
    out.mkdir(parents=True, exist_ok=True)
    print_tables(result, console)
    (out / f"{name}.json").write_text(json.dumps(_plain(result), indent=2) + "\n")
    (out / f"{name}.md").write_text(markdown(result) + "\n")
    plot(result, out / f"{name}.png")
    console.print(f"wrote {out / name}.md, .json and .png")
