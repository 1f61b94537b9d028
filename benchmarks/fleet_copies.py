"""``python -m benchmarks fleet copies``: does the budget hold, and what does a miss cost?

Copies of one model (the bundled MiniLM by default) under distinct ids, behind one
``fleetserve serve`` whose budget holds about ``--room`` of them, and a seeded Zipf
trace sent one request at a time. Each source tree asked for (``--before`` and the
tree after, alternated when repeated) gets a fresh server with the same budget in
bytes: ``--room`` times what one copy really holds, measured first as the server's
resident growth over its first request. Per run: the resident set sampled every 50 ms
(its peak growth over the budget is the figure), every answer against the first
copy's (the weights are the same), and each request's latency, a miss where the
server's load counter moved during it: a wake, where a sleeping copy woke
(``--host-tier``), else a load. ``--host-tier off,100%`` compares evicting with
sleeping in one run (each value a server of the tree after, alternated);
``--runtime torch`` puts the copies on torch fp32 (sleep needs it) instead of the
profile the rules pick.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import time
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml
from rich.console import Console

from fleetserve.bench.loadgen import percentile
from fleetserve.fleet.memory import rss_of

from .fleet_cold import describe, tree_src
from .fleet_models import SENTENCE, unpin_bundled
from .fleet_server import RssSampler, Server

MIB = 1 << 20
PREFIX = "copies/"
SUMMARY = (
    "budget_x", "grown_mib", "wrong", "errors", "miss_p50_ms", "wake_p50_ms", "hit_p50_ms",
    "loads", "wakes", "evictions", "drifts",
)  # fmt: skip


def catalog(model: str, copies: int, root: Path, runtime: str = "") -> tuple[Path, list[str]]:
    """``copies`` specs of the bundled ``model`` (``copies/<name>-NN``, unpinned), on
    ``runtime`` at fp32 where one is named."""
    bundled = resources.files("fleetserve.catalog") / "models"
    base = next(
        d
        for e in bundled.iterdir()
        if e.name.endswith((".yaml", ".yml"))
        and (d := yaml.safe_load(e.read_text())).get("id") == model
    )
    cat = root / f"catalog-{copies}"
    shutil.rmtree(cat, ignore_errors=True)
    cat.mkdir(parents=True)
    ids = [f"{PREFIX}{model.rsplit('/', 1)[-1]}-{i:02d}" for i in range(copies)]
    if runtime:
        cpu = {**base.get("budgets", {}).get("cpu", {}), "runtime": runtime, "precision": "fp32"}
        base = {**base, "runtime": runtime, "profiles": {"cpu": cpu}}
    for i, mid in enumerate(ids):
        (cat / f"copy-{i:02d}.yaml").write_text(
            yaml.safe_dump({**base, "id": mid, "pinned": False})
        )
    unpin_bundled(cat)
    return cat, ids


def serve_args(cat: Path, budget: int, threads: int, cache: Path, host_tier: str = "") -> list[str]:
    return [
        "--catalog", str(cat.resolve()), "--models", PREFIX + "*", "--device", "cpu",
        "--memory-budget", str(budget), "--cache-dir", str(cache), "--log-level", "warning",
        *(["--torch-threads", str(threads)] if threads else []),
        *(["--host-tier", host_tier] if host_tier else []),
    ]  # fmt: skip


def embed(client: httpx.Client, url: str, model: str) -> tuple[float, int, np.ndarray | None]:
    t0 = time.perf_counter()
    r = client.post(url + "/v1/embeddings", json={"model": model, "input": [SENTENCE]})
    dt = time.perf_counter() - t0
    if r.status_code != 200:
        return dt, r.status_code, None
    return dt, 200, np.asarray(r.json()["data"][0]["embedding"], dtype=np.float32)


def probe(cat: Path, ids: list[str], src: Path, args: argparse.Namespace) -> tuple[int, Any]:
    """What one copy holds (the resident growth over its first request), and its answer."""
    log_dir, cache = Path(args.log_dir), Path(args.log_dir) / "cache"
    srv = Server("copies-probe", serve_args(cat, 64 << 30, args.threads, cache), log_dir, src=src)
    try:
        srv.wait_ready()
        ready = rss_of(srv.pid)
        with httpx.Client(timeout=300) as c:
            _, status, vec = embed(c, srv.url, ids[0])
        if vec is None:
            raise RuntimeError(f"the probe's request failed ({status}): {srv.tail()}")
        return rss_of(srv.pid) - ready, vec
    finally:
        srv.stop()


def run_once(
    tree: str, src: Path, run: int, cat: Path, budget: int, trace: list[str], reference: Any,
    args: argparse.Namespace, host_tier: str = "",
) -> dict[str, Any]:  # fmt: skip
    log_dir = Path(args.log_dir)
    cache = log_dir / "cache"  # shared: exports and compiled models are made once
    name = f"copies-{tree}-{run}".replace("%", "pct")
    srv = Server(name, serve_args(cat, budget, args.threads, cache, host_tier), log_dir, src=src)
    wrong = errors = 0
    hits: list[float] = []
    misses: list[float] = []
    wakes: list[float] = []
    try:
        srv.wait_ready()
        ready = rss_of(srv.pid)
        with RssSampler(srv.pid) as rss, httpx.Client(timeout=300) as client:
            loads = _loads(srv)
            for model in trace:
                dt, _, vec = embed(client, srv.url, model)
                now = _loads(srv)
                if now[0] > loads[0]:
                    misses.append(dt)
                else:
                    (wakes if now[1] > loads[1] else hits).append(dt)
                loads = now
                if vec is None:
                    errors += 1
                elif not np.allclose(vec, reference, atol=1e-4):
                    wrong += 1
        m = srv.metrics()
        loaded = _loads(srv)[0]
    finally:
        srv.stop()
    grown = rss.peak - ready
    return {
        "tree": tree, "version": describe(src), "run": run, "requests": len(trace),
        "errors": errors, "wrong": wrong, "ready_rss": ready, "peak_rss": rss.peak,
        "grown_mib": grown / MIB, "budget_x": grown / budget,
        "miss_p50_ms": percentile(misses, 0.5) * 1e3 if misses else None,
        "miss_p99_ms": percentile(misses, 0.99) * 1e3 if misses else None,
        "wake_p50_ms": percentile(wakes, 0.5) * 1e3 if wakes else None,
        "wake_p99_ms": percentile(wakes, 0.99) * 1e3 if wakes else None,
        "hit_p50_ms": percentile(hits, 0.5) * 1e3 if hits else None,
        "misses": len(misses), "wakes": len(wakes), "loads": loaded,
        "sleeps": m.get("fleetserve_model_sleeps_total", 0.0),
        "evictions": m.get("fleetserve_model_evictions_total", 0.0),
        "drifts": m.get("fleetserve_memory_drift_total", 0.0),
        "rss_samples": rss.samples,
    }  # fmt: skip


def _loads(srv: Server) -> tuple[float, float]:
    """The server's loads and wakes so far."""
    loads = "fleetserve_model_loads_total"
    return (srv.metrics(outcome="ok").get(loads, 0.0), srv.metrics(outcome="woken").get(loads, 0.0))


