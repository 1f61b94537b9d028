"""``python -m benchmarks embed``: fleetserve over HTTP against in-process and peer servers.

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

from fleetserve.bench.loadgen import LoadResult, percentile, run_latency, run_load
from fleetserve.bench.report import machine

from .embed_report import markdown, plot, save, table
from .targets import HttpTarget, InProcess, InProcessRuntime, fleetserve_target, infinity_target

REAL = "sentence-transformers/all-MiniLM-L6-v2"
JSON_HEADERS = {"content-type": "application/json"}
# --http-limits: the same server with every HTTP limit off (http_limits.enabled: False)
UNLIMITED = "fleetserve-no-http-limits"
NO_HTTP_LIMITS = [
    f"--http-{name}=0"
    for name in (
        "max-header-bytes",
        "max-headers",
        "max-url-bytes",
        "header-timeout",
        "body-timeout",
        "max-connections",
    )
]


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks embed", description=__doc__)
    p.add_argument(
        "--model",
        default=REAL,
        help="a model of the catalog (with --catalog: one `fleetserve add` wrote) [%(default)s]",
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=6.0, help="seconds per measurement")
    p.add_argument("--tokens", type=int, default=64, help="tokens per sentence")
    p.add_argument("--batch", type=int, default=32, help="sentences per request at saturation")
    p.add_argument("--concurrency", type=int, default=4, help="clients at saturation")
    p.add_argument("--knee", default="1,2,4,8,16", help="client counts for the knee sweep")
    p.add_argument("--infinity-venv", default=".bench/infinity-venv")
    p.add_argument("--infinity-dtypes", default="auto,float32,bfloat16,float16,int8")
    p.add_argument(
        "--workload",
        default="sentences",
        choices=["sentences", "mix"],
        help="sentences: --tokens each; mix: real text of 8-256 tokens (zaragoza corpus)",
    )
    p.add_argument("--no-infinity", action="store_true")
    p.add_argument(
        "--http-limits",
        action="store_true",
        help="also run fleetserve with every HTTP limit off (plain httptools, as before "
        "issue 22), interleaved with the limited one, and report what the limits cost",
    )
    p.add_argument("--fleetserve-args", default="", help="extra flags for fleetserve serve")
    p.add_argument("--out", default=".bench/results")
    p.add_argument("--catalog", default="", help="extra catalog directory (also passed to serve)")
    p.add_argument(
        "--profile-dir",
        default="",
        help="tuned profiles (`fleetserve add` or `tune` wrote), for the in-process runtime "
        "and serve alike [the default one]",
    )
    p.add_argument("--device", default="cpu", help="device for the in-process baselines")
    return p.parse_args(list(argv))


def main(argv: Sequence[str] = ()) -> int:
    args = _args(argv)
    console = Console()
    from fleetserve.assembly import HF_CACHE, build_profiles
    from fleetserve.bench.tune.workload import mix, sentences
    from fleetserve.catalog import Catalog
    from fleetserve.catalog.sources import resolve
    from fleetserve.settings import Settings

    spec = Catalog.load([Path(args.catalog)] if args.catalog else []).get(args.model)
    path = resolve(args.model, spec.sources, HF_CACHE)
    if args.workload == "mix":
        texts, lengths = mix(path, 512)
        what = f"real text of {min(lengths)}-{max(lengths)} tokens (median {_median(lengths)})"
    else:
        texts = sentences(path, 512, args.tokens)
        lengths = [args.tokens] * len(texts)
        what = f"{args.tokens}-token sentences"
    tokens = statistics.fmean(lengths)  # per item, for the tokens/s of servers
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    console.rule(f"python -m benchmarks embed: {args.model}, {what}")
    console.print(machine())

    dev = args.device
    mine = {"profile_dir": args.profile_dir} if args.profile_dir else {}
    choice = build_profiles(Settings(device=dev, **mine)).choose(spec)
    prof = choice.profile
    console.print(f"fleetserve's profile here: {choice.reason}")
    inproc: list[InProcess | InProcessRuntime] = [
        InProcess("in-process sentence-transformers fp32", path, device=dev),
        InProcess("in-process sentence-transformers bf16 autocast", path, "bf16", device=dev),
        InProcessRuntime(
            f"in-process fleetserve runtime ({prof.runtime or spec.runtime} {prof.precision}, "
            f"batch {prof.max_batch_size}/{prof.max_batch_tokens})",
            spec,
            path,
            prof,
            device=dev,
        ),
    ]
    ref = inproc[0].embed(texts[:64])

    extra = args.fleetserve_args.split() + (["--catalog", args.catalog] if args.catalog else [])
    extra += ["--profile-dir", args.profile_dir] if args.profile_dir else []
    servers: list[HttpTarget] = [fleetserve_target(args.model, extra or None)]
    if args.http_limits:
        servers.append(fleetserve_target(args.model, extra + NO_HTTP_LIMITS, UNLIMITED))
    venv = Path(args.infinity_venv)
    if not args.no_infinity:
        if (venv / "bin" / "infinity_emb").exists():
            servers += [infinity_target(venv, path, d) for d in args.infinity_dtypes.split(",")]
        else:
            console.print(f"[yellow]no infinity venv at {venv}; run benchmarks/infinity_venv.sh[/]")
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
                sat.setdefault(ip.name, []).append(
                    _inproc_throughput(ip, texts, lengths, args.batch)
                )
                lat.setdefault(ip.name, []).append(_inproc_latency(ip, texts, args.duration / 2))
            for s in servers if r % 2 == 0 else servers[::-1]:  # ABBA: no order bias
                res = _load(s, texts, args.concurrency, args.batch, tokens, args.duration)
                sat.setdefault(s.name, []).append(res.tokens_per_s)
                lat.setdefault(s.name, []).append(_latency(s, texts, tokens, args.duration / 2))
                failed = f", {res.errors} failed requests" if res.errors else ""
                console.print(f"  {s.name}: {res.tokens_per_s:,.0f} tok/s{failed}")
        knee = {
            s.name: [
                _load(s, texts, c, 8, tokens, args.duration).__dict__
                for c in map(int, args.knee.split(","))
            ]
            for s in servers
            if s.name in ("fleetserve", "infinity-float32", "infinity-bfloat16")
        }
    finally:
        for s in servers:
            s.stop()

    rows = _rows(sat, lat, quality)
    console.print(table(rows, "saturation throughput and low-load latency (medians)"))
    if args.http_limits:
        console.print(_limits_cost(sat))
    header = (
        f"Machine: {machine()}. Workload: {what}. {args.rounds} interleaved rounds, "
        f"medians; saturation = {args.concurrency} clients x {args.batch} texts/request; "
        f"latency = 1 client x 1 text; fleetserve's profile: {choice.reason}; "
        f"{time.strftime('%Y-%m-%d')}."
    )
    md = markdown(rows, header)
    plot(knee, rows, out / "embed.png")
    save(out, {"rows": rows, "knee": knee, "machine": machine(), "args": vars(args)}, md, console)
    return 0


def _limits_cost(sat: dict[str, list[float]]) -> str:
    """The HTTP limits' cost: fleetserve's throughput against the same server without
    them, per interleaved round and of the medians."""
    pairs = [1 - a / b for a, b in zip(sat["fleetserve"], sat[UNLIMITED], strict=True)]
    med = 1 - statistics.median(sat["fleetserve"]) / statistics.median(sat[UNLIMITED])
    return (
        f"HTTP limits cost {med:+.2%} of saturation throughput (of the medians; "
        f"median of the rounds' pairs {statistics.median(pairs):+.2%}; per round: "
        f"{', '.join(f'{x:+.1%}' for x in pairs)}; negative: the limited server was faster)"
    )


def _min_cos(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


def _median(xs: list[int]) -> int:
    return int(statistics.median(xs))


def _load(
    s: HttpTarget, texts: list[str], conc: int, batch: int, tokens: float, dur: float
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


def _latency(s: HttpTarget, texts: list[str], tokens: float, dur: float) -> LoadResult:
    def body(i: int) -> bytes:
        return s.body([texts[i % len(texts)]])

    return run_latency(s.url, body, JSON_HEADERS, duration=dur, tokens_per_item=tokens)


def _inproc_throughput(
    ip: InProcess | InProcessRuntime, texts: list[str], lengths: list[int], batch: int
) -> float:
    """The same requests the servers get (``batch`` texts each), one after another."""
    ip.embed(texts[:batch])
    t0 = time.perf_counter()
    for k in range(0, len(texts), batch):
        ip.embed(texts[k : k + batch])
    return sum(lengths) / (time.perf_counter() - t0)


def _inproc_latency(
    ip: InProcess | InProcessRuntime, texts: list[str], duration: float
) -> LoadResult:
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
    inf_default = med.get("infinity-auto")
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
                "vs_infinity_default": v / inf_default if inf_default else None,
                "vs_infinity_best": v / inf_best if inf_best else None,
                "vs_inprocess_best": v / ip_best if ip_best else None,
                "p50_ms": statistics.median(r.p50_ms for r in lat[k]),
                "p99_ms": statistics.median(r.p99_ms for r in lat[k]),
                "min_cos": quality.get(k),
            }
        )
    return rows
