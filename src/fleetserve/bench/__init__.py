"""``fleetserve bench``: fleetserve over HTTP against in-process and peer servers.

Everything runs side by side in one run on the same cores, model and client; rounds
are interleaved across targets and medians reported, since shared machines are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from .loadgen import LoadResult, run_latency, run_load
from .report import machine, markdown, plot, save, table
from .targets import HttpTarget, InProcess, InProcessRuntime, fleetserve_target, infinity_target
from .workload import sentences

REAL = "sentence-transformers/all-MiniLM-L6-v2"
JSON_HEADERS = {"content-type": "application/json"}


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fleetserve bench", description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=6.0, help="seconds per measurement")
    p.add_argument("--tokens", type=int, default=64, help="tokens per sentence")
    p.add_argument("--batch", type=int, default=32, help="sentences per request at saturation")
    p.add_argument("--concurrency", type=int, default=4, help="clients at saturation")
    p.add_argument("--knee", default="1,2,4,8,16", help="client counts for the knee sweep")
    p.add_argument("--infinity-venv", default=".bench/infinity-venv")
    p.add_argument("--infinity-dtypes", default="float32,bfloat16,float16")
    p.add_argument("--no-infinity", action="store_true")
    p.add_argument("--fleetserve-args", default="", help="extra flags for fleetserve serve")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--catalog", default="", help="extra catalog directory (also passed to serve)")
    p.add_argument("--device", default="cpu", help="device for the in-process baselines")
    return p.parse_args(list(argv))


def main(argv: Sequence[str] = ()) -> int:
    """``fleetserve bench [embed] ...``, ``fleetserve bench http|cost|sim|dist|families ...``."""
    argv = list(argv)
    if argv and argv[0] == "http":
        from .http_stack import main as http_main

        return http_main(argv[1:])
    if argv and argv[0] == "cost":
        from .costfit import main as cost_main

        return cost_main(argv[1:])
    if argv and argv[0] == "dist":
        from .dist import main as dist_main

        return dist_main(argv[1:])
    if argv and argv[0] == "families":
        from .families import main as families_main

        return families_main(argv[1:])
    if argv and argv[0] == "sim":
        from .sim.cli import main as sim_main

        return sim_main(argv[1:])
    if argv and argv[0] == "embed":
        argv = argv[1:]
    return embed(argv)


def embed(argv: Sequence[str]) -> int:
    args = _args(argv)
    console = Console()
    from ..catalog import Catalog
    from ..catalog.sources import resolve
    from ..server import HF_CACHE

    spec = Catalog.load([Path(args.catalog)] if args.catalog else []).get(REAL)
    path = resolve(REAL, spec.sources, HF_CACHE)
    texts = sentences(path, 512, args.tokens)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    console.rule(f"fleetserve bench: {REAL}, {args.tokens}-token sentences")
    console.print(machine())

    dev = args.device
    hw = "cuda" if dev.startswith("cuda") else "cpu"
    prof = spec.profile(hw)
    inproc: list[InProcess | InProcessRuntime] = [
        InProcess("in-process sentence-transformers fp32", path, device=dev),
        InProcess("in-process sentence-transformers bf16 autocast", path, "bf16", device=dev),
        InProcessRuntime(
            f"in-process fleetserve runtime ({prof.precision}, batch {prof.max_batch_size})",
            spec,
            path,
            prof.precision,
            prof.max_batch_size,
            device=dev,
        ),
    ]
    ref = inproc[0].embed(texts[:64])

    extra = args.fleetserve_args.split() + (["--catalog", args.catalog] if args.catalog else [])
    servers: list[HttpTarget] = [fleetserve_target(REAL, extra or None)]
    venv = Path(args.infinity_venv)
    if not args.no_infinity:
        if (venv / "bin" / "infinity_emb").exists():
            servers += [infinity_target(venv, path, d) for d in args.infinity_dtypes.split(",")]
        else:
            console.print(f"[yellow]no infinity venv at {venv}; run bench/infinity_venv.sh[/]")
    quality: dict[str, float] = {}
    try:
        for s in servers:
            with console.status(f"starting {s.name}…"):
                s.start(out)
            quality[s.name] = _min_cos(s.embed(texts[:64]), ref)
        for ip in inproc:
            quality[ip.name] = _min_cos(ip.embed(texts[:64]), ref)
        sat: dict[str, list[float]] = {}
        lat: dict[str, list[LoadResult]] = {}
        for r in range(args.rounds):
            console.print(f"round {r + 1}/{args.rounds}")
            for ip in inproc:
                sat.setdefault(ip.name, []).append(_inproc_throughput(ip, texts, args.tokens))
                lat.setdefault(ip.name, []).append(_inproc_latency(ip, texts, args.duration / 2))
            for s in servers:
                res = _load(s, texts, args.concurrency, args.batch, args.tokens, args.duration)
                sat.setdefault(s.name, []).append(res.tokens_per_s)
                lat.setdefault(s.name, []).append(
                    _latency(s, texts, args.tokens, args.duration / 2)
                )
                console.print(f"  {s.name}: {res.tokens_per_s:,.0f} tok/s")
        knee = {
            s.name: [
                _load(s, texts, c, 8, args.tokens, args.duration).__dict__
                for c in map(int, args.knee.split(","))
            ]
            for s in servers
            if s.name in ("fleetserve", "infinity-float32")
        }
    finally:
        for s in servers:
            s.stop()

    rows = _rows(sat, lat, quality)
    console.print(table(rows, "saturation throughput and low-load latency (medians)"))
    header = (
        f"Machine: {machine()}. {args.rounds} interleaved rounds, medians; "
        f"saturation = {args.concurrency} clients x {args.batch} sentences/request; "
        f"latency = 1 client x 1 sentence; {time.strftime('%Y-%m-%d')}."
    )
    md = markdown(rows, header)
    plot(knee, rows, out / "embed.png")
    save(out, {"rows": rows, "knee": knee, "machine": machine(), "args": vars(args)}, md, console)
    return 0


def _min_cos(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


def _load(
    s: HttpTarget, texts: list[str], conc: int, batch: int, tokens: int, dur: float
) -> LoadResult:
    def body(i: int) -> bytes:
        start = (i * batch) % (len(texts) - batch + 1)
        return s.body(texts[start : start + batch])

    return asyncio.run(
        run_load(
            s.url,
            body,
            JSON_HEADERS,
            concurrency=conc,
            batch=batch,
            tokens_per_item=tokens,
            duration=dur,
        )
    )


def _latency(s: HttpTarget, texts: list[str], tokens: int, dur: float) -> LoadResult:
    def body(i: int) -> bytes:
        return s.body([texts[i % len(texts)]])

    return run_latency(s.url, body, JSON_HEADERS, duration=dur, tokens_per_item=tokens)


def _inproc_throughput(ip: InProcess | InProcessRuntime, texts: list[str], tokens: int) -> float:
    ip.embed(texts[:64])
    t0 = time.perf_counter()
    ip.embed(texts)
    return len(texts) * tokens / (time.perf_counter() - t0)


def _inproc_latency(
    ip: InProcess | InProcessRuntime, texts: list[str], duration: float
) -> LoadResult:
    from .loadgen import percentile

    xs: list[float] = []
    end = time.perf_counter() + duration
    i = 0
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        ip.embed([texts[i % len(texts)]])
        xs.append(time.perf_counter() - t0)
        i += 1
    return LoadResult(
        1,
        1,
        len(xs),
        duration,
        float("nan"),
        statistics.median(xs) * 1e3,
        percentile(xs, 0.99) * 1e3,
        0,
    )


def _rows(
    sat: dict[str, list[float]], lat: dict[str, list[LoadResult]], quality: dict[str, float]
) -> list[dict[str, Any]]:
    med = {k: statistics.median(v) for k, v in sat.items()}
    ok = {k for k, q in quality.items() if q >= 0.9999}
    inf_fp32 = med.get("infinity-float32")
    inf_best = max(
        (v for k, v in med.items() if k.startswith("infinity") and k in ok), default=None
    )
    ip_best = max(
        (v for k, v in med.items() if k.startswith("in-process") and k in ok), default=None
    )
    rows = []
    for k, v in med.items():
        rows.append(
            {
                "target": k,
                "tokens_per_s": v,
                "vs_infinity_fp32": v / inf_fp32 if inf_fp32 else None,
                "vs_infinity_best": v / inf_best if inf_best else None,
                "vs_inprocess_best": v / ip_best if ip_best else None,
                "p50_ms": statistics.median(r.p50_ms for r in lat[k]),
                "p99_ms": statistics.median(r.p99_ms for r in lat[k]),
                "min_cos": quality.get(k),
            }
        )
    return rows
