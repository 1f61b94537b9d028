"""``fleetserve bench knee``: open-loop load against embeddings servers.

Poisson arrivals at each offered rate in turn; at each rate every target is
measured before the next, so the shared machine's noise hits all alike.
Latency runs from each request's scheduled arrival. Rates: --rates (req/s),
or automatic: a closed-loop probe of each target's capacity, then geometric
steps from 0.2x the lowest to 1.5x the highest capacity. The knee is the
highest rate with achieved >= 98 % of offered and p99 <= --slo-ms; without
an SLO, the Kneedle point of p99 against offered rate, held to the same
throughput test (fleetserve.bench.knee_find). Tokens are counted with
--model's tokenizer; workloads: sentences of exactly --tokens tokens, or mix
(zaragoza-construction-faq: questions, answers, passages; 8 to 256 tokens).

  fleetserve bench knee \\
    --target fleetserve=http://127.0.0.1:8080/v1/embeddings \\
    --target infinity=http://127.0.0.1:7997/embeddings \\
    --target-model infinity=/path/the/infinity/server/loaded
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .knee_find import find_knee
from .knee_http import Sender, TargetError, parse_targets, requests_of
from .knee_report import TargetResult, fmt, report
from .openloop import auto_rates, capacity, open_loop
from .report import machine

REAL = "sentence-transformers/all-MiniLM-L6-v2"
HF_CACHE = Path("~/.cache/huggingface/hub").expanduser()  # Settings.hf_cache's default


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="fleetserve bench knee",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a = p.add_argument
    a("--target", action="append", default=[], required=True, metavar="[NAME=]URL")
    a("--model", default=REAL, help="model id in the bodies; its tokenizer counts tokens")
    a("--target-model", action="append", default=[], metavar="NAME=MODEL", help="its model id")
    a("--workload", choices=("sentences", "mix"), default="sentences")
    a("--tokens", type=int, default=64, help="tokens per sentence (sentences)")
    a("--items", type=int, default=8, help="texts per request")
    a("--texts", type=int, default=512, help="distinct texts drawn")
    a("--rates", default="auto", help="req/s, comma-separated, or auto")
    a("--points", type=int, default=8, help="automatic rates: how many (at least)")
    a("--probe-s", type=float, default=3.0, help="automatic rates: closed-loop probe, s")
    a("--probe-concurrency", type=int, default=8, metavar="N", help="probe clients")
    a("--duration", type=float, default=10.0, help="seconds of arrivals per rate")
    a("--drain", type=float, default=None, help="s to wait for stragglers [duration/2]")
    a("--slo-ms", type=float, default=None, help="p99 SLO (default: Kneedle)")
    a("--max-in-flight", type=int, default=256, metavar="N", help="outstanding requests")
    a("--timeout", type=float, default=60.0, help="per request, s")
    a("--encoding-format", choices=("base64", "float"), default="base64")
    a("--api-key", default="", help="sent as Authorization: Bearer KEY")
    a("--tokenizer", default="", metavar="DIR", help="has tokenizer.json [from the catalog]")
    a("--catalog", default="", metavar="DIR", help="extra catalog, to find --model")
    a("--seed", type=int, default=0, help="of the arrivals and the texts")
    a("--out", default=".bench/results", help="directory of the outputs")
    a("--name", default="knee", help="their file stem: NAME.{md,json,png}")
    return p.parse_args(list(argv))


def main(argv: Sequence[str] = ()) -> int:
    args = _args(argv)
    console = Console()
    try:
        _check(args)
        targets = parse_targets(args.target, args.target_model, args.model)
        rates = _rates(args.rates)
        texts, lengths, stats = _workload(args)
    except (TargetError, ValueError, RuntimeError) as exc:
        print(f"fleetserve bench knee: error: {exc}", file=sys.stderr)
        return 2
    console.rule("fleetserve bench knee")
    console.print(machine(), markup=False)
    console.print(f"workload {args.workload}: {len(texts)} texts, {args.items} per request")
    console.print("tokens per text: " + ", ".join(f"{k} {fmt(v)}" for k, v in stats.items()))
    reqs = requests_of(texts, lengths, args.items)
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else None
    senders = [
        Sender(
            t,
            reqs,
            encoding=args.encoding_format,
            timeout_s=args.timeout,
            max_in_flight=args.max_in_flight,
            headers=headers,
        )
        for t in targets
    ]
    results = [TargetResult(t.name, t.url, t.model) for t in targets]
    try:
        rates = asyncio.run(_run(args, senders, results, rates, console))
    except TargetError as exc:
        print(f"fleetserve bench knee: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if not results[-1].points:
            return 130
        console.print("[yellow]interrupted: reporting the rates measured so far[/]")
        rates = results[-1].rates
    for r in results:
        r.knee = find_knee(r.points, args.slo_ms)
    report(args, results, rates, stats, console)
    return 0


def _check(args: argparse.Namespace) -> None:
    for name in ("items", "texts", "tokens", "points", "probe_concurrency", "max_in_flight"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("duration", "probe_s", "timeout"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive")


def _rates(spec: str) -> list[float] | None:
    if spec == "auto":
        return None
    try:
        rates = sorted(float(x) for x in spec.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--rates wants req/s like 5,10,20 or auto, not {spec!r}") from None
    if not rates or rates[0] <= 0:
        raise ValueError("--rates must be positive")
    return rates


def _workload(args: argparse.Namespace) -> tuple[list[str], list[int], dict[str, float]]:
    try:
        from .tune.workload import length_stats, mix, sentences
    except ImportError as exc:  # tokenizers: the torch or onnx extra
        raise RuntimeError(f"the workloads need the tokenizers package ({exc})") from None
    tok = Path(args.tokenizer) if args.tokenizer else _tokenizer_dir(args.model, args.catalog)
    if not (tok / "tokenizer.json").is_file():
        raise RuntimeError(f"no tokenizer.json in {tok} (give --tokenizer DIR)")
    if args.workload == "mix":
        texts, lengths = mix(tok, args.texts, seed=args.seed)
    else:
        texts = sentences(tok, args.texts, args.tokens, seed=args.seed)
        lengths = [args.tokens] * len(texts)
    return texts, lengths, length_stats(lengths)


def _tokenizer_dir(model: str, catalog: str) -> Path:
    from ..catalog import Catalog
    from ..catalog.sources import resolve
    from ..wire import FleetError

    cat = Catalog.load([Path(catalog)] if catalog else [])
    if model not in cat:
        raise RuntimeError(f"{model!r} is not in the catalog: give --tokenizer DIR or --catalog")
    try:
        return resolve(model, cat.get(model).sources, HF_CACHE)
    except FleetError as exc:
        raise RuntimeError(f"{exc} (or give --tokenizer DIR)") from None


async def _run(
    args: argparse.Namespace,
    senders: list[Sender],
    results: list[TargetResult],
    rates: list[float] | None,
    console: Console,
) -> list[float]:
    try:
        for s in senders:
            await s.check()
        if rates is None:
            with console.status("probing each target's capacity (closed loop)…"):
                for s, r in zip(senders, results, strict=True):
                    conc = args.probe_concurrency
                    await capacity(s.send, args.probe_s / 3, concurrency=conc)  # warm-up
                    c = await capacity(s.send, args.probe_s, concurrency=conc)
                    r.capacity_rps = c
                    console.print(f"  {r.name}: ~{fmt(c)} req/s closed-loop", markup=False)
            rates = _shared_rates([r.capacity_rps or 0.0 for r in results], args.points)
        console.print("rates (req/s): " + ", ".join(fmt(x) for x in rates))
        console.print("each line: target, offered → achieved req/s, latency, errors")
        await _sweep(args, senders, results, rates, console)
    finally:
        for s in senders:
            await s.aclose()
    for s, r in zip(senders, results, strict=True):
        r.first_error = s.first_error
    return rates


def _shared_rates(caps: list[float], points: int) -> list[float]:
    """0.2x the lowest to 1.5x the highest capacity, at the ratio ``points`` steps give one."""
    lo, hi = min(caps), max(caps)
    if lo <= 0:
        raise TargetError("a target served nothing in the capacity probe: give --rates")
    n = points
    if hi > lo and points > 1:
        ratio = (1.5 / 0.2) ** (1 / (points - 1))
        n = min(2 * points, max(points, round(math.log(7.5 * hi / lo) / math.log(ratio)) + 1))
    return auto_rates(lo, n, low=0.2, high=1.5 * hi / lo)


async def _sweep(
    args: argparse.Namespace,
    senders: list[Sender],
    results: list[TargetResult],
    rates: list[float],
    console: Console,
) -> None:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("sweep", total=len(rates) * len(senders))
        for k, rate in enumerate(rates):
            for s, r in zip(senders, results, strict=True):
                what = escape(f"{fmt(rate)} req/s → {r.name}"[:40])
                progress.update(task, description=what)
                p = await open_loop(
                    s.send,
                    rate,
                    args.duration,
                    seed=args.seed + k,
                    max_in_flight=args.max_in_flight,
                    drain_s=args.drain,
                )
                r.rates.append(rate)
                r.points.append(p)
                progress.advance(task)
                progress.console.print(
                    f"{r.name[:14]:<14} {fmt(p.offered_rps):>7} → {fmt(p.achieved_rps):>7} req/s"
                    f"  p50 {fmt(p.p50_ms):>6}  p99 {fmt(p.p99_ms):>6} ms  err {p.errors}",
                    highlight=False,
                    markup=False,
                )
