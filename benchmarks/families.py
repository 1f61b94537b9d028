"""``python -m benchmarks families``: every family through the HTTP API beside in-process.

For each family the same model is measured two ways in one run, round after round:

- **in-process**: the family adapter called directly in this process (preprocess,
  forward in batches of the profile's size, postprocess), one request at a time;
- **HTTP**: a ``fleetserve serve`` subprocess serving the same models, driven by
  ``concurrency`` clients (saturation) and by one blocking client sending one item
  (latency).

Items/s at saturation and p50 latency are reported with their ratio; the issue's
target is server overhead <= 15 % of in-process throughput (ratio >= 0.85).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fleetserve.bench.loadgen import run_latency, run_load
from fleetserve.bench.report import machine

from .family_cases import CASES, Case, build_catalog
from .targets import fleetserve_target


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks families", description=__doc__)
    p.add_argument("--families", default=",".join(CASES), help="comma-separated cases")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    p.add_argument("--concurrency", type=int, default=4, help="clients at saturation")
    p.add_argument("--out", default=".bench/results")
    p.add_argument("--work", default=".bench/families", help="where derived models are built")
    return p.parse_args(list(argv))


def main(argv: Sequence[str] = ()) -> int:
    args = _args(argv)
    console = Console()
    names = [n for n in args.families.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        console.print(f"[red]unknown cases: {unknown}; known: {list(CASES)}[/]")
        return 2
    cases = [CASES[n] for n in names]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    console.rule("python -m benchmarks families")
    console.print(machine())
    with console.status("building the bench catalog (derived models)…"):
        catalog = build_catalog(cases, work)
    models = ",".join(c.model for c in cases)
    server = fleetserve_target(models, ["--catalog", str(catalog)], name="fleetserve")
    server.env = {"FLEETSERVE_REQUEST_TIMEOUT": "120"}
    inproc = {}
    for c in cases:
        with console.status(f"loading {c.model} in-process…"):
            inproc[c.name] = c.in_process(catalog)
    results: dict[str, dict[str, list[float]]] = {c.name: {} for c in cases}
    try:
        with console.status("starting fleetserve serve with every bench model…"):
            server.start(out, timeout=600)
        base = f"http://127.0.0.1:{server.port}"
        for r in range(args.rounds):
            console.print(f"round {r + 1}/{args.rounds}")
            for c in cases:
                ip = inproc[c.name]
                got = results[c.name]
                got.setdefault("inproc_items_s", []).append(ip.throughput(args.duration))
                got.setdefault("inproc_p50_ms", []).append(ip.latency(args.duration / 2))
                sat, p50 = _http(c, base, args.concurrency, args.duration)
                got.setdefault("http_items_s", []).append(sat)
                got.setdefault("http_p50_ms", []).append(p50)
                console.print(
                    f"  {c.name}: in-process {got['inproc_items_s'][-1]:,.1f} items/s, "
                    f"HTTP {sat:,.1f} items/s"
                )
    finally:
        server.stop()
    rows = [_row(c, results[c.name], args) for c in cases]
    console.print(_table(rows))
    md = _markdown(rows, args)
    (out / "families.md").write_text(md + "\n")
    (out / "families.json").write_text(
        json.dumps(
            {"rows": rows, "raw": results, "machine": machine(), "args": vars(args)}, indent=1
        )
    )
    _plot(rows, out / "families.png")
    console.print(f"wrote {out / 'families.md'}, families.json and families.png")
    return 0


def _http(c: Case, base: str, concurrency: int, duration: float) -> tuple[float, float]:
    url = base + c.url_path
    headers = c.headers
    sat = asyncio.run(
        run_load(
            url,
            lambda i: c.body(c.batch, i),
            headers,
            concurrency=concurrency,
            batch=c.batch,
            tokens_per_item=1,
            duration=duration,
        )
    )
    if sat.errors:
        raise RuntimeError(f"{c.name}: {sat.errors} HTTP errors at saturation")
    lat = run_latency(
        url, lambda i: c.body(1, i), headers, duration=duration / 2, tokens_per_item=1
    )
    return sat.tokens_per_s * c.units, lat.p50_ms


def _row(c: Case, got: dict[str, list[float]], args: argparse.Namespace) -> dict[str, Any]:
    med = {k: statistics.median(v) for k, v in got.items()}
    return {
        "family": c.name,
        "model": c.model,
        "unit": c.unit,
        "batch": c.batch,
        **med,
        "ratio": med["http_items_s"] / med["inproc_items_s"],
    }


_COLS = [
    ("family", "family"),
    ("model", "model"),
    ("batch", "items/request"),
    ("inproc_items_s", "in-process items/s"),
    ("http_items_s", "HTTP items/s"),
    ("ratio", "HTTP / in-process"),
    ("inproc_p50_ms", "in-process p50 ms"),
    ("http_p50_ms", "HTTP p50 ms"),
]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.2f}" if v < 100 else f"{v:,.0f}"
    return str(v)


def _table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="families: HTTP against in-process (medians)")
    for _, name in _COLS:
        t.add_column(name)
    for r in rows:
        t.add_row(*(_fmt(r[k]) for k, _ in _COLS))
    return t


def _markdown(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"Machine: {machine()}. {args.rounds} interleaved rounds, medians; saturation = "
        f"{args.concurrency} clients; latency = 1 client x 1 item; {time.strftime('%Y-%m-%d')}.",
        "",
        "| " + " | ".join(n for _, n in _COLS) + " |",
        "| --- | --- |" + " ---: |" * (len(_COLS) - 2),
    ]
    for r in rows:
        cells = [_fmt(r[k]) for k, _ in _COLS]
        cells[0] = f"{r['family']} ({r['unit']})"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    names = [r["family"] for r in rows]
    ax.bar(names, [r["ratio"] for r in rows], color="tab:blue")
    ax.axhline(0.85, color="tab:red", linestyle="--", label="target: overhead <= 15 %")
    ax.set_ylabel("HTTP items/s / in-process items/s")
    ax.set_ylim(0, 1.3)
    ax.legend(loc="lower right")
    ax.set_title("fleetserve families: server throughput relative to in-process")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
