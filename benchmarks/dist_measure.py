"""The measurements: embedded against NATS, the pull/push sweep, knees, put-backs.

Every measurement first waits (within ``--quiet-wait``) for other processes to leave
the cores alone, and records how much CPU they took meanwhile (``dist_cpu.CpuMeter``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import httpx
from rich.console import Console

from fleetserve.bench.loadgen import LoadResult, percentile, run_latency, run_load

from . import dist_mixed as mixed
from .dist_cpu import CpuMeter
from .dist_fleet import WorkerInfo, scrape, scrape_async
from .targets import HttpTarget

JSON_HEADERS = {"content-type": "application/json"}
T = TypeVar("T")


class Noise:
    """Others' CPU during each measurement, and the time spent waiting for quiet."""

    def __init__(self, meter: CpuMeter, quiet_wait: float) -> None:
        self.meter = meter
        self.quiet_wait = quiet_wait
        self.waited = 0.0
        self.loads: list[dict[str, float]] = []

    def measure(self, fn: Callable[[], T]) -> tuple[T, dict[str, float]]:
        if self.quiet_wait > 0:
            self.waited += self.meter.wait_quiet(self.quiet_wait)
        a = self.meter.sample()
        out = fn()
        load = self.meter.between(a, self.meter.sample())
        self.loads.append(load)
        return out, load

    def summary(self) -> dict[str, float]:
        others = [x["foreign_cores"] + x["steal_cores"] for x in self.loads] or [0.0]
        return {
            "others_cores_median": statistics.median(others),
            "others_cores_max": max(others),
            "noisy_share": sum(x > 0.25 for x in others) / len(others),
            "waited_s": self.waited,
        }


def _uniform(f: HttpTarget, texts: list[str], a: argparse.Namespace) -> tuple[float, LoadResult]:
    """Saturation and single-sentence latency, as ``python -m benchmarks embed`` measures them."""

    def batch_body(i: int) -> bytes:
        start = (i * a.batch) % (len(texts) - a.batch + 1)
        return f.body(texts[start : start + a.batch])

    sat = asyncio.run(
        run_load(
            f.url,
            batch_body,
            JSON_HEADERS,
            concurrency=a.concurrency,
            batch=a.batch,
            tokens_per_item=a.tokens,
            duration=a.duration,
        )
    )
    lat = run_latency(
        f.url,
        lambda i: f.body([texts[i % len(texts)]]),
        JSON_HEADERS,
        duration=a.duration / 2,
        tokens_per_item=a.tokens,
    )
    return sat.tokens_per_s, lat


def embedded_vs_nats(
    fronts: Sequence[HttpTarget],
    texts: list[str],
    a: argparse.Namespace,
    noise: Noise,
    console: Console,
) -> list[dict[str, Any]]:
    sat: dict[str, list[float]] = {f.name: [] for f in fronts}
    lat: dict[str, list[LoadResult]] = {f.name: [] for f in fronts}
    others: dict[str, list[float]] = {f.name: [] for f in fronts}
    for r in range(a.rounds):
        k = r % len(fronts)
        for f in [*fronts[k:], *fronts[:k]]:
            (tps, res), load = noise.measure(functools.partial(_uniform, f, texts, a))
            sat[f.name].append(tps)
            lat[f.name].append(res)
            others[f.name].append(load["foreign_cores"] + load["steal_cores"])
            console.print(
                f"  round {r + 1}/{a.rounds} {f.name}: {tps:,.0f} tok/s, "
                f"p50 {res.p50_ms:.2f} ms (others: {others[f.name][-1]:.2f} cores)"
            )
    base = fronts[0].name
    b_tps = statistics.median(sat[base])
    b_p50 = statistics.median(x.p50_ms for x in lat[base])
    rows = []
    for f in fronts:
        tps = statistics.median(sat[f.name])
        p50 = statistics.median(x.p50_ms for x in lat[f.name])
        rows.append(
            {
                "target": f.name,
                "tokens_per_s": tps,
                "vs_embedded": tps / b_tps,
                "p50_ms": p50,
                "p99_ms": statistics.median(x.p99_ms for x in lat[f.name]),
                "p50_over_embedded_ms": p50 - b_p50,
                "rounds_tokens_per_s": sat[f.name],
                "rounds_p50_ms": [x.p50_ms for x in lat[f.name]],
                "rounds_others_cores": others[f.name],
            }
        )
    return rows


def _worker_tokens(workers: Sequence[WorkerInfo]) -> mixed.ServerTokens:
    async def read(client: httpx.AsyncClient) -> float:
        urls = [w.health for w in workers]
        got = await asyncio.gather(
            *(scrape_async(client, u, "fleetserve_tokens_total") for u in urls)
        )
        return sum(got)

    return read