def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    root = Path(args.log_dir)
    cat, ids = catalog(args.model, args.copies, root, args.runtime)
    trees = {"after": tree_src(Path(args.src))}
    if args.before:
        trees = {"before": tree_src(Path(args.before)), **trees}
    tiers = {"": ""}  # each tree's label suffix -> --host-tier
    if args.host_tier:
        tiers = {f" tier={t}": t for t in args.host_tier.split(",")}
    with console.status("measuring what one copy holds…"):
        one, reference = probe(cat, ids, trees["after"], args)
    budget = int(args.room * one)
    rng = random.Random(args.seed)
    ranked = list(ids)
    rng.shuffle(ranked)
    weights = [1 / (k + 1) ** args.zipf for k in range(len(ranked))]
    trace = rng.choices(ranked, weights, k=args.requests)
    console.print(
        f"{args.copies} copies of {args.model}; one holds {one / MIB:.0f} MiB; budget "
        f"{budget / MIB:.0f} MiB (x{args.room:g}); {args.requests} requests one at a time, "
        f"Zipf s={args.zipf}, {len(set(trace))} copies asked for"
    )
    runs: list[dict[str, Any]] = []
    variants = [(t + s, t, tier) for t in trees for s, tier in tiers.items()]
    for r in range(args.repeats):
        for label, tree, tier in variants if r % 2 == 0 else variants[::-1]:
            with console.status(f"run {r + 1}/{args.repeats}: {label}…"):
                res = run_once(label, trees[tree], r, cat, budget, trace, reference, args, tier)
            runs.append(res)
            console.print(
                f"  {label} ({res['version']}): grew {res['grown_mib']:.0f} MiB = "
                f"x{res['budget_x']:.2f} the budget, miss p50 {res['miss_p50_ms'] or 0:.0f} ms, "
                f"{res['wrong']} wrong, {res['errors']} errors"
            )
    medians = {
        t: {
            k: statistics.median(v for x in runs if x["tree"] == t if (v := x[k]) is not None)
            if any(x[k] is not None for x in runs if x["tree"] == t)
            else None
            for k in SUMMARY
        }
        for t in (label for label, _, _ in variants)
    }
    return {
        "model": args.model, "copies": args.copies, "one_copy_bytes": one,
        "budget_bytes": budget, "room": args.room,
        "trace": {"requests": args.requests, "zipf_s": args.zipf, "seed": args.seed},
        "runs": runs, "medians": medians,
    }  # fmt: skip
