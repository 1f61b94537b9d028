"""The measurements of ``python -m benchmarks dist``, on one fleet of processes kept up
for the whole run so that every comparison is interleaved on the same machine."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from . import dist_mixed as mixed
from .dist_cpu import CpuMeter
from .dist_fleet import Fleet
from .dist_measure import (
    JSON_HEADERS,
    Clusters,
    Noise,
    counters,
    embedded_vs_nats,
    knees,
    pull_vs_push,
    put_back_rows,
)
from .targets import HttpTarget


def warm_up(fronts: Sequence[HttpTarget], texts: list[str], payloads: list[bytes], a: Any) -> None:
    """A few requests of every shape through every front: first calls are slow."""
    with httpx.Client(timeout=120) as client:
        for f in fronts:
            for i in range(8):
                client.post(f.url, content=f.body(texts[: a.batch]), headers=JSON_HEADERS)
                client.post(f.url, content=f.body([texts[i]]), headers=JSON_HEADERS)
                client.post(f.url, content=payloads[i], headers=JSON_HEADERS)


def start_fleet(
    fleet: Fleet, cores: int
) -> tuple[list[HttpTarget], dict[str, HttpTarget], Clusters]:
    """Everything at once: embedded, NATS with 1 and 2 workers (the latter is also the
    pull fleet), and 2 push workers behind a round-robin and a least-outstanding router."""
    fleet.start_nats()
    half = max(1, cores // 2)
    embedded = fleet.embedded("embedded")
    one = fleet.gateway(f"nats, 1 worker x {cores} threads", "one")
    one_w = [fleet.worker("one-w0", "one", cores)]
    pull = fleet.gateway(f"nats, 2 workers x {half} thread(s)", "pull")
    pull_w = [fleet.worker(f"pull-w{i}", "pull", half) for i in range(2)]
    push_w = [fleet.worker(f"push-w{i}", f"push-w{i}", half) for i in range(2)]
    rr = fleet.router("push-rr", [w.prefix for w in push_w], "rr")
    lor = fleet.router("push-lor", [w.prefix for w in push_w], "lor")
    fleet.wait_ready()
    clusters: Clusters = {
        "nats-1w": ([one], one_w),
        "pull": ([pull], pull_w),
        "push": ([rr, lor], push_w),
    }
    return [embedded, one, pull], {"pull": pull, "push-rr": rr, "push-lor": lor}, clusters


def run(a: argparse.Namespace, env: Mapping[str, str] | None, console: Console) -> dict[str, Any]:
    from fleetserve.assembly import HF_CACHE
    from fleetserve.bench.tune.workload import sentences
    from fleetserve.catalog import Catalog
    from fleetserve.catalog.sources import resolve

    t_start = time.perf_counter()
    spec = Catalog.load().get(a.model)
    path = resolve(a.model, spec.sources, HF_CACHE)
    texts = sentences(path, 512, a.tokens)
    lengths = mixed.make_lengths(a.pool, a.seed)
    words = mixed.single_token_words(path)
    reqs = mixed.Requests.build(a.model, lengths, words, spec.max_seq_len, a.seed)
    cores = os.cpu_count() or 1
    fleet = Fleet(a.model, Path(a.logs), env)
    noise = Noise(CpuMeter(fleet.pids), a.quiet_wait)
    try:
        with console.status("starting nats-server, servers, gateways, workers, routers…"):
            uniform, push_fronts, clusters = start_fleet(fleet, cores)
        long_item = " ".join(["fox"] * 600)  # past max_seq_len: truncated, not refused
        ref = uniform[0].embed([long_item, *texts[:15]])
        quality = {
            f.name: _min_cos(f.embed([long_item, *texts[:15]]), ref)
            for f in [*uniform, *push_fronts.values()]
        }
        with console.status("warming up every front…"):
            warm_up([*uniform, *push_fronts.values()], texts, reqs.payloads, a)
        snaps = [counters(clusters)]
        console.rule("embedded against NATS: uniform 64-token sentences")
        uni_rows = embedded_vs_nats(uniform, texts, a, noise, console)
        for row in uni_rows:
            row["min_cos"] = quality[row["target"]]
        snaps.append(counters(clusters))
        console.rule("pull against push: mixed request sizes")
        workers = {m: clusters["pull" if m == "pull" else "push"][1] for m in push_fronts}
        sweep = pull_vs_push(push_fronts, workers, reqs, a, noise, console)
        snaps.append(counters(clusters))
    finally:
        fleet.stop()
    n_items = [len(x) for x in lengths]
    return {
        "uniform": uni_rows,
        "sweep": sweep,
        "knees": knees(sweep),
        "put_backs": put_back_rows(snaps, ["uniform", "mixed"]),
        "min_cos_vs_embedded": quality,
        "noise": noise.summary(),
        "workload": {
            "requests_in_pool": len(lengths),
            "mean_items": statistics.mean(n_items),
            "single_item_share": sum(n == 1 for n in n_items) / len(n_items),
            "max_items": max(n_items),
            "mean_tokens_per_request": statistics.mean(reqs.costs),
            "item_tokens": list(mixed.ITEM_TOKENS),
            "max_seq_len": spec.max_seq_len,
            "mix": [list(m) for m in mixed.MIX],
        },
        "seconds": time.perf_counter() - t_start,
    }


def _min_cos(a: Any, b: Any) -> float:
    import numpy as np

    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())