def pull_vs_push(
    fronts: Mapping[str, HttpTarget],
    workers: Mapping[str, Sequence[WorkerInfo]],
    reqs: mixed.Requests,
    a: argparse.Namespace,
    noise: Noise,
    console: Console,
) -> list[dict[str, Any]]:
    """The concurrency sweep; rounds and modes interleaved, samples pooled per point.

    Each round starts elsewhere in the request pool; within a round every mode gets
    the same sequence of requests."""
    points: dict[tuple[str, int], list[tuple[mixed.Point, float]]] = {}
    sweep = [int(c) for c in a.sweep.split(",")]
    modes = list(fronts)
    for r in range(a.sweep_rounds):
        first = r * len(reqs.payloads) // a.sweep_rounds
        for j, c in enumerate(sweep):
            k = (r + j) % len(modes)
            for mode in [*modes[k:], *modes[:k]]:
                p = mixed.Point(mode, c, r, a.sweep_duration)
                loop = mixed.closed_loop(
                    fronts[mode].url,
                    reqs,
                    p,
                    warm=a.warm,
                    first=first,
                    server_tokens=_worker_tokens(workers[mode]),
                )
                _, load = noise.measure(functools.partial(asyncio.run, loop))
                busy = load["foreign_cores"] + load["steal_cores"]
                points.setdefault((mode, c), []).append((p, busy))
                p99 = percentile(p.latencies_ms, 0.99)
                console.print(
                    f"  round {r + 1}/{a.sweep_rounds} {c:>3} clients {mode:<8}: "
                    f"{p.tokens_per_s:>6,.0f} tok/s, {p.requests:>3} done, "
                    f"p99 {p99:,.0f} ms (others: {busy:.2f} cores)"
                    + (f", [red]{p.errors} errors[/]" if p.errors else "")
                )
    out = [_pool(mode, c, pb) for (mode, c), pb in points.items()]
    return sorted(out, key=lambda x: (modes.index(x["mode"]), x["concurrency"]))


def _pool(mode: str, c: int, pb: list[tuple[mixed.Point, float]]) -> dict[str, Any]:
    ps = [p for p, _ in pb]
    lat = [x for p in ps for x in p.latencies_ms]
    single = [x for p in ps for x in p.single_ms]
    secs = sum(p.seconds for p in ps)
    return {
        "mode": mode,
        "concurrency": c,
        "tokens_per_s": sum(p.tokens_per_s * p.seconds for p in ps) / secs,
        "completed_tokens_per_s": sum(p.tokens for p in ps) / secs,
        "requests_per_s": sum(p.requests for p in ps) / secs,
        "requests": sum(p.requests for p in ps),
        "errors": sum(p.errors for p in ps),
        "p50_ms": statistics.median(lat) if lat else float("nan"),
        "p99_ms": percentile(lat, 0.99),
        "single_p50_ms": statistics.median(single) if single else float("nan"),
        "single_p99_ms": percentile(single, 0.99),
        "latency_samples": len(lat),
        "rounds_tokens_per_s": [p.tokens_per_s for p in ps],
        "rounds_others_cores": [b for _, b in pb],
    }


def knees(sweep: list[dict[str, Any]], share: float = 0.95) -> list[dict[str, Any]]:
    """Per mode, the fewest clients that reach ``share`` of its best throughput: past it,
    more load adds little throughput and only queueing delay."""
    out = []
    for mode in dict.fromkeys(p["mode"] for p in sweep):
        pts = sorted((p for p in sweep if p["mode"] == mode), key=lambda p: p["concurrency"])
        best = max(p["tokens_per_s"] for p in pts)
        knee = next(p for p in pts if p["tokens_per_s"] >= share * best)
        out.append(
            {
                "mode": mode,
                "knee_clients": knee["concurrency"],
                "knee_tokens_per_s": knee["tokens_per_s"],
                "knee_p50_ms": knee["p50_ms"],
                "knee_p99_ms": knee["p99_ms"],
                "knee_single_p99_ms": knee["single_p99_ms"],
                "max_tokens_per_s": best,
                "top_clients": pts[-1]["concurrency"],
                "top_p99_ms": pts[-1]["p99_ms"],
            }
        )
    return out


Clusters = dict[str, tuple[list[HttpTarget], list[WorkerInfo]]]


def counters(clusters: Clusters) -> dict[str, dict[str, float]]:
    """Per cluster: requests answered (its fronts) and put-backs, redeliveries (workers)."""
    time.sleep(1.5)  # workers refresh these gauges every second
    out = {}
    for name, (fronts, workers) in clusters.items():
        out[name] = {
            "requests": sum(
                scrape(f"http://127.0.0.1:{f.port}", "fleetserve_requests_total", code="ok")
                for f in fronts
            ),
            "put_backs": sum(scrape(w.health, "fleetserve_put_backs") for w in workers),
            "redeliveries": sum(scrape(w.health, "fleetserve_redeliveries") for w in workers),
        }
    return out


def put_back_rows(snaps: list[dict[str, dict[str, float]]], phases: list[str]) -> list[Any]:
    rows = []
    for (before, after), phase in zip(itertools.pairwise(snaps), phases, strict=True):
        for name in after:
            d = {k: after[name][k] - before[name][k] for k in after[name]}
            if d["requests"] <= 0:
                continue
            rows.append(
                {
                    "cluster": name,
                    "phase": phase,
                    **d,
                    "put_backs_per_1000": 1000 * d["put_backs"] / d["requests"],
                    "redeliveries_per_1000": 1000 * d["redeliveries"] / d["requests"],
                }
            )
    return rows
