"""``python -m benchmarks selftune``: throughput against time since start under
``--tune auto``, on a class with no bundled profile (``--bundled-profiles false``).

One run, side by side on the same cores, model and client:

1. infinity-emb at each ``--infinity-dtypes`` (its best is the peer's line);
2. fleetserve ``--tune auto --bundled-profiles false`` from a fresh profile directory:
   every ``--every`` seconds a saturation sample (``--clients`` x ``--batch`` texts for
   ``--sample`` s); between samples the server is idle but for single-sentence queries
   (``--query-tokens`` each) spaced wider than ``--tune-idle`` (light traffic: each
   arrives while the tuner runs, so their latency shows how fast it steps aside);
3. after ``--minutes``, fleetserve on the profile ``fleetserve tune`` wrote for this
   class (the bundled one, or ``--tuned-profile-dir``) starts beside it, and the two
   are sampled in turns, ``--end-samples`` each (A B B A ...: drift falls on both).
   Those samples are the end figure and the tuned one; the same queries are then sent
   to the tuned server alone (their latency without a background tune).

A sample counts the tokens of the requests answered in it (real text varies).
Writes ``selftune.{json,md,png}`` under ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from fleetserve.bench.loadgen import percentile, run_load
from fleetserve.bench.report import machine

from .targets import HttpTarget, fleetserve_target, infinity_target

REAL = "sentence-transformers/all-MiniLM-L6-v2"
JSON = {"content-type": "application/json"}


def _args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks selftune", description=__doc__)
    p.add_argument("--model", default=REAL)
    p.add_argument("--catalog", default="", help="extra catalog directory (a user's model)")
    p.add_argument("--minutes", type=float, default=10.0, help="how long --tune auto runs")
    p.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    p.add_argument("--sample", type=float, default=10.0, help="seconds per sample")
    p.add_argument(
        "--end-samples", type=int, default=5,
        help="samples of each server at the end, in turns with the tuned one (medians)",
    )  # fmt: skip
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--tokens", type=int, default=64, help="tokens per sentence (sentences)")
    p.add_argument(
        "--workload", choices=("sentences", "mix"), default="sentences",
        help="sentences: --tokens each; mix: real text, 8-256 tokens",
    )  # fmt: skip
    p.add_argument("--query-gap", type=float, default=10.0, help="seconds between queries")
    p.add_argument("--query-tokens", type=int, default=32, help="tokens per query sentence")
    p.add_argument("--tune-budget", type=float, default=60.0)
    p.add_argument("--tune-refine-budget", type=float, default=300.0)
    p.add_argument(
        "--tuned-profile-dir", default="",
        help="profiles `fleetserve tune` wrote for the model (a user's model has no bundled "
        "one): what the tuned reference runs [the bundled profiles]",
    )  # fmt: skip
    p.add_argument("--infinity-venv", default=".bench/infinity-venv")
    p.add_argument("--infinity-dtypes", default="float32,bfloat16")
    p.add_argument("--no-infinity", action="store_true")
    p.add_argument("--out", default=".bench/results")
    return p.parse_args(list(argv))


def main(argv: Sequence[str] = ()) -> int:
    args = _args(argv)
    console = Console()
    from fleetserve.assembly import HF_CACHE
    from fleetserve.bench.tune.workload import mix, sentences
    from fleetserve.catalog import Catalog
    from fleetserve.catalog.sources import resolve

    spec = Catalog.load([Path(args.catalog)] if args.catalog else []).get(args.model)
    path = resolve(args.model, spec.sources, HF_CACHE)
    if args.workload == "mix":
        texts, lengths = mix(path, 512)
        args.per_item = statistics.mean(lengths)
    else:
        texts, args.per_item = sentences(path, 512, args.tokens), float(args.tokens)
        lengths = [args.tokens] * len(texts)
    work = _Work(texts, [float(n) for n in lengths], sentences(path, 64, args.query_tokens))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    console.rule(f"python -m benchmarks selftune: {args.model}, {_load(args)}")
    console.print(machine())
    cat = ["--catalog", args.catalog] if args.catalog else []
    peers: dict[str, float] = {}
    failed: dict[str, str] = {}  # a peer that could not answer the load (why)
    venv = Path(args.infinity_venv)
    if not args.no_infinity and (venv / "bin" / "infinity_emb").exists():
        for dtype in args.infinity_dtypes.split(","):
            t = infinity_target(venv, path, dtype)
            try:
                peers[t.name] = _steady(t, work, args, out, console)
            except httpx.HTTPError as exc:  # (a timeout: an emulated dtype on a slow CPU)
                failed[t.name] = f"{type(exc).__name__}: {exc}"[:200]
                console.print(f"  [yellow]{t.name} failed under the load: {failed[t.name]}[/]")
    elif not args.no_infinity:
        console.print(f"[yellow]no infinity venv at {venv}: run benchmarks/infinity_venv.sh[/]")
    with tempfile.TemporaryDirectory() as tmp:
        auto = fleetserve_target(args.model, [
            *cat, "--log-level", "info", "--tune", "auto", "--bundled-profiles", "false",
            "--profile-dir", f"{tmp}/profiles", "--tune-dir", f"{tmp}/runs",
            "--tune-budget", f"{args.tune_budget:g}",
            "--tune-refine-budget", f"{args.tune_refine_budget:g}",
        ], "fleetserve --tune auto")  # fmt: skip
        t0 = time.monotonic()
        auto.start(out)
        ready_s = time.monotonic() - t0
        mine = ["--profile-dir", args.tuned_profile_dir] if args.tuned_profile_dir else []
        name = "fleetserve tuned" if mine else "fleetserve bundled"
        tuned = fleetserve_target(args.model, [*cat, *mine, "--tune", "off"], name)
        try:
            samples, queries = _timeline(auto, work, args, console, t0)
            tuned.start(out)
            end, ref = _turns(auto, tuned, work, args, console, t0)
        finally:
            auto.stop()
        if (Path(tmp) / "runs").is_dir():  # the background tune's run documents, kept
            shutil.copytree(Path(tmp) / "runs", out / "tune-runs", dirs_exist_ok=True)
    try:
        ref_queries = _queries(tuned, work, args, len(queries))
    finally:
        tuned.stop()
    doc = _summary(args, samples, queries, end, ref, ref_queries, peers, ready_s)
    doc["peers_failed"] = failed
    doc["machine"] = machine()
    (out / "selftune.json").write_text(json.dumps(doc, indent=1))
    (out / "selftune.md").write_text(_markdown(doc) + "\n")
    _plot(doc, out / "selftune.png")
    console.print(_markdown(doc))
    console.print(f"wrote {out / 'selftune.json'}, .md and .png")
    return 0


@dataclass(frozen=True)
class _Work:
    texts: list[str]  # the bulk load's
    lengths: list[float]  # their tokens
    queries: list[str]  # single sentences


def _timeline(
    t: HttpTarget, work: _Work, args: argparse.Namespace, console: Console, t0: float
) -> tuple[list[dict[str, Any]], list[float]]:
    """Samples every ``--every`` s until ``--minutes`` after ``t0`` (the start);
    single-sentence queries between."""
    end = t0 + 60 * args.minutes
    samples: list[dict[str, Any]] = []
    queries: list[float] = []
    with httpx.Client(timeout=60) as c:
        while time.monotonic() < end:
            samples.append(_sample(t, work, args, c, console, t0))
            nxt = time.monotonic() + args.every
            while time.monotonic() < min(nxt, end):
                time.sleep(args.query_gap)  # light traffic: it arrives while the tuner runs
                queries.append(_query(t, work, c, len(queries)))
    return samples, queries


def _turns(
    auto: HttpTarget, tuned: HttpTarget, work: _Work, args: argparse.Namespace,
    console: Console, t0: float,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
    """``--end-samples`` of each, in turns (A B B A ...), the other server idle."""
    got: dict[str, list[dict[str, Any]]] = {auto.name: [], tuned.name: []}
    with httpx.Client(timeout=60) as c:
        _saturate(tuned, work, args)  # its warm-up, as infinity's
        for i in range(args.end_samples):
            for t in (auto, tuned) if i % 2 == 0 else (tuned, auto):
                got[t.name].append(_sample(t, work, args, c, console, t0))
    return got[auto.name], got[tuned.name]


def _queries(t: HttpTarget, work: _Work, args: argparse.Namespace, n: int) -> list[float]:
    """``n`` queries on an otherwise idle server, a second apart."""
    with httpx.Client(timeout=60) as c:
        out = []
        for i in range(max(n, 1)):
            time.sleep(min(args.query_gap, 1.0))
            out.append(_query(t, work, c, i))
    return out


def _query(t: HttpTarget, work: _Work, c: httpx.Client, i: int) -> float:
    q0 = time.perf_counter()
    c.post(t.url, content=t.body([work.queries[i % len(work.queries)]]), headers=JSON)
    return (time.perf_counter() - q0) * 1e3


def _sample(
    t: HttpTarget, work: _Work, args: argparse.Namespace, c: httpx.Client, console: Console,
    t0: float,
) -> dict[str, Any]:  # fmt: skip
    tps = _saturate(t, work, args)
    state = _tuning(t, c)
    at = time.monotonic() - t0
    console.print(f"  {t.name} t={at:5.0f}s {tps:9,.0f} tok/s  {state}")
    return {"t_s": round(at, 1), "tokens_per_s": tps, **state}


def _steady(
    t: HttpTarget, work: _Work, args: argparse.Namespace, out: Path, console: Console
) -> float:
    t.start(out)
    try:
        _saturate(t, work, args)  # warm
        got = statistics.median(_saturate(t, work, args) for _ in range(3))
    finally:
        t.stop()
    console.print(f"  {t.name}: {got:,.0f} tok/s")
    return got


def _saturate(t: HttpTarget, work: _Work, args: argparse.Namespace) -> float:
    def start(i: int) -> int:
        return int((i * args.batch) % (len(work.texts) - args.batch + 1))

    def body(i: int) -> bytes:
        return t.body(work.texts[start(i) : start(i) + args.batch])

    def tokens(i: int) -> float:
        return sum(work.lengths[start(i) : start(i) + args.batch])

    res = asyncio.run(
        run_load(t.url, body, JSON, concurrency=args.clients, batch=args.batch,
                 tokens_per_item=args.per_item, duration=args.sample, tokens_of=tokens)
    )  # fmt: skip
    return float(res.tokens_per_s)


def _tuning(t: HttpTarget, c: httpx.Client) -> dict[str, Any]:
    try:
        data = c.get(f"http://127.0.0.1:{t.port}/v1/models").json()["data"]
    except (httpx.HTTPError, ValueError, KeyError):
        return {}
    m: dict[str, Any] = next((d for d in data if d["id"] == t.model), {})
    tu, prof = m.get("tuning") or {}, m.get("profile") or {}
    return {"state": tu.get("state"), "phase": tu.get("phase"), "run": tu.get("run"),
            "reason": tu.get("reason"), "swaps": tu.get("swaps"), "how": prof.get("how"),
            "runs_on": f"{m.get('runtime')} {m.get('precision')}"}  # fmt: skip


def _summary(
    args: argparse.Namespace,
    samples: list[dict[str, Any]],
    queries: list[float],
    end: list[dict[str, Any]],
    ref: list[dict[str, Any]],
    ref_queries: list[float],
    peers: dict[str, float],
    ready_s: float,
) -> dict[str, Any]:
    best_peer = max(peers.values(), default=None)
    tuned = statistics.median(s["tokens_per_s"] for s in ref)
    first = samples[0]["tokens_per_s"] if samples else None
    last = statistics.median(s["tokens_per_s"] for s in end) if end else None
    return {
        "model": args.model,
        "date": time.strftime("%Y-%m-%d"),
        "args": vars(args),
        "ready_s": round(ready_s, 1),
        "samples": samples,
        "end": end,
        "reference": ref,
        "peers": peers,
        "at_start_tokens_s": first,
        "at_end_tokens_s": last,
        "tuned_tokens_s": tuned,
        "start_vs_peer": first / best_peer if first and best_peer else None,
        "end_vs_peer": last / best_peer if last and best_peer else None,
        "end_vs_tuned": last / tuned if last and tuned else None,
        "query_p50_ms": statistics.median(queries) if queries else None,
        "query_p99_ms": percentile([q / 1e3 for q in queries], 0.99) * 1e3 if queries else None,
        "query_p50_ms_no_tuner": statistics.median(ref_queries) if ref_queries else None,
        "query_p99_ms_no_tuner": (
            percentile([q / 1e3 for q in ref_queries], 0.99) * 1e3 if ref_queries else None
        ),
        "queries": len(queries),
        "query_ms": [round(q, 1) for q in queries],
        "query_ms_no_tuner": [round(q, 1) for q in ref_queries],
    }


def _markdown(d: dict[str, Any]) -> str:
    def f(v: Any, fmt: str = ",.0f") -> str:
        return "-" if v is None else format(v, fmt)

    q = d["args"].get("query_tokens", "real-text")
    peer = ", ".join(f"{k} {v:,.0f}" for k, v in d["peers"].items()) or "not run"
    peer += "".join(f"; {k} failed ({why})" for k, why in d.get("peers_failed", {}).items())
    return "\n".join([
        f"Machine: {d['machine']}. {d['model']}, {_load(argparse.Namespace(**d['args']))}, "
        f"{d['args']['clients']} clients x {d['args']['batch']} texts; {d['date']}.",
        "",
        "| figure | value |",
        "| --- | ---: |",
        f"| ready after start (s) | {f(d['ready_s'], '.1f')} |",
        f"| tokens/s at start (rules) | {f(d['at_start_tokens_s'])} |",
        f"| tokens/s after {d['args']['minutes']:g} minutes (median of {len(d['end'])} "
        f"samples) | {f(d['at_end_tokens_s'])} |",
        f"| tokens/s on fleetserve tune's profile (median of {len(d['reference'])} "
        f"samples, in turns with the above) | {f(d['tuned_tokens_s'])} |",
        f"| start / infinity best | {f(d['start_vs_peer'], '.2f')} |",
        f"| end / infinity best | {f(d['end_vs_peer'], '.2f')} |",
        f"| end / fleetserve tune | {f(d['end_vs_tuned'], '.2f')} |",
        f"| {q}-token query p50 / p99 while tuning (ms, {d['queries']} queries) | "
        f"{f(d['query_p50_ms'], '.1f')} / {f(d['query_p99_ms'], '.1f')} |",
        f"| the same query p50 / p99 without a tuner (ms) | "
        f"{f(d.get('query_p50_ms_no_tuner'), '.1f')} / "
        f"{f(d['query_p99_ms_no_tuner'], '.1f')} |",
        "",
        f"infinity-emb: {peer} tokens/s.",
    ])  # fmt: skip


def _plot(d: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    auto = d["samples"] + d.get("end", [])  # the end: in turns with the tuned one
    xs = [s["t_s"] / 60 for s in auto]
    ax.plot(xs, [s["tokens_per_s"] for s in auto], "o-", label="fleetserve --tune auto")
    if d.get("end"):
        ref = d["reference"]
        ax.plot([s["t_s"] / 60 for s in ref], [s["tokens_per_s"] for s in ref], "s",
                color="green", label="fleetserve tune's profile (in turns)")  # fmt: skip
    for prev, s in itertools.pairwise(auto):
        if (s.get("swaps") or 0) > (prev.get("swaps") or 0):
            ax.axvline(s["t_s"] / 60, color="grey", ls=":", lw=1)
    if d["tuned_tokens_s"]:
        ax.axhline(d["tuned_tokens_s"], color="green", ls="--", label="its median")
    if d["peers"]:
        name, best = max(d["peers"].items(), key=lambda kv: kv[1])
        ax.axhline(best, color="red", ls="--", label=f"{name} (infinity's best)")
    ax.set_xlabel("minutes since start (dotted: a swap)")
    ax.set_ylabel("tokens/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{d['model']}: --tune auto on a class with no bundled profile")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _load(args: argparse.Namespace) -> str:
    if getattr(args, "workload", "sentences") == "mix":
        return f"real-text mix (8-256 tokens, mean {args.per_item:.0f})"
    return f"{args.tokens}-token sentences"
